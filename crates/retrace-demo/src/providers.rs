//! A local stand-in for the OpenAI and Anthropic HTTP APIs, speaking their wire formats
//! (research/protocols.md): Chat Completions, Responses and Embeddings, and Anthropic Messages,
//! each streaming (SSE) and not. It is the demo's simulator, clearly not a model: answers are
//! random words, and ids, timestamps and chunk boundaries vary from call to call, as they do
//! upstream. It serves the proxy's tests, benchmarks and examples (`retrace simulate`).
//!
//! Misbehaviour on request, by the `model` name: `…-gzip` compresses the response whatever the
//! client accepts; `…-hang` never answers; `…-truncate` breaks a stream off mid-way (and
//! `…-truncate-early` before its first chunk); `…-429`
//! answers 429 with `retry-after: 3`, `…-500` 500 with no `retry-after`; `…-slow` spaces stream chunks by 20 ms; `…-stall` sends two stream events, then nothing for 10 minutes; `…-echo…` answers
//! with the last user text, streamed in pieces of three characters, and sends it back in an
//! `x-echo` response header (the privacy canary test's upstream). A request header
//! `x-sim-delay-ms: N` holds the answer back N ms (up to 10 s), so identical requests can be made
//! to finish in another order than they were sent. Chat Completions sends a request's query
//! (Azure's `?api-version=`) back in an `x-sim-query` response header.
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use rand::Rng;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

/// A running provider stand-in; stopped by [`Providers::stop`] or when dropped.
pub struct Providers {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Providers").field("addr", &self.addr).finish()
    }
}

