//! The conformance suite: every check written once, run against every backend.
//!
//! Each check is a `pub fn(make)` that builds fresh stores with `make` and panics (like a test)
//! when the backend misbehaves; [`run_all`] runs them all. A backend's test file calls
//! `run_all(&|| Arc::new(MyStore::new()))` or the checks one by one.
use std::sync::Arc;

use retrace_core::envelope::{
    Approval, ApprovalOutcome, Decision, MessageRef, ModelRef, PromptRef, ToolClass, ToolRef, Usage,
};
use retrace_core::run::{RunMeta, RunMode};
use retrace_core::{Digest, Event, EventType, Source};

use crate::{Batch, BlobHint, BlobPut, Store, StoreErrorKind, StoreResult};

mod blobs;
mod cache;
mod events;
mod gc;
mod knew;
mod leases;
mod ledger;
mod runs;
mod vault;
mod writer;

pub use blobs::{blobs_small_and_large, model_request_manifests, request_shapes_round_trip};
pub use cache::{
    cache_entries_commit_with_their_batch, cache_get_put_overwrite, cache_usable_at_by_class,
    writer_append_cached,
};
pub use events::{
    blobs_carried_without_bytes_are_confirmed_or_refused, causal_reads_match_events,
    commit_requires_dense_seqs, commit_to_unknown_run_is_not_found, deliveries_and_events_at,
    event_round_trips_exactly, events_paging_and_lookup, failed_commit_stores_nothing,
    fork_starts_at_fork_point, heard_by_matches_its_parts, located_reads_match_blob_reads,
    put_blobs_then_commit_where_they_are, request_blobs_match_blob_reads, summaries_match_events,
};
pub use gc::{
    aged_run, compact_keeps_everything_and_waits_for_running_runs, gc_deletes_expired_runs_and_their_blobs,
    gc_keeps_recent_blobs_and_running_runs, gc_keeps_what_kept_manifests_name, record_with_outputs,
};
pub use knew::knew_in_forks_answers_as_a_recording;
pub use leases::{a_kept_run_lives_with_its_keeper, dead_holder_is_recovered, leases_acquire_renew_release};
pub use ledger::{approvals_are_decided_once, ledger_counts_traces_once_per_hash};
pub use runs::{
    duplicate_run_conflicts, runs_create_get_update, runs_find_by_prefix, runs_list_oldest_first,
};
pub use vault::{audit_appends_in_order, reveal_audits_every_attempt, vault_put_is_idempotent};
pub use writer::{
    writer_concurrent_appends, writer_poisoned_after_failing_commit, writer_refuses_second_holder,
    writer_resumes_after_reopen, FailCommits, Flaky,
};

/// A store factory: each call returns a fresh, empty store.
pub type MakeStore<'a> = &'a dyn Fn() -> Arc<dyn Store>;

