//! The API's error shape for the refusals axum writes itself.
//!
//! A handler's own errors are `{"error": {"code", "message"}}` (the SDKs read `error.code`),
//! but axum answers some requests before any handler runs: a method a route doesn't take
//! (405, with an empty body), a path segment that doesn't percent-decode to UTF-8, a query
//! string a handler can't parse (400 with a line of plain text). Under `/api/` those replies
//! get the same JSON shape here, their status, headers (`Allow` on a 405) and text kept.

use axum::body::{to_bytes, Body};
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::json;

/// The most text of a plain refusal kept (axum's are one line).
const MAX_TEXT: usize = 64 << 10;

/// Rewrites a plain-text or empty error reply of an `/api/` route as JSON.
pub async fn middleware(request: Request, next: Next) -> Response {
    let api = request.uri().path().starts_with("/api/");
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let status = response.status();
    if !api || !(status.is_client_error() || status.is_server_error()) || is_json(&response) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = match to_bytes(body, MAX_TEXT).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        Err(_) => String::new(),
    };
    let (code, message) = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            let allowed = parts.headers.get(header::ALLOW).and_then(|v| v.to_str().ok()).unwrap_or("");
            let message = format!("retrace: {path} does not take {method}; it takes {allowed}");
            ("method_not_allowed", message)
        }
        // axum's "Failed to buffer the request body: length limit exceeded" names neither the
        // step nor the limit (QA34 D4).
        StatusCode::PAYLOAD_TOO_LARGE => (
            "too_large",
            format!(
                "retrace: {path}: the request body is larger than this daemon accepts (--max-body, 32 MiB \
                 by default): {}",
                or_status(&text, status)
            ),
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            ("bad_content_type", format!("retrace: {}", or_status(&text, status)))
        }
        s if s.is_client_error() => ("bad_request", format!("retrace: {path}: {}", or_status(&text, status))),
        _ => ("internal", format!("retrace: {}", or_status(&text, status))),
    };
    let body = json!({"error": {"code": code, "message": message}}).to_string();
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

fn is_json(response: &Response) -> bool {
    let kind = response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    kind.is_some_and(|k| k.starts_with("application/json") || k.starts_with("application/problem+json"))
}

/// `text`, or the status's reason when axum wrote none.
fn or_status(text: &str, status: StatusCode) -> String {
    match text.is_empty() {
        true => status.canonical_reason().unwrap_or("refused").to_lowercase(),
        false => text.to_owned(),
    }
}
