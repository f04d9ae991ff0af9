//! Garbage collection: which runs go, which blobs stay, dry runs, cutoffs and manifests.
use retrace_core::envelope::ToolClass;
use retrace_core::run::{Retention, RunMeta, RunMode, RunStatus};
use retrace_core::{Digest, Event, EventType};

use super::{raw, MakeStore};
use crate::gc::{collect, GcConfig, DAY_MS};
use crate::writer::lease::now_ms;
use crate::{Batch, BlobHint, BlobPut, CacheEntry, GcRequest, Store, INLINE_BLOB_MAX};

/// A finished run `id` of `mode` that started `days` ago (on the real clock), at `tier`.
pub fn aged_run(id: &str, mode: RunMode, days: u64, tier: Retention, source: Option<&str>) -> RunMeta {
    let mut meta = RunMeta::new(id, mode, now_ms() - days * DAY_MS);
    meta.status = RunStatus::Ok;
    meta.retention = tier;
    meta.source_run = source.map(str::to_owned);
    meta
}

/// Creates `meta` and commits one event per blob of `outputs` (from `fork_at`, or 1), each
/// naming its blob as `output_ref`.
pub fn record_with_outputs(store: &dyn Store, meta: &RunMeta, outputs: &[&BlobPut]) {
    store.create_run(meta).unwrap();
    let first = meta.fork_at.unwrap_or(1);
    let mut prev = None;
    let events: Vec<Event> = outputs
        .iter()
        .enumerate()
        .map(|(i, blob)| {
            let mut e = Event::new(meta.id.clone(), "a0", EventType::ToolCall);
            e.seq = first + i as u64;
            e.lamport = e.seq;
            e.key = Digest::of(format!("{} {i}", meta.id).as_bytes());
            e.output_ref = Some(blob.digest);
            e.seal(prev).unwrap();
            prev = Some(e.hash);
            e
        })
        .collect();
    if events.is_empty() {
        return;
    }
    let blobs = outputs.iter().map(|b| (*b).clone()).collect();
    store.commit(&Batch { run_id: meta.id.clone(), events, blobs, cache: Vec::new() }).unwrap();
}

fn ids(store: &dyn Store) -> Vec<String> {
    store.runs().unwrap().into_iter().map(|r| r.id).collect()
}

