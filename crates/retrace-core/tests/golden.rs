//! Golden digests: the exact hex of a few fixed envelopes and keys. If one of these changes, old
//! exports stop verifying: that is a format break, never a refactor.
use std::collections::BTreeMap;

use expect_test::expect;
use proptest::prelude::*;
use retrace_core::envelope::{
    Approval, ApprovalOutcome, Decision, MessageRef, ModelRef, PromptRef, ToolClass, ToolRef, Usage,
};
use retrace_core::json::parse;
use retrace_core::key::KeyConfig;
use retrace_core::{Digest, Event, EventType, Source};

fn model_call() -> Event {
    let mut e = Event::new("01jd0000000000000000000000", "reviewer", EventType::ModelCall);
    e.seq = 7;
    e.lamport = 12;
    e.role = Some("reviewer".into());
    e.name = Some("openai/chat.completions".into());
    e.causal_parent = Some(5);
    e.inbound = vec![5, 6];
    e.key = Digest::of(b"key");
    e.request_ref = Some(Digest::of(b"request"));
    e.output_ref = Some(Digest::of(b"output"));
    e.output_hash = Some(Digest::of(b"output"));
    e.model = Some(ModelRef {
        provider: "openai".into(),
        name: "gpt-4o".into(),
        snapshot: Some("gpt-4o-2024-08-06".into()),
    });
    let mut params = BTreeMap::new();
    params.insert("temperature".to_owned(), serde_json::json!(0));
    params.insert("seed".to_owned(), serde_json::json!(18446744073709551615u64));
    e.params = Some(params);
    e.prompt_template = Some(PromptRef { id: "reviewer@v14".into(), digest: Digest::of(b"template text") });
    e.usage =
        Some(Usage { input_tokens: 1200, output_tokens: 80, cost_usd: Some(0.0042), ..Default::default() });
    e.latency_ms = Some(830);
    e.source = Source::Live;
    e.seal(Some(Digest::of(b"previous"))).unwrap();
    e
}

fn others() -> Vec<Event> {
    let mut deliver = Event::new("01jd0000000000000000000000", "reviewer", EventType::Deliver);
    deliver.seq = 6;
    deliver.lamport = 11;
    deliver.causal_parent = Some(4);
    deliver.message = Some(MessageRef {
        from: Some("planner".into()),
        to: Some("reviewer".into()),
        kind: Some("backfill_ready".into()),
        timed_out: false,
    });
    deliver.key = Digest::of(b"deliver");
    deliver.seal(None).unwrap();

    let mut tool = Event::new("01jd0000000000000000000000", "planner", EventType::ToolCall);
    tool.seq = 9;
    tool.lamport = 3;
    tool.name = Some("email.send".into());
    tool.tool = Some(ToolRef {
        name: "email.send".into(),
        version: "2".into(),
        class: ToolClass::SideEffect,
        ttl_s: None,
    });
    tool.key = Digest::of(b"tool");
    tool.source = Source::DryRun;
    tool.origin_seq = Some(8);
    tool.seal(Some(Digest::of(b"eight"))).unwrap();

    let mut decision = Event::new("01jd0000000000000000000000", "reviewer", EventType::Decision);
    decision.seq = 10;
    decision.lamport = 13;
    decision.decision =
        Some(Decision { action: "approve".into(), target: Some("step:backfill_users".into()) });
    decision.approval = Some(Approval { outcome: ApprovalOutcome::Approved });
    decision.key = Digest::of(b"decision");
    decision.seal(Some(Digest::of(b"nine"))).unwrap();
    vec![deliver, tool, decision]
}

