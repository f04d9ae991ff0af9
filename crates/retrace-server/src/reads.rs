//! The API's read routes (the `viewer` role's): a run's events page by page, a blob's bytes,
//! and a run's `retrace-trace/1` export. What they serve is what the store holds: masked.
//!
//! - `GET /api/runs/{run}/events?from=1&limit=100` → `{run_id, count, events: [event…], next}`;
//!   a fork's inherited events included; `next` is the `from` of the next page, or null.
//! - `GET /api/blobs/{digest}` → the bytes. The digest must be exactly `sha256:<64 lowercase
//!   hex>`; anything else (a dot, a slash, an escape, NUL) is 400 before the store is asked.
//! - `GET /api/runs/{run}/export` → the trace file, streamed as it is written.
use std::io;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use retrace_core::run::RunMeta;
use retrace_core::{Digest, Event};
use retrace_store::export::{export_run, RunEvents};
use retrace_store::{Store, StoreError, StoreErrorKind};
use serde::Deserialize;
use serde_json::json;

use crate::AppState;

/// The most events one page holds.
pub const MAX_PAGE: u64 = 1000;

/// Why a read failed: each kind's status and code in one place, written as
/// `{"error": {code, message}}`.
#[derive(Debug)]
pub enum ReadError {
    /// 400 `bad_request`: a bad query or an ambiguous run prefix.
    BadRequest(String),
    /// 400 `bad_digest`: not exactly `sha256:<64 lowercase hex>`.
    BadDigest,
    /// 404 `unknown_run`.
    UnknownRun(String),
    /// 404 `unknown_blob`.
    UnknownBlob(Digest),
    /// 500 `corrupt`: stored bytes fail their digest.
    Corrupt(String),
    /// 503 `store_failed`: the store could not answer.
    Store(String),
    /// 500 `internal`.
    Internal(String),
}

impl ReadError {
    fn from_store(e: &StoreError) -> ReadError {
        match e.kind {
            StoreErrorKind::NotFound => ReadError::UnknownRun(e.to_string()),
            StoreErrorKind::Corrupt => ReadError::Corrupt(e.to_string()),
            _ => ReadError::Store(e.to_string()),
        }
    }
}

impl IntoResponse for ReadError {
    fn into_response(self) -> Response {
        let (status, code, message) = match self {
            ReadError::BadRequest(m) => (StatusCode::BAD_REQUEST, "bad_request", m),
            ReadError::BadDigest => (
                StatusCode::BAD_REQUEST,
                "bad_digest",
                "a blob is named by its digest: sha256: and 64 lowercase hex digits".into(),
            ),
            ReadError::UnknownRun(m) => (StatusCode::NOT_FOUND, "unknown_run", m),
            ReadError::UnknownBlob(d) => (StatusCode::NOT_FOUND, "unknown_blob", format!("no blob {d}")),
            ReadError::Corrupt(m) => (StatusCode::INTERNAL_SERVER_ERROR, "corrupt", m),
            ReadError::Store(m) => (StatusCode::SERVICE_UNAVAILABLE, "store_failed", m),
            ReadError::Internal(m) => (StatusCode::INTERNAL_SERVER_ERROR, "internal", m),
        };
        (status, Json(json!({"error": {"code": code, "message": message}}))).into_response()
    }
}

/// Runs `work` on the blocking pool (the store's calls block).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ReadError> + Send + 'static,
) -> Result<T, ReadError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| Err(ReadError::Internal(e.to_string())))
}

/// The run `id` names (an id or a unique prefix).
fn find(store: &dyn Store, id: &str) -> Result<RunMeta, ReadError> {
    store.find_run(id).map_err(|e| match e.kind {
        StoreErrorKind::NotFound => ReadError::UnknownRun(e.to_string()),
        _ => ReadError::BadRequest(e.to_string()),
    })
}

/// The query of `events`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    from: Option<u64>,
    limit: Option<u64>,
}

