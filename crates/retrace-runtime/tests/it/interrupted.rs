//! Replaying an interrupted recording (SPEC §7): the replay serves its events and then stops with
//! `log_ended`, "the recording ends at seq N", N its last stored seq, whether the program
//! finishes after consuming every recorded step (the recording holds no outcome to compare its
//! ending with, so the replay can't be a match), asks for one step more, or stops short.
use std::sync::Arc;

use retrace_core::run::RunStatus;
use retrace_core::{Divergence, DivergenceCode};
use retrace_runtime::{Agent, Outcome, RunReport, RuntimeError, Session, SessionOptions, ToolSpec};
use retrace_store::{open_store, Store, StoreConfig};
use serde_json::json;

/// Agent `a`'s `i`-th step: a tool call (replay answers it from the log; nothing runs).
fn step(agent: &Agent, i: u64) -> Result<u64, RuntimeError> {
    agent.tool("count", &json!({"i": i}), ToolSpec::deterministic("1"), || Ok::<_, String>(i * 10))
}

/// Records `steps` tool calls (and a clock read between them: two kinds of step) into the SQLite
/// store in `home`, then lets the session go unfinished, as a recorder that dies does, and opens
/// the store again: the run is `interrupted`. Returns the store, the run and its last seq.
fn interrupted(home: &std::path::Path, steps: u64) -> (Arc<dyn Store>, String, u64) {
    let config = StoreConfig::in_home(home);
    let store = open_store(&config).unwrap();
    let session = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let agent = session.agent("a");
    for i in 0..steps {
        assert_eq!(step(&agent, i).unwrap(), i * 10);
    }
    agent.now_ms().unwrap();
    let run = session.run_id();
    session.flush().unwrap();
    drop(agent);
    drop(session);
    drop(store);
    let store = open_store(&config).unwrap();
    let meta = store.run(&run).unwrap();
    assert_eq!(meta.status, RunStatus::Interrupted);
    assert_eq!(meta.exit_status, None, "a recorder that died recorded no exit status");
    let last = store.last_seq(&run).unwrap();
    assert_eq!(last, steps + 1, "every step was stored");
    (store, run, last)
}

/// Replays `run`, taking its first `steps` tool calls and then the clock read when `clock`.
fn replay(store: &Arc<dyn Store>, run: &str, steps: u64, clock: bool) -> (Session, Agent) {
    let r = Session::replay(store.clone(), run, SessionOptions::default()).unwrap();
    let agent = r.agent("a");
    for i in 0..steps {
        assert_eq!(step(&agent, i).unwrap(), i * 10, "recorded outputs are served");
    }
    if clock {
        agent.now_ms().unwrap();
    }
    (r, agent)
}

/// The divergence `finish` ended with, checked against what the store holds for the replay.
fn finished_with(
    store: &Arc<dyn Store>,
    r: &Session,
    finished: Result<RunReport, RuntimeError>,
) -> Divergence {
    let d = finished.expect_err("an interrupted recording never replays ok").divergence().cloned().unwrap();
    let meta = store.run(&r.run_id()).unwrap();
    assert_eq!(meta.status, RunStatus::Diverged);
    assert_eq!(meta.divergence, Some(d.to_json()), "the report is stored with the replay");
    d
}

#[test]
fn a_program_that_takes_every_recorded_step_and_finishes_ends_at_the_recording_s_end() {
    let home = tempfile::tempdir().unwrap();
    let (store, run, last) = interrupted(home.path(), 3);
    let (r, _agent) = replay(&store, &run, 3, true);
    let d = finished_with(&store, &r, r.finish(Outcome { exit_status: Some(0) }));
    assert_eq!(d.code, DivergenceCode::LogEnded, "{d}");
    assert_eq!(d.seq, Some(last), "{d}");
    assert!(d.detail.contains(&format!("the recording ends at seq {last}")), "{d}");
    assert!(d.to_string().starts_with(&format!("divergence [log_ended] at seq {last}")), "{d}");
}