impl Providers {
    /// Starts on `addr` (`127.0.0.1:0` for a free port).
    pub async fn start(addr: &str) -> std::io::Result<Providers> {
        let requests = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/responses", post(responses))
            .route("/v1/embeddings", post(embeddings))
            .route("/v1/messages", post(messages))
            .route("/v1/models", axum::routing::get(models))
            .route("/v1/messages/count_tokens", post(count_tokens))
            .with_state(requests.clone());
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(Providers { addr, requests, shutdown: Some(tx), task: Some(task) })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `OPENAI_BASE_URL` for it (with `/v1`).
    pub fn openai_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `ANTHROPIC_BASE_URL` for it.
    pub fn anthropic_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests served so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Stops serving; later connections are refused.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Providers {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// What a request asked for.
struct Ask {
    model: String,
    stream: bool,
    include_usage: bool,
    /// The last user text, for `…-echo` models.
    echo: String,
}

impl Ask {
    fn of(body: &Value) -> Ask {
        Ask {
            model: body["model"].as_str().unwrap_or("sim").to_owned(),
            stream: body["stream"].as_bool().unwrap_or(false),
            include_usage: body["stream_options"]["include_usage"].as_bool().unwrap_or(false),
            echo: last_user_text(body),
        }
    }
    /// The answer's text in stream pieces: `n` random words (the first bare, then each with a
    /// leading space), or for `…-echo` the last user text in pieces of three characters, so a
    /// secret in the prompt comes back split across chunks.
    fn pieces(&self, n: usize) -> Vec<String> {
        if self.echoes() {
            let chars: Vec<char> = self.echo.chars().collect();
            return chars.chunks(3).map(|c| c.iter().collect()).collect();
        }
        words(n).into_iter().enumerate().map(|(i, w)| if i == 0 { w } else { format!(" {w}") }).collect()
    }
    fn wants(&self, quirk: &str) -> bool {
        self.model.ends_with(quirk)
    }
    /// `-echo` combines with the other quirks (`sim-echo-gzip`).
    fn echoes(&self) -> bool {
        self.model.contains("-echo")
    }
    /// The pinned snapshot a real provider reports for an alias.
    fn snapshot(&self) -> String {
        format!("{}-2026-11-01", self.model)
    }
}

/// The text of the last message (Chat Completions and Anthropic `messages`, Responses `input`),
/// its content a string or a list of text parts.
fn last_user_text(body: &Value) -> String {
    let last = match (&body["messages"], &body["input"]) {
        (Value::Array(m), _) => m.last().cloned().unwrap_or(Value::Null),
        (_, Value::Array(items)) => items.last().cloned().unwrap_or(Value::Null),
        (_, Value::String(s)) => return s.clone(),
        _ => Value::Null,
    };
    match &last["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join(""),
        _ => String::new(),
    }
}

/// A random id. Its hex digits follow letters, never a separator: 16 random hex digits are
/// sometimes all decimal, and standing alone they can pass for a card number, which the
/// default masking rules replace with a token (so the recorded bytes would differ from the
/// bytes the client received).
fn id(prefix: &str) -> String {
    let n: u64 = rand::thread_rng().gen();
    format!("{prefix}sim{n:016x}")
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn words(n: usize) -> Vec<String> {
    const WORDS: &[&str] =
        &["the", "plan", "looks", "sound", "but", "check", "the", "backfill", "first", "then", "ship", "it"];
    let mut rng = rand::thread_rng();
    (0..n).map(|_| WORDS[rng.gen_range(0..WORDS.len())].to_owned()).collect()
}

/// Parses the body, counts the request, and applies the quirks that precede any answer.
async fn intake(counter: &AtomicUsize, body: &Bytes) -> Result<(Value, Ask), Response> {
    counter.fetch_add(1, Ordering::SeqCst);
    let Ok(body) = serde_json::from_slice::<Value>(body) else {
        return Err(json_response(
            StatusCode::BAD_REQUEST,
            &json!({"error": {"message": "bad JSON"}}),
            false,
        ));
    };
    let ask = Ask::of(&body);
    if ask.wants("-hang") {
        std::future::pending::<()>().await;
    }
    if ask.wants("-429") {
        let mut r = json_response(
            StatusCode::TOO_MANY_REQUESTS,
            &json!({"error": {"message": "Rate limit reached", "type": "rate_limit_error", "param": null, "code": null}}),
            false,
        );
        r.headers_mut().insert("retry-after", "3".parse().expect("header"));
        return Err(r);
    }
    if ask.wants("-500") {
        let error = json!({"error": {"message": "The server had an error", "type": "server_error", "param": null, "code": null}});
        return Err(json_response(StatusCode::INTERNAL_SERVER_ERROR, &error, false));
    }
    Ok((body, ask))
}

fn json_response(status: StatusCode, body: &Value, gzip: bool) -> Response {
    let bytes = serde_json::to_vec(body).expect("JSON");
    let mut response = if gzip {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&bytes).expect("gzip to memory");
        let mut r = Response::new(Body::from(enc.finish().expect("gzip to memory")));
        r.headers_mut().insert("content-encoding", "gzip".parse().expect("header"));
        r
    } else {
        Response::new(Body::from(bytes))
    };
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert("content-type", "application/json".parse().expect("header"));
    headers.insert("x-request-id", id("req_").parse().expect("header"));
    response
}

/// A server-sent event stream of `events`, spaced as asked; `-truncate` breaks off halfway.
fn sse(ask: &Ask, events: Vec<String>) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let gap = if ask.wants("-slow") { Duration::from_millis(20) } else { Duration::ZERO };
    let cut = if ask.wants("-truncate-early") {
        Some(0)
    } else {
        ask.wants("-truncate").then_some(events.len() / 2)
    };
    // `-stall`: two events, then nothing for ten minutes (a stream whose upstream stalls).
    let stall = ask.wants("-stall").then_some(2);
    tokio::spawn(async move {
        for (i, event) in events.into_iter().enumerate() {
            if Some(i) == stall {
                tokio::time::sleep(Duration::from_secs(600)).await;
            }
            if Some(i) == cut {
                // A pause first, so what came before is written before the connection breaks.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = tx.send(Err(std::io::Error::other("simulated upstream failure"))).await;
                return;
            }
            if !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
            if tx.send(Ok(Bytes::from(event))).await.is_err() {
                return;
            }
        }
    });
    let mut response = Response::new(Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)));
    response
        .headers_mut()
        .insert("content-type", "text/event-stream; charset=utf-8".parse().expect("header"));
    response.headers_mut().insert("x-request-id", id("req_").parse().expect("header"));
    echoed(ask, response)
}

