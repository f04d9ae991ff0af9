//! Garbage collection as a property, on SQLite (real files in a tempdir) and in memory: random
//! recordings, forks at random points, forks of forks, replays, tiers, ages and running runs,
//! sharing blobs at random (model requests among them, so chained manifests dedupe across
//! runs). After `gc`:
//! - no incident or pinned run, no running run, no source of a remaining fork or running
//!   replay is gone, and every remaining run reads whole (inherited events included) with every
//!   blob it references;
//! - no blob stored since the oldest running recording began is gone (those it shares with old
//!   runs, deduped onto existing rows, included; and those it stored before referencing them);
//! - everything that nothing keeps is gone: each remaining run has a reason to remain, and every
//!   blob from before the running recordings that no remaining run references was swept.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use proptest::prelude::*;
use retrace_core::run::{Retention, RunMeta, RunMode, RunStatus};
use retrace_core::{Digest, Event, EventType};
use retrace_store::export::RunEvents;
use retrace_store::gc::{collect, GcConfig, DAY_MS};
use retrace_store::memory::MemoryStore;
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Batch, BlobHint, BlobPut, Durability, Store};

const ROUTINE_DAYS: u64 = 30;

/// One generated run, before its source is resolved.
#[derive(Clone, Debug)]
struct Spec {
    /// 0: record, 1: fork, 2: replay (forks and replays fall back to record without a source).
    kind: u8,
    source: usize,
    fork_at: usize,
    tier: Retention,
    age_days: u64,
    running: bool,
    /// Which pool blobs its events output, in order (one event each).
    outputs: Vec<usize>,
    /// Whose conversation its model requests continue (shared topics dedupe across runs).
    topic: u8,
}

fn spec() -> impl Strategy<Value = Spec> {
    let tier = prop_oneof![4 => Just(Retention::Routine), 1 => Just(Retention::Incident), 1 => Just(Retention::Pinned)];
    (
        0u8..3,
        any::<usize>(),
        any::<usize>(),
        tier,
        0u64..60,
        prop::bool::weighted(0.15),
        prop::collection::vec(0usize..10, 1..5),
        0u8..3,
    )
        .prop_map(|(kind, source, fork_at, tier, age_days, running, outputs, topic)| Spec {
            kind,
            source,
            fork_at,
            tier,
            age_days,
            running,
            outputs,
            topic,
        })
}

/// The shared blob pool: small, packed and one over the inline limit.
fn pool(i: usize) -> BlobPut {
    let bytes = match i {
        0 => vec![b'L'; retrace_store::INLINE_BLOB_MAX + 100],
        1..=4 => format!("tiny {i}").into_bytes(),
        _ => vec![b'a' + i as u8; 200 + i * 50],
    };
    BlobPut::new(bytes, BlobHint::Raw)
}

/// The request of turn `n` of conversation `topic`: its first `n + 1` messages.
fn request(topic: u8, n: usize) -> BlobPut {
    let messages: Vec<String> = (0..=n)
        .map(|i| format!("{{\"role\":\"user\",\"content\":\"topic {topic} turn {i} {}\"}}", "m".repeat(90)))
        .collect();
    BlobPut::new(format!("{{\"messages\":[{}]}}", messages.join(",")).into_bytes(), BlobHint::ModelRequest)
}

