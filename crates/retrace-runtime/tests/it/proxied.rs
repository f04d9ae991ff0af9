//! A proxied model call (`Agent::http_model`): what its event says of the request, and its
//! replay, which hands back the stored document byte for byte.
use std::sync::Arc;

use retrace_core::EventType;
use retrace_runtime::{HttpModelCall, HttpModelOutput, Outcome, Session, SessionOptions};
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Durability, Store};
use serde_json::json;

fn call(body: &str) -> HttpModelCall {
    HttpModelCall {
        provider: "openai".into(),
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        key_headers: vec![],
        body: body.as_bytes().to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_names_the_model_and_params_and_replay_hands_back_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite =
        SqliteStore::open(&dir.path().join("retrace.db"), &dir.path().join("blobs"), Durability::Os, 5_000);
    let store: Arc<dyn Store> = Arc::new(sqlite.unwrap());
    // An escaped key is still `model`; numbers keep their text; `stream` is not a parameter.
    let bodies = [
        r#"{"mod\u0065l":"gpt-4o","temperature":0.25,"seed":12345678901234567,"stream":false,"messages":[{"role":"user","content":"hi"}]}"#,
        r#"{"messages":[],"model":7}"#,
        r#"[1,2]"#,
    ];
    let documents: Vec<Vec<u8>> = (0..bodies.len())
        .map(|i| {
            format!(r#"{{"format":"retrace-http/1","status":200,"headers":[],"body":{{"n":{i}}}}}"#)
                .into_bytes()
        })
        .collect();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let agent = s.agent("default");
    for (body, document) in bodies.iter().zip(&documents) {
        let live = document.clone();
        let reply = agent
            .http_model(call(body), |_| async move {
                Ok(HttpModelOutput { document: live, ..Default::default() })
            })
            .await
            .unwrap();
        assert_eq!(&reply.document, document);
    }
    s.finish(Outcome::default()).unwrap();

    let events = store.events(&s.run_id(), 1, 10).unwrap();
    let calls: Vec<_> = events.iter().filter(|e| e.kind == EventType::ModelCall).collect();
    let first = calls[0];
    assert_eq!(first.model.as_ref().unwrap().name, "gpt-4o");
    let params = serde_json::to_value(first.params.as_ref().unwrap()).unwrap();
    assert_eq!(params, json!({"temperature": 0.25, "seed": 12345678901234567u64}));
    for other in &calls[1..] {
        assert_eq!(other.model, None, "a body that names no model: {other:?}");
        assert!(other.params.is_none());
    }

    // Replay: nothing live, each document as stored (read ahead by the log's reader).
    let r = Session::replay(store.clone(), &s.run_id(), SessionOptions::default()).unwrap();
    let agent = r.agent("default");
    for (body, document) in bodies.iter().zip(&documents) {
        let reply =
            agent.http_model(call(body), |_| async { panic!("replay calls nothing live") }).await.unwrap();
        assert_eq!(&reply.document, document);
    }
    r.finish(Outcome::default()).unwrap();
}

/// A fork's `model:` and `param:` edits rewrite the body the proxy sends upstream, not only the
/// request the fork records (SPEC §4: "the proxy rewrites the body's field"); a replay of the
/// fork matches the edited request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forks_model_and_param_edits_reach_the_body_sent_upstream() {
    let store: Arc<dyn Store> = Arc::new(retrace_store::memory::MemoryStore::new());
    let body = r#"{"model":"gpt-4o-mini","temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;
    let document = br#"{"format":"retrace-http/1","status":200,"headers":[],"body":{"choices":[]}}"#.to_vec();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let live = document.clone();
    s.agent("critic")
        .http_model(
            call(body),
            |_| async move { Ok(HttpModelOutput { document: live, ..Default::default() }) },
        )
        .await
        .unwrap();
    s.finish(Outcome::default()).unwrap();

    let edits = vec!["model:critic=gpt-4o".parse().unwrap(), "param:critic.temperature=0.9".parse().unwrap()];
    let f = Session::fork_new(store.clone(), &s.run_id(), None, edits, SessionOptions::default()).unwrap();
    let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (seen, live) = (sent.clone(), document.clone());
    f.agent("critic")
        .http_model(call(body), |body| async move {
            *seen.lock().unwrap() = body;
            Ok(HttpModelOutput { document: live, ..Default::default() })
        })
        .await
        .unwrap();
    f.finish(Outcome::default()).unwrap();
    let sent: serde_json::Value = serde_json::from_slice(&sent.lock().unwrap()).unwrap();
    assert_eq!((&sent["model"], &sent["temperature"]), (&json!("gpt-4o"), &json!(0.9)), "{sent}");
    assert_eq!(sent["messages"], json!([{"role": "user", "content": "hi"}]));
    let event =
        store.events(&f.run_id(), 1, 10).unwrap().into_iter().find(|e| e.kind == EventType::ModelCall);
    let event = event.expect("the fork's model call");
    let recorded: serde_json::Value =
        serde_json::from_slice(&store.get_blob(&event.request_ref.unwrap()).unwrap()).unwrap();
    assert_eq!(recorded["body"].get("model").or(recorded.get("model")), Some(&json!("gpt-4o")), "{recorded}");

    // The fork replays: the program sends its original body, the edits apply again, it matches.
    let r = Session::replay(store.clone(), &f.run_id(), SessionOptions::default()).unwrap();
    r.agent("critic")
        .http_model(call(body), |_| async { panic!("replay calls nothing live") })
        .await
        .unwrap();
    r.finish(Outcome::default()).unwrap();
}

/// An agent whose calls go to several providers and endpoints (a program recorded through the
/// proxy: every call is agent `default`'s): a `model:` edit changes the calls its model can
/// serve (its provider's, and embeddings only for an embedding model), a `param:` edit the calls
/// that generate text; an edit no call can take is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_and_param_edits_change_only_the_calls_they_fit() {
    let store: Arc<dyn Store> = Arc::new(retrace_store::memory::MemoryStore::new());
    let calls = [
        ("openai", "/v1/chat/completions", r#"{"model":"gpt-4o-mini","messages":[]}"#),
        ("anthropic", "/v1/messages", r#"{"model":"claude-sonnet-4-5","max_tokens":9,"messages":[]}"#),
        ("openai", "/v1/embeddings", r#"{"model":"text-embedding-3-small","input":"hi"}"#),
    ];
    let to = |(provider, path, body): (&str, &str, &str)| HttpModelCall {
        provider: provider.into(),
        path: path.into(),
        body: body.as_bytes().to_vec(),
        ..call("{}")
    };
    let document = br#"{"format":"retrace-http/1","status":200,"headers":[],"body":{}}"#.to_vec();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    for c in calls {
        let live = document.clone();
        s.agent("default")
            .http_model(
                to(c),
                |_| async move { Ok(HttpModelOutput { document: live, ..Default::default() }) },
            )
            .await
            .unwrap();
    }
    s.finish(Outcome::default()).unwrap();

    let fork = |edits: &[&str]| {
        let edits = edits.iter().map(|e| e.parse().unwrap()).collect();
        Session::fork_new(store.clone(), &s.run_id(), None, edits, SessionOptions::default())
    };
    let f = fork(&["model:default=gpt-4o", "param:default.temperature=0.9"]).unwrap();
    let mut sent = Vec::new();
    for c in calls {
        let live = document.clone();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = seen.clone();
        f.agent("default")
            .http_model(to(c), |body| async move {
                *into.lock().unwrap() = body;
                Ok(HttpModelOutput { document: live, ..Default::default() })
            })
            .await
            .unwrap();
        // A call no edit changed is the source's: served from the cache, nothing is sent.
        let seen = seen.lock().unwrap();
        let body: Option<serde_json::Value> =
            (!seen.is_empty()).then(|| serde_json::from_slice(&seen).unwrap());
        sent.push(body.map(|b| (b["model"].clone(), b.get("temperature").cloned())));
    }
    f.finish(Outcome::default()).unwrap();
    assert_eq!(
        sent,
        [
            Some((json!("gpt-4o"), Some(json!(0.9)))),
            Some((json!("claude-sonnet-4-5"), Some(json!(0.9)))),
            None
        ]
    );
    // An embedding model replaces embedding models only; nothing else can take one.
    assert!(fork(&["model:default=text-embedding-3-large"]).is_ok());
    let s2 = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let live = document.clone();
    s2.agent("e")
        .http_model(
            to(calls[2]),
            |_| async move { Ok(HttpModelOutput { document: live, ..Default::default() }) },
        )
        .await
        .unwrap();
    s2.finish(Outcome::default()).unwrap();
    for (edit, said) in [
        ("model:e=gpt-4o", "none of agent \"e\"'s model calls can take gpt-4o (openai/v1/embeddings (1)"),
        ("param:e.temperature=0.5", "no model call that generates text"),
    ] {
        let refused = Session::fork_new(
            store.clone(),
            &s2.run_id(),
            None,
            vec![edit.parse().unwrap()],
            SessionOptions::default(),
        )
        .err()
        .unwrap_or_else(|| panic!("{edit} refused"));
        assert!(refused.to_string().contains(said), "{edit}: {refused}");
    }
}
