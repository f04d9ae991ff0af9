//! The Rust runtime as a client of the daemon (`Session::connect`, what `Session::from_env`
//! opens under `RETRACE_URL`): a two-agent program records through the daemon's scheduler (one
//! sequencer, dense seqs), replays with zero live calls (no closure runs), and a changed tool
//! argument is a divergence naming the step. Under a launcher, `finish` leaves the verdict to
//! the launcher.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use retrace_core::run::RunStatus;
use retrace_core::EventType;
use retrace_runtime::{
    DaemonRun, ModelCall, ModelReply, Outcome, RuntimeError, RuntimeResult, Session, SessionOptions, ToolSpec,
};
use serde_json::{json, Value};

use crate::support::{daemon_over, sqlite};

/// The program: a tool of each class, a model call, a clock read, a random id, a message from
/// planner to reviewer, and a decision. `calls` counts the program's own functions that ran.
async fn program(session: &Session, calls: &Arc<AtomicUsize>, limit: u64) -> RuntimeResult<String> {
    let planner = session.agent("planner");
    let reviewer = session.agent("reviewer");
    let c = calls.clone();
    let rows: Vec<u64> = planner
        .tool_async("sql.query", &json!({ "limit": limit }), ToolSpec::deterministic("1"), || async move {
            c.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(vec![1, 2, 3])
        })
        .await?;
    let c = calls.clone();
    let rate: f64 = reviewer.tool("fx.rate", "eur", ToolSpec::time_bound("1", 60), || {
        c.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(1.25)
    })?;
    let now = planner.now_ms()?;
    let id = planner.random_id()?;
    let call = ModelCall {
        provider: "openai".into(),
        endpoint: "chat.completions".into(),
        body: json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "plan"}]}),
    };
    let c = calls.clone();
    let reply = planner
        .model_async(&call, |_body| async move {
            c.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(ModelReply {
                body: json!({"choices": [{"message": {"content": "backfill"}}]}),
                snapshot: Some("gpt-4o-mini-2024-07-18".into()),
                usage: None,
            })
        })
        .await?;
    planner.send("reviewer", "plan", &json!({ "rows": rows, "id": id }), None).await?;
    let heard = reviewer.recv(Some(Duration::from_secs(5))).await?.expect("the plan arrives");
    let c = calls.clone();
    let sent: Value =
        reviewer.tool("email.send", &json!({"to": "ops"}), ToolSpec::side_effect("1"), || {
            c.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(json!({"queued": true}))
        })?;
    reviewer.decide("approve", Some("step:backfill"))?;
    Ok(format!(
        "rows={rows:?} rate={rate} now={now} id={id} reply={} heard={} sent={sent}",
        reply["choices"][0]["message"]["content"], heard.body
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rust_program_records_and_replays_through_the_daemon() {
    let (store, _home) = sqlite();
    let nowhere = "http://127.0.0.1:9".to_owned();
    let d = daemon_over(store.clone(), nowhere.clone(), nowhere, |_| {}).await;

    // Record: every function runs once, and the daemon is the run's one sequencer.
    let calls = Arc::new(AtomicUsize::new(0));
    let rec = Session::connect(&d.base, DaemonRun::New, SessionOptions::default()).unwrap();
    let recorded = program(&rec, &calls, 10).await.unwrap();
    let report = rec.finish(Outcome { exit_status: Some(0) }).unwrap();
    assert_eq!(report.status.to_string(), "ok");
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    let run = report.run_id;
    let events = store.events(&run, 1, 100).unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "dense seqs");
    let types: Vec<EventType> = events.iter().map(|e| e.kind).collect();
    for kind in [
        EventType::ToolCall,
        EventType::Intent,
        EventType::ModelCall,
        EventType::Clock,
        EventType::Random,
        EventType::Send,
        EventType::Deliver,
        EventType::Decision,
    ] {
        assert!(types.contains(&kind), "{kind} in {types:?}");
    }
    let model = events.iter().find(|e| e.kind == EventType::ModelCall).unwrap();
    assert_eq!(model.name.as_deref(), Some("openai/chat.completions"));
    assert_eq!(model.model.as_ref().and_then(|m| m.snapshot.as_deref()), Some("gpt-4o-mini-2024-07-18"));

    // Replay: the same answers, and not one function runs.
    let calls = Arc::new(AtomicUsize::new(0));
    let replay =
        Session::connect(&d.base, DaemonRun::Replay(run.clone()), SessionOptions::default()).unwrap();
    assert_eq!(replay.source_run().as_deref(), Some(run.as_str()));
    let replayed = program(&replay, &calls, 10).await.unwrap();
    let report = replay.finish(Outcome { exit_status: Some(0) }).unwrap();
    assert_eq!((replayed, calls.load(Ordering::SeqCst), report.live_calls), (recorded, 0, 0));
    assert_eq!(report.status.to_string(), "ok");

    // A changed argument: a divergence naming the step, and the first differing path.
    let changed = Session::connect(&d.base, DaemonRun::Replay(run), SessionOptions::default()).unwrap();
    let err = program(&changed, &calls, 11).await.unwrap_err();
    let d = err.divergence().unwrap_or_else(|| panic!("a divergence, not {err}"));
    assert_eq!(
        (d.agent.as_str(), d.step.as_deref(), d.seq),
        ("planner", Some("tool_call sql.query"), Some(1))
    );
    assert_eq!(d.path.as_deref(), Some("$.limit"));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert!(changed.finish(Outcome { exit_status: Some(0) }).unwrap_err().divergence().is_some());
}

#[test]
fn an_unreachable_daemon_is_named() {
    let err = Session::connect("http://127.0.0.1:9", DaemonRun::New, SessionOptions::default()).unwrap_err();
    assert!(matches!(&err, RuntimeError::Daemon { code, .. } if code == "unreachable"), "{err}");
    assert!(err.to_string().contains("http://127.0.0.1:9"), "{err}");
}

/// Under a launcher (`retrace replay -- CMD`) the program's session joins the launcher's run,
/// and its `finish` can't judge what was left: another process of the command may still take
/// those steps. So it reports the run as still `running` (not `ok`), and the launcher's own
/// finish, once the program has exited, finds the steps left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_a_launcher_finish_reports_running_and_the_launcher_judges_the_steps_left() {
    let (store, _home) = sqlite();
    let nowhere = "http://127.0.0.1:9".to_owned();
    let d = daemon_over(store, nowhere.clone(), nowhere, |_| {}).await;
    let step = |a: &retrace_runtime::Agent, n: u64| {
        a.tool("sql.count", &json!({ "n": n }), ToolSpec::deterministic("1"), || Ok::<_, String>(n))
    };
    let rec = Session::connect(&d.base, DaemonRun::New, SessionOptions::default()).unwrap();
    let planner = rec.agent("planner");
    step(&planner, 1).unwrap();
    step(&planner, 2).unwrap();
    let run = rec.finish(Outcome { exit_status: Some(0) }).unwrap().run_id;

    // What `retrace replay RUN -- CMD` does: the launcher makes the replay run and hands its id
    // to the program, which joins it and skips its second step.
    let replay = d.replay_of(&run).await;
    let program =
        Session::connect(&d.base, DaemonRun::Join(replay.clone()), SessionOptions::default()).unwrap();
    step(&program.agent("planner"), 1).unwrap();
    let report = program.finish(Outcome { exit_status: Some(0) }).unwrap();
    assert_eq!((report.run_id.as_str(), report.status), (replay.as_str(), RunStatus::Running));

    // The launcher ends the run after the program exits: that is the verdict.
    let verdict = d.finish(&replay).await;
    assert_eq!(verdict["status"], "diverged", "{verdict}");
    assert_eq!(verdict["divergence"]["code"], "steps_left", "{verdict}");
    assert_eq!(verdict["divergence"]["seq"], 2, "{verdict}");

    // `RETRACE_MODE=fork` names the fork run `retrace fork` made: a recording, running or not,
    // is refused before any step (it would record into it live), and so is a replay.
    let running = Session::connect(&d.base, DaemonRun::New, SessionOptions::default()).unwrap();
    for other in [run.clone(), running.run_id(), replay.clone()] {
        let err = Session::connect(&d.base, DaemonRun::Fork(other.clone()), SessionOptions::default())
            .err()
            .unwrap_or_else(|| panic!("fork of {other} refused"));
        assert!(err.to_string().contains("not a fork") && err.to_string().contains(&other), "{err}");
    }
    assert_eq!(d.store.last_seq(&running.run_id()).unwrap(), 0, "nothing recorded into it");
}

