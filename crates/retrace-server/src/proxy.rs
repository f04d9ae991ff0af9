//! The LLM recording proxy (SPEC §5): OpenAI-compatible `/v1/chat/completions`,
//! `/v1/responses`, `/v1/embeddings` and Anthropic-compatible `/v1/messages`, streaming and not.
//!
//! Each call becomes one `model_call` step of its run and agent, through the runtime's own step
//! pipeline ([`retrace_runtime::Agent::http_model`]): in record the proxy forwards the call
//! upstream and records the response's raw bytes; in replay the runtime matches the call by key
//! and the proxy serves the recorded bytes without contacting any upstream.
//!
//! The run and agent come from `X-Retrace-Run` / `X-Retrace-Agent` (UTF-8) or the path form; an
//! optional `X-Retrace-Role` sets the role recorded on the agent's events (as the SDK's
//! `run.agent(id, role=...)` does through `POST /api/runs/{run}/agents/{agent}/role`). None of
//! them is forwarded upstream or enters a key.
mod decode;
pub mod document;
mod identical;
mod passthrough;
mod record;
mod replay;
pub mod reply;
pub mod sse;
pub mod upstream;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use retrace_runtime::{HttpModelCall, Mode, RuntimeError};

use crate::host::HostError;
use crate::AppState;
use reply::{error, Provider};

pub use upstream::Upstreams;

/// Request headers that change a call's meaning: part of its key (lowercase).
const KEY_HEADERS: &[&str] = &["anthropic-version", "anthropic-beta", "openai-beta"];

/// Where a proxied call goes.
#[derive(Debug)]
pub(crate) struct Target {
    provider: Provider,
    /// Provider path after the proxy prefix: `/v1/chat/completions`.
    path: String,
    run: Option<String>,
    agent: Option<String>,
}

impl Target {
    fn known(&self) -> bool {
        match self.provider {
            Provider::OpenAi => {
                matches!(self.path.as_str(), "/v1/chat/completions" | "/v1/responses" | "/v1/embeddings")
            }
            Provider::Anthropic => self.path == "/v1/messages",
        }
    }
}

/// `/proxy/openai/v1/{*rest}`
pub(crate) async fn openai(
    State(app): State<Arc<AppState>>,
    Path(rest): Path<String>,
    RawQuery(query): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let target = Target { provider: Provider::OpenAi, path: format!("/v1/{rest}"), run: None, agent: None };
    handle(app, target, query, method, headers, body).await
}

/// `/proxy/anthropic/{*rest}`
pub(crate) async fn anthropic(
    State(app): State<Arc<AppState>>,
    Path(rest): Path<String>,
    RawQuery(query): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let target =
        Target { provider: Provider::Anthropic, path: anthropic_path(&rest), run: None, agent: None };
    handle(app, target, query, method, headers, body).await
}

