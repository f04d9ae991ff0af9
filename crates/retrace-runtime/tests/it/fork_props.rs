//! Forks of random step programs (SPEC §7 "Forks", "A fork's events"; issue 4). A program is a
//! DAG of tool and model steps on 1–3 agents, run one step at a time in a fixed order; each
//! step's request holds its id and the outputs of the earlier steps it depends on, and its live
//! function returns a fresh random value. Then:
//! - a fork with one output edit (at the edited seq or any earlier `--at`) runs live exactly the
//!   edited step's transitive dependents (computed here from the DAG, not from the log), serves
//!   every other step from the source, and replaying the fork reproduces it with nothing live;
//! - a fork with no edits, at any seq, runs nothing live and replays exactly.
//!
//! Every case runs on a fresh `MemoryStore`.
use std::cell::Cell;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use retrace_core::canonical::canonical_value;
use retrace_core::edit::{Content, Edit};
use retrace_core::envelope::Usage;
use retrace_core::run::RunStatus;
use retrace_core::{Event, EventType, Source};
use retrace_runtime::{ModelCall, ModelReply, Outcome, RuntimeError, Session, SessionOptions, ToolSpec};
use retrace_store::export::RunEvents;
use retrace_store::memory::MemoryStore;
use retrace_store::{BlobHint, Store};
use serde_json::{json, Value};

// ---- Programs ------------------------------------------------------------------------------

/// Tools by name, each with its one class (a time-bound tool is cached, but only for the same
/// request, which a changed step never repeats).
const TOOLS: &[(&str, bool)] = &[("lookup", false), ("search", true), ("score", false)];
const MODEL_STEP: &str = "openai/chat.completions";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `TOOLS[i]`.
    Tool(usize),
    Model,
}

#[derive(Clone, Debug)]
struct Step {
    agent: usize,
    kind: Kind,
    /// Earlier steps whose outputs this step's request holds.
    deps: Vec<usize>,
}

#[derive(Clone)]
struct Program {
    agents: usize,
    steps: Vec<Step>,
}

/// One line a step, so a shrunk failure reads as the DAG it is.
impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Program of {} agent(s):", self.agents)?;
        for (i, s) in self.steps.iter().enumerate() {
            let kind = match s.kind {
                Kind::Tool(t) => format!("tool {}", TOOLS[t].0),
                Kind::Model => "model".to_owned(),
            };
            writeln!(f, "  step {i:>2} (seq {:>2}): agent-{} {kind:<13} <- {:?}", i + 1, s.agent, s.deps)?;
        }
        Ok(())
    }
}

impl Program {
    /// The steps whose inputs change when step `k`'s output does: its transitive dependents,
    /// `k` excluded (its output comes from the edit).
    fn dependents(&self, k: usize) -> BTreeSet<usize> {
        let mut reached = BTreeSet::from([k]);
        for (i, s) in self.steps.iter().enumerate().skip(k + 1) {
            if s.deps.iter().any(|d| reached.contains(d)) {
                reached.insert(i);
            }
        }
        reached.remove(&k);
        reached
    }

    fn agent_name(a: usize) -> String {
        format!("agent-{a}")
    }
}

/// 5–30 steps on 1–3 agents; each step depends on each earlier step with probability 1/2, 1/4
/// or 1/8 (one density per program, so both deep chains and sparse forests come up).
fn program() -> impl Strategy<Value = Program> {
    (1..=3usize, 0..3u32, vec((0..3usize, 0..=TOOLS.len(), any::<[u32; 3]>()), 5..=30)).prop_map(
        |(agents, density, raw)| {
            let steps = raw
                .into_iter()
                .enumerate()
                .map(|(i, (agent, kind, [a, b, c]))| {
                    let mask = match density {
                        0 => a,
                        1 => a & b,
                        _ => a & b & c,
                    };
                    Step {
                        agent: agent % agents,
                        kind: if kind < TOOLS.len() { Kind::Tool(kind) } else { Kind::Model },
                        deps: (0..i).filter(|d| mask >> d & 1 == 1).collect(),
                    }
                })
                .collect();
            Program { agents, steps }
        },
    )
}

// ---- Running a program ---------------------------------------------------------------------

