//! Record then replay through the Session API: outputs come back byte for byte, nothing live runs,
//! and every kind of divergence is reported with its code, seq, agent, keys and path.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use retrace_core::DivergenceCode;
use retrace_runtime::{ModelCall, ModelReply, Outcome, RuntimeError, Session, SessionOptions, ToolSpec};
use retrace_store::memory::MemoryStore;
use retrace_store::Store;
use serde_json::{json, Value};

fn store() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

/// A little program: two agents, every kind of step. `q` changes the planner's query.
fn program(s: &Session, q: &str, calls: &AtomicUsize) -> Result<Vec<Value>, RuntimeError> {
    let planner = s.agent("planner").with_role("planner");
    let reviewer = s.agent("reviewer");
    let mut seen = vec![];
    seen.push(json!(planner.now_ms()?));
    seen.push(json!(planner.random_id()?));
    seen.push(json!(reviewer.env("HOME")?));
    let rows: Value = planner.tool("sql.query", &json!({"q": q}), ToolSpec::deterministic("2"), || {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(json!({"rows": [[1, "a"]], "n": rand::random::<u32>()}))
    })?;
    seen.push(rows);
    let call = ModelCall {
        provider: "openai".into(),
        endpoint: "chat.completions".into(),
        body: json!({"model": "gpt-x", "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}),
    };
    let reply = reviewer.model(&call, |_body| {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(ModelReply {
            body: json!({"choices": [{"message": {"content": format!("hello {}", rand::random::<u16>())}}]}),
            snapshot: Some("gpt-x-2026-01-01".into()),
            usage: None,
        })
    })?;
    seen.push(reply);
    let sent: Value =
        reviewer.tool("email.send", &json!({"to": "ops"}), ToolSpec::side_effect("1"), || {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(json!({"queued": true}))
        })?;
    seen.push(sent);
    reviewer.decide("approve", Some("step:backfill"))?;
    Ok(seen)
}

fn record(store: &Arc<dyn Store>, q: &str) -> (String, Vec<Value>) {
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let calls = AtomicUsize::new(0);
    let seen = program(&s, q, &calls).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let report = s.finish(Outcome { exit_status: Some(0) }).unwrap();
    (report.run_id, seen)
}

#[test]
fn replay_returns_what_record_saw_and_runs_nothing() {
    let store = store();
    let (run, seen) = record(&store, "select 1");
    for _ in 0..3 {
        let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
        let calls = AtomicUsize::new(0);
        let again = program(&r, "select 1", &calls).unwrap();
        assert_eq!(again, seen);
        assert_eq!(calls.load(Ordering::SeqCst), 0, "replay must not call live functions");
        let report = r.finish(Outcome { exit_status: Some(0) }).unwrap();
        assert_eq!(report.live_calls, 0);
        assert_eq!(report.source_run.as_deref(), Some(run.as_str()));
    }
}

#[test]
fn a_changed_request_is_a_step_mismatch_with_the_path() {
    let store = store();
    let (run, _) = record(&store, "select 1");
    let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
    let err = program(&r, "select 2", &AtomicUsize::new(0)).unwrap_err();
    let d = err.divergence().expect("a divergence").clone();
    assert_eq!(d.code, DivergenceCode::StepMismatch);
    assert_eq!(d.agent, "planner");
    assert_eq!(d.seq, Some(4));
    assert_eq!(d.path.as_deref(), Some("$.q"));
    assert!(d.expected.is_some() && d.got.is_some() && d.expected != d.got);
    let text = d.to_string();
    assert!(text.contains("recorded $.q = \"select 1\""), "{text}");
    assert!(text.contains("replayed $.q = \"select 2\""), "{text}");
    // The run is stored as diverged, with the report.
    let finished = r.finish(Outcome { exit_status: Some(0) }).unwrap_err();
    assert!(finished.divergence().is_some());
    let meta = store.run(&r.run_id()).unwrap();
    assert_eq!(meta.status.as_str(), "diverged");
    assert_eq!(meta.divergence.unwrap()["code"], "step_mismatch");
}

#[test]
fn missing_steps_are_reported_at_the_end() {
    let store = store();
    let (run, _) = record(&store, "select 1");
    let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
    let planner = r.agent("planner");
    planner.now_ms().unwrap();
    let err = r.finish(Outcome { exit_status: Some(0) }).unwrap_err();
    let d = err.divergence().unwrap();
    assert_eq!(d.code, DivergenceCode::StepsLeft);
    assert_eq!(d.seq, Some(2));
    assert!(d.detail.iter().any(|l| l.contains("reviewer")), "{d}");
}

#[test]
fn an_extra_step_is_unexpected() {
    let store = store();
    let (run, _) = record(&store, "select 1");
    let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
    program(&r, "select 1", &AtomicUsize::new(0)).unwrap();
    let err = r.agent("planner").random_u64().unwrap_err();
    let d = err.divergence().unwrap();
    assert_eq!(d.code, DivergenceCode::UnexpectedStep);
    // Past the agent's recording, the divergence is about the last step it recorded.
    let events = store.events(&run, 1, 100).unwrap();
    let last = events.iter().filter(|e| e.agent_id == "planner").map(|e| e.seq).max();
    assert_eq!(d.seq, last, "{d}");
    assert!(d.to_string().contains(&format!("its last was seq {}", last.unwrap())), "{d}");
    assert!(!d.to_string().contains("stopped by"), "{d}");

    // A recording whose program a signal stopped says so: the replay ran on where it was stopped.
    let mut meta = store.run(&run).unwrap();
    meta.exit_status = Some(143);
    store.update_run(&meta).unwrap();
    let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
    program(&r, "select 1", &AtomicUsize::new(0)).unwrap();
    let err = r.agent("planner").random_u64().unwrap_err();
    let d = err.divergence().unwrap();
    assert_eq!(d.code, DivergenceCode::UnexpectedStep);
    assert!(d.to_string().contains("the recorded program was stopped by SIGTERM (exit status 143)"), "{d}");

    // One that failed too (QA14 S4: a crashed recording, resolved, replayed on past its end).
    meta.exit_status = Some(9);
    store.update_run(&meta).unwrap();
    let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
    program(&r, "select 1", &AtomicUsize::new(0)).unwrap();
    let d = r.agent("planner").random_u64().unwrap_err().divergence().unwrap().clone();
    assert!(
        d.to_string().contains("the recorded program exited with status 9, so its recording ends there"),
        "{d}"
    );
}

#[test]
fn reordering_independent_steps_is_not_a_divergence() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let a = s.agent("a");
    let x: u32 = a.tool("t", &json!({"x": 1}), ToolSpec::deterministic("1"), || Ok::<_, String>(10)).unwrap();
    let y: u32 = a.tool("t", &json!({"x": 2}), ToolSpec::deterministic("1"), || Ok::<_, String>(20)).unwrap();
    s.finish(Outcome::default()).unwrap();
    let r = Session::replay(store.clone(), &s.run_id(), SessionOptions::default()).unwrap();
    let a = r.agent("a");
    let y2: u32 =
        a.tool("t", &json!({"x": 2}), ToolSpec::deterministic("1"), || Err::<u32, _>("not live")).unwrap();
    let x2: u32 =
        a.tool("t", &json!({"x": 1}), ToolSpec::deterministic("1"), || Err::<u32, _>("not live")).unwrap();
    assert_eq!((x, y), (x2, y2));
    let report = r.finish(Outcome::default()).unwrap();
    // Not a divergence, but said on the replay run, for `gate --strict-order` (QA19 D2).
    let labels = store.run(&report.run_id).unwrap().labels;
    assert_eq!(
        labels.get(retrace_runtime::session::REORDERED).map(String::as_str),
        Some(r#"agent "a": seq 2 (tool_call t) before seq 1 (tool_call t)"#),
        "{labels:?}"
    );
    // In recorded order, nothing is said.
    let r = Session::replay(store.clone(), &s.run_id(), SessionOptions::default()).unwrap();
    let a = r.agent("a");
    for x in [1, 2] {
        let _: u32 = a
            .tool("t", &json!({"x": x}), ToolSpec::deterministic("1"), || Err::<u32, _>("not live"))
            .unwrap();
    }
    let report = r.finish(Outcome::default()).unwrap();
    assert!(!store.run(&report.run_id).unwrap().labels.contains_key(retrace_runtime::session::REORDERED));
}

#[test]
fn identical_keys_replay_in_recorded_order() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let a = s.agent("a");
    let first = a.random_u64().unwrap();
    let second = a.random_u64().unwrap();
    s.finish(Outcome::default()).unwrap();
    let r = Session::replay(store, &s.run_id(), SessionOptions::default()).unwrap();
    let a = r.agent("a");
    assert_eq!((a.random_u64().unwrap(), a.random_u64().unwrap()), (first, second));
    r.finish(Outcome::default()).unwrap();
}

#[test]
fn a_different_decision_or_exit_status_diverges() {
    let store = store();
    let (run, _) = record(&store, "select 1");
    let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
    program(&r, "select 1", &AtomicUsize::new(0)).unwrap();
    let err = r.finish(Outcome { exit_status: Some(3) }).unwrap_err();
    assert_eq!(err.divergence().unwrap().code, DivergenceCode::ExitStatus);

    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    s.agent("a").decide("approve", None).unwrap();
    s.finish(Outcome::default()).unwrap();
    let r = Session::replay(store, &s.run_id(), SessionOptions::default()).unwrap();
    let err = r.agent("a").decide("reject", None).unwrap_err();
    let d = err.divergence().unwrap();
    assert_eq!(d.code, DivergenceCode::StepMismatch);
    assert_eq!(d.path.as_deref(), Some("$.action"));
}

#[test]
fn a_failed_step_replays_its_error() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let err = s
        .agent("a")
        .tool("t", &json!({}), ToolSpec::deterministic("1"), || Err::<u32, _>("boom"))
        .unwrap_err();
    assert!(err.to_string().contains("boom"));
    s.finish(Outcome::default()).unwrap();
    let r = Session::replay(store, &s.run_id(), SessionOptions::default()).unwrap();
    let err = r
        .agent("a")
        .tool("t", &json!({}), ToolSpec::deterministic("1"), || Ok::<u32, String>(1))
        .unwrap_err();
    assert!(matches!(err, RuntimeError::StepFailed { ref message, .. } if message == "boom"), "{err}");
}

