//! Properties of every recording: Lamport order consistent with happened-before, dense seqs.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use retrace_core::{Event, EventType};
use retrace_runtime::{Agent, Outcome, RuntimeResult, Session, SessionOptions, ToolSpec};
use retrace_store::memory::MemoryStore;
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Durability, Store};
use serde_json::json;

use crate::program::{record_stress, Plan};
use crate::{agent_name, all_events, mix, panic_again};

/// Local Lamport and seq rules: seqs dense; per agent, lamports strictly increase in seq order;
/// a delivery comes after its send (seq and lamport) and names a send to its agent; every causal
/// parent is an earlier event. By induction these give the global property checked below.
fn check_lamport_rules(events: &[Event], what: &str) {
    let mut last: HashMap<&str, u64> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "{what}: seqs are dense and unique");
        if let Some(&prev) = last.get(e.agent_id.as_str()) {
            assert!(e.lamport > prev, "{what}: {}'s lamport must increase at seq {}", e.agent_id, e.seq);
        }
        last.insert(&e.agent_id, e.lamport);
        if let Some(parent) = e.causal_parent {
            assert!(parent < e.seq, "{what}: seq {}'s causal parent {parent} is not earlier", e.seq);
        }
        if e.kind == EventType::Deliver && !e.message.as_ref().unwrap().timed_out {
            let send = &events[e.causal_parent.expect("a delivery names its send") as usize - 1];
            assert_eq!(send.kind, EventType::Send, "{what}: seq {} delivers a send", e.seq);
            assert_eq!(send.name.as_deref(), Some(e.agent_id.as_str()), "{what}: the send was to this agent");
            assert!(e.lamport > send.lamport, "{what}: lamport of deliver {} after its send", e.seq);
        }
    }
}

/// Happened-before by graph walk: a → b when b is the next event of a's agent, or a is the send
/// that b delivers; transitively. Every such pair must have L(a) < L(b) and seq(a) < seq(b).
fn check_happened_before(events: &[Event], what: &str) -> usize {
    let n = events.len();
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if let Some(prev) = last.insert(&e.agent_id, i) {
            edges[prev].push(i);
        }
        if e.kind == EventType::Deliver && !e.message.as_ref().unwrap().timed_out {
            edges[e.causal_parent.unwrap() as usize - 1].push(i);
        }
    }
    let mut pairs = 0;
    for a in 0..n {
        let mut seen = vec![false; n];
        let mut stack = edges[a].clone();
        while let Some(b) = stack.pop() {
            if std::mem::replace(&mut seen[b], true) {
                continue;
            }
            pairs += 1;
            let (ea, eb) = (&events[a], &events[b]);
            assert!(
                ea.lamport < eb.lamport,
                "{what}: seq {} happened before seq {} but L {} >= L {}",
                ea.seq,
                eb.seq,
                ea.lamport,
                eb.lamport
            );
            assert!(ea.seq < eb.seq, "{what}: seq {} happened before seq {} but comes later", ea.seq, eb.seq);
            stack.extend(&edges[b]);
        }
    }
    pairs
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn lamport_order_is_consistent_with_happened_before(
        seed in any::<u64>(),
        agents in 2usize..=6,
        hops in 0u64..=3,
        fanout in 1usize..=3,
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let plan = Arc::new(Plan::new(seed, agents, hops, fanout));
        let rec = rt.block_on(record_stress(&store, &plan, seed, seed % 2 == 1));
        let what = format!("seed {seed}, {agents} agents, {hops} hops");
        check_lamport_rules(&rec.events, &what);
        let pairs = check_happened_before(&rec.events, &what);
        prop_assert!(pairs > 0);
    }
}

const CONCURRENT_AGENTS: usize = 16;
/// Agents 0..4 run on plain threads through the blocking API.
const ON_THREADS: usize = 4;
const ROUNDS: usize = 40;

/// Agent `me` sends round `round`'s message here; so each agent receives `ROUNDS` messages.
fn concurrent_target(me: usize, round: usize) -> usize {
    (me + 1 + round % (CONCURRENT_AGENTS - 1)) % CONCURRENT_AGENTS
}

