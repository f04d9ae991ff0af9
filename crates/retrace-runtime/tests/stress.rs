//! Proofs of the multi-agent runtime (SPEC §7) under stress: sixteen and more agents as tokio
//! tasks with seeded random delays, fan-in and fan-out messaging, recv timeouts, and tool steps
//! whose arguments depend on what each agent heard, recorded under hundreds of chaos seeds and
//! replayed under different OS scheduling. What every replay must show:
//!
//! - each agent takes the same steps (types and keys) in the same order, and hears the same
//!   messages (sender, send seq, body) in the same order; nothing runs live;
//! - strict replay releases recorded seqs in exactly the recorded global order;
//! - agents that also wait on each other outside Retrace (a lock, a bounded channel) never
//!   deadlock in default mode;
//! - a divergence is reported at the first divergent step and releases every other agent.
//!
//! And of every recording: seqs are dense and unique under concurrency, and Lamport clocks are
//! consistent with happened-before (same agent, send → deliver, transitively).
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retrace_core::{Digest, Divergence, DivergenceCode, Event, EventType};
use retrace_runtime::{Agent, Outcome, RuntimeResult, Session, SessionOptions, ToolSpec};
use retrace_store::memory::MemoryStore;
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Durability, Store};
use serde_json::{json, Value};
use tokio::task::JoinSet;

/// Guard against hangs: no single record or replay of these programs takes anywhere near this.
const RUN_LIMIT: Duration = Duration::from_secs(20);

fn agent_name(i: usize) -> String {
    format!("a{i:02}")
}

/// splitmix64: what the "live" tools compute.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A seeded scheduling perturbation: nothing, a yield, or a sleep of 0–2 ms.
async fn jitter(rng: &mut StdRng) {
    match rng.gen_range(0..4) {
        0 => {}
        1 => tokio::task::yield_now().await,
        _ => tokio::time::sleep(Duration::from_micros(rng.gen_range(0..=2_000))).await,
    }
}

fn panic_again(e: tokio::task::JoinError) -> ! {
    match e.try_into_panic() {
        Ok(payload) => std::panic::resume_unwind(payload),
        Err(e) => panic!("task failed: {e}"),
    }
}

