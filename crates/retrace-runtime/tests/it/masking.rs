//! Masking of recorded outputs: a proxied model call's stream document is stored masked per
//! output part, with its chunks and their times as they came.
use std::sync::Arc;

use retrace_core::http_doc::{layout, BodySpan};
use retrace_core::mask::{MaskKey, MaskRule, MaskRules, ReplayAs, RuleMatch};
use retrace_core::EventType;
use retrace_runtime::{HttpModelCall, HttpModelOutput, Outcome, Session, SessionOptions};
use retrace_store::memory::MemoryStore;
use retrace_store::Store;

const SECRET: &str = "sk-Zq7/Wx@Vq9Jk.io";

fn event(content: &str) -> String {
    format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}}}}]}}\n\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_split_across_stream_chunks_is_stored_masked() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let key = MaskKey::from_bytes([5; 32]);
    let rules = MaskRules {
        rules: vec![MaskRule {
            name: "canary".into(),
            kind: "secret".into(),
            matcher: RuleMatch::Literal { value: SECRET.into() },
            replay: ReplayAs::Token,
        }],
    };
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
        .http_model(call, || async move { Ok(HttpModelOutput { document: live, ..Default::default() }) })
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