#[test]
fn golden_event_hashes() {
    let e = model_call();
    expect!["sha256:26e4c372a3699230516d28b01fda6fda4aa19abb93da2ee63eb9ad96a2f2663f"]
        .assert_eq(&e.hash.to_string());
    let hashes: Vec<String> = others().iter().map(|e| e.hash.to_string()).collect();
    expect![[r#"
        [
            "sha256:5af1e4b91df123aba37ea55742dba7b523ea9bce34bd821051814519848233db",
            "sha256:148dc15c0ec680a0d7810dcbbb99bbe5d77af018a98e9dcc4f6a2e81f488e479",
            "sha256:b38d89db281bf5018e9ba8a9316c55d58adb2dabbb79fb973753b84e428e1bfe",
        ]
    "#]]
    .assert_debug_eq(&hashes);
}

#[test]
fn golden_event_line() {
    let line = String::from_utf8(model_call().canonical().unwrap()).unwrap();
    expect![[r#"{"agent_id":"reviewer","approval":null,"causal_parent":5,"decision":null,"hash":"sha256:26e4c372a3699230516d28b01fda6fda4aa19abb93da2ee63eb9ad96a2f2663f","inbound":[5,6],"key":"sha256:2c70e12b7a0646f92279f427c7b38e7334d8e5389cff167a1dc30e73f826b683","lamport":12,"latency_ms":830,"message":null,"model":{"name":"gpt-4o","provider":"openai","snapshot":"gpt-4o-2024-08-06"},"name":"openai/chat.completions","origin_seq":null,"output_hash":"sha256:e0ee8bb50685e05fa0f47ed04203ae953fdfd055f5bd2892ea186504254f8c3a","output_ref":"sha256:e0ee8bb50685e05fa0f47ed04203ae953fdfd055f5bd2892ea186504254f8c3a","params":{"seed":18446744073709551615,"temperature":0},"prev":"sha256:6da0633528deaa0144e7b058315f0b753ec0b945163a72bf96a0d18180f9de0d","prompt_template":{"digest":"sha256:4bb92695a4cdbabad10b30fe5ecbbcee35d0ae932b06118126835e6c8dc734fb","id":"reviewer@v14"},"request_ref":"sha256:1f58b9145b24d108d7ac38887338b3ea3229833b9c1e418250343f907bfd1047","role":"reviewer","run_id":"01jd0000000000000000000000","seq":7,"source":"live","tool":null,"type":"model_call","usage":{"cost_usd":0.0042,"input_tokens":1200,"output_tokens":80}}"#]].assert_eq(&line);
}

#[test]
fn events_round_trip_through_their_json_form() {
    for e in std::iter::once(model_call()).chain(others()) {
        let back: Event = serde_json::from_slice(&e.canonical().unwrap()).unwrap();
        assert_eq!(back, e);
        assert_eq!(back.compute_hash().unwrap(), e.hash);
    }
}

#[test]
fn golden_keys() {
    let cfg = KeyConfig::default();
    let request =
        parse(br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"temperature":0}"#).unwrap();
    let key = cfg.key(EventType::ModelCall, Some("openai/chat.completions"), None, &request).unwrap();
    expect!["sha256:9e134e744e745e03c96341dcd658bf20059dd0455f84158102937dc2990da4fe"]
        .assert_eq(&key.to_string());
}

fn arb_json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "[a-zé\u{1F600} ]{0,8}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn key_of(cfg: &KeyConfig, text: &str) -> Digest {
    cfg.key(EventType::ToolCall, Some("t"), Some("1"), &parse(text.as_bytes()).unwrap()).unwrap()
}

proptest! {
    #[test]
    fn equal_requests_give_equal_keys_whatever_the_key_order_and_whitespace(v in arb_json(), volatile in any::<u64>()) {
        let cfg = KeyConfig::default();
        let compact = serde_json::to_string(&serde_json::json!({"args": v})).unwrap();
        let pretty = serde_json::to_string_pretty(&serde_json::json!({"args": v, "request_id": volatile})).unwrap();
        prop_assert_eq!(key_of(&cfg, &compact), key_of(&cfg, &pretty));
    }

    #[test]
    fn one_digit_of_a_64_bit_integer_changes_the_key(n in any::<u64>(), pos in 0usize..20) {
        let cfg = KeyConfig::default();
        let digits = n.to_string();
        let pos = pos % digits.len();
        let mut changed = digits.clone().into_bytes();
        changed[pos] = if changed[pos] == b'9' { b'8' } else { changed[pos] + 1 };
        let changed = String::from_utf8(changed).unwrap();
        prop_assume!(changed != digits);
        prop_assert_ne!(key_of(&cfg, &format!(r#"{{"id":{digits}}}"#)), key_of(&cfg, &format!(r#"{{"id":{changed}}}"#)));
    }

    #[test]
    fn any_change_to_a_non_volatile_field_changes_the_key(a in arb_json(), b in arb_json()) {
        prop_assume!(a != b);
        let cfg = KeyConfig::default();
        let ka = key_of(&cfg, &serde_json::to_string(&serde_json::json!({"args": a})).unwrap());
        let kb = key_of(&cfg, &serde_json::to_string(&serde_json::json!({"args": b})).unwrap());
        prop_assert_ne!(ka, kb);
    }
}
