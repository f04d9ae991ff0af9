//! Provider routes the proxy doesn't record go to the upstream unrecorded while a run records,
//! so a program that lists models or counts tokens works under `retrace record`; a replay,
//! which makes no live call, refuses them saying why (QA10 D7).
use retrace_demo::providers::Providers;

use super::support::{chat, client, daemon, Reply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_the_proxy_does_not_record_pass_through_while_recording_and_are_refused_in_replay() {
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
    let listed = get(run.clone(), "/proxy/openai/v1/models?limit=2").await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert_eq!(listed.json()["data"].as_array().map(Vec::len), Some(2), "the query reached the upstream");
    assert_eq!(listed.header("x-retrace-proxy"), Some("unrecorded"));
    let counted = d
        .call(&run, "/proxy/anthropic/v1/messages/count_tokens", &serde_json::json!({"model": "claude", "messages": [{"role": "user", "content": "one two three"}]}))
        .await;
    assert_eq!(counted.status, 200, "{}", counted.text());
    assert!(counted.json()["input_tokens"].as_u64().is_some(), "{}", counted.text());
    let answered = d.call(&run, "/proxy/openai/v1/chat/completions", &chat("hello", false)).await;
    assert_eq!(answered.status, 200, "{}", answered.text());
    d.finish(&run).await;
    let events = d.store.events(&run, 1, 100).unwrap();
    assert_eq!(events.len(), 1, "only the chat completion is recorded: {events:?}");

    let replay = d.replay_of(&run).await;
    let refused = get(replay.clone(), "/proxy/openai/v1/models?limit=2").await;
    assert_eq!(refused.status, 404, "{}", refused.text());
    assert!(refused.text().contains("GET /v1/models was not recorded"), "{}", refused.text());
    assert!(refused.text().contains("a replay makes no live call"), "{}", refused.text());
}
