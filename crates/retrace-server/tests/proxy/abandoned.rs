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
    let app = axum::Router::new().route("/v1/chat/completions", post(stream));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
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