/// What one execution saw: each step's output, and how many times each step's live function ran.
struct Execution {
    outputs: Vec<Value>,
    live: Vec<usize>,
}

impl Execution {
    fn ran(&self) -> BTreeSet<usize> {
        self.live.iter().enumerate().filter(|(_, n)| **n > 0).map(|(i, _)| i).collect()
    }
}

/// Runs `program` on `session`, one step at a time in program order, then each agent decides
/// `done`.
fn execute(session: &Session, program: &Program) -> Result<Execution, RuntimeError> {
    let agents: Vec<_> = (0..program.agents).map(|a| session.agent(&Program::agent_name(a))).collect();
    let live: Vec<Cell<usize>> = program.steps.iter().map(|_| Cell::new(0)).collect();
    let mut outputs: Vec<Value> = Vec::with_capacity(program.steps.len());
    for (id, step) in program.steps.iter().enumerate() {
        let agent = &agents[step.agent];
        let inputs: Vec<Value> = step.deps.iter().map(|&d| json!([d, outputs[d]])).collect();
        let ran = || live[id].set(live[id].get() + 1);
        let out = match step.kind {
            Kind::Tool(t) => {
                let (name, time_bound) = TOOLS[t];
                let spec =
                    if time_bound { ToolSpec::time_bound("1", 3600) } else { ToolSpec::deterministic("1") };
                agent.tool(name, &json!({"step": id, "inputs": inputs}), spec, || {
                    ran();
                    Ok::<Value, String>(json!({"step": id, "v": rand::random::<u64>()}))
                })?
            }
            Kind::Model => {
                let call = ModelCall {
                    provider: "openai".into(),
                    endpoint: "chat.completions".into(),
                    body: json!({
                        "model": "sim-1",
                        "step": id,
                        "messages": [{"role": "user", "content": Value::Array(inputs).to_string()}],
                    }),
                };
                agent.model(&call, |_body| {
                    ran();
                    Ok::<_, String>(ModelReply {
                        body: json!({"step": id, "text": format!("reply {:016x}", rand::random::<u64>())}),
                        snapshot: None,
                        usage: Some(Usage {
                            input_tokens: 10,
                            output_tokens: 5,
                            cost_usd: Some(0.001),
                            ..Default::default()
                        }),
                    })
                })?
            }
        };
        outputs.push(out);
    }
    for agent in &agents {
        agent.decide("done", None)?;
    }
    Ok(Execution { outputs, live: live.into_iter().map(Cell::into_inner).collect() })
}

/// Every event of `run`, inherited ones included.
fn all_events(store: &Arc<dyn Store>, run: &str) -> Vec<Event> {
    let mut events = Vec::new();
    let mut pages = RunEvents::new(store.as_ref(), run).unwrap();
    while let Some(page) = pages.next_page().unwrap() {
        events.extend(page);
    }
    events
}

/// A recorded program: step `i` is seq `i + 1`, then one `decide` per agent.
struct Recorded {
    run: String,
    events: Vec<Event>,
    outputs: Vec<Value>,
}

fn record(store: &Arc<dyn Store>, program: &Program) -> Recorded {
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let exec = execute(&s, program).unwrap();
    assert!(exec.live.iter().all(|n| *n == 1), "record runs every step once: {:?}", exec.live);
    let run = s.finish(Outcome::default()).unwrap().run_id;
    let events = all_events(store, &run);
    assert_eq!(events.len(), program.steps.len() + program.agents);
    for (i, (step, e)) in program.steps.iter().zip(&events).enumerate() {
        let want = match step.kind {
            Kind::Tool(t) => (EventType::ToolCall, TOOLS[t].0),
            Kind::Model => (EventType::ModelCall, MODEL_STEP),
        };
        assert_eq!((e.seq, e.kind, e.name.as_deref()), (i as u64 + 1, want.0, Some(want.1)));
        assert_eq!(e.agent_id, Program::agent_name(step.agent));
    }
    Recorded { run, events, outputs: exec.outputs }
}

