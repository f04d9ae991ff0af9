//! Counterfactual forks (issue 4): a fork of a 10,000-step run (quick: 2,000) at its midpoint
//! with one `tool-output:SEQ=@blob` edit whose effect reaches 1% of the downstream steps, every
//! model call taking 20 ms live. Exactly the reached steps run live (asserted), and the fork's
//! wall time is held to at most 1/20 of re-running the whole program live (steps × 20 ms plus
//! the recording's own overhead, measured when the source run is recorded).
//!
//! The program, one agent: step `i` is a model call with a ~1 KB request and output, except the
//! midpoint, a `lookup` tool call; every 100th model call after it carries the lookup's output
//! in its request. The edit replaces the lookup's output, so those calls (1% of the steps after
//! the fork point) change and run live; every other step is served from the source.
//!
//! Also `retrace diff` (`diff_runs`) of a 100,000-step run (quick: 20,000) against such a
//! fork of it, held to 1 s.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use retrace_core::canonical::canonical_value;
use retrace_core::edit::Edit;
use retrace_core::Source;
use retrace_runtime::{Agent, ModelCall, ModelReply, Outcome, RuntimeResult, Session, SessionOptions};
use retrace_store::diff::{diff_runs, DiffOptions};
use retrace_store::export::RunEvents;
use retrace_store::{BlobHint, Durability, Store};
use serde_json::{json, Value};

use crate::drive::spec;
use crate::env::{note, Config};
use crate::payload::{output, request};
use crate::report::{median, print, Line, Target};

/// A live model call's latency.
pub const MODEL_LATENCY: Duration = Duration::from_millis(20);

/// The fork must be at least this many times faster than a live re-run.
pub const TIMES_FASTER: f64 = 20.0;

/// Every this many steps after the midpoint, a model call depends on the lookup.
const EVERY: u64 = 100;

/// The agent.
const AGENT: &str = "worker";

/// The step (and seq) of the lookup, and the fork point.
fn midpoint(n: u64) -> u64 {
    n / 2
}

/// Whether step `i` of an `n`-step program carries the lookup's output.
#[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` needs Rust 1.87; the workspace supports 1.85.
fn depends(n: u64, i: u64) -> bool {
    i > midpoint(n) && i % EVERY == 0
}

/// The steps the edit reaches.
fn affected(n: u64) -> usize {
    (midpoint(n) + 1..=n).filter(|&i| depends(n, i)).count()
}

/// The program: `n` steps by one agent; each live model call sleeps `latency` and is counted
/// in `live`.
fn program(agent: &Agent, n: u64, latency: Duration, live: &AtomicUsize) -> RuntimeResult<()> {
    let m = midpoint(n);
    let mut looked_up = Value::Null;
    for i in 1..=n {
        if i == m {
            looked_up = agent.tool("lookup", &json!({"step": i}), spec(), || {
                Ok::<_, String>(json!({"rate": 42, "step": i}))
            })?;
            continue;
        }
        let mut body = request(i);
        body["model"] = "sim-1".into();
        if depends(n, i) {
            body["lookup"] = looked_up.clone();
        }
        let call = ModelCall { provider: "sim".into(), endpoint: "chat".into(), body };
        agent.model(&call, |sent| {
            live.fetch_add(1, Ordering::Relaxed);
            if !latency.is_zero() {
                std::thread::sleep(latency);
            }
            let mut reply = output(i);
            reply["lookup"] = sent.get("lookup").cloned().unwrap_or(Value::Null);
            Ok::<_, String>(ModelReply { body: reply, snapshot: None, usage: None })
        })?;
    }
    Ok(())
}

/// Records the program (no latency); returns the run id and the wall time.
fn record(store: &std::sync::Arc<dyn Store>, n: u64, wait_for_ack: bool) -> (String, Duration) {
    let began = Instant::now();
    let options = SessionOptions { wait_for_ack, ..SessionOptions::default() };
    let session = Session::record(store.clone(), options).expect("starting a recording");
    let live = AtomicUsize::new(0);
    program(&session.agent(AGENT), n, Duration::ZERO, &live).expect("recording the program");
    session.finish(Outcome::default()).expect("finishing the recording");
    assert_eq!(live.load(Ordering::Relaxed) as u64, n - 1, "every model call ran live");
    (session.run_id(), began.elapsed())
}