#[test]
fn nan_is_refused_at_record_time_naming_the_step() {
    let store = store();
    let s = Session::record(store, SessionOptions::default()).unwrap();
    let err = s
        .agent("a")
        .tool("score", &json!({}), ToolSpec::deterministic("1"), || Ok::<_, String>(vec![1.0, f64::NAN]))
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("tool_call score") && text.contains("$[1]"), "{text}");
}

/// Values JSON can't hold for other reasons are refused naming the step and the path too, and
/// a tool needs a name and a version (QA18 D6, D7).
#[test]
fn values_json_cant_hold_and_nameless_tools_are_refused_naming_the_step() {
    let store = store();
    let wide = |s: &Session| {
        s.agent("a")
            .tool("ids", &json!({}), ToolSpec::deterministic("1"), || {
                Ok::<_, String>(std::collections::BTreeMap::from([(
                    "big".to_owned(),
                    vec![1u128, u128::MAX],
                )]))
            })
            .unwrap_err()
            .to_string()
    };
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let refused = wide(&s);
    assert!(refused.contains("tool_call ids") && refused.contains("$.big[1]"), "{refused}");
    let a = s.agent("a");
    let keys = a
        .tool(
            "pairs",
            &std::collections::BTreeMap::from([((1, 2), "x")]),
            ToolSpec::deterministic("1"),
            || Ok::<_, String>(1),
        )
        .unwrap_err()
        .to_string();
    assert!(keys.contains("tool_call pairs") && keys.contains("$[?]"), "{keys}");
    for (name, version) in [("", "1"), ("t", "")] {
        let err = a
            .tool(name, &json!({}), ToolSpec::deterministic(version), || Ok::<_, String>(1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("is empty"), "{err}");
    }
    let run = s.finish(Outcome::default()).unwrap().run_id;
    // The refused output was the step's failure, recorded: replay fails the same way.
    let r = Session::replay(store, &run, SessionOptions::default()).unwrap();
    assert_eq!(wide(&r), refused);
    r.finish(Outcome::default()).unwrap();
}

#[test]
fn record_hands_back_the_canonical_round_trip() {
    let store = store();
    let s = Session::record(store, SessionOptions::default()).unwrap();
    // The program gets the decoded canonical bytes: a float that is an integer comes back as the
    // integer JSON holds, exactly as replay will hand it back.
    let v: Value = s
        .agent("a")
        .tool("t", &json!({}), ToolSpec::deterministic("1"), || {
            Ok::<_, String>(json!({"b": 2.0, "a": [1, "x"]}))
        })
        .unwrap();
    assert_eq!(serde_json::to_string(&v).unwrap(), r#"{"a":[1,"x"],"b":2}"#);
}

/// A replay streams the recorded run a page at a time: a step asked for far ahead of the
/// agent's next recorded one still matches by key, a side effect whose intent and completion
/// lie on two pages replays its output, and another agent's steps loaded on the way still
/// match after them.
#[test]
fn a_replay_streams_long_runs_and_matches_across_pages() {
    let store = store();
    let spec = || ToolSpec::deterministic("1");
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let (a, b) = (s.agent("a"), s.agent("b"));
    let mut recorded = Vec::new();
    for i in 0..2_500u64 {
        // Seqs 1024 and 1025 (a reader's page boundary) are a side effect's intent and call.
        if i == 1_023 {
            let sent: Value = a
                .tool("send", &json!({"n": i}), ToolSpec::side_effect("1"), || Ok::<_, String>(json!(i)))
                .unwrap();
            assert_eq!(sent, json!(i));
        }
        let agent = if i % 100 == 7 { &b } else { &a };
        recorded.push(agent.tool("t", &json!({"i": i}), spec(), || Ok::<_, String>(i * 3)).unwrap());
    }
    s.finish(Outcome::default()).unwrap();

    let r = Session::replay(store, &s.run_id(), SessionOptions::default()).unwrap();
    let (a, b) = (r.agent("a"), r.agent("b"));
    let not_live = || Err::<u64, _>("not live");
    // Far ahead of the agent's next recorded step first, then everything else in order.
    assert_eq!(a.tool("t", &json!({"i": 2_400}), spec(), not_live).unwrap(), 2_400 * 3);
    for i in (0..2_500u64).filter(|&i| i != 2_400) {
        if i == 1_023 {
            let spec = ToolSpec::side_effect("1");
            let sent: Value = a.tool("send", &json!({"n": i}), spec, || Err::<Value, _>("not live")).unwrap();
            assert_eq!(sent, json!(i));
        }
        let agent = if i % 100 == 7 { &b } else { &a };
        assert_eq!(agent.tool("t", &json!({"i": i}), spec(), not_live).unwrap(), recorded[i as usize]);
    }
    r.finish(Outcome::default()).unwrap();
}

/// A chat whose history carries every reply back: the replies are kept as manifests of the
/// message they hand back, so each message is stored once, and replay serves them unchanged.
#[test]
fn a_chat_reply_s_message_is_stored_once_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Arc::new(
        retrace_store::sqlite::SqliteStore::open(
            &dir.path().join("retrace.db"),
            &dir.path().join("blobs"),
            retrace_store::Durability::Os,
            5_000,
        )
        .unwrap(),
    );
    let store: Arc<dyn Store> = sqlite.clone();
    let chat = |s: &Session, live: bool| -> Vec<Value> {
        let agent = s.agent("assistant");
        let mut history = vec![];
        let mut replies = vec![];
        for turn in 0..4 {
            history.push(json!({"role": "user", "content": format!("turn {turn}")}));
            let body = json!({"model": "gpt-x", "messages": history});
            let call = ModelCall { provider: "openai".into(), endpoint: "chat.completions".into(), body };
            let reply = agent
                .model(&call, |_body| {
                    assert!(live, "replay must not call the model");
                    let content =
                        format!("reply {turn} {}", "x".repeat(2_000 + rand::random::<u8>() as usize));
                    let message = json!({"role": "assistant", "content": content, "refusal": null});
                    let body =
                        json!({"id": format!("c{turn}"), "choices": [{"index": 0, "message": message}]});
                    Ok::<_, String>(ModelReply { body, snapshot: None, usage: None })
                })
                .unwrap();
            history.push(reply["choices"][0]["message"].clone());
            replies.push(reply);
        }
        replies
    };
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let recorded = chat(&s, true);
    let run = s.finish(Outcome { exit_status: Some(0) }).unwrap().run_id;

    let calls: Vec<_> = store.events(&run, 1, usize::MAX).unwrap();
    let calls: Vec<_> =
        calls.iter().filter(|e| e.kind == retrace_core::envelope::EventType::ModelCall).collect();
    assert_eq!(calls.len(), 4);
    for (call, reply) in calls.iter().zip(&recorded) {
        let output = call.output_ref.unwrap();
        let manifest = store.manifest_of(&output).unwrap().expect("the reply is a manifest");
        let manifest: Value = serde_json::from_slice(&manifest).unwrap();
        let elements = manifest["elements"].as_array().unwrap();
        assert_eq!(elements.len(), 1, "{manifest}");
        // The one element is the message, byte for byte as the next request carries it.
        let digest: retrace_core::Digest = elements[0].as_str().unwrap().parse().unwrap();
        let message = retrace_core::canonical::canonical_value(&reply["choices"][0]["message"]).unwrap();
        assert_eq!(store.get_blob(&digest).unwrap(), message);
    }
    // The last request names the earlier replies' messages as stored blobs: one copy each.
    let conn = rusqlite::Connection::open(sqlite.path()).unwrap();
    let big: i64 = conn
        .query_row("SELECT count(*) FROM blobs WHERE size > 2000 AND kind != 2", [], |r| r.get(0))
        .unwrap();
    assert_eq!(big, 4, "four messages over 2 KB, each stored once (manifests aside)");

    for _ in 0..2 {
        let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
        assert_eq!(chat(&r, false), recorded);
        assert_eq!(r.finish(Outcome { exit_status: Some(0) }).unwrap().live_calls, 0);
    }
}

/// One run, one sequencer, within a process too: joining a run that a session of this process
/// records is refused, naming the holder, and the first session records on and finishes.
#[test]
fn a_second_session_of_one_process_cannot_join_a_run_being_recorded() {
    let (sqlite, _dir) = sqlite_store();
    for store in [store(), sqlite] {
        let first = Session::record(store.clone(), SessionOptions::default()).unwrap();
        let run = first.run_id();
        let agent = first.agent("a");
        let echo = |v: Value| move || Ok::<_, String>(v);
        let _: Value =
            agent.tool("t", &json!({"i": 1}), ToolSpec::deterministic("1"), echo(json!(1))).unwrap();
        let holder = store.lease_holder(&run).unwrap().expect("the recording holds its run");
        let err = Session::join(store.clone(), &run, SessionOptions::default()).unwrap_err();
        match &err {
            RuntimeError::Store(e) => assert_eq!(e.kind, retrace_store::StoreErrorKind::Busy, "{err}"),
            other => panic!("expected a busy store, got {other}"),
        }
        assert!(err.to_string().contains(&holder.0), "the refusal names the holder: {err}");
        assert_eq!(store.lease_holder(&run).unwrap(), Some(holder), "the refused join left the lease alone");
        let _: Value =
            agent.tool("t", &json!({"i": 2}), ToolSpec::deterministic("1"), echo(json!(2))).unwrap();
        first.finish(Outcome::default()).unwrap();
        assert_eq!(store.last_seq(&run).unwrap(), 2);
    }
}

/// A SQLite store in a temporary directory (kept alive by the returned guard).
pub(crate) fn sqlite_store() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = retrace_store::sqlite::SqliteStore::open(
        &dir.path().join("retrace.db"),
        &dir.path().join("blobs"),
        retrace_store::Durability::Batch,
        5_000,
    )
    .unwrap();
    (Arc::new(store), dir)
}