/// For `…-echo` models: the last user text in an `x-echo` response header too.
fn echoed(ask: &Ask, mut response: Response) -> Response {
    if ask.echoes() {
        // A header holds no control characters: they become spaces.
        if let Ok(value) = ask.echo.replace(|c: char| c.is_control(), " ").parse() {
            response.headers_mut().insert("x-echo", value);
        }
    }
    response
}

/// Waits as long as the request's `x-sim-delay-ms` header asks (up to 10 s).
async fn delay(headers: &HeaderMap) {
    let ms = headers.get("x-sim-delay-ms").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(ms) = ms {
        tokio::time::sleep(Duration::from_millis(ms.min(10_000))).await;
    }
}

async fn chat(
    State(counter): State<Arc<AtomicUsize>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut response = chat_answer(counter, headers, body).await;
    if let Some(value) = query.and_then(|q| axum::http::HeaderValue::from_str(&q).ok()) {
        response.headers_mut().insert("x-sim-query", value);
    }
    response
}

async fn chat_answer(counter: Arc<AtomicUsize>, headers: HeaderMap, body: Bytes) -> Response {
    let (_, ask) = match intake(&counter, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    delay(&headers).await;
    let (cid, created, model) = (id("chatcmpl-"), now(), ask.snapshot());
    let text = ask.pieces(6);
    let usage =
        json!({"prompt_tokens": 12, "completion_tokens": text.len(), "total_tokens": 12 + text.len()});
    if !ask.stream {
        let body = json!({
            "id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text.concat(), "refusal": null},
                         "logprobs": null, "finish_reason": "stop"}],
            "usage": usage, "system_fingerprint": id("fp_"),
        });
        return echoed(&ask, json_response(StatusCode::OK, &body, ask.wants("-gzip")));
    }
    let chunk = |delta: Value, finish: Value| {
        let c = json!({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]});
        format!("data: {c}\n\n")
    };
    let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
    for piece in &text {
        events.push(chunk(json!({"content": piece}), Value::Null));
    }
    events.push(chunk(json!({}), json!("stop")));
    if ask.include_usage {
        let c = json!({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [], "usage": usage});
        events.push(format!("data: {c}\n\n"));
    }
    events.push("data: [DONE]\n\n".into());
    sse(&ask, events)
}

async fn responses(State(counter): State<Arc<AtomicUsize>>, body: Bytes) -> Response {
    let (_, ask) = match intake(&counter, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (rid, mid, created, model) = (id("resp_"), id("msg_"), now(), ask.snapshot());
    let pieces = ask.pieces(5);
    let text = pieces.concat();
    let usage = json!({"input_tokens": 9, "output_tokens": 5, "total_tokens": 14});
    let done = |status: &str| {
        json!({"id": rid, "object": "response", "created_at": created, "status": status, "model": model,
               "output": [{"id": mid, "type": "message", "status": "completed", "role": "assistant",
                           "content": [{"type": "output_text", "text": text, "annotations": []}]}],
               "usage": usage})
    };
    if !ask.stream {
        return echoed(&ask, json_response(StatusCode::OK, &done("completed"), ask.wants("-gzip")));
    }
    let mut seq = 0;
    let mut event = |kind: &str, mut data: Value| {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(seq);
        seq += 1;
        format!("event: {kind}\ndata: {data}\n\n")
    };
    let mut created_resp = done("in_progress");
    created_resp["output"] = json!([]);
    let mut events = vec![event("response.created", json!({"response": created_resp}))];
    for w in &pieces {
        events.push(event(
            "response.output_text.delta",
            json!({"item_id": mid, "output_index": 0, "content_index": 0, "delta": w}),
        ));
    }
    events.push(event("response.completed", json!({"response": done("completed")})));
    sse(&ask, events)
}

/// `GET /v1/models`: the models a program may ask for, as OpenAI lists them (`?limit=N` keeps
/// the first N): a route the proxy passes through unrecorded.
async fn models(
    State(counter): State<Arc<AtomicUsize>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    counter.fetch_add(1, Ordering::SeqCst);
    let limit = query
        .as_deref()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("limit=")))
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(usize::MAX);
    let data: Vec<Value> = ["gpt-4o-mini", "gpt-4o", "text-embedding-3-small"]
        .iter()
        .take(limit)
        .map(|id| json!({"id": id, "object": "model", "created": 1_715_367_049, "owned_by": "retrace-simulate"}))
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}), false)
}