/// Forks `source` at its midpoint with the lookup's output replaced by `{"rate": rate}` and
/// runs the program in it. Returns the fork's id, its wall time (fork creation to `finish`) and
/// the live calls made.
fn fork(
    store: &std::sync::Arc<dyn Store>,
    source: &str,
    n: u64,
    rate: u64,
    latency: Duration,
    wait_for_ack: bool,
) -> (String, Duration, usize) {
    let m = midpoint(n);
    let edited = canonical_value(&json!({"rate": rate, "step": m})).expect("canonical");
    let blob = store.put_blob(&edited, BlobHint::Raw).expect("storing the edit");
    let edit: Edit = format!("tool-output:{m}=@{blob}").parse().expect("an edit");
    let live = AtomicUsize::new(0);
    let options = SessionOptions { wait_for_ack, ..SessionOptions::default() };
    let began = Instant::now();
    let session = Session::fork_new(store.clone(), source, Some(m), vec![edit], options).expect("forking");
    program(&session.agent(AGENT), n, latency, &live).expect("running the fork");
    let report = session.finish(Outcome::default()).expect("finishing the fork");
    let wall = began.elapsed();
    let live = live.load(Ordering::Relaxed);
    assert_eq!(report.live_calls, live, "the session counted the live calls made");
    (session.run_id(), wall, live)
}

/// The fork's own events that ran live.
fn live_events(store: &dyn Store, fork: &str) -> usize {
    let mut pages = RunEvents::new(store, fork).expect("reading the fork");
    let mut live = 0;
    while let Some(page) = pages.next_page().expect("a page") {
        live += page.iter().filter(|e| e.run_id == fork && e.source == Source::Live).count();
    }
    live
}

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let n: u64 = cfg.pick(2_000, 10_000);
    let reached = affected(n);
    let store = cfg.store("fork", Durability::Batch);
    let (source, recorded) = record(&store.store, n, true);
    let reference = n as f64 * MODEL_LATENCY.as_secs_f64() + recorded.as_secs_f64();
    note(&format!(
        "fork: {n}-step source recorded in {:.2} s (acked, no latency); a live re-run at {} ms a call \
         takes >= {reference:.1} s; forking at {} with 1 edit reaching {reached} steps, {} repeats",
        recorded.as_secs_f64(),
        MODEL_LATENCY.as_millis(),
        midpoint(n),
        cfg.repeats
    ));
    let mut walls = Vec::new();
    for r in 0..cfg.repeats as u64 {
        // A new edited value each time, so no repeat finds the previous one's calls cached.
        let (id, wall, live) = fork(&store.store, &source, n, 1_000 + r, MODEL_LATENCY, true);
        assert_eq!(live, reached, "live calls are exactly the steps the edit reaches");
        assert_eq!(live_events(store.store.as_ref(), &id), reached, "the fork's live events");
        walls.push(wall.as_secs_f64());
    }
    let label = if cfg.quick { "2k" } else { "10k" };
    let wall = median(&walls);
    print(
        lines,
        Line::new(
            &format!("fork.{label} steps, live calls (= reached)"),
            reached as f64,
            "calls",
            Some((n - midpoint(n)) as f64),
            Target::Info,
        ),
    );
    print(
        lines,
        Line::new(
            &format!("fork.{label} steps at mid, 1% reached, 20 ms"),
            wall,
            "s",
            Some(reference),
            Target::TimesBelow(TIMES_FASTER),
        ),
    );
    print(
        lines,
        Line::new(
            &format!("fork.{label}: {reached} live calls x 20 ms alone"),
            reached as f64 * MODEL_LATENCY.as_secs_f64(),
            "s",
            None,
            Target::Info,
        ),
    );
    drop(store);
    diff(cfg, lines);
}

/// `diff_runs` of a recorded run and a fork of it (as above, no latency).
fn diff(cfg: &Config, lines: &mut Vec<Line>) {
    let n: u64 = cfg.pick(20_000, 100_000);
    let store = cfg.store("diff", Durability::Batch);
    let began = Instant::now();
    let (source, _) = record(&store.store, n, false);
    let (fork_id, _, live) = fork(&store.store, &source, n, 7, Duration::ZERO, false);
    assert_eq!(live, affected(n));
    store.sqlite.checkpoint().expect("checkpointing");
    note(&format!("diff: {n}-step source and its fork built in {:.1} s", began.elapsed().as_secs_f64()));
    let options = DiffOptions::default();
    let mut times = Vec::new();
    for _ in 0..cfg.repeats {
        let began = Instant::now();
        let d = diff_runs(store.store.as_ref(), &source, &fork_id, &options).expect("diffing");
        times.push(began.elapsed().as_secs_f64());
        assert_eq!(d.counts.changed, live as u64 + 1, "the edited lookup and the calls it reached");
        assert_eq!((d.counts.only_in_a, d.counts.only_in_b), (0, 0));
        assert_eq!(d.counts.same + d.counts.changed, n);
    }
    let label = if cfg.quick { "20k" } else { "100k" };
    print(
        lines,
        Line::new(
            &format!("diff {label}-step run vs its fork vs 1 s"),
            median(&times),
            "s",
            Some(1.0),
            Target::RatioAtMost(1.0),
        ),
    );
}
