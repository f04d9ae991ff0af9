//! Record (and fork): forward the call upstream and record the response's raw bytes as the
//! step's output. In a fork, a step that matches the source is served from its recorded bytes.
//!
//! A whole response reaches the client once its event is acknowledged. A stream's chunks pass
//! through as they arrive, except its terminal event (and whatever follows it), which waits for
//! the acknowledgment; a stream that closes without one is closed only then (SPEC §1). The step
//! runs in its own task, so a client that disconnects never cuts a recording short, and counts
//! as in flight until it is stored ([`crate::host::RunHost::call_started`]): the run's end
//! waits for it, so a program that stops reading a stream and exits still has it recorded.
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use parking_lot::Mutex;
use retrace_runtime::{HttpModelOutput, RuntimeResult, Session};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use super::document::{keeps_header, ClientGone, Recorded, RecordedBody, StreamDocument, StreamEnd};
use super::replay::{break_off, respond};
use super::reply::{error, error_body, upstream_failure, Provider};
use super::sse::{body_facts, snapshot_of, SseScanner};
use super::upstream::{chain, UpstreamError};
use super::{runtime_error, Call};
use crate::AppState;

/// How long a stream's upstream may stay open, silent, after the terminal event before the
/// stream is taken as ended (whole).
const AFTER_TERMINAL: Duration = Duration::from_secs(2);

type Chunk = Result<Bytes, std::io::Error>;

/// What is left to send once the step is acknowledged.
enum Pending {
    /// The whole response.
    Whole(Response),
    /// A stream's held chunks, and its end.
    Tail { tx: mpsc::Sender<Chunk>, held: Vec<Bytes>, broke_off: Option<String> },
}

/// Shared between the step's live function and the task that finishes the reply.
struct Reply {
    head: Mutex<Option<oneshot::Sender<Response>>>,
    pending: Mutex<Option<Pending>>,
    /// When the request reached the proxy: what the client's wait is measured from, in record
    /// as in replay (the live function may start later, behind the run's scheduler).
    arrived: Instant,
    /// When the client left without a response head (its request was dropped).
    left: Mutex<Option<Instant>>,
    /// Signalled when the client leaves without a response head: the call stops there.
    left_signal: tokio::sync::Notify,
    /// The call counted among its agent's identical calls in flight, until it is stored or its
    /// client leaves (a client's own retry after its timeout is no second caller: QA17 D6).
    identical: Mutex<Option<super::identical::InFlight>>,
}

/// Notes when the client left, if it left before the response head reached it.
struct LeftWatch {
    reply: Arc<Reply>,
    answered: bool,
}

impl Drop for LeftWatch {
    fn drop(&mut self) {
        if !self.answered {
            *self.reply.left.lock() = Some(Instant::now());
            self.reply.left_signal.notify_one();
            drop(self.reply.identical.lock().take());
        }
    }
}

impl Reply {
    fn send_head(&self, response: Response) {
        if let Some(tx) = self.head.lock().take() {
            let _ = tx.send(response);
        }
    }

    /// Resolves once the client has left without a response head (at once if it has).
    async fn client_left(&self) {
        self.left_signal.notified().await;
    }

    /// When the client left without a response head, in ms since it arrived.
    fn left_ms(&self) -> Option<u64> {
        let left = (*self.left.lock())?;
        Some(left.saturating_duration_since(self.arrived).as_millis() as u64)
    }

    /// Ms since the request arrived.
    fn waited_ms(&self) -> u64 {
        self.arrived.elapsed().as_millis() as u64
    }
}

/// Records `call` live.
pub(crate) async fn record(app: Arc<AppState>, session: Session, call: Call) -> Response {
    let (head_tx, head_rx) = oneshot::channel();
    let reply = Arc::new(Reply {
        head: Mutex::new(Some(head_tx)),
        pending: Mutex::new(None),
        arrived: Instant::now(),
        left: Mutex::new(None),
        left_signal: tokio::sync::Notify::new(),
        identical: Mutex::new(None),
    });
    // Dropped unanswered when the client leaves (hyper drops the request's future).
    let mut watch = LeftWatch { reply: reply.clone(), answered: false };
    // Counted until the step is stored: the run's end waits for it, even once the client left.
    let in_flight = app.host.call_started(&call.run);
    let call = Arc::new(call);
    *reply.identical.lock() = Some(super::identical::InFlight::enter(&call));
    let task = {
        let (app, reply, call) = (app.clone(), reply.clone(), call.clone());
        tokio::spawn(async move {
            let agent = session.agent(&call.agent);
            let live = {
                let (app, reply, call) = (app.clone(), reply.clone(), call.clone());
                move |body| live(app, call, reply, body)
            };
            let result = agent.http_model(call.model_call(), live).await;
            // Stored (or failed): what is left goes to the client only, which the run's end
            // needn't wait for.
            drop((in_flight, reply.identical.lock().take()));
            let pending = reply.pending.lock().take();
            match (result, pending) {
                (Ok(_), Some(Pending::Whole(response))) => reply.send_head(response),
                (Ok(_), Some(Pending::Tail { tx, held, broke_off })) => {
                    for chunk in held {
                        if tx.send(Ok(chunk)).await.is_err() {
                            break;
                        }
                    }
                    if let Some(why) = broke_off {
                        let _ = tx.send(break_off(std::io::Error::other(why)).await).await;
                    }
                }
                // A fork step served from the source run or a cache: nothing ran live.
                (Ok(served), None) => reply.send_head(match Recorded::decode(&served.document) {
                    Ok(doc) => {
                        let held = super::replay::hold_if_client_left(&session, &served.document).await;
                        super::replay::respond_with(doc, true, held)
                    }
                    Err(e) => error(
                        call.provider,
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &format!("retrace proxy: {e}"),
                    ),
                }),
                (Err(e), pending) => {
                    let response = runtime_error(&app, &call, &e);
                    match pending {
                        Some(Pending::Tail { tx, .. }) => {
                            let why = format!("retrace proxy: the stream could not be recorded: {e}");
                            let _ = tx.send(break_off(std::io::Error::other(why)).await).await;
                        }
                        _ => reply.send_head(response),
                    }
                }
            }
        })
    };
    let head = head_rx.await;
    watch.answered = true;
    match head {
        Ok(response) => response,
        Err(_) => {
            let why = match task.await {
                Err(e) => format!("retrace proxy: the recording task failed: {e}"),
                Ok(()) => "retrace proxy: the recording task ended without a reply".into(),
            };
            error(call.provider, StatusCode::INTERNAL_SERVER_ERROR, &why)
        }
    }
}