/// Expired routine runs go with their replays and every blob only they referenced (a cache entry
/// on such a blob included); pinned runs, sources of young forks, what they reference and
/// fork edits stay. A dry run reports the same and changes nothing.
pub fn gc_deletes_expired_runs_and_their_blobs(make: MakeStore<'_>) {
    let store = make();
    let (shared, only_old, src_blob, fork_blob) =
        (raw(b"shared"), raw(&[b'o'; 300]), raw(b"src"), raw(b"fork"));
    let big = raw(&vec![b'b'; INLINE_BLOB_MAX + 10]);
    record_with_outputs(
        &*store,
        &aged_run("old", RunMode::Record, 90, Retention::Routine, None),
        &[&shared, &only_old, &big],
    );
    record_with_outputs(&*store, &aged_run("kept", RunMode::Record, 90, Retention::Pinned, None), &[&shared]);
    record_with_outputs(
        &*store,
        &aged_run("src", RunMode::Record, 80, Retention::Routine, None),
        &[&src_blob, &src_blob],
    );
    let edit = store.put_blob(b"{\"edited\":true}", BlobHint::Raw).unwrap();
    let mut fork = aged_run("fork", RunMode::Fork, 1, Retention::Routine, Some("src"));
    fork.fork_at = Some(2);
    fork.edits = vec![format!("message:1=@{edit}")];
    record_with_outputs(&*store, &fork, &[&fork_blob]);
    record_with_outputs(
        &*store,
        &aged_run("replay", RunMode::Replay, 2, Retention::Pinned, Some("old")),
        &[],
    );
    let orphan = store.put_blob(b"nobody's", BlobHint::Raw).unwrap();
    let entry = CacheEntry {
        output_ref: only_old.digest,
        usage: None,
        stored_at_ms: 1,
        class: Some(ToolClass::Deterministic),
        ttl_s: None,
        snapshot: None,
    };
    let cache_key = Digest::of(b"cached step");
    store.cache_put(&cache_key, &entry).unwrap();
    // Each run held a side effect; the deleted ones' approvals go with them (QA27 D2).
    for run in ["old", "kept"] {
        let held = crate::ledger::ApprovalRecord {
            id: format!("ap_{run}"),
            run: run.into(),
            agent: "a".into(),
            tool: "t".into(),
            key: Digest::of(run.as_bytes()),
            rung: "unproven".into(),
            why: "below the bar".into(),
            requested_at_ms: 1,
            decision: None,
        };
        store.approval_request(&held).unwrap();
    }
    // A secret's original goes with the last run holding its token (QA38 D1); one that no run
    // holds (stored before runs held tokens) stays.
    let key = retrace_core::vault::VaultKey::from_bytes([3; 32]);
    let original = |token: &str| (token.to_owned(), format!("{token}@example.com").into_bytes());
    crate::vault::store_originals(&*store, &key, Some("old"), &[original("rtk_old"), original("rtk_both")])
        .unwrap();
    crate::vault::store_originals(&*store, &key, Some("kept"), &[original("rtk_both")]).unwrap();
    crate::vault::store_originals(&*store, &key, None, &[original("rtk_nobody")]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(3));

    let mut config = GcConfig::new(now_ms(), 30);
    config.blob_grace_ms = 0;
    config.dry_run = true;
    let planned = collect(&*store, &config).unwrap();
    assert_eq!(planned.runs_deleted, ["old", "replay"]);
    assert_eq!((planned.events_deleted, planned.blobs_deleted, planned.cache_entries_dropped), (3, 3, 1));
    assert_eq!(planned.vault_originals_deleted, 1, "{planned:?}");
    assert!(store.vault_get("rtk_old").unwrap().is_some(), "a dry run changes nothing");
    assert!(planned.bytes_freed >= big.bytes.len() as u64, "{planned:?}");
    assert_eq!(ids(&*store), ["old", "kept", "src", "replay", "fork"], "a dry run changes nothing");
    assert!(store.has_blob(&orphan).unwrap() && store.cache_get(&cache_key).unwrap().is_some());

    config.dry_run = false;
    let done = collect(&*store, &config).unwrap();
    assert_eq!(done, crate::GcReport { dry_run: false, ..planned });
    assert_eq!(ids(&*store), ["kept", "src", "fork"]);
    assert_eq!(store.approval("ap_old").unwrap(), None, "a deleted run's approval is deleted");
    assert!(store.approval("ap_kept").unwrap().is_some());
    assert_eq!(store.vault_get("rtk_old").unwrap(), None, "only the deleted run held it");
    for kept in ["rtk_both", "rtk_nobody"] {
        assert!(store.vault_get(kept).unwrap().is_some(), "{kept} stays");
    }
    for gone in [&only_old.digest, &big.digest, &orphan] {
        assert!(!store.has_blob(gone).unwrap(), "{gone} is swept");
    }
    for kept in [&shared, &src_blob, &fork_blob] {
        assert_eq!(store.get_blob(&kept.digest).unwrap(), kept.bytes.to_vec());
    }
    assert!(store.has_blob(&edit).unwrap(), "a kept fork's edit stays");
    assert_eq!(store.cache_get(&cache_key).unwrap(), None, "the cache entry went with its blob");
    assert_eq!(store.events("src", 1, 10).unwrap().len(), 2, "a young fork's source stays whole");
    let again = collect(&*store, &config).unwrap();
    assert_eq!((again.runs_deleted.len(), again.blobs_deleted, again.bytes_freed), (0, 0, 0));
}

/// Blobs stored at or after the cutoff stay though nothing references them; running runs are
/// never deleted, even when asked.
pub fn gc_keeps_recent_blobs_and_running_runs(make: MakeStore<'_>) {
    let store = make();
    let orphan = store.put_blob(b"waiting for its run", BlobHint::Raw).unwrap();
    let mut running = aged_run("rec", RunMode::Record, 60, Retention::Routine, None);
    running.status = RunStatus::Running;
    let output = raw(b"recorded");
    record_with_outputs(&*store, &running, &[&output]);
    let keep_all = GcRequest { runs: vec!["rec".into()], named: vec![], blob_cutoff_ms: 0, dry_run: false };
    let report = store.collect_garbage(&keep_all).unwrap();
    assert_eq!((report.runs_deleted.len(), report.blobs_deleted), (0, 0));
    assert!(store.has_blob(&orphan).unwrap());
    let after = GcRequest { blob_cutoff_ms: now_ms() + 1_000, ..keep_all };
    let report = store.collect_garbage(&after).unwrap();
    assert_eq!((report.runs_deleted.len(), report.blobs_deleted), (0, 1));
    assert!(!store.has_blob(&orphan).unwrap());
    assert_eq!(store.get_blob(&output.digest).unwrap(), b"recorded");
    assert_eq!(ids(&*store), ["rec"]);
}

fn request(n: usize, tag: &str) -> BlobPut {
    let messages: Vec<String> = (0..n)
        .map(|i| format!("{{\"role\":\"user\",\"content\":\"{tag} message {i} {}\"}}", "x".repeat(80)))
        .collect();
    BlobPut::new(format!("{{\"messages\":[{}]}}", messages.join(",")).into_bytes(), BlobHint::ModelRequest)
}

