//! Provider calls the proxy can't record: a body that is neither JSON nor empty (a file upload,
//! an audio transcription's multipart form), which no step can key. Every other route
//! (`GET /v1/models`, moderations, Anthropic's `count_tokens`...) is recorded like a model call.
//! A program recorded with `retrace record` sends every call of its client to the proxy, and one
//! that works against the real API must not break because it is recorded: while a run records
//! (or forks) such calls go to the upstream as they are, unrecorded, and the daemon says so on
//! standard error once per route and run; in a replay, which makes no live call, they are
//! refused, saying why.
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use retrace_runtime::Mode;

use super::reply::{error, upstream_failure, Provider};
use super::{host_error, Named, Target};
use crate::AppState;

/// Response headers not copied from the upstream's answer (recomputed, or hop-by-hop).
const NOT_COPIED: &[&str] =
    &["content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"];

/// What the proxy records, for the messages.
const RECORDED: &str = "calls whose body is JSON or empty";

/// Answers `method` `target` (with `query`), a route the proxy doesn't record.
pub(crate) async fn other_route(
    app: Arc<AppState>,
    target: Target,
    query: Option<String>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let provider = target.provider;
    // Masked as a recorded step's name is: the daemon's standard error is often a kept log (QA27 D6).
    let route = app.masker.mask_url(&format!("{method} {}", target.path)).0.into_owned();
    let named = Named::read(&headers).ok();
    let run = target.run.or(named.and_then(|n| n.run)).or_else(|| app.default_run.clone());
    let Some(run) = run else {
        let msg = format!(
            "retrace proxy: which run is {route} part of? Send X-Retrace-Run (or use \
             /proxy/run/{{run}}/agent/{{agent}}/...), or start the program with `retrace record -- CMD`"
        );
        return error(provider, StatusCode::BAD_REQUEST, &msg);
    };
    let session = match app.host.session(&run) {
        Ok(s) => s,
        Err(e) => return host_error(provider, &e),
    };
    if session.mode() == Mode::Replay {
        let msg = format!(
            "retrace proxy: {route} was not recorded (Retrace records {RECORDED}; other calls go to the \
             upstream unrecorded while recording), and a replay makes no live call, so it can't answer it"
        );
        return error(provider, StatusCode::NOT_FOUND, &msg);
    }
    said_once(&run, &route, provider);
    let limit = app.host.body_limit(&run).unwrap_or(app.config.max_body);
    let body = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b.to_vec(),
        Err(e) => {
            let msg = format!("retrace proxy: could not read the request body of {route}: {e}");
            return error(provider, StatusCode::BAD_REQUEST, &msg);
        }
    };
    let path = match &query {
        Some(q) => format!("{}?{q}", target.path),
        None => target.path.clone(),
    };
    let Ok(upstream_method) = reqwest::Method::from_bytes(method.as_str().as_bytes()) else {
        return error(
            provider,
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("retrace proxy: no method {method}"),
        );
    };
    let upstreams = &app.upstreams;
    let answered = upstreams.send_as(upstream_method, provider, &path, &headers, body).await;
    let response = match answered {
        Ok(response) => response,
        Err(e) => {
            let status = match e {
                super::upstream::UpstreamError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::BAD_GATEWAY,
            };
            return upstream_failure(provider, status, &format!("retrace proxy: {e}"));
        }
    };
    let status = StatusCode::from_u16(response.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut copied = HeaderMap::new();
    for (name, value) in response.headers() {
        if NOT_COPIED.contains(&name.as_str()) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(name.as_str().as_bytes()),
            axum::http::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            copied.append(name, value);
        }
    }
    let bytes = match tokio::time::timeout(upstreams.timeout, response.bytes()).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            let msg = format!("retrace proxy: the upstream's answer to {route} broke off: {e}");
            return upstream_failure(provider, StatusCode::BAD_GATEWAY, &msg);
        }
        Err(_) => {
            let msg = format!("retrace proxy: the upstream's answer to {route} did not finish in time");
            return upstream_failure(provider, StatusCode::GATEWAY_TIMEOUT, &msg);
        }
    };
    let mut reply = Response::new(Body::from(bytes));
    *reply.status_mut() = status;
    *reply.headers_mut() = copied;
    reply.headers_mut().insert("x-retrace-proxy", axum::http::HeaderValue::from_static("unrecorded"));
    reply
}

/// Says on standard error, once per run and route, that `route` went upstream unrecorded;
/// whether it said so now.
fn said_once(run: &str, route: &str, provider: Provider) -> bool {
    static SAID: Mutex<Option<HashSet<(String, String)>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    let first = said.get_or_insert_with(HashSet::new).insert((run.to_owned(), route.to_owned()));
    if first {
        eprintln!(
            "retrace: warning: {route} ({}) went to the upstream unrecorded: Retrace records {RECORDED}; a \
             replay of run {run} can't answer it",
            provider.as_str(),
        );
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warning_is_said_once_per_run_and_route() {
        let said = |run, route| said_once(run, route, Provider::OpenAi);
        assert!(said("01onceA", "GET /v1/models"));
        assert!(!said("01onceA", "GET /v1/models"), "the same run and route: said already");
        assert!(said("01onceA", "POST /v1/moderations"));
        assert!(said("01onceB", "GET /v1/models"));
    }
}