/// The step's live function: sends `body` (the call's, with a fork's edits applied) upstream
/// and builds the output document.
async fn live(
    app: Arc<AppState>,
    call: Arc<Call>,
    reply: Arc<Reply>,
    body: Vec<u8>,
) -> RuntimeResult<HttpModelOutput> {
    let started = Instant::now();
    // The model asked for: a fork's `model:` edit may have changed it.
    let edited = (body != call.body).then(|| super::asked_model(&body).ok()).flatten();
    let asked = edited.as_ref().unwrap_or(&call.model);
    let upstreams = &app.upstreams;
    let body = if call.bodiless { Vec::new() } else { body };
    let method =
        reqwest::Method::from_bytes(call.method.as_str().as_bytes()).unwrap_or(reqwest::Method::POST);
    // A client that leaves before the answer stops the call: recorded as what it saw, nothing.
    let sent = tokio::select! {
        sent = upstreams.send_as(method, call.provider, &call.path, &call.headers, body) => sent,
        () = reply.client_left() => return Ok(client_left(&reply, call.provider)),
    };
    let response = match sent {
        Ok(r) => r,
        Err(e) => return Ok(own_error(&reply, call.provider, &e, started)),
    };
    let status = response.status().as_u16();
    let headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .filter(|(k, _)| keeps_header(k.as_str()))
        .map(|(k, v)| (k.as_str().to_ascii_lowercase(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let is_stream = headers.iter().any(|(k, v)| {
        k == "content-type" && v.trim_start().to_ascii_lowercase().starts_with("text/event-stream")
    });
    if !is_stream {
        let read = tokio::select! {
            read = tokio::time::timeout(upstreams.timeout, response.bytes()) => read,
            () = reply.client_left() => return Ok(client_left(&reply, call.provider)),
        };
        let body = match read {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                let e = UpstreamError::Other {
                    url: upstreams.url(call.provider, &call.path),
                    message: format!("the response body broke off: {}", chain(&e)),
                };
                return Ok(own_error(&reply, call.provider, &e, started));
            }
            Err(_) => {
                let e = UpstreamError::Timeout {
                    url: upstreams.url(call.provider, &call.path),
                    after: upstreams.timeout,
                };
                return Ok(own_error(&reply, call.provider, &e, started));
            }
        };
        let (model, usage) = body_facts(&body);
        let doc = Recorded { status, headers, body: RecordedBody::Whole(body) };
        let document = doc.encode();
        *reply.pending.lock() = Some(Pending::Whole(respond(doc, false)));
        return Ok(HttpModelOutput {
            document,
            snapshot: snapshot_of(asked, model.as_deref()),
            usage,
            latency_ms: started.elapsed().as_millis() as u64,
            // Only a model route's answer is cached: a fork must not answer a poll (`GET
            // /v1/batches/{id}`) or a `DELETE` from an earlier run's cache.
            failed: !(200..300).contains(&status) || !call.model_route,
        });
    }
    // A stream: the head goes out now, chunks as they arrive.
    let (tx, rx) = mpsc::channel::<Chunk>(64);
    let head_ms = reply.waited_ms();
    let head = Recorded { status, headers: headers.clone(), body: RecordedBody::Whole(Bytes::new()) };
    let mut head = respond(head, false);
    *head.body_mut() = Body::from_stream(ReceiverStream::new(rx));
    reply.send_head(head);
    let since = Instant::now();
    let mut scanner = SseScanner::default();
    // The document is written as the chunks pass, so the terminal event waits only for its end
    // to be written, the append and the acknowledgment.
    let mut document = StreamDocument::new(status, &headers);
    let mut held = Vec::new();
    let mut client_gone = false;
    // When the client left mid-stream (seen at the first chunk it didn't take).
    let mut left_ms = None;
    let mut broke_off = None;
    let mut stream = response.bytes_stream();
    // Counted among its agent's identical calls until its client leaves (not once a chunk finds
    // it gone): a client that timed out between chunks and retried is no second caller.
    let mut counted = true;
    loop {
        // Once the terminal event has come, the stream has said all it has to say: an upstream
        // that then keeps the connection open (a gateway holding it for keep-alive) is waited
        // for only briefly, not for its timeout, before the stream is stored and its end sent.
        let wait = match held.is_empty() {
            true => upstreams.timeout,
            false => upstreams.timeout.min(AFTER_TERMINAL),
        };
        let next = match counted {
            true => tokio::select! {
                next = tokio::time::timeout(wait, stream.next()) => next,
                () = tx.closed() => {
                    counted = false;
                    drop(reply.identical.lock().take());
                    continue;
                }
            },
            false => tokio::time::timeout(wait, stream.next()).await,
        };
        let chunk = match next {
            Err(_) if !held.is_empty() => break,
            Err(_) => {
                broke_off = Some(format!("the upstream sent nothing for {:?}", upstreams.timeout));
                break;
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                broke_off = Some(format!("the upstream broke off the stream: {}", chain(&e)));
                break;
            }
            Ok(Some(Ok(chunk))) => chunk,
        };
        let t_ms = since.elapsed().as_millis() as u64;
        if scanner.feed(&chunk) || !held.is_empty() {
            document.push(t_ms, &chunk);
            held.push(chunk);
        } else {
            // A client that left still gets its stream recorded whole (see the README).
            if !client_gone && tx.send(Ok(chunk.clone())).await.is_err() {
                client_gone = true;
                left_ms = Some(reply.waited_ms());
            }
            document.push(t_ms, &chunk);
        }
    }
    let end = if broke_off.is_some() { StreamEnd::Truncated } else { StreamEnd::Complete };
    let document = document.finish(end, broke_off.as_deref());
    // A client that left mid-stream (a read timeout between chunks): replay sends the chunks at
    // their recorded times, so a client with the same read timeout leaves again.
    let document = match left_ms {
        Some(left_ms) => ClientGone { answered_ms: Some(head_ms), left_ms }.add_to(document),
        None => document,
    };
    *reply.pending.lock() = Some(Pending::Tail { tx, held, broke_off });
    Ok(HttpModelOutput {
        document,
        snapshot: snapshot_of(asked, scanner.model.as_deref()),
        usage: scanner.usage(),
        latency_ms: started.elapsed().as_millis() as u64,
        failed: !(200..300).contains(&status) || end == StreamEnd::Truncated || !call.model_route,
    })
}

/// An upstream that could not be reached or did not answer: the proxy's own reply (502 or 504,
/// provider-shaped, left to the client's retry policy), recorded like any response, as a failed
/// step, so replay gives the program the same failure and then, by its key, whatever the
/// client's retry was answered.
/// The step's output for a call whose client left before the upstream answered: the proxy's
/// own 504 saying so, marked `client_gone`. Nothing reaches the client (it is gone); in replay,
/// the answer is held back past where the client left, so a client with the same timeout leaves
/// again, and one that waits longer gets this 504.
fn client_left(reply: &Reply, provider: Provider) -> HttpModelOutput {
    let left_ms = reply.left_ms().unwrap_or_else(|| reply.waited_ms());
    let message = format!(
        "retrace proxy: the client left {left_ms} ms into the call, before the upstream answered, and the \
         call was stopped there; no answer was recorded"
    );
    let doc = proxy_answer(provider, StatusCode::GATEWAY_TIMEOUT, &message);
    let document = ClientGone { answered_ms: None, left_ms }.add_to(doc.encode());
    // Sent to no one (the client is gone), but sent: the task ends once the step is stored.
    *reply.pending.lock() = Some(Pending::Whole(respond(doc, false)));
    HttpModelOutput { document, snapshot: None, usage: None, latency_ms: left_ms, failed: true }
}

/// The step's output for an upstream the proxy could not reach or that did not answer in time:
/// the proxy's own 502 or 504, which the client gets.
fn own_error(reply: &Reply, provider: Provider, e: &UpstreamError, started: Instant) -> HttpModelOutput {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_GATEWAY);
    let doc = proxy_answer(provider, status, &format!("retrace proxy: {e}"));
    let document = doc.encode();
    *reply.pending.lock() = Some(Pending::Whole(respond(doc, false)));
    HttpModelOutput {
        document,
        snapshot: None,
        usage: None,
        latency_ms: started.elapsed().as_millis() as u64,
        failed: true,
    }
}

/// The proxy's own answer with `status` and `message`, in the provider's shape, as a document.
fn proxy_answer(provider: Provider, status: StatusCode, message: &str) -> Recorded {
    let response = upstream_failure(provider, status, message);
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let body = error_body(provider, status, message);
    Recorded { status: status.as_u16(), headers, body: RecordedBody::Whole(Bytes::from(body)) }
}
