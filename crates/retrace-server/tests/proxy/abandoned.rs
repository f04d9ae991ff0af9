//! A stream the client stops reading goes on to the upstream's end and is recorded whole; the
//! run's end waits for it, so a program that breaks out of a stream and exits at once still
//! has the call in its log (QA7 D1).
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use axum::routing::post;
use bytes::Bytes;
use futures_util::StreamExt;
use retrace_core::run::RunStatus;
use retrace_server::proxy::document::{Recorded, RecordedBody, StreamEnd};

use crate::support::{chat, client, daemon_over, sqlite};

const CHUNKS: usize = 8;
const GAP: Duration = Duration::from_millis(100);

/// An OpenAI-shaped upstream whose stream sends a word every [`GAP`], then `[DONE]`.
async fn slow_stream_upstream() -> SocketAddr {
    let stream = || async {
        let words = futures_util::stream::iter(0..CHUNKS).then(|i| async move {
            tokio::time::sleep(GAP).await;
            let chunk = format!(
                "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"slow\",\
                 \"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"w{i} \"}}}}]}}\n\n"
            );
            Ok::<_, std::io::Error>(Bytes::from(chunk))
        });
        let done = futures_util::stream::once(async { Ok(Bytes::from_static(b"data: [DONE]\n\n")) });
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(words.chain(done)))
            .unwrap()
    };
    serve(axum::Router::new().route("/v1/chat/completions", post(stream))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_client_stopped_reading_is_recorded_whole_before_the_run_ends() {
    let upstream = slow_stream_upstream().await;
    let (store, home) = sqlite();
    let mut d =
        daemon_over(store, format!("http://{upstream}/v1"), format!("http://{upstream}"), |_| {}).await;
    d._home = Some(home);
    let run = d.new_run().await;
    let response = client()
        .post(format!("{}/proxy/openai/v1/chat/completions", d.base))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test-never-stored")
        .header("x-retrace-run", &run)
        .body(chat("hi", true).to_string())
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("w0"), "{first:?}");
    drop(body); // The program breaks out of the stream and ends its run at once.
    let ending = Instant::now();
    let finished = d.finish(&run).await;
    assert!(ending.elapsed() >= GAP * (CHUNKS as u32 - 2), "the end waited for the stream: {finished}");

    let events = d.store.events(&run, 1, 10).unwrap();
    assert_eq!(events.len(), 1, "the abandoned call is in the log: {events:#?}");
    assert_eq!(d.store.run(&run).unwrap().status, RunStatus::Ok);
    let doc = Recorded::decode(&d.store.get_blob(&events[0].output_ref.unwrap()).unwrap()).unwrap();
    match &doc.body {
        RecordedBody::Stream { end, .. } => assert_eq!(*end, StreamEnd::Complete, "{doc:?}"),
        other => panic!("recorded as a stream: {other:?}"),
    }

    // Replayed, the whole stream comes back, for a program that reads further this time.
    let replay = d.replay_of(&run).await;
    let again = d.call(&replay, "/proxy/openai/v1/chat/completions", &chat("hi", true)).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert!(again.text().contains(&format!("w{} ", CHUNKS - 1)), "{}", again.text());
}

/// An OpenAI-shaped upstream whose stream sends one word and `[DONE]`, then keeps the
/// connection open without another byte (a gateway holding it for keep-alive).
async fn done_then_silent_upstream() -> SocketAddr {
    let stream = || async {
        let events = futures_util::stream::iter([
            "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"held\",\
             \"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello\"}}]}\n\n",
            "data: [DONE]\n\n",
        ])
        .map(|s| Ok::<_, std::io::Error>(Bytes::from_static(s.as_bytes())));
        let open = futures_util::stream::pending::<Result<Bytes, std::io::Error>>();
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(events.chain(open)))
            .unwrap()
    };
    serve(axum::Router::new().route("/v1/chat/completions", post(stream))).await
}

/// The terminal event ends a stream: an upstream that stays open after `[DONE]` delays the
/// client's `[DONE]` a moment (the proxy's short wait for more), not the upstream timeout, and
/// the stream is recorded whole (QA17).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_left_open_after_its_terminal_event_ends_the_stream_soon() {
    let upstream = done_then_silent_upstream().await;
    let (store, home) = sqlite();
    let mut d = daemon_over(store, format!("http://{upstream}/v1"), format!("http://{upstream}"), |c| {
        c.upstream_timeout = Duration::from_secs(60);
    })
    .await;
    d._home = Some(home);
    let run = d.new_run().await;
    let started = Instant::now();
    let reply = tokio::time::timeout(
        Duration::from_secs(20),
        d.call(&run, "/proxy/openai/v1/chat/completions", &chat("hi", true)),
    )
    .await
    .expect("the client gets the stream's end well before the upstream timeout");
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.text().ends_with("data: [DONE]\n\n"), "{}", reply.text());
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    d.finish(&run).await;
    let events = d.store.events(&run, 1, 10).unwrap();
    assert_eq!(events.len(), 1, "{events:#?}");
    let doc = Recorded::decode(&d.store.get_blob(&events[0].output_ref.unwrap()).unwrap()).unwrap();
    match &doc.body {
        RecordedBody::Stream { end, .. } => assert_eq!(*end, StreamEnd::Complete, "{doc:?}"),
        other => panic!("recorded as a stream: {other:?}"),
    }
    assert_eq!(d.store.run(&run).unwrap().status, RunStatus::Ok);
}

/// Serves `app` on a free loopback port.
async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}
