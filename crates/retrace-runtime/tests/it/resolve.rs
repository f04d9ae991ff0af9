//! Side effects that may or may not have happened: an intent without its completion stops
//! replay and fork until a person resolves it; then replay returns the answer, or stops at
//! `log_ended` when it never happened, and a fork dry-runs it.
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use retrace_core::json::Json;
use retrace_core::key::KeyConfig;
use retrace_core::{DivergenceCode, Event, EventType, Source};
use retrace_runtime::{Outcome, RuntimeError, Session, SessionOptions, ToolSpec};
use retrace_store::memory::MemoryStore;
use retrace_store::{BlobHint, BlobPut, LeaseHolder, RunWriter, Store};
use serde_json::{json, Value};

/// Records a run whose side effect died between its intent and its completion.
fn interrupted(store: &Arc<dyn Store>) -> (String, u64) {
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let a = s.agent("ops");
    let _: u32 = a.tool("count", &json!({}), ToolSpec::deterministic("1"), || Ok::<_, String>(3)).unwrap();
    let died = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let _: Value = a
            .tool(
                "email.send",
                &json!({"to": "ceo"}),
                ToolSpec::side_effect("1"),
                || -> Result<Value, String> { panic!("the process died mid-call") },
            )
            .unwrap();
    }));
    assert!(died.is_err());
    let run = s.run_id();
    s.flush().unwrap();
    drop(a);
    drop(s);
    let intent =
        store.events(&run, 1, 10).unwrap().into_iter().find(|e| e.kind == EventType::Intent).unwrap();
    (run, intent.seq)
}

fn resolve(store: &Arc<dyn Store>, run: &str, intent_seq: u64, outcome: Option<Value>) {
    let intent = store.event(run, intent_seq).unwrap();
    let mut e = Event::new(run, intent.agent_id.clone(), EventType::Resolution);
    e.causal_parent = Some(intent_seq);
    e.source = Source::Recorded;
    let mut blobs = Vec::new();
    match outcome {
        Some(v) => {
            let b = BlobPut::new(serde_json::to_vec(&v).unwrap(), BlobHint::Raw);
            e.output_ref = Some(b.digest());
            e.name = Some("executed".into());
            blobs.push(b);
        }
        None => e.name = Some("not_executed".into()),
    }
    e.key = KeyConfig::default().key(EventType::Resolution, e.name.as_deref(), None, &Json::Null).unwrap();
    let w = RunWriter::open(store.clone(), run, LeaseHolder::current()).unwrap();
    w.append_sync(e, blobs).unwrap();
    w.close().unwrap();
}

fn program(s: &Session) -> Result<Value, RuntimeError> {
    let a = s.agent("ops");
    let _: u32 = a.tool("count", &json!({}), ToolSpec::deterministic("1"), || Ok::<_, String>(3))?;
    let spec = ToolSpec::side_effect("1").with_dry_run(|_| json!({"dry": true}));
    a.tool("email.send", &json!({"to": "ceo"}), spec, || -> Result<Value, String> {
        panic!("never runs in replay")
    })
}

#[test]
fn an_unresolved_intent_stops_replay_at_that_step() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (run, intent) = interrupted(&store);
    let r = Session::replay(store, &run, SessionOptions::default()).unwrap();
    let d = program(&r).unwrap_err().divergence().cloned().unwrap();
    assert_eq!(d.code, DivergenceCode::PendingIntent);
    assert_eq!(d.seq, Some(intent));
    assert!(d.to_string().contains("retrace resolve"), "{d}");
}

#[test]
fn a_resolved_outcome_replays_and_not_executed_ends_the_log() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (run, intent) = interrupted(&store);
    resolve(&store, &run, intent, Some(json!({"sent": true, "id": 42})));
    let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
    assert_eq!(program(&r).unwrap(), json!({"sent": true, "id": 42}));

    let (run, intent) = interrupted(&store);
    resolve(&store, &run, intent, None);
    let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
    let d = program(&r).unwrap_err().divergence().cloned().unwrap();
    assert_eq!(d.code, DivergenceCode::LogEnded);
    // A fork treats a call that never happened as a new step: a dry run.
    let f = Session::fork_new(store.clone(), &run, Some(1), vec![], SessionOptions::default()).unwrap();
    assert_eq!(program(&f).unwrap(), json!({"dry": true}));
    f.finish(Outcome::default()).unwrap();
}