/// Reads a run's events, page by page.
fn all_events(store: &dyn Store, run: &str) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    loop {
        let page = store.events(run, out.len() as u64 + 1, 4096).unwrap();
        let done = page.len() < 4096;
        out.extend(page);
        if done {
            return out;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The stress program.
// ---------------------------------------------------------------------------------------------

/// Who talks to whom. Each agent fans out a first message to a few others; a receiver forwards
/// every message of hop < `hops` to a target that depends only on (receiver, sender, hop). So
/// the multiset of messages, and how many each agent receives, are fixed by the plan while the
/// order they arrive in is not — and every body and tool argument depends on that order.
#[derive(Debug)]
struct Plan {
    agents: usize,
    fanout: Vec<Vec<usize>>,
    hops: u64,
    salt: usize,
    expected: Vec<usize>,
}

impl Plan {
    fn new(seed: u64, agents: usize, hops: u64, max_fanout: usize) -> Plan {
        let mut rng = StdRng::seed_from_u64(mix(seed));
        let fanout: Vec<Vec<usize>> = (0..agents)
            .map(|me| {
                let k = rng.gen_range(1..=max_fanout.min(agents - 1));
                let mut targets: Vec<usize> = Vec::new();
                while targets.len() < k {
                    let t = rng.gen_range(0..agents);
                    if t != me && !targets.contains(&t) {
                        targets.push(t);
                    }
                }
                targets
            })
            .collect();
        let mut plan = Plan { agents, fanout, hops, salt: rng.gen_range(0..agents), expected: vec![] };
        let mut expected = vec![0; agents];
        let mut queue: Vec<(usize, usize, u64)> =
            (0..agents).flat_map(|me| plan.fanout[me].iter().map(move |&t| (t, me, 0))).collect();
        while let Some((to, from, hop)) = queue.pop() {
            expected[to] += 1;
            if hop < plan.hops {
                queue.push((plan.forward_to(to, from, hop), to, hop + 1));
            }
        }
        plan.expected = expected;
        plan
    }

    fn forward_to(&self, me: usize, from: usize, hop: u64) -> usize {
        let t = (me * 7 + from * 3 + hop as usize * 5 + self.salt) % self.agents;
        if t == me {
            (me + 1) % self.agents
        } else {
            t
        }
    }
}

/// Makes one agent of the stress program ask for different tool arguments at its `digest`-th
/// digest step (replay only: a deliberate divergence).
#[derive(Clone, Copy, Debug)]
struct Tamper {
    agent: usize,
    digest: usize,
}

/// One agent of the stress program; returns everything it observed, in order.
async fn stress_agent(
    a: Agent,
    plan: Arc<Plan>,
    me: usize,
    jitter_seed: u64,
    live: Arc<AtomicUsize>,
    tamper: Option<Tamper>,
) -> RuntimeResult<Vec<Value>> {
    let mut rng = StdRng::seed_from_u64(jitter_seed);
    let mut seen = Vec::new();
    jitter(&mut rng).await;
    let r = a.random_u64()?;
    seen.push(json!(["random", r]));
    let live_init = live.clone();
    let mut acc: u64 = a
        .tool_async(
            "init",
            &json!({ "me": me, "r": r % 1000 }),
            ToolSpec::deterministic("1"),
            || async move {
                live_init.fetch_add(1, Ordering::Relaxed);
                Ok::<_, String>(mix(r ^ me as u64))
            },
        )
        .await?;
    seen.push(json!(["init", acc]));
    for &t in &plan.fanout[me] {
        jitter(&mut rng).await;
        let seq = a.send(&agent_name(t), "hello", &json!({ "hop": 0, "acc": acc }), None).await?;
        seen.push(json!(["send", t, seq]));
    }
    let (mut got, mut misses) = (0, 0);
    while got < plan.expected[me] {
        jitter(&mut rng).await;
        // Short timeouts, but at most two in a row per message: the program always ends.
        let timeout = if misses < 2 { Duration::from_millis(1) } else { Duration::from_secs(10) };
        let Some(m) = a.recv(Some(timeout)).await? else {
            misses += 1;
            let now = a.now_ms()?;
            seen.push(json!(["timeout", now]));
            continue;
        };
        misses = 0;
        seen.push(json!(["recv", m.sender, m.seq, m.kind, m.body]));
        let hop = m.body["hop"].as_u64().expect("hop");
        let from: usize = m.sender[1..].parse().expect("agent index");
        let tampered = tamper.is_some_and(|t| t.agent == me && t.digest == got);
        let args = json!({
            "me": me,
            "from": from,
            "hop": hop,
            "theirs": m.body["acc"],
            "acc": acc,
            "got": got + usize::from(tampered),
        });
        let live_digest = live.clone();
        let theirs = m.body["acc"].as_u64().expect("acc");
        acc = if got % 2 == 0 {
            a.tool_async("digest", &args, ToolSpec::deterministic("1"), || async move {
                live_digest.fetch_add(1, Ordering::Relaxed);
                Ok::<_, String>(mix(acc ^ theirs.rotate_left(17) ^ hop))
            })
            .await?
        } else {
            // The blocking form from an async task: default replay answers it at once.
            a.tool("digest", &args, ToolSpec::deterministic("1"), || {
                live_digest.fetch_add(1, Ordering::Relaxed);
                Ok::<_, String>(mix(acc ^ theirs.rotate_left(17) ^ hop))
            })?
        };
        seen.push(json!(["digest", acc]));
        got += 1;
        if hop < plan.hops {
            jitter(&mut rng).await;
            let to = plan.forward_to(me, from, hop);
            let seq = a.send(&agent_name(to), "fwd", &json!({ "hop": hop + 1, "acc": acc }), None).await?;
            seen.push(json!(["send", to, seq]));
        }
    }
    a.decide("done", Some(&format!("{acc:016x}")))?;
    seen.push(json!(["decide", acc]));
    Ok(seen)
}

/// Runs the stress program in `s`: every agent as a tokio task. Returns each agent's result.
async fn run_stress(
    s: &Session,
    plan: &Arc<Plan>,
    jitter_salt: u64,
    live: &Arc<AtomicUsize>,
    tamper: Option<Tamper>,
) -> Vec<RuntimeResult<Vec<Value>>> {
    let handles: Vec<_> = (0..plan.agents)
        .map(|me| {
            let (plan, live) = (plan.clone(), live.clone());
            let jitter_seed = mix(jitter_salt ^ (me as u64).wrapping_mul(0x1234_5678_9abc));
            s.spawn(&agent_name(me), move |a| stress_agent(a, plan, me, jitter_seed, live, tamper))
        })
        .collect();
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await.unwrap_or_else(|e| panic_again(e)));
    }
    results
}

/// A recorded run of the stress program.
struct Recording {
    seed: u64,
    run: String,
    events: Vec<Event>,
    seen: Vec<Vec<Value>>,
}