/// A kept request stays readable whatever it was stored as (a chained manifest names earlier
/// requests that no event references), and later requests of its run still build on it.
pub fn gc_keeps_what_kept_manifests_name(make: MakeStore<'_>) {
    let store = make();
    let (r1, r2, r3, r4) = (request(1, "b"), request(2, "b"), request(3, "b"), request(4, "b"));
    let gone = request(2, "a");
    record_with_outputs(&*store, &aged_run("a", RunMode::Record, 90, Retention::Routine, None), &[&gone]);
    let kept = aged_run("b", RunMode::Record, 90, Retention::Pinned, None);
    store.create_run(&kept).unwrap();
    let blobs_only = Batch { run_id: "b".into(), blobs: vec![r1, r2], ..Batch::default() };
    store.commit(&blobs_only).unwrap();
    let mut e = Event::new("b", "a0", EventType::ModelCall);
    (e.seq, e.lamport, e.key, e.request_ref) = (1, 1, Digest::of(b"k"), Some(r3.digest));
    e.seal(None).unwrap();
    let prev = e.hash;
    store
        .commit(&Batch { run_id: "b".into(), events: vec![e], blobs: vec![r3.clone()], ..Batch::default() })
        .unwrap();

    let report = store.collect_garbage(&GcRequest {
        runs: vec!["a".into()],
        named: vec![],
        blob_cutoff_ms: u64::MAX,
        dry_run: false,
    });
    assert_eq!(report.unwrap().runs_deleted, ["a"]);
    assert_eq!(store.get_blob(&r3.digest).unwrap(), r3.bytes.to_vec());
    assert!(!store.has_blob(&gone.digest).unwrap());
    let mut e = Event::new("b", "a0", EventType::ModelCall);
    (e.seq, e.lamport, e.key, e.request_ref) = (2, 2, Digest::of(b"k2"), Some(r4.digest));
    e.seal(Some(prev)).unwrap();
    store
        .commit(&Batch { run_id: "b".into(), events: vec![e], blobs: vec![r4.clone()], ..Batch::default() })
        .unwrap();
    assert_eq!(store.get_blob(&r4.digest).unwrap(), r4.bytes.to_vec());
    assert_eq!(store.get_blob(&r3.digest).unwrap(), r3.bytes.to_vec());
}

/// Compacting refuses (`Busy`, naming the run) while a run is `running`, and changes nothing;
/// once no run is running it keeps every run, event and blob the store holds, and its report's
/// sizes are the store's files before and after (never more after than before).
pub fn compact_keeps_everything_and_waits_for_running_runs(make: MakeStore<'_>) {
    let store = make();
    let (kept, gone) = (raw(&[b'k'; 3000]), raw(&[b'g'; 3000]));
    record_with_outputs(&*store, &aged_run("kept", RunMode::Record, 0, Retention::Pinned, None), &[&kept]);
    let many: Vec<BlobPut> =
        (0..200u32).map(|i| raw(format!("{i:04}{}", "x".repeat(2000)).as_bytes())).collect();
    record_with_outputs(
        &*store,
        &aged_run("old", RunMode::Record, 90, Retention::Routine, None),
        &many.iter().chain([&gone]).collect::<Vec<_>>(),
    );
    let mut live = RunMeta::new("live", RunMode::Record, now_ms());
    live.status = RunStatus::Running;
    store.create_run(&live).unwrap();

    let err = store.compact().unwrap_err();
    assert_eq!(err.kind, crate::StoreErrorKind::Busy, "{err}");
    assert!(err.to_string().contains("run live is running"), "{err}");
    assert_eq!(ids(&*store), ["old", "kept", "live"], "a refused compaction changes nothing");

    live.status = RunStatus::Ok;
    store.update_run(&live).unwrap();
    // A second from now, so that the blobs stored this millisecond are old enough to go.
    let mut config = GcConfig::new(now_ms() + 1_000, 30);
    config.blob_grace_ms = 0;
    assert_eq!(collect(&*store, &config).unwrap().runs_deleted, ["old"]);
    let compacted = store.compact().unwrap();
    assert!(compacted.bytes_after <= compacted.bytes_before, "{compacted:?}");
    assert_eq!(ids(&*store), ["kept", "live"]);
    assert_eq!(store.events("kept", 1, 10).unwrap().len(), 1);
    assert_eq!(store.get_blob(&kept.digest()).unwrap(), &kept.bytes()[..]);
    assert!(store.get_blob(&gone.digest()).is_err(), "the collected blob stays gone");
    // A second compaction finds nothing more to give back.
    let again = store.compact().unwrap();
    assert!(again.bytes_after <= again.bytes_before, "{again:?}");
}
