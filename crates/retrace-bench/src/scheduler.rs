//! Replay scheduler overhead (issue 3): what replay through the Session (default, non-strict
//! scheduler) costs per step beyond answering the same steps straight from the store, with 2, 16
//! and 128 agents running as tokio tasks.
//!
//! The recorded run: every agent takes its share of ~100k (quick: ~10k) tool steps with ~1 KB
//! requests and outputs, on a SQLite store with batch durability. Both sides below run the same
//! agents as tokio tasks on the same runtime, from the same pre-built requests:
//!
//! - **replay**: `Session::replay` (log load), every step through `Agent::tool_async`, `finish`.
//! - **floor**: `RecordedLog::load`, then per step what any replay must do: the step's key
//!   (`KeyConfig::key` of the request), the agent's recorded step by key (`RecordedLog::take`),
//!   its output blob (`get_blob`, digest-verified) and the decoded output.
//!
//! The overhead is `(replay - floor) / steps`, paired per repeat; its median is held to 5 µs.
//! A second floor adds the two value conversions of the typed API (`to_value` of the
//! arguments, `from_value` of the output into the caller's type): the overhead beyond that one
//! is the scheduler's and the Session's own bookkeeping, reported for context.
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use retrace_core::json::Json;
use retrace_core::key::KeyConfig;
use retrace_core::{Digest, EventType};
use retrace_runtime::matcher::RecordedLog;
use retrace_runtime::{Outcome, RuntimeError, Session, SessionOptions};
use retrace_store::{Durability, Store};
use serde_json::Value;
use tokio::runtime::Runtime;

use crate::drive::{agent_name, spec, TOOL};
use crate::env::{note, Config};
use crate::payload::{output, request};
use crate::report::{median, print, Line, Target};

/// The agent counts measured.
pub const AGENTS: [usize; 3] = [2, 16, 128];

/// The most a replayed step may cost beyond the store, µs.
pub const BUDGET_US: f64 = 5.0;

/// Every this many steps the output served is checked (on both sides, so it cancels out).
const CHECK_EVERY: usize = 64;

/// Each agent's requests, built once outside every clock.
type Requests = Vec<Arc<Vec<Value>>>;

/// The payload seed of agent `a`'s step `i`.
fn seed(a: usize, i: usize) -> u64 {
    ((a as u64) << 32) | i as u64
}

/// A multi-thread tokio runtime as `#[tokio::main]` builds it (one worker per core).
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("starting a tokio runtime")
}

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let total: usize = cfg.pick(10_000, 100_000);
    let rt = runtime();
    let store = cfg.store("scheduler", Durability::Batch);
    note(&format!(
        "scheduler: {total} tool steps (1 KB request + 1 KB output) split over {AGENTS:?} agents (tokio tasks), {} repeats",
        cfg.repeats
    ));
    let mut runs = Vec::new();
    for &agents in &AGENTS {
        let per = total / agents;
        let requests: Requests =
            (0..agents).map(|a| Arc::new((0..per).map(|i| request(seed(a, i))).collect())).collect();
        let began = Instant::now();
        let run_id = record(&rt, store.store.clone(), &requests);
        note(&format!(
            "recorded {} steps by {agents} agents in {:.1} s (setup)",
            per * agents,
            began.elapsed().as_secs_f64()
        ));
        runs.push((agents, run_id, requests));
    }
    store.sqlite.checkpoint().expect("checkpointing the recorded runs");

    // Per agent count: replay, floor, floor with conversions; each repeat in a rotated order.
    let mut results: Vec<[Vec<f64>; 3]> = vec![Default::default(); AGENTS.len()];
    for r in 0..cfg.repeats {
        for ((_, run_id, requests), times) in runs.iter().zip(&mut results) {
            let steps = requests.iter().map(|r| r.len()).sum::<usize>() as f64;
            for side in (0..3).map(|i| (i + r) % 3) {
                let took = match side {
                    0 => replay(&rt, &store.store, run_id, requests),
                    _ => floor(&rt, &store.store, run_id, requests, side == 2),
                };
                times[side].push(took.as_secs_f64() * 1e6 / steps);
            }
        }
    }
    let us = "us/step";
    for ((agents, ..), [replays, floors, converted]) in runs.iter().zip(&results) {
        let beyond = |base: &[f64]| -> Vec<f64> { replays.iter().zip(base).map(|(r, f)| r - f).collect() };
        let floor = median(floors);
        print(
            lines,
            Line::new(
                &format!("scheduler.replay {agents} agents (Session)"),
                median(replays),
                us,
                Some(floor),
                Target::Info,
            ),
        );
        print(
            lines,
            Line::new(
                &format!("scheduler.overhead {agents} agents vs 5 us"),
                median(&beyond(floors)),
                us,
                Some(BUDGET_US),
                Target::RatioAtMost(1.0),
            ),
        );
        print(
            lines,
            Line::new(
                &format!("scheduler.overhead {agents}: beyond conversions"),
                median(&beyond(converted)),
                us,
                None,
                Target::Info,
            ),
        );
    }
}

