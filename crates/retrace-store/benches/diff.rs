//! `retrace diff` of two 100,000-step runs in SQLite (target: at most 1 s).
//!
//! ```text
//! cargo bench -p retrace-store --bench diff
//! ```
//!
//! Medians measured on a 2-core VM at load average ~4.5 (other builds running): fork 388 ms,
//! unrelated 640 ms; the floor, reading both runs as whole events, 882 ms. The release binary,
//! `retrace diff` end to end on the same store: 0.29 to 0.39 s, 53 to 67 MB peak RSS.
//!
//! Two shapes: a fork at seq 2 that re-ran everything with 20 changed model outputs (aligned by
//! `origin_seq`), and two unrelated recordings that differ in the same 20 steps (paired by key,
//! then by type and name). Events look like a real run's: model calls with a model, usage and
//! latency; tool calls with a tool; sends and deliveries with a message envelope.
use criterion::{criterion_group, criterion_main, Criterion};
use retrace_core::envelope::{MessageRef, ModelRef, ToolClass, ToolRef, Usage};
use retrace_core::run::{RunMeta, RunMode};
use retrace_core::{Digest, Event, EventType, Source};
use retrace_store::diff::{diff_runs, DiffOptions};
use retrace_store::export::RunEvents;
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Batch, BlobHint, BlobPut, EventStore};

const N: u64 = 100_000;
const AGENTS: [&str; 4] = ["planner", "reviewer", "executor", "critic"];

/// Event `seq` of `run`; `output` names its output.
fn event(run: &str, seq: u64, output: &str) -> Event {
    let agent = AGENTS[(seq % 4) as usize];
    let kind = [EventType::ModelCall, EventType::ToolCall, EventType::Send, EventType::Deliver]
        [(seq % 8 / 2) as usize];
    let mut e = Event::new(run, agent, kind);
    e.seq = seq;
    e.lamport = seq;
    e.role = Some(agent.to_owned());
    e.key = Digest::of(format!("{agent} {seq}").as_bytes());
    e.causal_parent = Some(seq.saturating_sub(1));
    match kind {
        EventType::ModelCall => {
            e.name = Some("/v1/chat/completions".into());
            e.model = Some(ModelRef { provider: "openai".into(), name: "gpt-4o".into(), snapshot: None });
            e.usage = Some(Usage {
                input_tokens: 1200,
                output_tokens: 80,
                cost_usd: Some(0.0042),
                ..Default::default()
            });
            e.latency_ms = Some(900);
        }
        EventType::ToolCall => {
            e.name = Some("sql.query".into());
            e.tool = Some(ToolRef {
                name: "sql.query".into(),
                version: "2".into(),
                class: ToolClass::Deterministic,
                ttl_s: None,
            });
        }
        _ => {
            let peer = AGENTS[((seq + 1) % 4) as usize];
            e.name = Some(peer.to_owned());
            let (from, to) = if kind == EventType::Send { (agent, peer) } else { (peer, agent) };
            e.message = Some(MessageRef {
                from: Some(from.into()),
                to: Some(to.into()),
                kind: Some("note".into()),
                timed_out: false,
            });
        }
    }
    if matches!(kind, EventType::ModelCall | EventType::ToolCall) {
        e.output_hash = Some(Digest::of(output.as_bytes()));
        e.output_ref = e.output_hash;
        e.request_ref = Some(Digest::of(format!("request {seq}").as_bytes()));
    }
    e
}

/// Commits `events` (and `blobs`) to `meta`'s new run in batches of 4096.
fn commit(store: &SqliteStore, meta: &RunMeta, events: Vec<Event>, blobs: Vec<BlobPut>) {
    store.create_run(meta).unwrap();
    for chunk in events.chunks(4096) {
        store.commit(&Batch { run_id: meta.id.clone(), events: chunk.to_vec(), ..Batch::default() }).unwrap();
    }
    store.commit(&Batch { run_id: meta.id.clone(), blobs, ..Batch::default() }).unwrap();
}

/// The store: `src`, `fork` (a fork of `src` at 2) and `other` (an unrelated recording).
fn setup() -> SqliteStore {
    let store = SqliteStore::temporary().unwrap();
    let changed: Vec<u64> = (1..=20).map(|i| i * 4_096 + 1).collect();
    let output = |seq: u64, changed_here: bool| match changed_here {
        true => format!("{{\"out\": \"changed {seq}\"}}"),
        false => format!("{{\"out\": \"step {seq}\"}}"),
    };
    let mut blobs = Vec::new();
    let source: Vec<Event> = (1..=N).map(|s| event("src", s, &output(s, false))).collect();
    for &s in &changed {
        blobs.push(BlobPut::new(output(s, false).into_bytes(), BlobHint::Raw));
        blobs.push(BlobPut::new(output(s, true).into_bytes(), BlobHint::Raw));
    }
    let mut fork = RunMeta::new("fork", RunMode::Fork, 2);
    (fork.source_run, fork.fork_at) = (Some("src".into()), Some(2));
    let own: Vec<Event> = (2..=N)
        .map(|s| {
            let mut e = event("fork", s, &output(s, changed.contains(&s)));
            e.origin_seq = Some(s);
            e.source = if changed.contains(&s) { Source::Live } else { Source::Recorded };
            e
        })
        .collect();
    let other: Vec<Event> = (1..=N).map(|s| event("other", s, &output(s, changed.contains(&s)))).collect();
    commit(&store, &RunMeta::new("src", RunMode::Record, 1), source, blobs);
    commit(&store, &fork, own, Vec::new());
    commit(&store, &RunMeta::new("other", RunMode::Record, 3), other, Vec::new());
    store
}

fn bench(c: &mut Criterion) {
    let store = setup();
    let options = DiffOptions::default();
    let mut group = c.benchmark_group("diff_100k");
    group.sample_size(10);
    group.bench_function("floor_read_both_runs", |b| {
        b.iter(|| {
            let mut count = 0;
            for run in ["src", "other"] {
                let mut pages = RunEvents::new(&store, run).unwrap();
                while let Some(page) = pages.next_page().unwrap() {
                    count += page.len();
                }
            }
            assert_eq!(count as u64, 2 * N);
        })
    });
    group.bench_function("fork_by_origin_seq", |b| {
        b.iter(|| {
            let diff = diff_runs(&store, "src", "fork", &options).unwrap();
            assert_eq!(diff.counts.changed, diff.changed.len() as u64);
        })
    });
    group.bench_function("unrelated_by_pairing", |b| {
        b.iter(|| {
            let diff = diff_runs(&store, "src", "other", &options).unwrap();
            assert_eq!(diff.counts.changed, diff.changed.len() as u64);
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
