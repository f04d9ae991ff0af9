//! Upstream errors, hangs, truncated streams and compression: recorded as they happened, replayed
//! the same way.
use std::io::Write;

use retrace_demo::providers::Providers;
use retrace_server::proxy::document::{Recorded, RecordedBody, StreamEnd};
use serde_json::json;

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
    assert_eq!((hang.status, hang.header("x-should-retry")), (504, Some("false")), "{}", hang.text());
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
    let fine = d.call(&run, path, &chat("hi", false)).await;
    assert_eq!(fine.status, 200, "{}", fine.text());
    d.finish(&run).await;
    let events = d.store.events(&run, 1, 10).unwrap();
    // Every failure is recorded, but only the answer is left in the LLM cache: a fork asking
    // the same again goes live instead of being served a 504, a 429 or half a stream.
    let cached: Vec<bool> = events.iter().map(|e| d.store.cache_get(&e.key).unwrap().is_some()).collect();
    assert_eq!(cached, [false, false, false, false, false, true], "{events:#?}");
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
    assert_eq!((refused.status, refused.header("x-should-retry")), (502, Some("false")));
    assert!(refused.text().contains("could not connect"), "{}", refused.text());
    d.finish(&run).await;
    let step = &d.store.events(&run, 1, 1).unwrap()[0];
    assert!(d.store.cache_get(&step.key).unwrap().is_none(), "the proxy's own 502 is never cached");
    let replay = d.replay_of(&run).await;
    let again = d.call(&replay, "/proxy/openai/v1/chat/completions", &chat("hi", false)).await;
    assert_eq!((again.status, again.text()), (502, refused.text()));
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