/// One conformance check.
pub type Check = fn(MakeStore<'_>);

/// Every check, in order.
pub fn run_all(make: MakeStore<'_>) {
    let checks: &[(&str, Check)] = &[
        ("runs_create_get_update", runs_create_get_update),
        ("runs_find_by_prefix", runs_find_by_prefix),
        ("runs_list_oldest_first", runs_list_oldest_first),
        ("duplicate_run_conflicts", duplicate_run_conflicts),
        ("commit_requires_dense_seqs", commit_requires_dense_seqs),
        ("failed_commit_stores_nothing", failed_commit_stores_nothing),
        ("commit_to_unknown_run_is_not_found", commit_to_unknown_run_is_not_found),
        ("events_paging_and_lookup", events_paging_and_lookup),
        ("event_round_trips_exactly", event_round_trips_exactly),
        ("deliveries_and_events_at", deliveries_and_events_at),
        ("causal_reads_match_events", causal_reads_match_events),
        ("request_blobs_match_blob_reads", request_blobs_match_blob_reads),
        ("located_reads_match_blob_reads", located_reads_match_blob_reads),
        ("put_blobs_then_commit_where_they_are", put_blobs_then_commit_where_they_are),
        (
            "blobs_carried_without_bytes_are_confirmed_or_refused",
            blobs_carried_without_bytes_are_confirmed_or_refused,
        ),
        ("heard_by_matches_its_parts", heard_by_matches_its_parts),
        ("fork_starts_at_fork_point", fork_starts_at_fork_point),
        ("knew_in_forks_answers_as_a_recording", knew_in_forks_answers_as_a_recording),
        ("summaries_match_events", summaries_match_events),
        ("blobs_small_and_large", blobs_small_and_large),
        ("model_request_manifests", model_request_manifests),
        ("request_shapes_round_trip", request_shapes_round_trip),
        ("leases_acquire_renew_release", leases_acquire_renew_release),
        ("dead_holder_is_recovered", dead_holder_is_recovered),
        ("a_kept_run_lives_with_its_keeper", a_kept_run_lives_with_its_keeper),
        ("writer_concurrent_appends", writer_concurrent_appends),
        ("writer_resumes_after_reopen", writer_resumes_after_reopen),
        ("writer_poisoned_after_failing_commit", writer_poisoned_after_failing_commit),
        ("writer_refuses_second_holder", writer_refuses_second_holder),
        ("cache_get_put_overwrite", cache_get_put_overwrite),
        ("cache_entries_commit_with_their_batch", cache_entries_commit_with_their_batch),
        ("cache_usable_at_by_class", cache_usable_at_by_class),
        ("writer_append_cached", writer_append_cached),
        ("vault_put_is_idempotent", vault_put_is_idempotent),
        ("audit_appends_in_order", audit_appends_in_order),
        ("reveal_audits_every_attempt", reveal_audits_every_attempt),
        ("ledger_counts_traces_once_per_hash", ledger_counts_traces_once_per_hash),
        ("approvals_are_decided_once", approvals_are_decided_once),
        ("gc_deletes_expired_runs_and_their_blobs", gc_deletes_expired_runs_and_their_blobs),
        (
            "compact_keeps_everything_and_waits_for_running_runs",
            compact_keeps_everything_and_waits_for_running_runs,
        ),
        ("gc_keeps_recent_blobs_and_running_runs", gc_keeps_recent_blobs_and_running_runs),
        ("gc_keeps_what_kept_manifests_name", gc_keeps_what_kept_manifests_name),
    ];
    for (name, check) in checks {
        let started = std::time::Instant::now();
        check(make);
        eprintln!("conformance: {name} ok ({} ms)", started.elapsed().as_millis());
    }
}

/// A recording run `id` started at `started_at_ms`.
pub fn sample_run(id: &str, started_at_ms: u64) -> RunMeta {
    RunMeta::new(id, RunMode::Record, started_at_ms)
}

/// `n` sealed, chained events of `run` with seqs `first..first+n`, agents `a0..a2` in turn.
pub fn sample_events(run: &str, first: u64, n: u64, prev: Option<Digest>) -> Vec<Event> {
    let mut prev = prev;
    (first..first + n)
        .map(|seq| {
            let mut e = Event::new(run, format!("a{}", seq % 3), EventType::ToolCall);
            e.seq = seq;
            e.lamport = seq;
            e.name = Some("sql.query".into());
            e.key = Digest::of(format!("key {seq}").as_bytes());
            e.seal(prev).expect("sample events hash");
            prev = Some(e.hash);
            e
        })
        .collect()
}

/// An event with every optional field set, sealed after `prev`.
pub fn full_event(run: &str, seq: u64, prev: Option<Digest>) -> Event {
    let mut e = Event::new(run, "reviewer", EventType::ModelCall);
    e.seq = seq;
    e.lamport = 41;
    e.role = Some("reviewer".into());
    e.name = Some("/v1/chat/completions".into());
    e.causal_parent = Some(seq.saturating_sub(1));
    e.inbound = vec![2, 3];
    e.key = Digest::of(b"key");
    e.request_ref = Some(Digest::of(b"request"));
    e.output_ref = Some(Digest::of(b"output"));
    e.output_hash = Some(Digest::of(b"canonical output"));
    e.model =
        Some(ModelRef { provider: "openai".into(), name: "gpt".into(), snapshot: Some("gpt-2024".into()) });
    let params = [
        ("temperature", serde_json::json!(0.7)),
        ("top_p", serde_json::json!(0.1 + 0.2)),
        ("max_tokens", serde_json::json!(512)),
        ("seed", serde_json::json!(-3)),
        ("stop", serde_json::json!(["\n", "é\u{1F600}"])),
        ("tiny", serde_json::json!(5e-324)),
        ("big", serde_json::json!(1.7976931348623157e308)),
    ];
    e.params = Some(params.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
    e.prompt_template = Some(PromptRef { id: "reviewer@v14".into(), digest: Digest::of(b"template") });
    e.tool = Some(ToolRef {
        name: "sql".into(),
        version: "2".into(),
        class: ToolClass::TimeBound,
        ttl_s: Some(60),
    });
    e.message = Some(MessageRef {
        from: Some("planner".into()),
        to: None,
        kind: Some("ready".into()),
        timed_out: true,
    });
    e.decision = Some(Decision { action: "approve".into(), target: Some("step:backfill".into()) });
    e.approval = Some(Approval { outcome: ApprovalOutcome::TimedOut });
    e.usage = Some(Usage {
        input_tokens: 1200,
        output_tokens: 34,
        cost_usd: Some(0.001_234_567_890_123),
        ..Default::default()
    });
    e.latency_ms = Some(812);
    e.source = Source::CacheHit;
    e.origin_seq = Some(7);
    e.error = Some("upstream said \"no\"".into());
    e.seal(prev).expect("full event hashes");
    e
}

/// A batch of `events` for `run` without blobs.
pub fn batch(run: &str, events: Vec<Event>) -> Batch {
    Batch { run_id: run.to_string(), events, ..Batch::default() }
}

/// Deterministic printable text of `len` bytes from `seed` (xorshift).
pub fn text(seed: &mut u64, len: usize) -> String {
    (0..len)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            char::from(b' ' + (*seed % 95) as u8)
        })
        .collect()
}

/// The kind of `result`'s error; panics when it succeeded.
pub fn err_kind<T: std::fmt::Debug>(result: StoreResult<T>) -> StoreErrorKind {
    result.expect_err("expected an error").kind
}

/// A raw blob put.
pub fn raw(bytes: &[u8]) -> BlobPut {
    BlobPut::new(bytes.to_vec(), BlobHint::Raw)
}
