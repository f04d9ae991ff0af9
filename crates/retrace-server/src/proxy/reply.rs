//! Replies the proxy makes itself, in the provider's error shape. Its refusals (divergence 409,
//! store failure 503, 404, 413, 400) carry `x-should-retry: false`, since the official clients
//! otherwise retry them; an upstream that could not be reached or did not answer (502, 504) is
//! left to the client's own retry policy, as it would be without Retrace.
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;

/// Which provider's shapes to speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// OpenAI-compatible.
    OpenAi,
    /// Anthropic-compatible.
    Anthropic,
}

impl Provider {
    /// `openai` or `anthropic`.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
        }
    }
}

/// A refusal in `provider`'s shape, with `x-should-retry: false`.
pub fn error(provider: Provider, status: StatusCode, message: &str) -> Response {
    let mut response = upstream_failure(provider, status, message);
    response.headers_mut().insert("x-should-retry", HeaderValue::from_static("false"));
    response
}

/// The reply for an upstream that could not be reached or did not answer, in `provider`'s shape:
/// no `x-should-retry`, so the client retries it (or not) by its own policy, as it would retry
/// the connection error it would have seen without Retrace.
pub fn upstream_failure(provider: Provider, status: StatusCode, message: &str) -> Response {
    let mut response = Response::new(Body::from(error_body(provider, status, message)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("x-retrace-proxy", HeaderValue::from_static("error"));
    response
}

/// The body of an error in `provider`'s shape.
pub fn error_body(provider: Provider, status: StatusCode, message: &str) -> Vec<u8> {
    let body = match provider {
        Provider::OpenAi => serde_json::json!({
            "error": {"message": message, "type": openai_type(status), "param": null, "code": "retrace_proxy"}
        }),
        Provider::Anthropic => serde_json::json!({
            "type": "error", "error": {"type": anthropic_type(status), "message": message}
        }),
    };
    serde_json::to_vec(&body).expect("JSON")
}

fn openai_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 404 | 409 | 413 | 415 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        _ => "server_error",
    }
}

fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 409 | 415 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}
