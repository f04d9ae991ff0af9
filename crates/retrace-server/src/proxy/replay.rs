//! Replay: the runtime matches the call by key against its agent's unconsumed recorded steps
//! (SPEC §7) and the proxy serves the recorded bytes, stream chunks and their boundaries
//! included. No upstream is contacted.
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::StreamExt;
use retrace_runtime::scheduler::Hold;
use retrace_runtime::{RuntimeError, Session};

use super::document::{ClientGone, Recorded, RecordedBody, StreamEnd};
use super::reply::error;
use super::{runtime_error, Call};
use crate::AppState;

/// Serves `call` from the log.
pub(crate) async fn replay(app: Arc<AppState>, session: Session, call: Call) -> Response {
    let agent = session.agent(&call.agent);
    let never = |_| async { Err(RuntimeError::Usage("replay never calls the upstream".into())) };
    match agent.http_model(call.model_call(), never).await {
        Ok(reply) => match Recorded::decode(&reply.document) {
            Ok(doc) => {
                let held = hold_if_client_left(&session, &reply.document).await;
                respond_with(doc, true, held)
            }
            Err(e) => error(call.provider, StatusCode::INTERNAL_SERVER_ERROR, &format!("retrace proxy: {e}")),
        },
        Err(e) => runtime_error(&app, &call, &e),
    }
}

/// For a call whose client left (`client_gone`): waits as the client did in record, so a client
/// that gives up as it did then (its timeout) gives up again, rather than getting an answer it
/// never had. A client that left before the answer is held past where it left
/// ([`ClientGone::grace_ms`]), then gets the recorded 504; one that left mid-stream gets the head
/// after the time the upstream took, then the whole stream, paced as recorded. Leaving drops this
/// future with the request's. Returns what [`respond_with`] needs to pace a stream.
///
/// The run's stall watchdog is held off meanwhile, and while the paced stream is sent: the
/// hold can outlast `--stall-timeout` (a client that waited a minute), and another agent
/// waiting for what this one does after it is not a stall.
pub(crate) async fn hold_if_client_left(session: &Session, document: &[u8]) -> Option<Held> {
    let gone = ClientGone::of(document)?;
    let hold = session.hold();
    let wait = match gone.answered_ms {
        Some(answered) => answered,
        None => gone.left_ms + ClientGone::grace_ms(gone.left_ms),
    };
    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
    Some(Held { gone, _hold: hold })
}

/// A call whose client left, held back ([`hold_if_client_left`]).
pub(crate) struct Held {
    gone: ClientGone,
    /// Keeps the stall watchdog off until the response's body is sent or dropped.
    _hold: Option<Hold>,
}

/// The response a recorded document stands for. In replay, a recorded error's `retry-after`
/// and `retry-after-ms` are served as `retry-after-ms: 1`, so a recorded retry follows at once
/// (the log keeps the original headers); so is a recorded error the official clients retry
/// by their own backoff when it says nothing (408, 409, 429, 5xx: up to seconds per retry), and
/// the proxy's own reply for an upstream it could not reach.
pub(crate) fn respond(doc: Recorded, replaying: bool) -> Response {
    respond_with(doc, replaying, None)
}

/// [`respond`] for a call whose client left (`held`): a stream's chunks at their recorded times
/// after the head, so that a read timeout that fired between two chunks in record fires again.
pub(crate) fn respond_with(doc: Recorded, replaying: bool, held: Option<Held>) -> Response {
    let paced = held.as_ref().is_some_and(|h| h.gone.answered_ms.is_some());
    let has = |name: &str| doc.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    let upstream_failed =
        doc.headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("x-retrace-proxy") && v == "error")
            && !has("x-should-retry");
    let backed_off = matches!(doc.status, 408 | 409 | 429) || doc.status >= 500;
    let retry_soon = replaying
        && doc.status >= 400
        && (has("retry-after") || has("retry-after-ms") || upstream_failed || backed_off);
    let body = match doc.body {
        RecordedBody::Whole(bytes) => Body::from(bytes),
        RecordedBody::Stream { chunks, end, error } => {
            let head = tokio::time::Instant::now();
            let chunks = futures_util::stream::iter(chunks).then(move |(t_ms, c)| {
                // The closure owns the hold: it ends with the body, sent or dropped.
                let _ = &held;
                async move {
                    if paced {
                        tokio::time::sleep_until(head + std::time::Duration::from_millis(t_ms)).await;
                    }
                    Ok(c)
                }
            });
            let broke_off = (end == StreamEnd::Truncated).then(|| {
                let why = error.unwrap_or_else(|| "the upstream broke off the stream".into());
                std::io::Error::other(format!("recorded truncated stream: {why}"))
            });
            Body::from_stream(chunks.chain(futures_util::stream::iter(broke_off).then(break_off)))
        }
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(doc.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = response.headers_mut();
    for (name, value) in &doc.headers {
        if retry_soon
            && (name.eq_ignore_ascii_case("retry-after") || name.eq_ignore_ascii_case("retry-after-ms"))
        {
            continue;
        }
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
            headers.append(n, v);
        }
    }
    if retry_soon {
        headers.insert("retry-after-ms", HeaderValue::from_static("1"));
    }
    response
}

/// Ends a body with `e` once what came before has been written: the server drops whatever is
/// still buffered when a body fails, so the break comes after a pause.
pub(crate) async fn break_off(e: std::io::Error) -> Result<bytes::Bytes, std::io::Error> {
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    Err(e)
}
