//! Upstream errors, hangs, truncated streams and compression: recorded as they happened, replayed
//! the same way.
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use retrace_demo::providers::Providers;
use retrace_server::proxy::document::{Recorded, RecordedBody, StreamEnd};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{chat, daemon, daemon_over, sqlite, Reply};

fn ask(model: &str, stream: bool) -> serde_json::Value {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "x"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_replay_as_they_were_recorded() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |c| c.upstream_timeout = std::time::Duration::from_millis(300)).await;
    let run = d.new_run().await;
    let path = "/proxy/openai/v1/chat/completions";
    let hang = d.call(&run, path, &ask("m-hang", false)).await;
    // The client's retry policy decides, as it would about its own timeout without Retrace.
    assert_eq!((hang.status, hang.header("x-should-retry")), (504, None), "{}", hang.text());
    let limited = d.call(&run, path, &ask("m-429", false)).await;
    assert_eq!((limited.status, limited.header("retry-after")), (429, Some("3")), "live: as sent");
    let cut = d.call(&run, path, &ask("m-truncate", true)).await;
    assert!(cut.broke_off, "the client sees the stream break off: {cut:?} {}", cut.text());
    assert!(cut.text().starts_with("data: "), "{}", cut.text());
    let cut_anthropic = d
        .call(
            &run,
            "/proxy/anthropic/v1/messages",
            &json!({"model": "c-truncate", "max_tokens": 9, "stream": true, "messages": []}),
        )
        .await;
    assert!(cut_anthropic.broke_off);
    let early = d.call(&run, path, &ask("m-truncate-early", true)).await;
    assert_eq!((early.status, early.broke_off, early.body.len()), (200, true, 0), "head, then the break");
    let failed = d.call(&run, path, &ask("m-500", false)).await;
    assert_eq!((failed.status, failed.header("retry-after-ms")), (500, None), "live: as sent");
    let fine = d.call(&run, path, &chat("hi", false)).await;
    assert_eq!(fine.status, 200, "{}", fine.text());
    d.finish(&run).await;
    let events = d.store.events(&run, 1, 10).unwrap();
    // Every failure is recorded, but only the answer is left in the LLM cache: a fork asking
    // the same again goes live instead of being served a 504, a 429 or half a stream.
    let cached: Vec<bool> = events.iter().map(|e| d.store.cache_get(&e.key).unwrap().is_some()).collect();
    assert_eq!(cached, [false, false, false, false, false, false, true], "{events:#?}");
    let doc = Recorded::decode(&d.store.get_blob(&events[2].output_ref.unwrap()).unwrap()).unwrap();
    assert!(matches!(doc.body, RecordedBody::Stream { end: StreamEnd::Truncated, .. }), "{doc:?}");
    providers.stop().await;

    let replay = d.replay_of(&run).await;
    let again = d.call(&replay, path, &ask("m-hang", false)).await;
    assert_eq!((again.status, again.text()), (504, hang.text()));
    let again = d.call(&replay, path, &ask("m-429", false)).await;
    assert_eq!((again.status, again.text()), (429, limited.text()));
    assert_eq!(again.header("retry-after"), None);
    assert_eq!(again.header("retry-after-ms"), Some("1"), "a recorded retry follows at once");
    let again = d.call(&replay, path, &ask("m-truncate", true)).await;
    assert!(again.broke_off, "replayed as truncated");
    assert_eq!(again.text(), cut.text());
    let again = d
        .call(
            &replay,
            "/proxy/anthropic/v1/messages",
            &json!({"model": "c-truncate", "max_tokens": 9, "stream": true, "messages": []}),
        )
        .await;
    assert_eq!((again.broke_off, again.text()), (true, cut_anthropic.text()));
    let again = d.call(&replay, path, &ask("m-truncate-early", true)).await;
    assert_eq!((again.status, again.broke_off, again.body.len()), (200, true, 0));
    // A 500 that said nothing of when to retry: the client's retry follows at once too.
    let again = d.call(&replay, path, &ask("m-500", false)).await;
    assert_eq!((again.status, again.text(), again.header("retry-after-ms")), (500, failed.text(), Some("1")));
    let again = d.call(&replay, path, &chat("hi", false)).await;
    assert_eq!(again.text(), fine.text());
    assert_eq!(d.finish(&replay).await["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_502_recorded_and_replayed() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let (store, _home) = sqlite();
    let d = daemon_over(store, url.clone(), url, |_| {}).await;
    let run = d.new_run().await;
    let refused = d.call(&run, "/proxy/openai/v1/chat/completions", &chat("hi", false)).await;
    assert_eq!((refused.status, refused.header("x-should-retry")), (502, None), "the client may retry it");
    assert!(refused.text().contains("could not connect"), "{}", refused.text());
    d.finish(&run).await;
    let step = &d.store.events(&run, 1, 1).unwrap()[0];
    assert!(d.store.cache_get(&step.key).unwrap().is_none(), "the proxy's own 502 is never cached");
    let replay = d.replay_of(&run).await;
    let again = d.call(&replay, "/proxy/openai/v1/chat/completions", &chat("hi", false)).await;
    assert_eq!((again.status, again.text()), (502, refused.text()));
    assert_eq!(again.header("x-should-retry"), None);
}

/// An upstream that reads each request and closes the first connection without answering, then
/// answers every later one with a chat completion. Stops when the handle is aborted.
async fn dropping_the_first_connection() -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let serving = tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            read_request(&mut sock).await;
            if n == 0 {
                continue; // dropped: closed with no answer
            }
            let body = format!(
                r#"{{"id":"chatcmpl-{n}","object":"chat.completion","created":1,"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"answer {n}"}},"finish_reason":"stop"}}]}}"#
            );
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(format!("{head}{body}").as_bytes()).await;
        }
    });
    (url, seen, serving)
}

