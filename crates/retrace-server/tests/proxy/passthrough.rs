//! Provider routes besides the model calls (`GET /v1/models`, `count_tokens`...) are recorded
//! and replayed like model calls, so a program that lists models or counts tokens replays. A
//! body that is neither JSON nor empty (a file upload) goes to the upstream unrecorded while a
//! run records, and a replay, which makes no live call, refuses it saying why (QA10 D7).
use retrace_core::mask::{MaskKey, MaskRules};
use retrace_demo::providers::Providers;
use serde_json::json;

use super::support::{chat, client, daemon, Reply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_routes_are_recorded_and_replayed_and_uploads_pass_through_unrecorded() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    let get = |run: String, path: &'static str| {
        let base = d.base.clone();
        async move {
            let r = client()
                .get(format!("{base}{path}"))
                .header("authorization", "Bearer sk-test-never-stored")
                .header("x-retrace-run", run)
                .send()
                .await
                .unwrap();
            Reply::read(r).await
        }
    };
    let upload = |run: String| {
        let base = d.base.clone();
        async move {
            let r = client()
                .post(format!("{base}/proxy/openai/v1/audio/transcriptions"))
                .header("authorization", "Bearer sk-test-never-stored")
                .header("content-type", "multipart/form-data; boundary=x")
                .header("x-retrace-run", run)
                .body("--x\r\ncontent-disposition: form-data; name=\"file\"\r\n\r\nRIFF....\r\n--x--\r\n")
                .send()
                .await
                .unwrap();
            Reply::read(r).await
        }
    };
    let count = json!({"model": "claude", "messages": [{"role": "user", "content": "one two three"}]});
    let listed = get(run.clone(), "/proxy/openai/v1/models?limit=2").await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert_eq!(listed.json()["data"].as_array().map(Vec::len), Some(2), "the query reached the upstream");
    assert_eq!(listed.header("x-retrace-proxy"), None, "recorded, not passed through");
    let counted = d.call(&run, "/proxy/anthropic/v1/messages/count_tokens", &count).await;
    assert_eq!(counted.status, 200, "{}", counted.text());
    assert!(counted.json()["input_tokens"].as_u64().is_some(), "{}", counted.text());
    let uploaded = upload(run.clone()).await;
    assert_eq!(uploaded.header("x-retrace-proxy"), Some("unrecorded"), "{}", uploaded.text());
    let answered = d.call(&run, "/proxy/openai/v1/chat/completions", &chat("hello", false)).await;
    assert_eq!(answered.status, 200, "{}", answered.text());
    assert_eq!(d.finish(&run).await["status"], "ok");
    let events = d.store.events(&run, 1, 100).unwrap();
    let names: Vec<_> = events.iter().filter_map(|e| e.name.clone()).collect();
    assert_eq!(
        names,
        ["openai/GET v1/models?limit=2", "anthropic/v1/messages/count_tokens", "openai/v1/chat/completions"],
        "the upload is not recorded"
    );
    // Only the model route's answer is cached: a fork must not answer a poll from an old run.
    let cached: Vec<bool> = events.iter().map(|e| d.store.cache_get(&e.key).unwrap().is_some()).collect();
    assert_eq!(cached, [false, false, true]);
    providers.stop().await;

    let replay = d.replay_of(&run).await;
    let again = get(replay.clone(), "/proxy/openai/v1/models?limit=2").await;
    assert_eq!((again.status, again.text()), (200, listed.text()), "served from the log, byte for byte");
    let again = d.call(&replay, "/proxy/anthropic/v1/messages/count_tokens", &count).await;
    assert_eq!(again.text(), counted.text());
    let refused = upload(replay.clone()).await;
    assert_eq!(refused.status, 404, "{}", refused.text());
    assert!(refused.text().contains("POST /v1/audio/transcriptions was not recorded"), "{}", refused.text());
    assert!(refused.text().contains("a replay makes no live call"), "{}", refused.text());
    let again = d.call(&replay, "/proxy/openai/v1/chat/completions", &chat("hello", false)).await;
    assert_eq!(again.text(), answered.text());
    assert_eq!(d.finish(&replay).await["status"], "ok");

    // Another query is another request: a divergence, not the recorded list.
    let replay = d.replay_of(&run).await;
    let other = get(replay.clone(), "/proxy/openai/v1/models?limit=3").await;
    assert_eq!(other.status, 409, "{}", other.text());
}

/// A query reaches the upstream on the model routes too (Azure OpenAI wants `?api-version=`;
/// the proxy used to drop it there), and is part of the step's name and key. A secret in a
/// query is masked in the step's name like one in a body: nothing persisted holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_reaches_the_upstream_on_model_routes_and_a_key_in_it_is_masked_in_the_name() {
    const KEY: &str = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t";
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |c| {
        c.mask_key = Some(MaskKey::from_bytes([5; 32]));
        c.mask_rules = MaskRules::defaults();
    })
    .await;
    let run = d.new_run().await;
    let azure = "/proxy/openai/v1/chat/completions?api-version=2024-10-21";
    let answered = d.call(&run, azure, &chat("hello", false)).await;
    assert_eq!(answered.status, 200, "{}", answered.text());
    assert_eq!(
        answered.header("x-sim-query"),
        Some("api-version=2024-10-21"),
        "the query reached the upstream"
    );
    let keyed = format!("/proxy/openai/v1/chat/completions?key={KEY}");
    let answered_keyed = d.call(&run, &keyed, &chat("hello", false)).await;
    assert_eq!(answered_keyed.header("x-sim-query").map(str::to_owned), Some(format!("key={KEY}")));
    assert_eq!(d.finish(&run).await["status"], "ok");
    let events = d.store.events(&run, 1, 100).unwrap();
    let names: Vec<_> = events.iter().filter_map(|e| e.name.clone()).collect();
    let token = MaskKey::from_bytes([5; 32]).token("apikey", KEY);
    assert_eq!(
        names,
        [
            "openai/v1/chat/completions?api-version=2024-10-21".to_owned(),
            format!("openai/v1/chat/completions?key={token}")
        ]
    );
    providers.stop().await;

    let replay = d.replay_of(&run).await;
    let again = d.call(&replay, azure, &chat("hello", false)).await;
    assert_eq!(again.text(), answered.text(), "served from the log");
    let again = d.call(&replay, &keyed, &chat("hello", false)).await;
    assert_eq!(again.text(), answered_keyed.text(), "the masked name matches the same query again");
    assert_eq!(d.finish(&replay).await["status"], "ok");

    // Another api-version is another request.
    let replay = d.replay_of(&run).await;
    let other = d
        .call(&replay, "/proxy/openai/v1/chat/completions?api-version=2025-01-01", &chat("hello", false))
        .await;
    assert_eq!(other.status, 409, "{}", other.text());
}