async fn record_stress(store: &Arc<dyn Store>, plan: &Arc<Plan>, seed: u64, wait_for_ack: bool) -> Recording {
    let options = SessionOptions {
        chaos_seed: Some(seed),
        chaos_max_delay: Duration::from_millis(seed % 4),
        wait_for_ack,
        ..Default::default()
    };
    let s = Session::record(store.clone(), options).unwrap();
    let live = Arc::new(AtomicUsize::new(0));
    let results = tokio::time::timeout(RUN_LIMIT, run_stress(&s, plan, seed, &live, None))
        .await
        .unwrap_or_else(|_| panic!("seed {seed}: record did not finish in {RUN_LIMIT:?}"));
    let seen: Vec<Vec<Value>> = results
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|e| panic!("seed {seed}: agent {i} failed in record: {e}")))
        .collect();
    let report = s.finish(Outcome { exit_status: Some(0) }).unwrap();
    let events = all_events(store.as_ref(), &report.run_id);
    let tools = events.iter().filter(|e| e.kind == EventType::ToolCall).count();
    assert_eq!(live.load(Ordering::Relaxed), tools, "seed {seed}: every tool ran live once");
    let rec = Recording { seed, run: report.run_id, events, seen };
    check_recording(&rec, plan);
    rec
}

/// What each agent heard, in order: (sender, send seq, body), or None for a timeout.
fn heard(seen: &[Value]) -> Vec<Option<(String, u64, Value)>> {
    seen.iter()
        .filter_map(|o| match o[0].as_str() {
            Some("recv") => {
                Some(Some((o[1].as_str().unwrap().to_owned(), o[2].as_u64().unwrap(), o[4].clone())))
            }
            Some("timeout") => Some(None),
            _ => None,
        })
        .collect()
}

/// The recording agrees with what the program saw: dense seqs, each agent's deliver events are
/// what its recv returned, and every message's body is its send's.
fn check_recording(rec: &Recording, plan: &Plan) {
    let seed = rec.seed;
    for (i, e) in rec.events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "seed {seed}: seqs are dense and unique");
    }
    for me in 0..plan.agents {
        let name = agent_name(me);
        let recorded: Vec<Option<(String, u64)>> = rec
            .events
            .iter()
            .filter(|e| e.kind == EventType::Deliver && e.agent_id == name)
            .map(|e| {
                let m = e.message.as_ref().unwrap();
                (!m.timed_out).then(|| (m.from.clone().unwrap(), e.causal_parent.unwrap()))
            })
            .collect();
        let observed: Vec<Option<(String, u64)>> =
            heard(&rec.seen[me]).into_iter().map(|h| h.map(|(from, seq, _)| (from, seq))).collect();
        assert_eq!(recorded, observed, "seed {seed}: {name}'s deliver events are what its recv returned");
        assert_eq!(
            observed.iter().flatten().count(),
            plan.expected[me],
            "seed {seed}: {name} heard its plan"
        );
    }
}

/// Replays `rec` with its own scheduling perturbation and checks everything §7 promises.
async fn replay_stress(
    store: &Arc<dyn Store>,
    plan: &Arc<Plan>,
    rec: &Recording,
    jitter_salt: u64,
    strict: bool,
) {
    let seed = rec.seed;
    let options = SessionOptions { strict, stall_timeout: Duration::from_secs(15), ..Default::default() };
    let r = Session::replay(store.clone(), &rec.run, options).unwrap();
    let live = Arc::new(AtomicUsize::new(0));
    let results = tokio::time::timeout(RUN_LIMIT, run_stress(&r, plan, jitter_salt, &live, None))
        .await
        .unwrap_or_else(|_| panic!("seed {seed} (strict {strict}): replay did not finish in {RUN_LIMIT:?}"));
    for (me, result) in results.into_iter().enumerate() {
        let seen = result
            .unwrap_or_else(|e| panic!("seed {seed} (strict {strict}): agent {me} failed in replay: {e}"));
        // (b) the same messages in the same order, per receiver.
        assert_eq!(
            heard(&seen),
            heard(&rec.seen[me]),
            "seed {seed} (strict {strict}): a{me:02}'s delivery order"
        );
        // Everything else it observed: tool outputs, random, clock, send seqs.
        assert_eq!(seen, rec.seen[me], "seed {seed} (strict {strict}): a{me:02}'s observations");
    }
    // (c) ok, nothing live.
    let report = r
        .finish(Outcome { exit_status: Some(0) })
        .unwrap_or_else(|e| panic!("seed {seed} (strict {strict}): replay did not finish ok: {e}"));
    assert_eq!(report.live_calls, 0, "seed {seed}: replay makes no live call");
    assert_eq!(live.load(Ordering::Relaxed), 0, "seed {seed}: replay runs no live function");
    // (a) each agent consumed its recorded steps, same types and keys, in recorded order.
    let trace = r.replay_trace();
    check_per_agent_steps(&rec.events, &trace, &format!("seed {seed} (strict {strict})"));
    if strict {
        let n = rec.events.len() as u64;
        assert_eq!(trace, (1..=n).collect::<Vec<_>>(), "seed {seed}: strict replay keeps the global order");
    }
}

