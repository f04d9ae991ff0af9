//! Masking of recorded outputs: a proxied model call's stream document is stored masked per
//! output part, with its chunks and their times as they came; a decision is stored masked.
use std::sync::Arc;

use retrace_core::http_doc::{layout, BodySpan};
use retrace_core::mask::{MaskKey, MaskRule, MaskRules, ReplayAs, RuleMatch};
use retrace_core::EventType;
use retrace_runtime::{HttpModelCall, HttpModelOutput, Outcome, Session, SessionOptions};
use retrace_store::memory::MemoryStore;
use retrace_store::Store;

const SECRET: &str = "sk-Zq7/Wx@Vq9Jk.io";

/// One rule: [`SECRET`] is a `secret`, replayed as its token.
fn canary_rules() -> MaskRules {
    MaskRules {
        rules: vec![MaskRule {
            name: "canary".into(),
            kind: "secret".into(),
            matcher: RuleMatch::Literal { value: SECRET.into() },
            replay: ReplayAs::Token,
        }],
    }
}

fn event(content: &str) -> String {
    format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}}}}]}}\n\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_split_across_stream_chunks_is_stored_masked() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let key = MaskKey::from_bytes([5; 32]);
    let rules = canary_rules();
    let options = SessionOptions { mask_rules: rules, mask_key: Some(key.clone()), ..Default::default() };
    let s = Session::record(store.clone(), options).unwrap();
    let chunks =
        [event("key sk\\u002dZq"), event("7\\/Wx\\u0040"), event("Vq9Jk.io"), "data: [DONE]\n\n".into()];
    let stream: Vec<String> = chunks.iter().map(|c| serde_json::to_string(c).unwrap()).collect();
    let document = format!(
        r#"{{"format":"retrace-http/1","status":200,"headers":[["content-type","text/event-stream"]],"stream":[[0,{}],[4,{}],[9,{}],[12,{}]],"end":"complete"}}"#,
        stream[0], stream[1], stream[2], stream[3]
    );
    let call = HttpModelCall {
        provider: "openai".into(),
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        key_headers: vec![],
        body: br#"{"model":"gpt-x","stream":true,"messages":[]}"#.to_vec(),
    };
    let live = document.clone().into_bytes();
    let reply = s
        .agent("default")
        .http_model(call, |_| async move { Ok(HttpModelOutput { document: live, ..Default::default() }) })
        .await
        .unwrap();
    assert_eq!(reply.document, document.as_bytes(), "the client gets the live document");
    s.finish(Outcome::default()).unwrap();

    let events = store.events(&s.run_id(), 1, 10).unwrap();
    let model = events.iter().find(|e| e.kind == EventType::ModelCall).expect("a model call");
    let stored = store.get_blob(model.output_ref.as_ref().expect("an output")).unwrap();
    let Some(BodySpan::Stream(got)) = layout(&stored).unwrap().body else { panic!("a stream") };
    assert_eq!(got.iter().map(|c| c.t_ms).collect::<Vec<_>>(), [0, 4, 9, 12], "chunks and times kept");
    let text = String::from_utf8(got.iter().flat_map(|c| c.bytes.clone()).collect()).unwrap();
    let token = key.token("secret", SECRET);
    assert_eq!(text.matches(&token).count(), 1, "{text}");
    for fragment in ["Zq7", "Wx", "Vq9", "Jk.io"] {
        assert!(!String::from_utf8_lossy(&stored).contains(fragment), "{fragment} stored");
    }
}

/// A decision's target is the program's data (it may name a person, or hold a key): the
/// decision event and the run's final decisions hold it masked, as its request is, and a
/// replay taking the same decision matches them.
#[test]
fn a_decision_is_stored_masked_and_replays_matched() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let key = MaskKey::from_bytes([6; 32]);
    let rules = canary_rules();
    let options =
        || SessionOptions { mask_rules: rules.clone(), mask_key: Some(key.clone()), ..Default::default() };
    let target = format!("rotate:{SECRET}");
    let s = Session::record(store.clone(), options()).unwrap();
    s.agent("ops").decide("approve", Some(&target)).unwrap();
    s.finish(Outcome::default()).unwrap();
    let run = s.run_id();

    let masked = format!("rotate:{}", key.token("secret", SECRET));
    let events = store.events(&run, 1, 10).unwrap();
    let decision = events.iter().find_map(|e| e.decision.clone()).expect("a decision event");
    assert_eq!(decision.target.as_deref(), Some(masked.as_str()));
    let meta = store.run(&run).unwrap();
    assert_eq!(meta.decisions.len(), 1);
    assert_eq!(meta.decisions[0].target.as_deref(), Some(masked.as_str()));
    assert!(meta.holds_tokens, "the run says it holds a token");
    assert_eq!(retrace_store::verify::verify_run(&*store, &run), vec![]);

    let r = Session::replay(store.clone(), &run, options()).unwrap();
    r.agent("ops").decide("approve", Some(&target)).unwrap();
    r.finish(Outcome::default()).expect("the same decision replays matched");
    let r = Session::replay(store.clone(), &run, options()).unwrap();
    let other = r.agent("ops").decide("approve", Some("rotate:another"));
    assert!(other.is_err() || r.finish(Outcome::default()).is_err(), "another target diverges");
}

