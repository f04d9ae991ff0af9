//! The stress program: agents that fan messages out and in along a seeded plan, with tool
//! steps whose arguments depend on what they heard; how to record it, replay it and check it.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retrace_core::{Digest, Event, EventType};
use retrace_runtime::{Agent, Outcome, RuntimeResult, Session, SessionOptions, ToolSpec};
use retrace_store::Store;
use serde_json::{json, Value};

use crate::{agent_name, all_events, jitter, mix, panic_again, RUN_LIMIT};

/// Who talks to whom. Each agent fans out a first message to a few others; a receiver forwards
/// every message of hop < `hops` to a target that depends only on (receiver, sender, hop). So
/// the multiset of messages, and how many each agent receives, are fixed by the plan while the
/// order they arrive in is not — and every body and tool argument depends on that order.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) agents: usize,
    pub(crate) fanout: Vec<Vec<usize>>,
    pub(crate) hops: u64,
    pub(crate) salt: usize,
    pub(crate) expected: Vec<usize>,
}

impl Plan {
    pub(crate) fn new(seed: u64, agents: usize, hops: u64, max_fanout: usize) -> Plan {
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
pub(crate) struct Tamper {
    pub(crate) agent: usize,
    pub(crate) digest: usize,
}

/// One agent of the stress program; returns everything it observed, in order.
pub(crate) async fn stress_agent(
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
        acc = if got % 2 == 1 {
            // The blocking form from an async task (in strict replay it waits there for its
            // turn, and must not starve the runtime).
            a.tool("digest", &args, ToolSpec::deterministic("1"), || {
                live_digest.fetch_add(1, Ordering::Relaxed);
                Ok::<_, String>(mix(acc ^ theirs.rotate_left(17) ^ hop))
            })?
        } else {
            a.tool_async("digest", &args, ToolSpec::deterministic("1"), || async move {
                live_digest.fetch_add(1, Ordering::Relaxed);
                Ok::<_, String>(mix(acc ^ theirs.rotate_left(17) ^ hop))
            })
            .await?
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
pub(crate) async fn run_stress(
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
pub(crate) struct Recording {
    pub(crate) seed: u64,
    pub(crate) run: String,
    pub(crate) events: Vec<Event>,
    pub(crate) seen: Vec<Vec<Value>>,
}

pub(crate) async fn record_stress(
    store: &Arc<dyn Store>,
    plan: &Arc<Plan>,
    seed: u64,
    wait_for_ack: bool,
) -> Recording {
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
pub(crate) fn heard(seen: &[Value]) -> Vec<Option<(String, u64, Value)>> {
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
pub(crate) fn check_recording(rec: &Recording, plan: &Plan) {
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
/// Returns whether replay released the recorded seqs in another global order than recorded.
pub(crate) async fn replay_stress(
    store: &Arc<dyn Store>,
    plan: &Arc<Plan>,
    rec: &Recording,
    jitter_salt: u64,
    strict: bool,
) -> bool {
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
    let recorded_order: Vec<u64> = (1..=rec.events.len() as u64).collect();
    if strict {
        assert_eq!(trace, recorded_order, "seed {seed}: strict replay keeps the global order");
    }
    trace != recorded_order
}

/// Per agent, the (type, key) of the steps replay consumed, in the order it consumed them, are
/// the recorded ones in seq order; and every recorded seq is consumed once.
pub(crate) fn check_per_agent_steps(events: &[Event], trace: &[u64], what: &str) {
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
/// Returns (recorded events, recorded timeouts, whether the default replay's global order
/// differed from the recorded one).
pub(crate) async fn stress_seed(store: Arc<dyn Store>, seed: u64, agents: usize) -> (usize, usize, bool) {
    let plan = Arc::new(Plan::new(seed, agents, 1 + seed % 3, 3));
    let rec = record_stress(&store, &plan, seed, seed % 2 == 1).await;
    let reordered = replay_stress(&store, &plan, &rec, mix(!seed), false).await;
    if seed % 10 == 9 {
        replay_stress(&store, &plan, &rec, mix(seed.rotate_left(7)), true).await;
    }
    let timeouts = rec.seen.iter().flat_map(|seen| heard(seen)).filter(Option::is_none).count();
    (rec.events.len(), timeouts, reordered)
}