/// A tool asked for with the recorded arguments but another version diverges naming what
/// differs (the version is part of the key), not with two bare digests.
#[test]
fn a_changed_tool_version_is_named_with_both_versions() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let a = s.agent("a");
    let _: u32 = a
        .tool("sql.count", &json!({"t": "users"}), ToolSpec::deterministic("2"), || Ok::<_, String>(1))
        .unwrap();
    let run = s.finish(Outcome { exit_status: Some(0) }).unwrap().run_id;
    let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
    let replayed: Result<u32, _> =
        r.agent("a")
            .tool("sql.count", &json!({"t": "users"}), ToolSpec::deterministic("3"), || Ok::<_, String>(1));
    let err = replayed.unwrap_err();
    let d = err.divergence().unwrap();
    assert_eq!(
        (d.code, d.seq, d.path.as_deref()),
        (DivergenceCode::StepMismatch, Some(1), Some("tool version"))
    );
    assert_eq!(d.detail, ["recorded tool version = \"2\"", "replayed tool version = \"3\""], "{d}");
}

/// An extra step amid an agent's recorded ones names the step it skipped to, by seq.
#[test]
fn an_extra_step_amid_the_recorded_ones_names_the_next_recorded_step() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let a = s.agent("a");
    a.now_ms().unwrap();
    a.random_u64().unwrap();
    let run = s.finish(Outcome { exit_status: Some(0) }).unwrap().run_id;
    let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
    let a = r.agent("a");
    a.now_ms().unwrap();
    let d = a.now_ms().unwrap_err().divergence().cloned().unwrap();
    assert_eq!((d.code, d.seq), (DivergenceCode::UnexpectedStep, Some(2)), "{d}");
    assert!(d.detail[0].contains("its next recorded step is seq 2 (random"), "{d}");
    assert!(!d.to_string().contains("ran out"), "{d}");
}