/// A message body holding a secret is stored masked, and a replay hands the receiver what the
/// log holds, the token, as it hands back a tool's output, even though the sender runs in the
/// same process and sends the original again (QA14 D7: the in-process receiver got the
/// original, a receiver whose sender ran elsewhere the token).
#[test]
fn a_replayed_message_reaches_its_receiver_as_the_log_holds_it() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let key = MaskKey::from_bytes([7; 32]);
    let rules = canary_rules();
    let options =
        || SessionOptions { mask_rules: rules.clone(), mask_key: Some(key.clone()), ..Default::default() };
    let body = serde_json::json!({"note": format!("use {SECRET}"), "n": 1});
    let exchange = |s: &Session| -> serde_json::Value {
        let (a, b) = (s.agent("a"), s.agent("b"));
        a.send_blocking("b", "note", &body, None).unwrap();
        let heard = b.recv_blocking(Some(std::time::Duration::from_secs(5))).unwrap().expect("a message");
        heard.body
    };
    let s = Session::record(store.clone(), options()).unwrap();
    assert_eq!(exchange(&s), body, "record hands the receiver what was sent");
    s.finish(Outcome::default()).unwrap();
    let run = s.run_id();

    let token = key.token("secret", SECRET);
    let r = Session::replay(store.clone(), &run, options()).unwrap();
    let heard = exchange(&r);
    r.finish(Outcome::default()).expect("the exchange replays matched");
    assert_eq!(heard, serde_json::json!({"note": format!("use {token}"), "n": 1}));
}

/// A step's name is masked like its request (QA27 D1: an env var named after a key, a tool
/// named after a secret were stored in clear, in the event and the tool reference, while the
/// request blob masked them), and a replay taking the same steps matches them.
#[test]
fn step_names_are_stored_masked_and_replay_matched() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let key = MaskKey::from_bytes([7; 32]);
    let options =
        || SessionOptions { mask_rules: canary_rules(), mask_key: Some(key.clone()), ..Default::default() };
    let (var, tool) = (format!("TOKEN_{SECRET}"), format!("lookup {SECRET}"));
    let program = |s: &Session| {
        let a = s.agent("ops");
        a.env(&var).unwrap();
        a.tool(&tool, &serde_json::json!({}), retrace_runtime::ToolSpec::deterministic("1"), || {
            Ok::<u8, String>(1)
        })
        .unwrap();
        // A message's kind is masked like a name (QA39 D1), in its send and its delivery.
        let kind = format!("note {SECRET}");
        s.agent("audit").send_blocking("ops", &kind, &serde_json::json!({}), None).unwrap();
        let heard = a.recv_blocking(Some(std::time::Duration::from_secs(5))).unwrap().expect("a message");
        assert!(heard.kind.is_some());
    };
    let s = Session::record(store.clone(), options()).unwrap();
    program(&s);
    s.finish(Outcome::default()).unwrap();
    let run = s.run_id();
    let token = key.token("secret", SECRET);
    let events = store.events(&run, 1, 10).unwrap();
    assert_eq!(events[0].name.as_deref(), Some(format!("TOKEN_{token}").as_str()));
    assert_eq!(events[1].name.as_deref(), Some(format!("lookup {token}").as_str()));
    assert_eq!(events[1].tool.as_ref().map(|t| t.name.clone()), events[1].name.clone());
    let kinds: Vec<_> = events[2..].iter().map(|e| e.message.as_ref().and_then(|m| m.kind.clone())).collect();
    assert_eq!(
        kinds,
        [Some(format!("note {token}")), Some(format!("note {token}"))],
        "the send, then the delivery"
    );
    let stored = serde_json::to_string(&events).unwrap();
    assert!(!stored.contains(SECRET), "{stored}");
    assert!(store.run(&run).unwrap().holds_tokens);

    let r = Session::replay(store.clone(), &run, options()).unwrap();
    program(&r);
    r.finish(Outcome::default()).expect("the same steps replay matched");
}