/// SPEC §2 through the daemon too (the QA's `trio nan`): a message body holding NaN is refused
/// in the program, naming the step, before anything is posted, so the run holds no send.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_body_holding_nan_is_refused_before_it_reaches_the_daemon() {
    let (store, _home) = sqlite();
    let nowhere = "http://127.0.0.1:9".to_owned();
    let d = daemon_over(store.clone(), nowhere.clone(), nowhere, |_| {}).await;
    let rec = Session::connect(&d.base, DaemonRun::New, SessionOptions::default()).unwrap();
    let mut nan = std::collections::BTreeMap::from([("rid", 1.0)]);
    nan.insert("nan", f64::NAN);
    let err = rec.agent("planner").send("reviewer", "score", &nan, None).await.unwrap_err();
    assert!(err.to_string().contains("send reviewer") && err.to_string().contains("$.nan"), "{err}");
    rec.agent("planner").send("reviewer", "score", &json!({ "rid": 1 }), None).await.unwrap();
    let run = rec.finish(Outcome { exit_status: Some(0) }).unwrap().run_id;
    let sends = store.events(&run, 1, 100).unwrap();
    assert_eq!(sends.iter().filter(|e| e.kind == EventType::Send).count(), 1, "only the finite one");
}

/// A program whose agent task still waits in a remote `recv` with no timeout when its runtime
/// shuts down (main returned, or dropped the runtime) exits: the dropped request closes its
/// connection, so the blocking exchange ends rather than holding the runtime's shutdown for good
/// (QA18 D1), and the daemon drops the wait, so the message sent afterwards goes to the next
/// `recv`, not the abandoned one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runtime_shut_down_while_an_agent_waits_in_recv_exits_and_the_wait_takes_no_message() {
    let (store, _home) = sqlite();
    let nowhere = "http://127.0.0.1:9".to_owned();
    let d = daemon_over(store, nowhere.clone(), nowhere, |_| {}).await;
    let rec = Session::connect(&d.base, DaemonRun::New, SessionOptions::default()).unwrap();
    let (waiter, sender) = (rec.agent("waiter"), rec.agent("sender"));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        rt.spawn(async move { waiter.recv(None).await });
        std::thread::sleep(Duration::from_millis(300)); // the recv is in flight at the daemon
        drop(rt);
        done_tx.send(()).unwrap();
    });
    let dropped =
        tokio::task::spawn_blocking(move || done_rx.recv_timeout(Duration::from_secs(20))).await.unwrap();
    assert!(dropped.is_ok(), "the runtime's shutdown waited on the recv");
    tokio::time::sleep(Duration::from_millis(300)).await; // the daemon notices the closed connection
    let seq = sender.send("waiter", "ping", &json!({"n": 1}), None).await.unwrap();
    let heard = rec.agent("waiter").recv(Some(Duration::from_secs(5))).await.unwrap();
    assert_eq!(heard.map(|m| m.seq), Some(seq), "the abandoned recv took no message");
    rec.finish(Outcome { exit_status: Some(0) }).unwrap();
}

/// A session of a run it created on the daemon, dropped without `finish` (a panic, an early
/// return), leaves the run `interrupted`, as an in-process session does (QA18 D4: it stayed
/// `running` as long as the daemon lived, and replay refused it as still being recorded).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_daemon_run_whose_session_is_dropped_unfinished_is_interrupted() {
    let (store, _home) = sqlite();
    let nowhere = "http://127.0.0.1:9".to_owned();
    let d = daemon_over(store, nowhere.clone(), nowhere, |_| {}).await;
    let rec = Session::connect(&d.base, DaemonRun::New, SessionOptions::default()).unwrap();
    let a = rec.agent("a");
    a.tool("count", &json!({"n": 1}), ToolSpec::deterministic("1"), || Ok::<_, String>(1)).unwrap();
    let run = rec.run_id();
    drop((a, rec));
    let meta = d.store.run(&run).unwrap();
    assert_eq!(meta.status, RunStatus::Interrupted);
    assert!(meta.labels["failure"].contains("without finishing"), "{:?}", meta.labels);
    assert_eq!(d.store.last_seq(&run).unwrap(), 1, "its step is kept");
}