/// `GET /api/runs/{run}/events?from=&limit=`
pub async fn events(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Response {
    let query = match query {
        Ok(Query(q)) => q,
        Err(e) => return ReadError::BadRequest(e.body_text()).into_response(),
    };
    let from = query.from.unwrap_or(1);
    let limit = query.limit.unwrap_or(100);
    if from == 0 || !(1..=MAX_PAGE).contains(&limit) {
        let message = format!("from must be at least 1 and limit 1 to {MAX_PAGE}");
        return ReadError::BadRequest(message).into_response();
    }
    let store = app.host.store().clone();
    let page = blocking(move || {
        let meta = find(&*store, &id)?;
        let (count, events) = page(&*store, &meta.id, from, limit).map_err(|e| ReadError::from_store(&e))?;
        Ok((meta.id, count, events))
    })
    .await;
    match page {
        Ok((run_id, count, events)) => {
            let next = events.last().map(|e| e.seq + 1).filter(|&n| n <= count);
            Json(json!({"run_id": run_id, "count": count, "events": events, "next": next})).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// Events `from..from + limit` of `run`'s whole history (a fork's inherited ones included),
/// and how many it has.
fn page(store: &dyn Store, run: &str, from: u64, limit: u64) -> Result<(u64, Vec<Event>), StoreError> {
    let history = RunEvents::new(store, run)?;
    let mut events = Vec::new();
    let mut seq = from;
    for segment in history.segments() {
        let left = limit - events.len() as u64;
        if left == 0 || seq > segment.to || seq < segment.from {
            continue;
        }
        let take = left.min(segment.to - seq + 1);
        events.extend(store.events(&segment.run, seq, take as usize)?);
        seq += take;
    }
    Ok((history.count(), events))
}

/// `sha256:<64 lowercase hex>`, nothing else.
fn parse_digest(text: &str) -> Option<Digest> {
    let hex = text.strip_prefix("sha256:")?;
    let exact = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    exact.then(|| text.parse().ok()).flatten()
}

/// `GET /api/blobs/{digest}`
pub async fn blob(State(app): State<Arc<AppState>>, Path(text): Path<String>) -> Response {
    let Some(digest) = parse_digest(&text) else {
        return ReadError::BadDigest.into_response();
    };
    let store = app.host.store().clone();
    let bytes = blocking(move || {
        store.get_blob(&digest).map_err(|e| match e.kind {
            StoreErrorKind::NotFound => ReadError::UnknownBlob(digest),
            _ => ReadError::from_store(&e),
        })
    })
    .await;
    match bytes {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /api/runs/{run}/export`: the file `retrace export RUN` writes, streamed.
pub async fn export(State(app): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    let store = app.host.store().clone();
    let meta = match blocking({
        let store = store.clone();
        move || find(&*store, &id)
    })
    .await
    {
        Ok(meta) => meta,
        Err(e) => return e.into_response(),
    };
    if meta.labels.contains_key(retrace_store::import::UNFINISHED_LABEL) {
        let why = format!(
            "retrace: run {} is an unfinished import, not the whole run: import its trace file again, then export it",
            meta.id
        );
        return crate::api::ApiError::new(StatusCode::CONFLICT, why).into_response();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(4);
    let run = meta.id.clone();
    tokio::task::spawn_blocking(move || {
        let mut out = ChannelWriter(tx.clone());
        if let Err(e) = export_run(&*store, &run, &mut out, &mut |_| {}) {
            let _ = tx.blocking_send(Err(io::Error::other(e.to_string())));
        }
    });
    let mut response = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{}.jsonl\"", meta.id)) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    response
}

/// Writes into a response body; a client that went away is a broken pipe.
struct ChannelWriter(tokio::sync::mpsc::Sender<io::Result<Bytes>>);

impl io::Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_exact_digests_parse() {
        let good = format!("sha256:{}", "0123456789abcdef".repeat(4));
        assert!(super::parse_digest(&good).is_some());
        for bad in [
            good.to_uppercase(),
            good.replace("sha256:", "SHA256:"),
            format!("{good}0"),
            good[..good.len() - 1].to_owned(),
            format!("sha256:{}", "../".repeat(21) + "a"),
            format!("sha256:{}\0", &good[7..70]),
            "sha256:%2e%2e".into(),
            String::new(),
        ] {
            assert!(super::parse_digest(&bad).is_none(), "{bad:?}");
        }
    }
}