/// Records every agent's steps as its own tokio task (pipelined); returns the run id.
fn record(rt: &Runtime, store: Arc<dyn Store>, requests: &Requests) -> String {
    let options = SessionOptions { wait_for_ack: false, ..SessionOptions::default() };
    let session = Session::record(store, options).expect("starting a recording");
    rt.block_on(async {
        let tasks: Vec<_> = requests
            .iter()
            .enumerate()
            .map(|(a, reqs)| {
                let reqs = reqs.clone();
                session.spawn(&agent_name(a), move |agent| async move {
                    for (i, req) in reqs.iter().enumerate() {
                        let out = output(seed(a, i));
                        let _: Value = agent
                            .tool_async(TOOL, req, spec(), || async move { Ok::<_, String>(out) })
                            .await?;
                    }
                    Ok(())
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("an agent task panicked").expect("recording a step");
        }
    });
    session.finish(Outcome::default()).expect("finishing a recording");
    session.run_id()
}

/// The whole program replayed through a new replay session: open (log load), every agent's
/// steps as its own task, finish.
fn replay(rt: &Runtime, store: &Arc<dyn Store>, run_id: &str, requests: &Requests) -> Duration {
    let began = Instant::now();
    let session =
        Session::replay(store.clone(), run_id, SessionOptions::default()).expect("opening a replay");
    rt.block_on(async {
        let tasks: Vec<_> = requests
            .iter()
            .enumerate()
            .map(|(a, reqs)| {
                let reqs = reqs.clone();
                session.spawn(&agent_name(a), move |agent| async move {
                    for (i, req) in reqs.iter().enumerate() {
                        let value: Value = agent
                            .tool_async(TOOL, req, spec(), || async {
                                Err::<Value, _>("replay ran a live call".to_owned())
                            })
                            .await?;
                        check(&value, a, i).map_err(RuntimeError::Usage)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("an agent task panicked").expect("replaying a step");
        }
    });
    session.finish(Outcome::default()).expect("the replay matched");
    began.elapsed()
}

/// The same steps served from the store without the Session: log load, then per step key,
/// take by key, output blob and decode, each agent on its own task. With `conversions`, also
/// the typed API's: the arguments to a JSON value and the output into the caller's type.
fn floor(
    rt: &Runtime,
    store: &Arc<dyn Store>,
    run_id: &str,
    requests: &Requests,
    conversions: bool,
) -> Duration {
    let began = Instant::now();
    let log = Arc::new(RecordedLog::load(store.as_ref(), run_id).expect("loading the recorded log"));
    rt.block_on(async {
        let tasks: Vec<_> = requests
            .iter()
            .enumerate()
            .map(|(a, reqs)| {
                let (reqs, log, store) = (reqs.clone(), log.clone(), store.clone());
                tokio::spawn(async move {
                    let (keys, agent) = (KeyConfig::default(), agent_name(a));
                    for (i, req) in reqs.iter().enumerate() {
                        if conversions {
                            black_box(serde_json::to_value(req).expect("arguments"));
                        }
                        let step = log.take(&agent, &key(&keys, req)).expect("the step is recorded");
                        let bytes = store.get_blob(&step.output_ref.expect("an output")).expect("its output");
                        let mut value: Value = serde_json::from_slice(&bytes).expect("output JSON");
                        if conversions {
                            value = serde_json::from_value(value).expect("the caller's type");
                        }
                        check(&value, a, i).expect("the recorded output");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a floor task panicked");
        }
    });
    assert!(log.leftovers().is_empty(), "the floor served every step");
    began.elapsed()
}

/// The key replay computes for a tool step with `request`.
fn key(keys: &KeyConfig, request: &Value) -> Digest {
    keys.key(EventType::ToolCall, Some(TOOL), Some("1"), &Json::from_value(request))
        .expect("a canonical request")
}

/// Every [`CHECK_EVERY`]th output must be agent `a`'s step `i`.
#[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` needs Rust 1.87; the workspace supports 1.85.
fn check(value: &Value, a: usize, i: usize) -> Result<(), String> {
    if i % CHECK_EVERY == 0 && value["id"] != format!("call-{}", seed(a, i)).as_str() {
        return Err(format!("agent {a} step {i} got output {}", value["id"]));
    }
    Ok(())
}