/// Replays fork `fork`: the same outputs as `expected`, nothing live, and `finish` is ok.
fn check_replay(store: &Arc<dyn Store>, program: &Program, fork: &str, expected: &[Value]) {
    let r = Session::replay(store.clone(), fork, SessionOptions::default()).unwrap();
    let exec = execute(&r, program).unwrap_or_else(|e| panic!("replay of fork {fork}: {e}"));
    let report = r.finish(Outcome::default()).unwrap_or_else(|e| panic!("replay of fork {fork}: {e}"));
    assert_eq!(exec.ran(), BTreeSet::new(), "replaying a fork runs nothing live");
    assert_eq!(report.live_calls, 0);
    assert_eq!(exec.outputs, expected, "replaying the fork hands back the fork's outputs");
}

// ---- Properties ----------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct OneEdit {
    program: Program,
    target: Index,
    /// `--at`: none (the edited seq), or a seq at or before it.
    at: Option<Index>,
    nonce: u64,
}

fn one_edit() -> impl Strategy<Value = OneEdit> {
    (program(), any::<Index>(), proptest::option::of(any::<Index>()), any::<u64>())
        .prop_map(|(program, target, at, nonce)| OneEdit { program, target, at, nonce })
}

fn check_one_edit(store: &Arc<dyn Store>, case: &OneEdit) {
    let program = &case.program;
    let rec = record(store, program);
    let k = case.target.index(program.steps.len());
    let seq = k as u64 + 1;
    let at = case.at.map_or(seq, |i| i.index(k + 1) as u64 + 1);
    let edited = json!({"edited": k, "nonce": case.nonce});
    let blob = store.put_blob(&canonical_value(&edited).unwrap(), BlobHint::Raw).unwrap();
    let edit = match program.steps[k].kind {
        Kind::Tool(_) => Edit::ToolOutput { seq, content: Content::Blob(blob) },
        Kind::Model => Edit::ModelOutput { seq, content: Content::Blob(blob) },
    };
    let f = Session::fork_new(
        store.clone(),
        &rec.run,
        case.at.map(|_| at),
        vec![edit.clone()],
        SessionOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{edit} --at {at}: {e}"));
    let fork_of = format!("{edit} --at {at}");
    let fork = f.run_id();
    let exec = execute(&f, program).unwrap_or_else(|e| panic!("fork with {fork_of}: {e}"));
    let report = f.finish(Outcome::default()).unwrap_or_else(|e| panic!("fork with {fork_of}: {e}"));

    // What ran live is exactly what the DAG says the edit reaches, each step once.
    let affected = program.dependents(k);
    assert_eq!(exec.ran(), affected, "{fork_of}: steps run live vs the edited step's dependents");
    assert!(exec.live.iter().all(|n| *n <= 1), "{fork_of}: a step ran twice: {:?}", exec.live);
    assert_eq!(report.live_calls, affected.len());
    let meta = store.run(&fork).unwrap();
    assert_eq!((meta.status, meta.fork_at), (RunStatus::Ok, Some(at)));

    // The program saw the edit, the source's outputs where nothing changed, new ones elsewhere.
    assert_eq!(exec.outputs[k], edited);
    for (i, (now, then)) in exec.outputs.iter().zip(&rec.outputs).enumerate() {
        if i != k {
            assert_eq!(now == then, !affected.contains(&i), "step {i}: {now} vs recorded {then}");
        }
    }

    // The fork's events: 1..at-1 inherited, its own from `at`, each paired with its source step.
    let events = all_events(store, &fork);
    assert_eq!(events.len(), rec.events.len());
    for (i, (e, src)) in events.iter().zip(&rec.events).enumerate() {
        let what = format!("{fork_of}: seq {} ({})", src.seq, src.label());
        assert_eq!((e.seq, e.kind, &e.name, &e.agent_id), (src.seq, src.kind, &src.name, &src.agent_id));
        if src.seq < at {
            assert_eq!(e, src, "{what}: inherited as is");
            continue;
        }
        assert_eq!(e.run_id, fork, "{what}");
        assert_eq!(e.origin_seq, Some(src.seq), "{what}: paired with its own source step");
        if i == k {
            assert_eq!(e.source, Source::Recorded, "{what}: the edited step");
            assert_eq!(e.key, src.key, "{what}: the edited step asks what the source asked");
            assert_eq!(e.output_hash, Some(blob), "{what}: the edited step holds the edit");
            assert!(e.usage.is_none(), "{what}: zero tokens");
        } else if affected.contains(&i) {
            assert_eq!(e.source, Source::Live, "{what}: an affected step");
            assert_ne!(e.key, src.key, "{what}: an affected step's request changed");
            assert_ne!(e.output_hash, src.output_hash, "{what}: a live step's new output");
        } else {
            assert_eq!(e.source, Source::Recorded, "{what}: an unaffected step");
            assert_eq!(e.key, src.key, "{what}");
            assert_eq!(e.output_hash, src.output_hash, "{what}: the source's output");
            assert!(e.usage.is_none(), "{what}: zero tokens");
        }
    }

    check_replay(store, program, &fork, &exec.outputs);
}

#[derive(Clone, Debug)]
struct NoEdit {
    program: Program,
    at: Index,
}

fn no_edit() -> impl Strategy<Value = NoEdit> {
    (program(), any::<Index>()).prop_map(|(program, at)| NoEdit { program, at })
}

fn check_no_edit(store: &Arc<dyn Store>, case: &NoEdit) {
    let program = &case.program;
    let rec = record(store, program);
    // Any seq of the source, or one past its end (everything inherited).
    let at = case.at.index(rec.events.len() + 1) as u64 + 1;
    let f = Session::fork_new(store.clone(), &rec.run, Some(at), vec![], SessionOptions::default())
        .unwrap_or_else(|e| panic!("--at {at}: {e}"));
    let fork = f.run_id();
    let exec = execute(&f, program).unwrap_or_else(|e| panic!("fork --at {at}: {e}"));
    let report = f.finish(Outcome::default()).unwrap_or_else(|e| panic!("fork --at {at}: {e}"));
    assert_eq!(exec.ran(), BTreeSet::new(), "--at {at}: a fork with no edits runs nothing live");
    assert_eq!(report.live_calls, 0);
    assert_eq!(exec.outputs, rec.outputs);
    assert_eq!(store.run(&fork).unwrap().status, RunStatus::Ok);

    let events = all_events(store, &fork);
    assert_eq!(events.len(), rec.events.len());
    for (e, src) in events.iter().zip(&rec.events) {
        let what = format!("--at {at}: seq {} ({})", src.seq, src.label());
        if src.seq < at {
            assert_eq!(e, src, "{what}: inherited as is");
            continue;
        }
        assert_eq!((e.seq, e.kind, &e.name, &e.agent_id), (src.seq, src.kind, &src.name, &src.agent_id));
        assert_eq!(e.run_id, fork, "{what}");
        assert_eq!(e.source, Source::Recorded, "{what}");
        assert_eq!(e.origin_seq, Some(src.seq), "{what}");
        assert_eq!((e.key, e.output_hash), (src.key, src.output_hash), "{what}");
        assert!(e.usage.is_none(), "{what}: zero tokens");
    }

    check_replay(store, program, &fork, &rec.outputs);
}

fn config() -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 48;
    }
    config
}

fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn one_edit_runs_live_exactly_the_steps_whose_inputs_changed(case in one_edit()) {
        check_one_edit(&memory(), &case);
    }

    #[test]
    fn a_fork_without_edits_runs_nothing_live_at_any_seq_and_replays_exactly(case in no_edit()) {
        check_no_edit(&memory(), &case);
    }
}

/// The generator's dependency sets are what the property is checked against: spot-check them.
#[test]
fn dependents_are_the_transitive_closure_without_the_edited_step() {
    let step = |deps: &[usize]| Step { agent: 0, kind: Kind::Tool(0), deps: deps.to_vec() };
    // 0 → 1 → 3, 0 → 2, 4 independent, 5 ← 3 and 4.
    let program = Program {
        agents: 1,
        steps: vec![step(&[]), step(&[0]), step(&[0]), step(&[1]), step(&[]), step(&[3, 4])],
    };
    assert_eq!(program.dependents(0), BTreeSet::from([1, 2, 3, 5]));
    assert_eq!(program.dependents(1), BTreeSet::from([3, 5]));
    assert_eq!(program.dependents(4), BTreeSet::from([5]));
    assert_eq!(program.dependents(5), BTreeSet::new());
}