/// A tool function that panics: the panic is recorded as the step's failure and goes on, so a
/// program that catches it (a task's JoinHandle) takes its fallback; replay panics again at that
/// step with the same message, and the program takes the same path (QA18 D2: nothing was
/// recorded, and every replay diverged at the step). A side effect's panic completes its intent.
#[test]
fn a_tool_whose_function_panics_is_recorded_and_panics_again_in_replay() {
    let store = store();
    let ran = Arc::new(AtomicUsize::new(0));
    let program = |s: &Session| -> Vec<String> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let mut said = vec![];
        for spec in [ToolSpec::deterministic("1"), ToolSpec::side_effect("1")] {
            let (a, ran) = (s.agent("a"), ran.clone());
            let task = rt.spawn(async move {
                a.tool_async("parse", &json!({"side": spec.class.as_str()}), spec, || async move {
                    // Always panics (the `if` leaves the closure its result type).
                    if ran.fetch_add(1, Ordering::SeqCst) < usize::MAX {
                        panic!("bad input at line 3");
                    }
                    Ok::<u32, String>(1)
                })
                .await
            });
            let panicked = rt.block_on(task).unwrap_err().into_panic();
            let message = panicked
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panicked.downcast_ref::<String>().cloned())
                .unwrap();
            said.push(message);
        }
        let fallback: u32 = s
            .agent("a")
            .tool("fallback", &json!({}), ToolSpec::deterministic("1"), || Ok::<_, String>(7))
            .unwrap();
        said.push(fallback.to_string());
        said
    };
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let recorded = program(&s);
    assert_eq!(recorded, ["bad input at line 3", "bad input at line 3", "7"]);
    let run = s.finish(Outcome::default()).unwrap().run_id;
    let events = store.events(&run, 1, 10).unwrap();
    let failed: Vec<_> = events.iter().filter_map(|e| e.error.clone()).collect();
    assert_eq!(failed, ["panicked: bad input at line 3", "panicked: bad input at line 3"]);
    let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
    assert_eq!(program(&r), recorded);
    assert_eq!(ran.load(Ordering::SeqCst), 2, "nothing ran in replay");
    r.finish(Outcome::default()).unwrap();
}
