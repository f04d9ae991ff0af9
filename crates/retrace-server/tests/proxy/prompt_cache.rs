//! Prompt caching (QA25 D2): the proxy reads the providers' prompt-cache counts, whole bodies and
//! streams alike, counts them among the input tokens and prices them at their own rates; a replay
//! hands the same bytes back.
use std::net::SocketAddr;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Json;
use retrace_core::envelope::{EventType, Usage};
use serde_json::{json, Value};

use crate::support::{daemon_over, sqlite};

/// An upstream answering as OpenAI and Anthropic do once a prompt's prefix is cached.
async fn caching_upstream() -> SocketAddr {
    async fn chat(Json(request): Json<Value>) -> Response {
        let usage = json!({"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
                           "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0}});
        if request["stream"] == true {
            let body = format!(
                "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
                json!({"id": "c1", "object": "chat.completion.chunk", "model": "gpt-4o-2024-08-06", "usage": null,
                       "choices": [{"index": 0, "delta": {"content": "hi"}}]}),
                json!({"id": "c1", "object": "chat.completion.chunk", "model": "gpt-4o-2024-08-06", "choices": [], "usage": usage}),
            );
            return Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from(body))
                .unwrap();
        }
        Json(json!({"id": "c1", "object": "chat.completion", "model": "gpt-4o-2024-08-06", "usage": usage,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}))
        .into_response()
    }
    async fn messages() -> Response {
        let start = json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-20250514", "content": [], "stop_reason": null,
            "usage": {"input_tokens": 12, "cache_creation_input_tokens": 1000, "cache_read_input_tokens": 8000, "output_tokens": 1}}});
        let delta = json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 50}});
        let body = format!(
            "event: message_start\ndata: {start}\n\nevent: message_delta\ndata: {delta}\n\nevent: message_stop\ndata: {}\n\n",
            json!({"type": "message_stop"})
        );
        Response::builder().header("content-type", "text/event-stream").body(Body::from(body)).unwrap()
    }
    let app =
        axum::Router::new().route("/v1/chat/completions", post(chat)).route("/v1/messages", post(messages));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn counts(u: &Usage) -> (u64, u64, u64, u64) {
    (u.input_tokens, u.cache_read_tokens, u.cache_write_tokens, u.output_tokens)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_cache_tokens_are_counted_and_priced_at_their_rates() {
    let upstream = caching_upstream().await;
    let (store, _home) = sqlite();
    let d = daemon_over(store.clone(), format!("http://{upstream}/v1"), format!("http://{upstream}"), |_| {})
        .await;
    let run = d.new_run().await;
    let chat = |stream: bool| json!({"model": "gpt-4o", "stream": stream, "messages": [{"role": "user", "content": "hi"}]});
    let anthropic = json!({"model": "claude-sonnet-4", "max_tokens": 64, "stream": true,
                           "messages": [{"role": "user", "content": "hi"}]});
    let calls = [
        ("/proxy/openai/v1/chat/completions", chat(false)),
        ("/proxy/openai/v1/chat/completions", chat(true)),
        ("/proxy/anthropic/v1/messages", anthropic),
    ];
    let mut recorded = Vec::new();
    for (path, body) in &calls {
        let reply = d.call(&run, path, body).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.text());
        recorded.push(reply.body);
    }
    assert_eq!(d.finish(&run).await["status"], "ok");

    let events = store.events(&run, 1, 100).unwrap();
    let usages: Vec<Usage> = events
        .iter()
        .filter(|e| e.kind == EventType::ModelCall)
        .map(|e| e.usage.clone().expect("a usage"))
        .collect();
    // OpenAI's cached tokens are among its prompt tokens: 86 at $2.50/M, 1,920 at $1.25/M, 300 out at $10/M.
    let openai = (86.0 * 2.5 + 1920.0 * 1.25 + 300.0 * 10.0) / 1e6;
    for u in &usages[..2] {
        assert_eq!(counts(u), (2006, 1920, 0, 300));
        assert_eq!(u.cost_usd, Some((openai * 1e8f64).round() / 1e8), "{u:?}");
    }
    // Anthropic's are counted apart and added in: 12 at $3/M, 8,000 read at $0.30/M, 1,000
    // written at $3.75/M, 50 out at $15/M.
    assert_eq!(counts(&usages[2]), (9012, 8000, 1000, 50));
    let anthropic = (12.0 * 3.0 + 8000.0 * 0.3 + 1000.0 * 3.75 + 50.0 * 15.0) / 1e6;
    assert_eq!(usages[2].cost_usd, Some((anthropic * 1e8f64).round() / 1e8));
    assert!(usages[2].cost_usd.unwrap() < 9062.0 * 3.0 / 1e6, "cheaper than at the input price");

    // A replay serves the same bytes.
    let replay = d.replay_of(&run).await;
    for ((path, body), bytes) in calls.iter().zip(&recorded) {
        let reply = d.call(&replay, path, body).await;
        assert_eq!(&reply.body, bytes, "{path}");
    }
    assert_eq!(d.finish(&replay).await["status"], "ok");
}