/// One agent of the concurrency program, through the async API (the thread agents take the
/// same steps through the blocking API, see [`concurrent_thread`]). Counts its steps.
async fn concurrent_agent(a: Agent, me: usize, steps: Arc<AtomicUsize>) -> RuntimeResult<()> {
    let on_thread = me < ON_THREADS;
    let mut got = 0;
    for round in 0..ROUNDS {
        let args = json!({ "me": me, "round": round });
        let _: u64 = a
            .tool_async("work", &args, ToolSpec::deterministic("1"), || async move {
                Ok::<_, String>(mix((me * 1000 + round) as u64))
            })
            .await?;
        a.send(&agent_name(concurrent_target(me, round)), "m", &json!({ "round": round }), None).await?;
        if on_thread {
            a.now_ms()?;
        } else {
            a.random_u64()?;
        }
        steps.fetch_add(3, Ordering::Relaxed);
        if !on_thread && round % 3 == 2 {
            got += usize::from(a.recv(Some(Duration::ZERO)).await?.is_some());
            steps.fetch_add(1, Ordering::Relaxed);
        }
    }
    while got < ROUNDS {
        got += usize::from(a.recv(Some(Duration::from_secs(10))).await?.is_some());
        steps.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// [`concurrent_agent`] on a plain thread, through the blocking API.
fn concurrent_thread(a: Agent, me: usize, steps: Arc<AtomicUsize>) -> RuntimeResult<()> {
    let mut got = 0;
    for round in 0..ROUNDS {
        let args = json!({ "me": me, "round": round });
        let _: u64 = a.tool("work", &args, ToolSpec::deterministic("1"), || {
            Ok::<_, String>(mix((me * 1000 + round) as u64))
        })?;
        a.send_blocking(&agent_name(concurrent_target(me, round)), "m", &json!({ "round": round }), None)?;
        a.now_ms()?;
        steps.fetch_add(3, Ordering::Relaxed);
    }
    while got < ROUNDS {
        got += usize::from(a.recv_blocking(Some(Duration::from_secs(10)))?.is_some());
        steps.fetch_add(1, Ordering::Relaxed);
    }
    a.exit();
    Ok(())
}

/// Sixteen agents stepping at once on a multi-thread runtime (twelve tokio tasks, four plain
/// threads): seqs are dense and unique, one per step taken, the hash chain is sound, the
/// Lamport rules hold, and the run replays (every agent through the async API).
fn seqs_under_concurrency(store: Arc<dyn Store>, wait_for_ack: bool) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let options = SessionOptions {
        wait_for_ack,
        chaos_seed: Some(3),
        chaos_max_delay: Duration::from_millis(1),
        ..Default::default()
    };
    let s = Session::record(store.clone(), options).unwrap();
    let steps = Arc::new(AtomicUsize::new(0));
    rt.block_on(async {
        let tasks: Vec<_> = (ON_THREADS..CONCURRENT_AGENTS)
            .map(|me| {
                let steps = steps.clone();
                s.spawn(&agent_name(me), move |a| concurrent_agent(a, me, steps))
            })
            .collect();
        let threads: Vec<_> = (0..ON_THREADS)
            .map(|me| {
                let (a, steps) = (s.agent(&agent_name(me)), steps.clone());
                std::thread::spawn(move || concurrent_thread(a, me, steps))
            })
            .collect();
        for t in tasks {
            t.await.unwrap_or_else(|e| panic_again(e)).unwrap();
        }
        for t in threads {
            t.join().unwrap().unwrap();
        }
    });
    let report = s.finish(Outcome::default()).unwrap();
    let events = all_events(store.as_ref(), &report.run_id);
    let what = format!("{} (wait_for_ack {wait_for_ack})", store.backend());
    assert_eq!(events.len(), steps.load(Ordering::Relaxed), "{what}: one event per step");
    check_lamport_rules(&events, &what);
    let problems = retrace_store::verify::verify_run(store.as_ref(), &report.run_id);
    assert!(problems.is_empty(), "{what}: {problems:?}");

    let r = Session::replay(store.clone(), &report.run_id, SessionOptions::default()).unwrap();
    rt.block_on(async {
        let tasks: Vec<_> = (0..CONCURRENT_AGENTS)
            .map(|me| r.spawn(&agent_name(me), move |a| concurrent_agent(a, me, Arc::default())))
            .collect();
        for t in tasks {
            t.await.unwrap_or_else(|e| panic_again(e)).unwrap();
        }
    });
    let replayed = r.finish(Outcome::default()).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(replayed.live_calls, 0);
}

#[test]
fn seqs_are_dense_and_unique_under_concurrency() {
    seqs_under_concurrency(Arc::new(MemoryStore::new()), false);
    seqs_under_concurrency(Arc::new(MemoryStore::new()), true);
    let dir = tempfile::tempdir().unwrap();
    let sqlite =
        SqliteStore::open(&dir.path().join("retrace.db"), &dir.path().join("blobs"), Durability::Os, 5_000)
            .unwrap();
    seqs_under_concurrency(Arc::new(sqlite), false);
}
