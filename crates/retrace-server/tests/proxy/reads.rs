//! The API's read routes: events page by page, blobs by exact digest (path tricks refused before
//! the store is asked), and the export, byte for byte what `retrace export` writes.
use retrace_demo::providers::Providers;
use retrace_store::export::export_run;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{chat, client, daemon, Daemon, Reply};

async fn get(d: &Daemon, path: &str) -> Reply {
    Reply::read(client().get(format!("{}{path}", d.base)).send().await.unwrap()).await
}

/// The status of a request sent as raw bytes, so no client normalizes the path first.
async fn raw_status(d: &Daemon, path: &[u8]) -> (u16, String) {
    let addr = d.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = b"GET ".to_vec();
    request.extend_from_slice(path);
    request.extend_from_slice(b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    stream.write_all(&request).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

async fn recorded(d: &Daemon, calls: usize) -> String {
    let run = d.new_run().await;
    for i in 0..calls {
        let reply = d.call(&run, "/proxy/openai/v1/chat/completions", &chat(&format!("q{i}"), false)).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    d.finish(&run).await;
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_come_in_pages_and_the_export_is_the_cli_s() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = recorded(&d, 3).await;
    let all = get(&d, &format!("/api/runs/{run}/events")).await.json();
    assert_eq!((all["count"].as_u64(), all["next"].clone()), (Some(3), Value::Null), "{all}");
    let stored = d.store.events(&run, 1, 10).unwrap();
    assert_eq!(all["events"], serde_json::to_value(&stored).unwrap());
    let page = get(&d, &format!("/api/runs/{}/events?from=2&limit=1", &run[..8])).await.json();
    assert_eq!((page["events"][0]["seq"].as_u64(), page["next"].as_u64()), (Some(2), Some(3)), "{page}");
    assert_eq!(page["run_id"], run.as_str(), "a prefix names the run");
    let past = get(&d, &format!("/api/runs/{run}/events?from=9")).await.json();
    assert_eq!(past["events"], json!([]));
    // The run as `retrace runs --json` gives it: `id`, its tier, its decisions.
    let one = get(&d, &format!("/api/runs/{run}")).await.json();
    assert_eq!((one["id"].as_str(), one["run_id"].as_str()), (Some(run.as_str()), Some(run.as_str())));
    assert_eq!((one["retention"].as_str(), one["decisions"].clone()), (Some("routine"), json!([])), "{one}");
    let prefix = get(&d, &format!("/api/runs/{}", &run[..2])).await;
    assert_eq!(prefix.status, 400, "a prefix too short to name one run: {}", prefix.text());

    let export = get(&d, &format!("/api/runs/{run}/export")).await;
    assert_eq!(export.status, 200);
    assert_eq!(export.header("content-type"), Some("application/x-ndjson"));
    let mut want = Vec::new();
    export_run(&*d.store, &run, &mut want, &mut |_| {}).unwrap();
    assert!(export.body == want, "the export differs from `retrace export`'s");
    // An unfinished import is not the whole run: refused, as `retrace export` refuses it.
    let mut meta = d.store.run(&run).unwrap();
    meta.labels.insert(retrace_store::import::UNFINISHED_LABEL.into(), "stored in part".into());
    d.store.update_run(&meta).unwrap();
    let unfinished = get(&d, &format!("/api/runs/{run}/export")).await;
    assert_eq!(unfinished.status, 409, "{}", unfinished.text());
    assert!(unfinished.text().contains("unfinished import"), "{}", unfinished.text());
    meta.labels.remove(retrace_store::import::UNFINISHED_LABEL);
    d.store.update_run(&meta).unwrap();

    let digest = stored[0].output_ref.unwrap();
    let blob = get(&d, &format!("/api/blobs/{digest}")).await;
    assert_eq!((blob.status, blob.header("content-type")), (200, Some("application/octet-stream")));
    assert_eq!(blob.body, d.store.get_blob(&digest).unwrap());
    providers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_runs_and_blobs_and_bad_queries_are_json_errors() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let absent = format!("sha256:{}", "ab".repeat(32));
    for (path, status, code) in [
        ("/api/runs/01nosuchrun/events".to_owned(), 404, "unknown_run"),
        ("/api/runs/01nosuchrun/export".to_owned(), 404, "unknown_run"),
        (format!("/api/blobs/{absent}"), 404, "unknown_blob"),
        ("/api/runs/01nosuchrun/events?limit=0".to_owned(), 400, "bad_request"),
        ("/api/runs/01nosuchrun/events?from=x".to_owned(), 400, "bad_request"),
        ("/api/runs/01nosuchrun/events?limit=1001".to_owned(), 400, "bad_request"),
        ("/api/runs/01nosuchrun/events?what=1".to_owned(), 400, "bad_request"),
    ] {
        let reply = get(&d, &path).await;
        assert_eq!((reply.status, reply.json()["error"]["code"].as_str()), (status, Some(code)), "{path}");
    }
    providers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_path_that_is_not_exactly_a_digest_is_refused() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = recorded(&d, 1).await;
    let good = d.store.events(&run, 1, 1).unwrap()[0].output_ref.unwrap().to_string();
    let hex = &good[7..];
    let tricks: Vec<Vec<u8>> = vec![
        b"/api/blobs/../../etc/passwd".to_vec(),
        b"/api/blobs/..%2f..%2fetc%2fpasswd".to_vec(),
        b"/api/blobs/%2e%2e".to_vec(),
        b"/api/blobs/%2E%2E%2F%2E%2E%2Fretrace.db".to_vec(),
        b"/api/blobs/sha256:..%2F..%2Fretrace.db".to_vec(),
        format!("/api/blobs/{good}/..").into_bytes(),
        format!("/api/blobs/sha256:{}/{}", &hex[..32], &hex[32..]).into_bytes(),
        format!("/api/blobs/{good}%00").into_bytes(),
        format!("/api/blobs/sha256:{}%00{}", &hex[..32], &hex[33..]).into_bytes(),
        format!("/api/blobs/{}", good.to_uppercase()).into_bytes(),
        format!("/api/blobs/{good}0").into_bytes(),
        format!("/api/blobs/{}", &good[..good.len() - 1]).into_bytes(),
        format!("/api/blobs/sha512:{hex}").into_bytes(),
        format!("/api/blobs/{hex}").into_bytes(),
    ];
    for trick in tricks {
        let (status, text) = raw_status(&d, &trick).await;
        let shown = String::from_utf8_lossy(&trick);
        assert_eq!(status, 400, "{shown}: {text}");
        assert!(text.contains("bad_digest"), "{shown}: {text}");
    }
    // The exact digest, sent the same raw way, is served (and `%3a` is just an escaped colon).
    for path in [format!("/api/blobs/{good}"), format!("/api/blobs/sha256%3a{hex}")] {
        assert_eq!(raw_status(&d, path.as_bytes()).await.0, 200, "{path}");
    }
    providers.stop().await;
}

/// A run created through the API has its name and labels masked, as `retrace record --name
/// --label` has (QA27 D1: stored in clear).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_created_through_the_api_is_named_masked() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let key = retrace_core::mask::MaskKey::from_bytes([3; 32]);
    let d = daemon(&providers, |c| {
        c.mask_key = Some(key.clone());
        c.mask_rules = retrace_core::mask::MaskRules::defaults();
    })
    .await;
    let email = "alice.smith@example-corp.com";
    let made =
        d.api("/api/runs", json!({"name": format!("nightly for {email}"), "labels": {"who": email}})).await;
    let meta = d.store.run(made["run_id"].as_str().unwrap()).unwrap();
    let token = key.token("email", email);
    assert_eq!(meta.name, Some(format!("nightly for {token}")));
    assert_eq!(meta.labels.get("who"), Some(&token));
}