/// `POST /v1/messages/count_tokens`: Anthropic's count, one token per word of the messages.
async fn count_tokens(State(counter): State<Arc<AtomicUsize>>, body: Bytes) -> Response {
    counter.fetch_add(1, Ordering::SeqCst);
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return json_response(
            StatusCode::BAD_REQUEST,
            &json!({"type": "error", "error": {"type": "invalid_request_error", "message": "not JSON"}}),
            false,
        );
    };
    let words = body["messages"].to_string().split_whitespace().count();
    json_response(StatusCode::OK, &json!({"input_tokens": words}), false)
}

async fn embeddings(State(counter): State<Arc<AtomicUsize>>, body: Bytes) -> Response {
    let (body, ask) = match intake(&counter, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let inputs = match &body["input"] {
        Value::Array(items) => items.len(),
        _ => 1,
    };
    let base64 = body["encoding_format"].as_str() == Some("base64");
    let data: Vec<Value> = (0..inputs)
        .map(|i| {
            let v: Vec<f32> = (0..8).map(|_| rand::thread_rng().gen_range(-1.0..1.0)).collect();
            let embedding = if base64 {
                use base64::Engine;
                let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let out = json!({"object": "list", "data": data, "model": ask.model, "usage": {"prompt_tokens": 4, "total_tokens": 4}});
    json_response(StatusCode::OK, &out, ask.wants("-gzip"))
}

async fn messages(State(counter): State<Arc<AtomicUsize>>, headers: HeaderMap, body: Bytes) -> Response {
    if headers.get("anthropic-version").is_none() {
        let err = json!({"type": "error", "error": {"type": "invalid_request_error", "message": "anthropic-version header is required"}});
        return json_response(StatusCode::BAD_REQUEST, &err, false);
    }
    let (_, ask) = match intake(&counter, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    delay(&headers).await;
    let (mid, model) = (id("msg_"), ask.snapshot());
    let text = ask.pieces(7);
    if !ask.stream {
        let body = json!({
            "id": mid, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text.concat()}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 21, "output_tokens": text.len()},
        });
        return echoed(&ask, json_response(StatusCode::OK, &body, ask.wants("-gzip")));
    }
    let event = |kind: &str, data: Value| format!("event: {kind}\ndata: {data}\n\n");
    let mut events = vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": {"id": mid, "type": "message", "role": "assistant",
            "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 21, "output_tokens": 1}}}),
        ),
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        // The real API's ping has spaces in its JSON: replay must keep raw bytes.
        "event: ping\ndata: {\"type\": \"ping\"}\n\n".to_owned(),
    ];
    for piece in &text {
        events.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}),
        ));
    }
    events.push(event("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
    events.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": text.len()}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    sse(&ask, events)
}

#[cfg(test)]
mod tests {
    use retrace_core::mask::{MaskKey, MaskRules, Masker};

    #[test]
    fn the_default_masking_rules_leave_simulated_ids_alone() {
        let masker = Masker::new(MaskRules::defaults(), Some(MaskKey::from_bytes([7; 32]))).unwrap();
        // The old form: sixteen hex digits, all decimal by chance, standing alone after a dash.
        let (masked, tokens) = masker.mask_text("chatcmpl-4532015112830366");
        assert_eq!(tokens, 1, "{masked}");
        for prefix in ["chatcmpl-", "fp_", "msg_", "resp_", "req_"] {
            for _ in 0..2_000 {
                let id = super::id(prefix);
                assert_eq!(masker.mask_text(&id).1, 0, "{id}");
            }
            let digits = format!("{prefix}sim4532015112830366");
            assert_eq!(masker.mask_text(&digits).1, 0, "{digits}");
        }
    }
}