/// Reads one request: its head, then as many bytes as its `content-length` says.
async fn read_request(sock: &mut tokio::net::TcpStream) {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let Ok(n @ 1..) = sock.read(&mut buf).await else { return };
        bytes.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&bytes);
        let Some(end) = text.find("\r\n\r\n") else { continue };
        let length = text[..end]
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        if bytes.len() >= end + 4 + length {
            return;
        }
    }
}

/// Finding: a dropped connection answered `x-should-retry: false` made the official clients give
/// up where, without Retrace, they retry. The proxy's 502 is left to the client's policy; the
/// failed attempt is recorded as a step (its output the 502, never cached) and the retry as the
/// next step of the same key, and replay, with the upstream gone, answers both as recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_is_retried_by_the_client_and_replays_exactly() {
    let (url, seen, serving) = dropping_the_first_connection().await;
    let (store, _home) = sqlite();
    let d = daemon_over(store, url.clone(), url, |_| {}).await;
    let run = d.new_run().await;
    let path = "/proxy/openai/v1/chat/completions";
    let dropped = d.call(&run, path, &chat("hi", false)).await;
    assert_eq!((dropped.status, dropped.header("x-should-retry")), (502, None), "{}", dropped.text());
    assert_eq!(dropped.header("x-retrace-proxy"), Some("error"), "the proxy's own answer");
    assert!(dropped.text().contains("failed"), "{}", dropped.text());
    let retried = d.call(&run, path, &chat("hi", false)).await;
    assert_eq!(retried.status, 200, "{}", retried.text());
    assert_eq!(retried.json()["choices"][0]["message"]["content"], "answer 1");
    d.finish(&run).await;
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    let events = d.store.events(&run, 1, 10).unwrap();
    assert_eq!(events.len(), 2, "{events:#?}");
    assert_eq!(events[0].key, events[1].key, "the retry asks for the same step");
    let statuses: Vec<u16> = events
        .iter()
        .map(|e| Recorded::decode(&d.store.get_blob(&e.output_ref.unwrap()).unwrap()).unwrap().status)
        .collect();
    assert_eq!(statuses, [502, 200]);
    // The 502 is never cached; the retry, the key's second call, has its own entry (the n-th
    // identical call of a run has the n-th: a fork's retries get answers of their own).
    let cached = d.store.cache_get(&events[0].key).unwrap().map(|c| c.output_ref);
    assert_eq!(cached, None, "the key's first call answered 502, which is never cached");
    serving.abort();

    let replay = d.replay_of(&run).await;
    let again = d.call(&replay, path, &chat("hi", false)).await;
    assert_eq!((again.status, again.header("x-should-retry"), again.text()), (502, None, dropped.text()));
    // The client's retry follows at once, not after its backoff.
    assert_eq!(again.header("retry-after-ms"), Some("1"));
    let again = d.call(&replay, path, &chat("hi", false)).await;
    assert_eq!((again.status, again.text()), (200, retried.text()));
    assert_eq!(d.finish(&replay).await["status"], "ok");
    assert_eq!(seen.load(Ordering::SeqCst), 2, "replay never reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_compressed_is_stored() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    let body = ask("m-gzip", false).to_string();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(body.as_bytes()).unwrap();
    let path = "/proxy/openai/v1/chat/completions";
    let live = d.call_with(&run, path, gz.finish().unwrap(), &[("content-encoding", "gzip")]).await;
    assert_eq!(live.status, 200, "{}", live.text());
    assert!(live.json()["choices"].is_array(), "the client gets the decoded body");
    assert_eq!(live.header("content-encoding"), None);
    let event = d.store.event(&run, 1).unwrap();
    assert_eq!(
        d.store.get_blob(&event.request_ref.unwrap()).unwrap(),
        body.as_bytes(),
        "request stored decoded"
    );
    let output = d.store.get_blob(&event.output_ref.unwrap()).unwrap();
    assert!(!output.windows(2).any(|w| w == [0x1f, 0x8b]), "no gzip in the stored response");
    let Recorded { body: RecordedBody::Whole(stored), .. } = Recorded::decode(&output).unwrap() else {
        panic!()
    };
    assert_eq!(stored, live.body);
    d.finish(&run).await;
    let replay = d.replay_of(&run).await;
    // The same request, sent plain this time: the key is the decoded body's.
    let again: Reply = d.call_with(&replay, path, body.into_bytes(), &[]).await;
    assert_eq!(again.body, live.body);
}
