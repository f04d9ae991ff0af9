//! Round trips of random step programs (SPEC §7): replay hands back what record saw, byte for
//! byte, with nothing live; a changed or extra step diverges at that step and poisons the rest of
//! the session, a missing step diverges at the end, and reordering an agent's independent steps
//! does not diverge. Every property runs on a fresh `MemoryStore` per case, and once more on SQLite.
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use retrace_core::canonical::canonical_value;
use retrace_core::envelope::ToolClass;
use retrace_core::run::RunStatus;
use retrace_core::{Digest, Divergence, DivergenceCode, EventType};
use retrace_runtime::env_sources::Clock;
use retrace_runtime::{
    Agent, ModelCall, ModelReply, Outcome, RuntimeError, Session, SessionOptions, ToolSpec,
};
use retrace_store::memory::MemoryStore;
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Durability, Store};
use serde_json::{json, Value};

// ---- Programs ------------------------------------------------------------------------------

/// One step of a generated program, with what its live call returns in record.
#[derive(Clone, Debug)]
enum Op {
    Tool { name: &'static str, args: Value, output: Value, spec: ToolSpec },
    Model { messages: Vec<Value>, reply: Value },
    Now,
    RandomU64,
    RandomId,
    Env(&'static str),
    Decide { action: &'static str, target: Option<String> },
}

const TOOLS: &[&str] = &["sql.query", "search", "email.send", "fs.read"];
const ENV: &[&str] = &["PATH", "HOME", "RETRACE_ROUNDTRIP_UNSET"];
const ACTIONS: &[&str] = &["approve", "reject", "retry"];

fn agent_name(i: usize) -> String {
    format!("agent-{i}")
}

fn model_call(messages: &[Value]) -> ModelCall {
    ModelCall {
        provider: "openai".into(),
        endpoint: "chat.completions".into(),
        body: json!({"model": "gpt-x", "temperature": 0, "messages": messages}),
    }
}

/// A wall clock that reads a random time: `now_ms` is as live as `random_u64` in record.
#[derive(Debug)]
struct RandomClock;

impl Clock for RandomClock {
    fn now_ms(&self) -> u64 {
        rand::random::<u64>() >> 11
    }
}

/// Runs one step; every live function it hands the session bumps `live`.
fn step(agent: &Agent, op: &Op, live: &AtomicUsize) -> Result<Value, RuntimeError> {
    let called = || live.fetch_add(1, Ordering::SeqCst);
    match op {
        Op::Tool { name, args, output, spec } => agent.tool(name, args, spec.clone(), || {
            called();
            Ok::<Value, String>(output.clone())
        }),
        Op::Model { messages, reply } => agent.model(&model_call(messages), |_body| {
            called();
            Ok::<_, String>(ModelReply {
                body: reply.clone(),
                snapshot: Some("gpt-x-2026-01-01".into()),
                usage: None,
            })
        }),
        Op::Now => agent.now_ms().map(Value::from),
        Op::RandomU64 => agent.random_u64().map(Value::from),
        Op::RandomId => agent.random_id().map(Value::from),
        Op::Env(name) => agent.env(name).map(Value::from),
        Op::Decide { action, target } => agent.decide(action, target.as_deref()).map(|()| Value::Null),
    }
}

/// What one step handed the program: the canonical JSON of its value, or the error.
type Seen = Result<Vec<u8>, RuntimeError>;

fn canonical(v: &Value) -> Vec<u8> {
    canonical_value(v).expect("step values are canonical JSON")
}

fn run_agent(session: &Session, i: usize, ops: &[Op], live: &AtomicUsize) -> Vec<Seen> {
    let agent = session.agent(&agent_name(i));
    ops.iter().map(|op| step(&agent, op, live).map(|v| canonical(&v))).collect()
}

/// Runs every agent's steps, one agent after the other or each on its own thread.
fn run(session: &Session, agents: &[Vec<Op>], threaded: bool, live: &AtomicUsize) -> Vec<Vec<Seen>> {
    if !threaded {
        return agents.iter().enumerate().map(|(i, ops)| run_agent(session, i, ops, live)).collect();
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = agents
            .iter()
            .enumerate()
            .map(|(i, ops)| scope.spawn(move || run_agent(session, i, ops, live)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A recorded program: its run, what each step returned, and each step's events.
struct Recorded {
    run: String,
    seen: Vec<Vec<Vec<u8>>>,
    /// Per agent, per step: `(seq, key)` of its events (an intent, then the call, for a side effect).
    events: Vec<Vec<Vec<(u64, Digest)>>>,
}

impl Recorded {
    /// The step's recorded seq as a divergence names it: its first event.
    fn seq(&self, agent: usize, op: usize) -> u64 {
        self.events[agent][op][0].0
    }
    /// Steps with the same call key are interchangeable: replay hands them out in recorded order.
    fn call_key(&self, agent: usize, op: usize) -> Digest {
        self.events[agent][op].last().unwrap().1
    }
}

fn options() -> SessionOptions {
    SessionOptions { clock: Arc::new(RandomClock), ..SessionOptions::default() }
}

fn record(store: &Arc<dyn Store>, agents: &[Vec<Op>], threaded: bool) -> Recorded {
    let session = Session::record(store.clone(), options()).unwrap();
    let live = AtomicUsize::new(0);
    let seen = run(&session, agents, threaded, &live);
    let report = session.finish(Outcome { exit_status: Some(0) }).unwrap();
    let calls = agents.iter().flatten().filter(|op| matches!(op, Op::Tool { .. } | Op::Model { .. })).count();
    assert_eq!(live.load(Ordering::SeqCst), calls);
    let seen = seen.into_iter().map(|steps| steps.into_iter().map(Result::unwrap).collect()).collect();

    let mut by_agent: HashMap<String, VecDeque<(u64, Digest, EventType)>> = HashMap::new();
    for e in store.events(&report.run_id, 1, 1_000_000).unwrap() {
        by_agent.entry(e.agent_id.clone()).or_default().push_back((e.seq, e.key, e.kind));
    }
    let mut events = Vec::new();
    for (i, ops) in agents.iter().enumerate() {
        let queue = by_agent.entry(agent_name(i)).or_default();
        let mut per_op = Vec::new();
        for op in ops {
            let kinds: &[EventType] = match op {
                Op::Tool { spec, .. } if spec.class == ToolClass::SideEffect => {
                    &[EventType::Intent, EventType::ToolCall]
                }
                Op::Tool { .. } => &[EventType::ToolCall],
                Op::Model { .. } => &[EventType::ModelCall],
                Op::Now => &[EventType::Clock],
                Op::RandomU64 | Op::RandomId => &[EventType::Random],
                Op::Env(_) => &[EventType::Env],
                Op::Decide { .. } => &[EventType::Decision],
            };
            let mut mine = Vec::new();
            for kind in kinds {
                let (seq, key, found) = queue.pop_front().expect("every step was recorded");
                assert_eq!(found, *kind, "agent {i}'s events follow its steps");
                mine.push((seq, key));
            }
            per_op.push(mine);
        }
        assert!(queue.is_empty(), "agent {i} recorded only its steps");
        events.push(per_op);
    }
    Recorded { run: report.run_id, seen, events }
}

fn replay_session(store: &Arc<dyn Store>, rec: &Recorded) -> Session {
    Session::replay(store.clone(), &rec.run, options()).unwrap()
}

fn divergence(seen: Seen) -> Divergence {
    match seen {
        Err(RuntimeError::Divergence(d)) => *d,
        Err(e) => panic!("expected a divergence, got {e}"),
        Ok(v) => panic!("expected a divergence, got {}", String::from_utf8_lossy(&v)),
    }
}

// ---- Strategies ----------------------------------------------------------------------------

fn text() -> impl Strategy<Value = String> {
    "(?s).{0,12}"
}

/// Object keys of requests: never one of the volatile fields keys strip.
fn field() -> impl Strategy<Value = String> {
    "[a-h]{1,3}"
}

fn json_value() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter("JSON holds finite numbers", |f| f.is_finite()).prop_map(Value::from),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map(prop_oneof![field(), text()], inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

fn tool_spec() -> impl Strategy<Value = ToolSpec> {
    let version = select(&["1", "2"][..]);
    prop_oneof![
        version.clone().prop_map(ToolSpec::deterministic),
        (version.clone(), 1..86_400u64).prop_map(|(v, ttl)| ToolSpec::time_bound(v, ttl)),
        version.prop_map(ToolSpec::side_effect),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let args = btree_map(field(), json_value(), 0..4).prop_map(|m| Value::Object(m.into_iter().collect()));
    let message = (select(&["system", "user", "assistant"][..]), text())
        .prop_map(|(role, content)| json!({"role": role, "content": content}));
    prop_oneof![
        4 => (select(TOOLS), args, json_value(), tool_spec())
            .prop_map(|(name, args, output, spec)| Op::Tool { name, args, output, spec }),
        2 => (vec(message, 1..4), json_value())
            .prop_map(|(messages, reply)| Op::Model { messages, reply }),
        1 => Just(Op::Now),
        1 => Just(Op::RandomU64),
        1 => Just(Op::RandomId),
        1 => select(ENV).prop_map(Op::Env),
        1 => (select(ACTIONS), proptest::option::of(text()))
            .prop_map(|(action, target)| Op::Decide { action, target }),
    ]
}

/// 1–4 agents of 1–12 steps each.
fn program() -> impl Strategy<Value = Vec<Vec<Op>>> {
    vec(vec(op(), 1..=12), 1..=4)
}

fn config() -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 64;
    }
    config
}

// ---- Properties ----------------------------------------------------------------------------

/// Record, then replay: the same bytes everywhere, nothing live, and `finish` is ok.
#[derive(Clone, Debug)]
struct RoundTrip {
    agents: Vec<Vec<Op>>,
    record_threaded: bool,
    replay_threaded: bool,
}

fn round_trip() -> impl Strategy<Value = RoundTrip> {
    (program(), any::<bool>(), any::<bool>()).prop_map(|(agents, record_threaded, replay_threaded)| {
        RoundTrip { agents, record_threaded, replay_threaded }
    })
}

fn check_round_trip(store: &Arc<dyn Store>, case: &RoundTrip) {
    let rec = record(store, &case.agents, case.record_threaded);
    for _ in 0..2 {
        let session = replay_session(store, &rec);
        let live = AtomicUsize::new(0);
        let seen = run(&session, &case.agents, case.replay_threaded, &live);
        for (i, steps) in seen.into_iter().enumerate() {
            for (k, got) in steps.into_iter().enumerate() {
                let got = got.unwrap_or_else(|e| panic!("agent {i} step {k}: {e}"));
                assert_eq!(
                    String::from_utf8_lossy(&got),
                    String::from_utf8_lossy(&rec.seen[i][k]),
                    "agent {i} step {k}"
                );
            }
        }
        assert_eq!(live.load(Ordering::SeqCst), 0, "replay ran a live function");
        assert_eq!(session.live_calls(), 0);
        let report = session.finish(Outcome { exit_status: Some(0) }).unwrap();
        assert_eq!((report.status, report.live_calls), (RunStatus::Ok, 0));
    }
}

/// Step `op` of agent `agent` asks for something its agent's unconsumed steps don't hold.
#[derive(Clone, Debug)]
struct Changed {
    agents: Vec<Vec<Op>>,
    record_threaded: bool,
    agent: Index,
    op: Index,
}

fn changed() -> impl Strategy<Value = Changed> {
    (program(), any::<bool>(), any::<Index>(), any::<Index>())
        .prop_map(|(agents, record_threaded, agent, op)| Changed { agents, record_threaded, agent, op })
}

/// The changed step, and the path of the changed field when an unconsumed step of the same type
/// and name is expected (`None`: the agent has no such step left, so the step is unexpected).
fn change(op: &Op) -> (Op, Option<String>) {
    match op.clone() {
        Op::Tool { name, mut args, output, spec } => {
            args["mutated"] = json!(true);
            let op = Op::Tool { name, args, output, spec };
            (op, Some("$.mutated".into()))
        }
        Op::Model { mut messages, reply } => {
            let last = messages.len() - 1;
            let content = messages[last]["content"].as_str().unwrap().to_owned();
            // Longer than any generated content, so no recorded request holds it.
            messages[last]["content"] = json!(format!("{content} [changed by the test]"));
            let path = format!("$.messages[{last}].content");
            (Op::Model { messages, reply }, Some(path))
        }
        Op::Decide { target, .. } => {
            let op = Op::Decide { action: "escalate", target };
            (op, Some("$.action".into()))
        }
        Op::Now | Op::RandomU64 | Op::RandomId | Op::Env(_) => (Op::Env("RETRACE_ROUNDTRIP_CHANGED"), None),
    }
}

fn label(op: &Op) -> String {
    match op {
        Op::Tool { name, .. } => format!("tool_call {name}"),
        Op::Model { .. } => "model_call openai/chat.completions".into(),
        Op::Now => "clock wall".into(),
        Op::RandomU64 => "random u64".into(),
        Op::RandomId => "random id".into(),
        Op::Env(name) => format!("env {name}"),
        Op::Decide { .. } => "decision".into(),
    }
}

fn check_changed(store: &Arc<dyn Store>, case: &Changed) {
    let rec = record(store, &case.agents, case.record_threaded);
    let a = case.agent.index(case.agents.len());
    let k = case.op.index(case.agents[a].len());
    let (new_op, path) = change(&case.agents[a][k]);
    let session = replay_session(store, &rec);
    let live = AtomicUsize::new(0);

    // Everything before the changed step replays as recorded.
    for (i, ops) in case.agents.iter().enumerate().take(a) {
        for (j, seen) in run_agent(&session, i, ops, &live).into_iter().enumerate() {
            assert_eq!(seen.unwrap(), rec.seen[i][j], "agent {i} step {j}");
        }
    }
    let agent = session.agent(&agent_name(a));
    for (j, op) in case.agents[a][..k].iter().enumerate() {
        let seen = step(&agent, op, &live).map(|v| canonical(&v));
        assert_eq!(seen.unwrap(), rec.seen[a][j], "agent {a} step {j}");
    }

    // The changed step diverges, naming the agent, the expected step and the changed field.
    let d = divergence(step(&agent, &new_op, &live).map(|v| canonical(&v)));
    assert_eq!(d.agent, agent_name(a), "{d}");
    assert_eq!(d.step.as_deref(), Some(label(&new_op).as_str()), "{d}");
    assert!(d.got.is_some() && d.expected != d.got, "{d}");
    match path {
        Some(path) => {
            assert_eq!(d.code, DivergenceCode::StepMismatch, "{d}");
            assert_eq!(d.seq, Some(rec.seq(a, k)), "{d}");
            assert!(d.expected.is_some(), "{d}");
            assert_eq!(d.path, Some(path), "{d}");
        }
        None => {
            // No step of that type and name is left: the divergence is about the step the
            // agent skipped, its next recorded one.
            assert_eq!(d.code, DivergenceCode::UnexpectedStep, "{d}");
            assert_eq!((d.seq, d.expected), (Some(rec.seq(a, k)), None), "{d}");
        }
    }

    // Every later step of the session, of any agent, returns that same divergence.
    let later = case.agents[a][k + 1..].iter().map(|op| (a, op));
    let others = case.agents.iter().enumerate().skip(a + 1);
    let others = others.flat_map(|(i, ops)| ops.iter().map(move |op| (i, op)));
    let earlier = (0..a).map(|i| (i, &Op::RandomU64));
    for (i, op) in later.chain(others).chain(earlier) {
        let again = step(&session.agent(&agent_name(i)), op, &live).map(|v| canonical(&v));
        assert_eq!(divergence(again), d, "agent {i}");
    }
    assert_eq!(live.load(Ordering::SeqCst), 0, "replay ran a live function");
    let finished = session.finish(Outcome { exit_status: Some(0) }).unwrap_err();
    assert_eq!(finished.divergence(), Some(&d));
    let meta = store.run(&session.run_id()).unwrap();
    assert_eq!(meta.status, RunStatus::Diverged);
    assert_eq!(meta.divergence, Some(d.to_json()));
}

/// One agent's steps run in another order; steps with identical keys keep their recorded order.
#[derive(Clone, Debug)]
struct Reordered {
    agents: Vec<Vec<Op>>,
    record_threaded: bool,
    replay_threaded: bool,
    agent: Index,
    order: Vec<u64>,
}

fn reordered() -> impl Strategy<Value = Reordered> {
    (program(), any::<bool>(), any::<bool>(), any::<Index>(), vec(any::<u64>(), 12)).prop_map(
        |(agents, record_threaded, replay_threaded, agent, order)| Reordered {
            agents,
            record_threaded,
            replay_threaded,
            agent,
            order,
        },
    )
}

/// A permutation of agent `a`'s steps from `order`, where steps with the same call key (and all
/// decisions, whose order is the outcome) keep their recorded relative order.
fn permutation(rec: &Recorded, agents: &[Vec<Op>], a: usize, order: &[u64]) -> Vec<usize> {
    let n = agents[a].len();
    let mut shuffled: Vec<usize> = (0..n).collect();
    shuffled.sort_by_key(|&i| order[i]);
    let group = |i: usize| match agents[a][i] {
        Op::Decide { .. } => None,
        _ => Some(rec.call_key(a, i)),
    };
    let mut members: HashMap<Option<Digest>, VecDeque<usize>> = HashMap::new();
    for i in 0..n {
        members.entry(group(i)).or_default().push_back(i);
    }
    shuffled.iter().map(|&i| members.get_mut(&group(i)).unwrap().pop_front().unwrap()).collect()
}

fn check_reordered(store: &Arc<dyn Store>, case: &Reordered) {
    let rec = record(store, &case.agents, case.record_threaded);
    let a = case.agent.index(case.agents.len());
    let perm = permutation(&rec, &case.agents, a, &case.order);
    let mut agents = case.agents.clone();
    agents[a] = perm.iter().map(|&i| case.agents[a][i].clone()).collect();

    let session = replay_session(store, &rec);
    let live = AtomicUsize::new(0);
    let seen = run(&session, &agents, case.replay_threaded, &live);
    for (i, steps) in seen.into_iter().enumerate() {
        for (j, got) in steps.into_iter().enumerate() {
            let k = if i == a { perm[j] } else { j };
            let got = got.unwrap_or_else(|e| panic!("agent {i} step {j} (recorded {k}): {e}"));
            assert_eq!(got, rec.seen[i][k], "agent {i} step {j} (recorded {k})");
        }
    }
    assert_eq!(live.load(Ordering::SeqCst), 0, "replay ran a live function");
    session.finish(Outcome { exit_status: Some(0) }).unwrap();
}

/// One agent takes one step more than it recorded (at its end, or as a new agent).
#[derive(Clone, Debug)]
struct Extra {
    agents: Vec<Vec<Op>>,
    record_threaded: bool,
    agent: Index,
    op: Op,
}

fn extra() -> impl Strategy<Value = Extra> {
    (program(), any::<bool>(), any::<Index>(), op()).prop_map(|(agents, record_threaded, agent, op)| Extra {
        agents,
        record_threaded,
        agent,
        op,
    })
}

fn check_extra(store: &Arc<dyn Store>, case: &Extra) {
    let rec = record(store, &case.agents, case.record_threaded);
    // Index `len` is an agent that recorded nothing.
    let a = case.agent.index(case.agents.len() + 1);
    let session = replay_session(store, &rec);
    let live = AtomicUsize::new(0);
    for (i, steps) in run(&session, &case.agents, false, &live).into_iter().enumerate() {
        for (j, got) in steps.into_iter().enumerate() {
            assert_eq!(got.unwrap(), rec.seen[i][j], "agent {i} step {j}");
        }
    }
    let got = step(&session.agent(&agent_name(a)), &case.op, &live).map(|v| canonical(&v));
    let d = divergence(got);
    assert_eq!(d.code, DivergenceCode::UnexpectedStep, "{d}");
    assert_eq!(d.agent, agent_name(a), "{d}");
    assert_eq!(d.step.as_deref(), Some(label(&case.op).as_str()), "{d}");
    assert_eq!(d.expected, None, "{d}");
    assert!(d.got.is_some(), "{d}");
    // About the agent's last recorded event (a side effect's completion is its own); an agent
    // that recorded nothing has none.
    let last = rec.events.get(a).and_then(|steps| steps.iter().flatten().map(|(seq, _)| *seq).max());
    assert_eq!(d.seq, last, "{d}");
    assert_eq!(live.load(Ordering::SeqCst), 0, "replay ran a live function");
    let finished = session.finish(Outcome { exit_status: Some(0) }).unwrap_err();
    assert_eq!(finished.divergence(), Some(&d));
}

/// Some recorded steps are never taken in replay.
#[derive(Clone, Debug)]
struct Missing {
    agents: Vec<Vec<Op>>,
    record_threaded: bool,
    replay_threaded: bool,
    /// Per agent and step: whether replay skips it.
    skip: Vec<Vec<bool>>,
    /// One step skipped for sure: `(agent, step)`.
    surely: (Index, Index),
}

fn missing() -> impl Strategy<Value = Missing> {
    (
        program(),
        any::<bool>(),
        any::<bool>(),
        vec(vec(proptest::bool::weighted(0.2), 12), 4),
        any::<(Index, Index)>(),
    )
        .prop_map(|(agents, record_threaded, replay_threaded, skip, surely)| Missing {
            agents,
            record_threaded,
            replay_threaded,
            skip,
            surely,
        })
}

fn check_missing(store: &Arc<dyn Store>, case: &Missing) {
    let rec = record(store, &case.agents, case.record_threaded);
    let mut skip = case.skip.clone();
    let a = case.surely.0.index(case.agents.len());
    skip[a][case.surely.1.index(case.agents[a].len())] = true;
    let kept: Vec<Vec<usize>> = case
        .agents
        .iter()
        .enumerate()
        .map(|(i, ops)| (0..ops.len()).filter(|&k| !skip[i][k]).collect())
        .collect();
    let agents: Vec<Vec<Op>> = kept
        .iter()
        .enumerate()
        .map(|(i, ks)| ks.iter().map(|&k| case.agents[i][k].clone()).collect())
        .collect();

    let session = replay_session(store, &rec);
    let live = AtomicUsize::new(0);
    for (i, steps) in run(&session, &agents, case.replay_threaded, &live).into_iter().enumerate() {
        for (j, got) in steps.into_iter().enumerate() {
            // A skipped step's twin (same key, later) takes its recorded output, so only check
            // that nothing diverges before the end.
            got.unwrap_or_else(|e| panic!("agent {i} step {j}: {e}"));
        }
    }
    assert_eq!(live.load(Ordering::SeqCst), 0, "replay ran a live function");

    // Each agent's first unconsumed recorded event: replay takes, for each step, the earliest
    // unconsumed recorded event with each of its keys.
    let mut leftovers: Vec<(u64, String, Digest)> = Vec::new();
    for (i, ks) in kept.iter().enumerate() {
        let mut queues: HashMap<Digest, VecDeque<u64>> = HashMap::new();
        let mut keys: HashMap<u64, Digest> = HashMap::new();
        for &(seq, key) in rec.events[i].iter().flatten() {
            queues.entry(key).or_default().push_back(seq);
            keys.insert(seq, key);
        }
        for &k in ks {
            for (_, key) in &rec.events[i][k] {
                queues.get_mut(key).unwrap().pop_front().unwrap();
            }
        }
        if let Some(first) = queues.values().flatten().min() {
            leftovers.push((*first, agent_name(i), keys[first]));
        }
    }
    leftovers.sort();
    let err = session.finish(Outcome { exit_status: Some(0) }).unwrap_err();
    let d = err.divergence().unwrap_or_else(|| panic!("expected a divergence, got {err}"));
    let (seq, agent, key) = &leftovers[0];
    assert_eq!(d.code, DivergenceCode::StepsLeft, "{d}");
    assert_eq!((d.seq, &d.agent, d.expected), (Some(*seq), agent, Some(*key)), "{d}");
    assert_eq!(d.detail.len(), leftovers.len(), "{d}");
    for (seq, agent, _) in &leftovers {
        let line = format!("agent {agent:?}: first unconsumed step is seq {seq} (");
        assert!(d.detail.iter().any(|l| l.starts_with(&line)), "{line}\n{d}");
    }
}

fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn replay_hands_back_every_recorded_output_and_runs_nothing(case in round_trip()) {
        check_round_trip(&memory(), &case);
    }

    #[test]
    fn a_changed_step_diverges_there_and_for_the_rest_of_the_session(case in changed()) {
        check_changed(&memory(), &case);
    }

    #[test]
    fn reordering_an_agents_independent_steps_is_not_a_divergence(case in reordered()) {
        check_reordered(&memory(), &case);
    }

    #[test]
    fn an_extra_step_is_unexpected(case in extra()) {
        check_extra(&memory(), &case);
    }

    #[test]
    fn missing_steps_are_left_at_the_end_naming_each_agents_first(case in missing()) {
        check_missing(&memory(), &case);
    }
}

/// `n` values of `strategy` from a fixed seed.
fn samples<S: Strategy>(strategy: S, n: usize) -> Vec<S::Value> {
    let mut runner = TestRunner::deterministic();
    (0..n).map(|_| strategy.new_tree(&mut runner).unwrap().current()).collect()
}

#[test]
fn the_same_properties_hold_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(&dir.path().join("retrace.db"), &dir.path().join("blobs"), Durability::Os, 5_000)
            .unwrap(),
    );
    for case in samples(round_trip(), 8) {
        check_round_trip(&store, &case);
    }
    for case in samples(changed(), 8) {
        check_changed(&store, &case);
    }
    for case in samples(reordered(), 8) {
        check_reordered(&store, &case);
    }
    for case in samples(extra(), 8) {
        check_extra(&store, &case);
    }
    for case in samples(missing(), 8) {
        check_missing(&store, &case);
    }
}