/// Per agent, the (type, key) of the steps replay consumed, in the order it consumed them, are
/// the recorded ones in seq order; and every recorded seq is consumed once.
fn check_per_agent_steps(events: &[Event], trace: &[u64], what: &str) {
    let mut sorted = trace.to_vec();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (1..=events.len() as u64).collect::<Vec<_>>(),
        "{what}: every recorded seq consumed once"
    );
    type Steps = BTreeMap<String, Vec<(u64, EventType, Digest)>>;
    let mut recorded: Steps = BTreeMap::new();
    for e in events {
        recorded.entry(e.agent_id.clone()).or_default().push((e.seq, e.kind, e.key));
    }
    let mut replayed: Steps = BTreeMap::new();
    for &seq in trace {
        let e = &events[seq as usize - 1];
        replayed.entry(e.agent_id.clone()).or_default().push((e.seq, e.kind, e.key));
    }
    for (agent, steps) in &recorded {
        let types_keys =
            |s: &[(u64, EventType, Digest)]| s.iter().map(|(_, t, k)| (*t, *k)).collect::<Vec<_>>();
        assert_eq!(types_keys(&replayed[agent]), types_keys(steps), "{what}: {agent}'s step types and keys");
        assert_eq!(replayed[agent], *steps, "{what}: {agent}'s steps in recorded order");
    }
}

/// Records seed `seed` and replays it with different scheduling; every tenth seed also strictly.
async fn stress_seed(store: Arc<dyn Store>, seed: u64, agents: usize) {
    let plan = Arc::new(Plan::new(seed, agents, 1 + seed % 3, 3));
    let rec = record_stress(&store, &plan, seed, seed % 2 == 0).await;
    replay_stress(&store, &plan, &rec, mix(!seed), false).await;
    if seed % 10 == 0 {
        replay_stress(&store, &plan, &rec, mix(seed.rotate_left(7)), true).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_seeds_of_sixteen_agents_replay_what_each_agent_heard() {
    const SEEDS: u64 = 500;
    const BATCH: u64 = 20;
    let started = Instant::now();
    let mut events = 0;
    for batch in 0..SEEDS / BATCH {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let mut set = JoinSet::new();
        for seed in batch * BATCH..(batch + 1) * BATCH {
            set.spawn(stress_seed(store.clone(), seed, 16 + (seed % 5) as usize));
        }
        while let Some(done) = set.join_next().await {
            done.unwrap_or_else(|e| panic_again(e));
        }
        events += store.runs().unwrap().iter().map(|r| store.last_seq(&r.id).unwrap()).sum::<u64>();
    }
    eprintln!(
        "stress: {SEEDS} seeds recorded and replayed ({} strict), {events} recorded events, in {:?}",
        SEEDS / 10,
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stress_program_on_sqlite() {
    const SEEDS: u64 = 24;
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(
        &dir.path().join("retrace.db"),
        &dir.path().join("blobs"),
        Durability::Batch,
        5_000,
    )
    .unwrap();
    let store: Arc<dyn Store> = Arc::new(store);
    let mut set = JoinSet::new();
    for seed in 1_000..1_000 + SEEDS {
        let store = store.clone();
        set.spawn(async move {
            let plan = Arc::new(Plan::new(seed, 16, 1 + seed % 2, 2));
            let rec = record_stress(&store, &plan, seed, seed % 2 == 0).await;
            let problems = retrace_store::verify::verify_run(store.as_ref(), &rec.run);
            assert!(problems.is_empty(), "seed {seed}: {problems:?}");
            replay_stress(&store, &plan, &rec, mix(!seed), false).await;
            if seed % 4 == 0 {
                replay_stress(&store, &plan, &rec, mix(seed ^ 0xabc), true).await;
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.unwrap_or_else(|e| panic_again(e));
    }
    eprintln!("sqlite stress: {SEEDS} seeds in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_one_seed() {
    let seed: u64 = std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    for k in 0..20 {
        let t = Instant::now();
        let agents = 16 + (seed % 5) as usize;
        let plan = Arc::new(Plan::new(seed, agents, 1 + seed % 3, 3));
        let rec = record_stress(&store, &plan, seed, seed % 2 == 0).await;
        eprintln!("recorded {} events in {:?}", rec.events.len(), t.elapsed());
        let t = Instant::now();
        replay_stress(&store, &plan, &rec, mix(!seed ^ k), false).await;
        eprintln!("replayed in {:?}", t.elapsed());
    }
}