/// `/proxy/run/{run}/agent/{agent}/openai/v1/{*rest}`
pub(crate) async fn openai_for(
    State(app): State<Arc<AppState>>,
    Path((run, agent, rest)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let target = Target {
        provider: Provider::OpenAi,
        path: format!("/v1/{rest}"),
        run: Some(run),
        agent: Some(agent),
    };
    handle(app, target, query, method, headers, body).await
}

/// `/proxy/run/{run}/agent/{agent}/anthropic/{*rest}`
pub(crate) async fn anthropic_for(
    State(app): State<Arc<AppState>>,
    Path((run, agent, rest)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let target = Target {
        provider: Provider::Anthropic,
        path: anthropic_path(&rest),
        run: Some(run),
        agent: Some(agent),
    };
    handle(app, target, query, method, headers, body).await
}

/// `ANTHROPIC_BASE_URL=http://host/v1` is a common slip that makes the client ask for
/// `/v1/v1/messages`: tolerate it.
fn anthropic_path(rest: &str) -> String {
    let path = format!("/{rest}");
    match path.strip_prefix("/v1/v1/") {
        Some(tail) => format!("/v1/{tail}"),
        None => path,
    }
}

/// A proxied request, checked and decoded.
pub(crate) struct Call {
    pub(crate) provider: Provider,
    /// `POST` for the model routes; any method for the others.
    pub(crate) method: Method,
    /// The provider path, with the request's query (Azure's `?api-version=`, `?limit=2`): sent
    /// upstream, and part of the step's name and key.
    pub(crate) path: String,
    /// The request had no body: `body` is `null` (what is keyed and stored), and the upstream
    /// gets none.
    pub(crate) bodiless: bool,
    /// One of the model routes (chat completions, responses, embeddings, messages), whose
    /// answers the cache keeps; other routes' answers are recorded but never cached.
    pub(crate) model_route: bool,
    pub(crate) run: String,
    pub(crate) agent: String,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
    /// The `model` the body asks for (empty when it names none).
    pub(crate) model: String,
}

impl Call {
    /// The request headers that are part of its key, lowercase names.
    fn key_headers(&self) -> Vec<(String, String)> {
        KEY_HEADERS
            .iter()
            .filter_map(|h| {
                self.headers
                    .get(*h)
                    .map(|v| ((*h).to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            })
            .collect()
    }

    fn model_call(&self) -> HttpModelCall {
        HttpModelCall {
            provider: self.provider.as_str().to_owned(),
            method: self.method.as_str().to_owned(),
            path: self.path.clone(),
            key_headers: self.key_headers(),
            body: self.body.clone(),
        }
    }
}

async fn handle(
    app: Arc<AppState>,
    target: Target,
    query: Option<String>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let provider = target.provider;
    // The model routes, and any other route whose body is JSON or empty (`GET /v1/models`,
    // `count_tokens`, moderations...), are recorded; the rest pass through unrecorded.
    let model_route = method == Method::POST && target.known();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let named = match Named::read(&headers) {
        Ok(named) => named,
        Err(why) => return error(provider, StatusCode::BAD_REQUEST, &why),
    };
    let role = named.role;
    let Some(run) = target.run.clone().or(named.run).or_else(|| app.default_run.clone()) else {
        let msg = "retrace proxy: which run is this call part of? Send X-Retrace-Run (or use \
                   /proxy/run/{run}/agent/{agent}/...), or start the program with `retrace record -- CMD`";
        return error(provider, StatusCode::BAD_REQUEST, msg);
    };
    let agent = target.agent.clone().or(named.agent).unwrap_or_else(|| "default".into());
    if let Err(why) = crate::steps::valid_agent(&agent) {
        return error(provider, StatusCode::BAD_REQUEST, &format!("retrace proxy: {why}"));
    }
    if let Some(Err(why)) = role.as_deref().map(crate::steps::valid_role) {
        return error(provider, StatusCode::BAD_REQUEST, &format!("retrace proxy: X-Retrace-Role: {why}"));
    }
    // The run's session first: a run keeps the body limit it was recorded with (QA32 D4).
    let session = match app.host.session(&run) {
        Ok(s) => s,
        Err(e) => return host_error(provider, &e),
    };
    // A request refused for its body is answered and not recorded: noted, so `record` can say
    // why a run holds less than the program asked for (QA28 S4).
    let refuse = |status: StatusCode, msg: &str| {
        app.refused.note(msg);
        error(provider, status, msg)
    };
    let limit = app.host.body_limit(&run).unwrap_or(app.config.max_body);
    if header("content-length").and_then(|n| n.parse::<usize>().ok()).is_some_and(|n| n > limit) {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, &too_large(limit));
    }
    let raw = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => {
            let too_big = std::error::Error::source(&e)
                .is_some_and(|s| s.to_string().contains("length limit"))
                || e.to_string().contains("length limit");
            if too_big {
                return refuse(StatusCode::PAYLOAD_TOO_LARGE, &too_large(limit));
            }
            let msg = format!("retrace proxy: could not read the request body: {e}");
            return refuse(StatusCode::BAD_REQUEST, &msg);
        }
    };
    let body = match decode::decode_body(raw.to_vec(), header("content-encoding").as_deref(), limit) {
        Ok(b) => b,
        Err(decode::DecodeError::TooLarge { limit }) => {
            return refuse(StatusCode::PAYLOAD_TOO_LARGE, &too_large(limit))
        }
        Err(e @ decode::DecodeError::Unsupported(_)) => {
            return refuse(StatusCode::UNSUPPORTED_MEDIA_TYPE, &format!("retrace proxy: {e}"))
        }
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &format!("retrace proxy: {e}")),
    };
    let bodiless = body.is_empty() && !model_route;
    let (body, model) = if bodiless {
        (b"null".to_vec(), String::new())
    } else {
        match asked_model(&body) {
            Ok(model) => (body, model),
            Err(_) if !model_route => {
                // Not JSON (a file upload): not something a step can key; it goes through.
                let passed = Body::from(raw);
                return passthrough::other_route(app, target, query, method, headers, passed).await;
            }
            Err(e) => {
                let msg = format!("retrace proxy: the request body is not valid JSON: {e}");
                return refuse(StatusCode::BAD_REQUEST, &msg);
            }
        }
    };
    let path = match query {
        Some(q) => format!("{}?{q}", target.path),
        None => target.path,
    };
    let call = Call { provider, method, path, bodiless, model_route, run, agent, headers, body, model };
    if let Some(role) = &role {
        session.set_role(&call.agent, role);
    }
    // The SDK's clients name their process as its step routes do: an agent whose steps so far
    // are model calls is then tied to it too, and a replay waiting on it when that process exits
    // stalls at once (QA23 D1: after --stall-timeout).
    if let Some(pid) = call.headers.get("x-retrace-process").map(|v| String::from_utf8_lossy(v.as_bytes())) {
        let Ok(pid) = pid.parse::<u32>() else {
            return error(
                provider,
                StatusCode::BAD_REQUEST,
                "retrace proxy: X-Retrace-Process must be a process id",
            );
        };
        if let Err(e) = app.processes.claim(&app.host, &call.run, &call.agent, pid) {
            return error(provider, StatusCode::CONFLICT, &format!("retrace proxy: {e}"));
        }
    }
    match session.mode() {
        Mode::Record | Mode::Off | Mode::Fork => record::record(app, session, call).await,
        Mode::Replay => replay::replay(app, session, call).await,
    }
}

/// What Retrace's own headers name: `X-Retrace-Run`, `X-Retrace-Agent`, `X-Retrace-Role`.
pub(crate) struct Named {
    run: Option<String>,
    agent: Option<String>,
    role: Option<String>,
}

impl Named {
    /// Each value decoded as UTF-8 (a name such as `アリス` arrives as its UTF-8 bytes, as the
    /// path form takes it percent-encoded), `None` when absent. An empty or non-UTF-8 value is
    /// refused (the reason names the header) rather than the call recorded under another run or
    /// agent.
    pub(crate) fn read(headers: &HeaderMap) -> Result<Named, String> {
        let value = |name: &str, names: &str| {
            let Some(value) = headers.get(name.to_ascii_lowercase()) else { return Ok(None) };
            match std::str::from_utf8(value.as_bytes()) {
                Ok("") => {
                    Err(format!("retrace proxy: {name} is empty; send {names}, or leave the header out"))
                }
                Ok(text) => Ok(Some(text.to_owned())),
                Err(e) => {
                    Err(format!("retrace proxy: {name} is not UTF-8 ({e}); send {names} as UTF-8 text"))
                }
            }
        };
        Ok(Named {
            run: value("X-Retrace-Run", "a run id")?,
            agent: value("X-Retrace-Agent", "an agent id")?,
            role: value("X-Retrace-Role", "a role")?,
        })
    }
}

/// Checks that `body` is JSON and reads the `model` it asks for (empty when it names none), in
/// one pass over a body that is an object.
fn asked_model(body: &[u8]) -> Result<String, serde_json::Error> {
    #[derive(serde::Deserialize)]
    struct Asked<'a> {
        #[serde(borrow, default)]
        model: Option<&'a serde_json::value::RawValue>,
    }
    let model_of = |raw: &serde_json::value::RawValue| serde_json::from_str::<String>(raw.get()).ok();
    if body.first() == Some(&b'{') {
        if let Ok(asked) = serde_json::from_slice::<Asked<'_>>(body) {
            return Ok(asked.model.and_then(model_of).unwrap_or_default());
        }
    }
    // Not an object, not JSON, or an object the struct refuses (a repeated `model`): the whole
    // value says which, and its error is the one the caller is told.
    let value = serde_json::from_slice::<serde_json::Value>(body)?;
    Ok(value.get("model").and_then(serde_json::Value::as_str).unwrap_or_default().to_owned())
}