#[test]
fn a_step_past_the_recording_s_end_is_log_ended_at_its_last_seq() {
    let home = tempfile::tempdir().unwrap();
    let (store, run, last) = interrupted(home.path(), 3);
    let (r, agent) = replay(&store, &run, 3, true);
    let err = step(&agent, 3).unwrap_err();
    let d = err.divergence().cloned().expect("a divergence");
    assert_eq!(d.code, DivergenceCode::LogEnded, "{d}");
    assert_eq!((d.seq, d.agent.as_str()), (Some(last), "a"), "{d}");
    assert_eq!(d.step.as_deref(), Some("tool_call count"), "{d}");
    assert!(d.detail.contains(&format!("the recording ends at seq {last}")), "{d}");
    // The first divergence is the run's: finishing reports the same one.
    assert_eq!(finished_with(&store, &r, r.finish(Outcome { exit_status: Some(0) })), d);
}

#[test]
fn a_program_that_stops_short_still_ends_at_the_recording_s_end_and_names_what_is_left() {
    let home = tempfile::tempdir().unwrap();
    let (store, run, last) = interrupted(home.path(), 3);
    let (r, _agent) = replay(&store, &run, 2, false);
    let d = finished_with(&store, &r, r.finish(Outcome { exit_status: Some(0) }));
    assert_eq!((d.code, d.seq), (DivergenceCode::LogEnded, Some(last)), "{d}");
    assert!(
        d.detail.iter().any(|l| l == "agent \"a\": first unconsumed step is seq 3 (tool_call count)"),
        "{d}"
    );
}

#[test]
fn a_finished_recording_replayed_the_same_way_is_ok() {
    // The contrast: the same steps, recorded to the end, replay clean.
    let home = tempfile::tempdir().unwrap();
    let store = open_store(&StoreConfig::in_home(home.path())).unwrap();
    let session = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let agent = session.agent("a");
    (0..3).for_each(|i| assert_eq!(step(&agent, i).unwrap(), i * 10));
    agent.now_ms().unwrap();
    let run = session.finish(Outcome { exit_status: Some(0) }).unwrap().run_id;
    let (r, _agent) = replay(&store, &run, 3, true);
    assert_eq!(r.finish(Outcome { exit_status: Some(0) }).unwrap().status, RunStatus::Ok);
}

#[test]
fn a_recv_past_the_recording_s_end_is_log_ended_too() {
    let home = tempfile::tempdir().unwrap();
    let config = StoreConfig::in_home(home.path());
    let store = open_store(&config).unwrap();
    let session = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let (a, b) = (session.agent("a"), session.agent("b"));
    a.send_blocking("b", "note", &json!({"n": 1}), None).unwrap();
    let heard = b.recv_blocking(Some(std::time::Duration::from_secs(5))).unwrap().expect("a message");
    let run = session.run_id();
    session.flush().unwrap();
    drop((a, b, session, store));
    let store = open_store(&config).unwrap();
    assert_eq!(store.run(&run).unwrap().status, RunStatus::Interrupted);
    let last = store.last_seq(&run).unwrap();

    let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
    let (a, b) = (r.agent("a"), r.agent("b"));
    a.send_blocking("b", "note", &json!({"n": 1}), None).unwrap();
    assert_eq!(b.recv_blocking(None).unwrap().expect("the recorded message").body, heard.body);
    let d = b.recv_blocking(None).unwrap_err().divergence().cloned().expect("a divergence");
    assert_eq!((d.code, d.seq, d.agent.as_str()), (DivergenceCode::LogEnded, Some(last), "b"), "{d}");
    assert!(d.detail.contains(&format!("the recording ends at seq {last}")), "{d}");
}

/// A replay or a fork dropped without `finish` (a panic, an early return) is stored
/// `interrupted`, as a recording is (QA18 D5: both stayed `running` for good).
#[test]
fn a_replay_or_fork_dropped_unfinished_is_interrupted() {
    let store: Arc<dyn Store> = Arc::new(retrace_store::memory::MemoryStore::new());
    let rec = Session::record(store.clone(), SessionOptions::default()).unwrap();
    step(&rec.agent("a"), 1).unwrap();
    let run = rec.finish(Outcome { exit_status: Some(0) }).unwrap().run_id;
    let replay = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
    step(&replay.agent("a"), 1).unwrap();
    let replay_run = replay.run_id();
    drop(replay);
    let fork = Session::fork_new(store.clone(), &run, Some(1), vec![], SessionOptions::default()).unwrap();
    step(&fork.agent("a"), 1).unwrap();
    let fork_run = fork.run_id();
    drop(fork);
    for id in [replay_run, fork_run] {
        assert_eq!(store.run(&id).unwrap().status, RunStatus::Interrupted, "{id}");
    }
}