/// What the test built: every run, and which blobs were stored before the running ones began.
struct World {
    runs: Vec<RunMeta>,
    /// Digests each run's own events reference.
    refs: HashMap<String, Vec<Digest>>,
    old_blobs: HashSet<Digest>,
    /// Every digest stored when gc starts (of those the test knows: pool and run references).
    stored: HashSet<Digest>,
    /// The pool's digests.
    pool: HashSet<Digest>,
    pending: Vec<Digest>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

fn build(store: &dyn Store, specs: &[Spec]) -> World {
    let mut world = World {
        runs: Vec::new(),
        refs: HashMap::new(),
        old_blobs: HashSet::new(),
        stored: HashSet::new(),
        pool: pool_digests().into_iter().collect(),
        pending: Vec::new(),
    };
    let mut last_seq: HashMap<String, u64> = HashMap::new();
    let phase_one: Vec<&Spec> = specs.iter().filter(|s| !s.running).collect();
    let phase_two: Vec<&Spec> = specs.iter().filter(|s| s.running).collect();
    let now = now_ms();
    for spec in &phase_one {
        add_run(store, &mut world, &mut last_seq, spec, now - spec.age_days * DAY_MS);
    }
    std::thread::sleep(std::time::Duration::from_millis(3));
    let split = now_ms();
    for digest in pool_digests().into_iter().chain(world.refs.values().flatten().copied()) {
        if store.has_blob(&digest).unwrap() {
            world.old_blobs.insert(digest);
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(3));
    for spec in &phase_two {
        // A recording stores a blob before the event that will reference it.
        let pending = format!("pending of run {}", world.runs.len()).into_bytes();
        world.pending.push(store.put_blob(&pending, BlobHint::Raw).unwrap());
        add_run(store, &mut world, &mut last_seq, spec, split);
    }
    for digest in pool_digests().into_iter().chain(world.refs.values().flatten().copied()) {
        if store.has_blob(&digest).unwrap() {
            world.stored.insert(digest);
        }
    }
    world
}

fn pool_digests() -> Vec<Digest> {
    (0..10).map(|i| pool(i).digest()).collect()
}

fn add_run(
    store: &dyn Store,
    world: &mut World,
    last_seq: &mut HashMap<String, u64>,
    spec: &Spec,
    started: u64,
) {
    let id = format!("run{:02}", world.runs.len());
    let sources: Vec<&RunMeta> =
        world.runs.iter().filter(|r| r.mode != RunMode::Replay && r.status != RunStatus::Running).collect();
    let source = (!sources.is_empty() && spec.kind > 0).then(|| sources[spec.source % sources.len()]);
    let mut meta = RunMeta::new(&id, RunMode::Record, started);
    meta.status = if spec.running { RunStatus::Running } else { RunStatus::Ok };
    meta.retention = spec.tier;
    let mut first = 1;
    match source {
        Some(src) if spec.kind == 1 => {
            meta.mode = RunMode::Fork;
            meta.source_run = Some(src.id.clone());
            first = 2 + (spec.fork_at as u64 % last_seq[&src.id]);
            meta.fork_at = Some(first);
        }
        Some(src) => {
            meta.mode = RunMode::Replay;
            meta.source_run = Some(src.id.clone());
        }
        None => {}
    }
    store.create_run(&meta).unwrap();
    let mut refs = Vec::new();
    if meta.mode != RunMode::Replay {
        let mut events = Vec::new();
        let mut blobs = Vec::new();
        let mut prev = None;
        for (i, blob) in spec.outputs.iter().enumerate() {
            let seq = first + i as u64;
            let output = pool(*blob);
            let mut e = Event::new(&id, "a0", EventType::ModelCall);
            (e.seq, e.lamport, e.key) = (seq, seq, Digest::of(format!("{id} {seq}").as_bytes()));
            e.output_ref = Some(output.digest());
            if i % 2 == 0 {
                let req = request(spec.topic, (seq as usize) / 2);
                e.request_ref = Some(req.digest());
                blobs.push(req);
            }
            e.seal(prev).unwrap();
            prev = Some(e.hash);
            refs.extend(e.request_ref.iter().chain(&e.output_ref).copied());
            blobs.push(output);
            events.push(e);
        }
        last_seq.insert(id.clone(), first + events.len() as u64 - 1);
        store.commit(&Batch { run_id: id.clone(), events, blobs, cache: Vec::new() }).unwrap();
    }
    world.refs.insert(id, refs);
    world.runs.push(meta);
}

/// Runs `specs` on `store` through gc and checks every property.
fn check(store: &dyn Store, specs: &[Spec]) -> Result<(), TestCaseError> {
    let world = build(store, specs);
    std::thread::sleep(std::time::Duration::from_millis(2));
    let mut config = GcConfig::new(now_ms(), ROUTINE_DAYS);
    config.blob_grace_ms = 0;
    config.dry_run = true;
    let planned = collect(store, &config).unwrap();
    let before: Vec<String> = store.runs().unwrap().into_iter().map(|r| r.id).collect();
    prop_assert_eq!(before.len(), world.runs.len(), "a dry run deletes nothing");
    config.dry_run = false;
    let report = collect(store, &config).unwrap();
    prop_assert_eq!(&report.runs_deleted, &planned.runs_deleted, "the dry run reported what gc did");
    prop_assert_eq!((report.blobs_deleted, report.bytes_freed), (planned.blobs_deleted, planned.bytes_freed));

    let remaining: HashMap<String, RunMeta> =
        store.runs().unwrap().into_iter().map(|r| (r.id.clone(), r)).collect();
    let running = world.runs.iter().any(|r| r.status == RunStatus::Running);
    for run in &world.runs {
        let stays = remaining.contains_key(&run.id);
        let tier_keeps = run.mode != RunMode::Replay && run.retention != Retention::Routine;
        prop_assert!(stays || !(tier_keeps || run.status == RunStatus::Running), "{} is gone", run.id);
        let keeps_source = run.mode != RunMode::Replay || run.status == RunStatus::Running;
        if let (true, true, Some(source)) = (stays, keeps_source, &run.source_run) {
            prop_assert!(remaining.contains_key(source), "{} stays but its source {source} is gone", run.id);
        }
        if !stays {
            continue;
        }
        // Something keeps it.
        let young = now_ms() - run.started_at_ms <= ROUTINE_DAYS * DAY_MS;
        let own = run.status == RunStatus::Running || (run.mode != RunMode::Replay && (tier_keeps || young));
        let kept_by_fork = remaining.values().any(|r| {
            r.source_run.as_deref() == Some(&run.id)
                && (r.mode != RunMode::Replay || r.status == RunStatus::Running)
        });
        let with_source =
            run.mode == RunMode::Replay && run.source_run.as_ref().is_some_and(|s| remaining.contains_key(s));
        prop_assert!(own || kept_by_fork || with_source, "{} stays though nothing keeps it", run.id);
        // It reads whole, inherited events and their blobs included.
        if run.mode != RunMode::Replay {
            let mut pages = RunEvents::new(store, &run.id).unwrap();
            while let Some(page) = pages.next_page().unwrap() {
                for e in page {
                    for d in e.request_ref.iter().chain(&e.output_ref) {
                        prop_assert!(store.get_blob(d).is_ok(), "{} seq {} lost blob {d}", run.id, e.seq);
                    }
                }
            }
        }
    }
    let referenced: HashSet<Digest> =
        remaining.keys().flat_map(|id| world.refs[id].iter().copied()).collect();
    for digest in &world.pending {
        prop_assert!(store.has_blob(digest).unwrap(), "pending blob {digest} of a running recording is gone");
    }
    for digest in &world.stored {
        let held = store.has_blob(digest).unwrap();
        if referenced.contains(digest) {
            prop_assert!(held, "blob {digest}, referenced by a remaining run, is gone");
        } else if !world.old_blobs.contains(digest) {
            prop_assert!(held, "blob {digest}, stored since the running recordings began, is gone");
        } else if store.backend() == "memory" || world.pool.contains(digest) {
            // Old and unreferenced: swept. (In SQLite a model request may live on as the base
            // of a kept request's chained manifest; every kept request reading back is checked
            // above.)
            prop_assert!(!held, "unreferenced old blob {digest} survived (running recordings: {running})");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn gc_keeps_what_is_kept_and_sweeps_the_rest_in_memory(specs in prop::collection::vec(spec(), 1..12)) {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        check(&*store, &specs)?;
    }

    #[test]
    fn gc_keeps_what_is_kept_and_sweeps_the_rest_in_sqlite(specs in prop::collection::vec(spec(), 1..12)) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("retrace.db"), &dir.path().join("blobs"), Durability::Os, 5_000).unwrap();
        check(&store, &specs)?;
    }
}