fn too_large(limit: usize) -> String {
    format!("retrace proxy: the request body is larger than the proxy's limit of {limit} bytes (--max-body)")
}

pub(crate) fn host_error(provider: Provider, e: &HostError) -> Response {
    match e {
        HostError::UnknownRun(_) => error(provider, StatusCode::NOT_FOUND, &format!("retrace proxy: {e}")),
        HostError::Open { source: RuntimeError::Store(s), .. }
            if s.kind() == retrace_store::StoreErrorKind::Busy =>
        {
            let msg = format!(
                "retrace proxy: {e}. One run has one sequencer: a program that records through the \
                 Rust runtime's own Session can't also send its model calls through the proxy for \
                 the same run"
            );
            error(provider, StatusCode::CONFLICT, &msg)
        }
        _ => error(provider, StatusCode::CONFLICT, &format!("retrace proxy: {e}")),
    }
}

/// The reply for a step that failed in the runtime.
pub(crate) fn runtime_error(app: &AppState, call: &Call, e: &RuntimeError) -> Response {
    match e {
        RuntimeError::Divergence(d) => {
            let msg = format!("retrace replay diverged:\n{d}");
            error(call.provider, StatusCode::CONFLICT, &msg)
        }
        RuntimeError::Store(s) => {
            app.host.mark_failed(&call.run, &s.to_string());
            let msg = format!("retrace proxy: the call could not be recorded, so it was not answered (recording fails closed): {s}");
            error(call.provider, StatusCode::SERVICE_UNAVAILABLE, &msg)
        }
        // A request no step can be made of (JSON a canonical value can't hold: invalid UTF-8, a
        // duplicate key, a lone surrogate) is the client's to fix, as a body that doesn't parse:
        // 400, not the 409 a divergence gets (QA28 D2).
        RuntimeError::NotCanonical { .. } => {
            let msg = format!("retrace proxy: {e}");
            app.refused.note(&msg);
            error(call.provider, StatusCode::BAD_REQUEST, &msg)
        }
        other => error(call.provider, StatusCode::CONFLICT, &format!("retrace proxy: {other}")),
    }
}
