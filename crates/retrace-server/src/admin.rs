//! The API's admin routes (the `admin` role's, SPEC §4 `retrace vault`, `retain`, `gc` over
//! HTTP). Each calls the very function its command calls, in `retrace-store`, so the two can't
//! disagree:
//!
//! - `POST /api/vault/reveal` `{token, reason}` → `{token, original}` (`original` as text when it
//!   is UTF-8, else base64 with `encoding: "base64"`), under the daemon's vault key; every
//!   attempt is in the audit log before it is answered, refusals included ([`vault`]).
//! - `GET /api/vault/audit[?token=|?run=]` → the audit log, oldest first.
//! - `POST /api/runs/{run}/retain` `{tier}` → `{run, retention, previous}` ([`retention`]).
//! - `POST /api/gc` `{dry_run, older_than_days?}` → what `retrace gc --json` prints.
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use retrace_store::{StoreError, StoreErrorKind};
use serde::de::DeserializeOwned;
use serde_json::json;

pub mod retention;
pub mod vault;

/// Why an admin call failed: each kind's status and code in one place, written as
/// `{"error": {code, message}}`.
#[derive(Debug)]
pub enum AdminError {
    /// 400 `bad_request`: a body or query that doesn't parse, an unknown tier, an ambiguous
    /// run prefix.
    BadRequest(String),
    /// 400 `missing_reason`: a reveal without a reason (audited).
    MissingReason(String),
    /// 400 `replay_has_no_tier`: replay runs go with their source.
    ReplayHasNoTier(String),
    /// 403 `forbidden`: the vault refused the role.
    Forbidden(String),
    /// 404 `unknown_run`.
    UnknownRun(String),
    /// 404 `unknown_token`: the vault holds no original for it (audited).
    UnknownToken(String),
    /// 409 `no_vault_key`: the daemon was started without `RETRACE_VAULT_KEY` (audited).
    NoVaultKey(String),
    /// 409 `cannot_open`: the original doesn't open under the daemon's vault key (audited).
    CannotOpen(String),
    /// 409 `run_in_use`: a run to delete is running, or a remaining fork or running replay
    /// needs it.
    RunInUse(String),
    /// 409 `read_only`: the daemon serves a store it can't write.
    ReadOnly(String),
    /// 503 `store_failed`: the store (or the audit log) could not be used; nothing was revealed.
    Store(String),
    /// 500 `internal`.
    Internal(String),
}

impl AdminError {
    fn from_store(e: &StoreError) -> AdminError {
        match e.kind {
            StoreErrorKind::NotFound => AdminError::UnknownRun(e.to_string()),
            StoreErrorKind::ReadOnly => AdminError::ReadOnly(e.to_string()),
            _ => AdminError::Store(e.to_string()),
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        use AdminError::*;
        let (status, code, message) = match self {
            BadRequest(m) => (StatusCode::BAD_REQUEST, "bad_request", m),
            MissingReason(m) => (StatusCode::BAD_REQUEST, "missing_reason", m),
            ReplayHasNoTier(m) => (StatusCode::BAD_REQUEST, "replay_has_no_tier", m),
            Forbidden(m) => (StatusCode::FORBIDDEN, "forbidden", m),
            UnknownRun(m) => (StatusCode::NOT_FOUND, "unknown_run", m),
            UnknownToken(m) => (StatusCode::NOT_FOUND, "unknown_token", m),
            NoVaultKey(m) => (StatusCode::CONFLICT, "no_vault_key", m),
            CannotOpen(m) => (StatusCode::CONFLICT, "cannot_open", m),
            RunInUse(m) => (StatusCode::CONFLICT, "run_in_use", m),
            ReadOnly(m) => (StatusCode::CONFLICT, "read_only", m),
            Store(m) => (StatusCode::SERVICE_UNAVAILABLE, "store_failed", m),
            Internal(m) => (StatusCode::INTERNAL_SERVER_ERROR, "internal", m),
        };
        (status, Json(json!({"error": {"code": code, "message": message}}))).into_response()
    }
}

/// A JSON body that must be there and parse (400 otherwise).
fn required_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, AdminError> {
    serde_json::from_slice(bytes).map_err(|e| AdminError::BadRequest(format!("bad request body: {e}")))
}

/// Runs `work` on the blocking pool (the store's calls block).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, AdminError> + Send + 'static,
) -> Result<T, AdminError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| Err(AdminError::Internal(e.to_string())))
}

/// Unix milliseconds now.
fn now_ms() -> u64 {
    use retrace_runtime::env_sources::{Clock as _, SystemClock};
    SystemClock.now_ms()
}

/// The answer of a handler: JSON, or the error's JSON.
fn answer<T: serde::Serialize>(result: Result<T, AdminError>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(e) => e.into_response(),
    }
}
