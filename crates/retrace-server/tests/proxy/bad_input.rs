//! Bad input gets a clear answer in the provider's shape, with `x-should-retry: false`, and the
//! daemon stays up.
use std::io::Write;
use std::sync::Arc;

use retrace_demo::providers::Providers;
use retrace_store::conformance::Flaky;
use retrace_store::{LeaseHolder, RunWriter, Store};
use serde_json::json;

use crate::support::{chat, client, daemon, daemon_over, sqlite, Reply};

fn own_error(reply: &Reply, status: u16, needle: &str) {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert_eq!(reply.header("x-should-retry"), Some("false"));
    assert!(reply.text().contains(needle), "{needle:?} not in {}", reply.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_provider_shaped_errors() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |c| c.max_body = 1024).await;
    let run = d.new_run().await;
    // Any route, for no run: its own 400 in the provider's shape, saying how to name one.
    let no_run = |path: &'static str| {
        let base = d.base.clone();
        async move {
            Reply::read(client().post(format!("{base}{path}")).json(&json!({})).send().await.unwrap()).await
        }
    };
    let unknown = no_run("/proxy/openai/v1/models/gpt").await;
    own_error(&unknown, 400, "which run is this call part of?");
    assert!(unknown.json()["error"]["message"].is_string(), "OpenAI's shape");
    let unknown = no_run("/proxy/anthropic/v1/complete").await;
    own_error(&unknown, 400, "invalid_request_error");
    assert_eq!(unknown.json()["type"], "error", "Anthropic's shape");
    // For a recording run, a route the upstream doesn't know gets (and records) its own answer.
    let upstream = d.call(&run, "/proxy/openai/v1/models/gpt", &json!({})).await;
    assert_eq!(
        (upstream.status, upstream.header("x-retrace-proxy")),
        (404, None),
        "the upstream's own answer"
    );
    // An unknown API route answers in the API's shape, which the SDKs read.
    let api = client().post(format!("{}/api/runs/{run}/nothing", d.base)).send().await.unwrap();
    let api = Reply::read(api).await;
    assert_eq!(api.status, 404);
    assert_eq!(api.json()["error"]["code"], "no_route", "{}", api.text());
    assert!(api.text().contains("no route for /api/runs/"), "{}", api.text());
    // So do the refusals axum writes before any handler runs: a method the route doesn't
    // take, a path segment that isn't UTF-8, a query that doesn't parse.
    let wrong = client().get(format!("{}/api/runs/{run}/finish", d.base)).send().await.unwrap();
    let wrong = Reply::read(wrong).await;
    assert_eq!(wrong.status, 405, "{}", wrong.text());
    assert_eq!(wrong.header("allow"), Some("POST"));
    assert_eq!(wrong.json()["error"]["code"], "method_not_allowed", "{}", wrong.text());
    assert!(wrong.text().contains("does not take GET; it takes POST"), "{}", wrong.text());
    let bytes = client().get(format!("{}/api/runs/%FF%FE", d.base)).send().await.unwrap();
    let bytes = Reply::read(bytes).await;
    assert_eq!(bytes.status, 400, "{}", bytes.text());
    assert_eq!(bytes.json()["error"]["code"], "bad_request", "{}", bytes.text());
    assert!(bytes.text().contains("UTF-8"), "axum's reason is kept: {}", bytes.text());
    let query = client().get(format!("{}/api/runs/{run}/events?from=x", d.base)).send().await.unwrap();
    let query = Reply::read(query).await;
    assert_eq!(query.status, 400, "{}", query.text());
    assert!(query.json()["error"]["code"].is_string(), "{}", query.text());
    // A run named with nothing, or labelled with an empty key, is refused.
    for body in [json!({"name": ""}), json!({"labels": {"": "x"}})] {
        let empty = client().post(format!("{}/api/runs", d.base)).json(&body).send().await.unwrap();
        let empty = Reply::read(empty).await;
        assert_eq!(empty.status, 400, "{}", empty.text());
        assert!(empty.text().contains("is empty"), "{}", empty.text());
    }
    let get = client().get(format!("{}/proxy/openai/v1/chat/completions", d.base)).send().await.unwrap();
    own_error(&Reply::read(get).await, 400, "which run is this call part of?");
    let malformed =
        d.call_with(&run, "/proxy/openai/v1/chat/completions", b"{\"model\": ".to_vec(), &[]).await;
    own_error(&malformed, 400, "not valid JSON");
    // So is JSON no step can hold (invalid UTF-8, a duplicate key, a lone surrogate): 400 naming
    // the step, not the 409 of a divergence (QA28 D2).
    for body in [
        &b"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9\"}]}"[..],
        b"{\"model\":\"m\",\"model\":\"m\",\"messages\":[]}",
        b"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\\udcff\"}]}",
    ] {
        let refused = d.call_with(&run, "/proxy/openai/v1/chat/completions", body.to_vec(), &[]).await;
        own_error(&refused, 400, "step model_call openai/v1/chat/completions");
    }
    let big = chat(&"x".repeat(2000), false);
    own_error(&d.call(&run, "/proxy/openai/v1/chat/completions", &big).await, 413, "limit of 1024 bytes");
    // A compressed body that inflates past the limit is refused too.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(big.to_string().as_bytes()).unwrap();
    let bomb = d
        .call_with(
            &run,
            "/proxy/openai/v1/chat/completions",
            gz.finish().unwrap(),
            &[("content-encoding", "gzip")],
        )
        .await;
    own_error(&bomb, 413, "limit");
    let odd = d
        .call_with(&run, "/proxy/openai/v1/chat/completions", b"{}".to_vec(), &[("content-encoding", "lzma")])
        .await;
    own_error(&odd, 415, "lzma");
    let nowhere = client()
        .post(format!("{}/proxy/openai/v1/chat/completions", d.base))
        .json(&chat("hi", false))
        .send()
        .await
        .unwrap();
    own_error(&Reply::read(nowhere).await, 400, "X-Retrace-Run");
    own_error(
        &d.call("no-such-run", "/proxy/openai/v1/chat/completions", &chat("hi", false)).await,
        404,
        "no run",
    );
    // Nothing of that was recorded but the upstream's own 404, and the daemon still works.
    assert_eq!(d.store.last_seq(&run).unwrap(), 1);
    assert_eq!(d.call(&run, "/proxy/openai/v1/chat/completions", &chat("hi", false)).await.status, 200);
    assert_eq!(providers.requests(), 1, "the simulator counts the calls it answers, not its 404s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_request_is_refused_and_the_daemon_stays_up() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    let addr = d.base.trim_start_matches("http://").to_owned();
    let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /proxy/openai/v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-retrace-run: {run}\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{{\"model\":"
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    sock.shutdown().await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), sock.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.is_empty() || answer.contains("400"), "{answer}");
    assert_eq!(d.store.last_seq(&run).unwrap(), 0);
    assert_eq!(d.call(&run, "/proxy/openai/v1/chat/completions", &chat("hi", false)).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_divergence_is_409_and_marks_the_replay_diverged() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    d.call(&run, "/proxy/openai/v1/chat/completions", &chat("approve the backfill?", false)).await;
    d.finish(&run).await;
    providers.stop().await;
    let replay = d.replay_of(&run).await;
    let other =
        d.call(&replay, "/proxy/openai/v1/chat/completions", &chat("reject the backfill?", false)).await;
    own_error(&other, 409, "step_mismatch");
    assert!(other.text().contains("$.messages[0].content"), "{}", other.text());
    assert!(other.text().contains("approve the backfill?"), "shows the recorded value: {}", other.text());
    let outcome = d.finish(&replay).await;
    assert_eq!(outcome["status"], "diverged", "{outcome}");
    assert_eq!(outcome["divergence"]["code"], "step_mismatch", "{outcome}");
}

/// A key header is part of the key but not of the stored request: a divergence it alone causes
/// names it, with the recorded and the replayed value (from the events' params).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_divergence_in_a_key_header_names_the_header_and_both_values() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let path = "/proxy/anthropic/v1/messages";
    let ask = json!({"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "a"}]});
    // The `anthropic-beta` sent live and in replay, and the two values the divergence shows.
    let cases = [
        (None, Some("x-2025"), "(absent)", "\"x-2025\""),
        (Some("tools-1"), Some("tools-2"), "\"tools-1\"", "\"tools-2\""),
        (Some("tools-1"), None, "\"tools-1\"", "(absent)"),
    ];
    let beta = |value: Option<&'static str>| value.map(|v| vec![("anthropic-beta", v)]).unwrap_or_default();
    for (recorded, replayed, was, is) in cases {
        let (recorded, replayed) = (beta(recorded), beta(replayed));
        let run = d.new_run().await;
        let live = d.call_with(&run, path, ask.to_string().into_bytes(), &recorded).await;
        assert_eq!(live.status, 200, "{}", live.text());
        d.finish(&run).await;
        let replay = d.replay_of(&run).await;
        let other = d.call_with(&replay, path, ask.to_string().into_bytes(), &replayed).await;
        own_error(&other, 409, "step_mismatch");
        assert!(other.text().contains("first difference at header anthropic-beta"), "{}", other.text());
        let outcome = d.finish(&replay).await;
        let divergence = &outcome["divergence"];
        assert_eq!(divergence["path"], "header anthropic-beta", "{outcome}");
        assert_eq!(
            divergence["detail"],
            json!([
                format!("recorded header anthropic-beta = {was}"),
                format!("replayed header anthropic-beta = {is}")
            ]),
            "{outcome}"
        );
    }
}

/// `X-Retrace-Run`, `X-Retrace-Agent` and `X-Retrace-Role` are UTF-8 (as the path form's
/// percent-encoded names are); an empty or non-UTF-8 one is refused naming the header, never
/// recorded under another run or agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrace_headers_are_utf8_and_never_empty() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    let path = "/proxy/openai/v1/chat/completions";
    let named = d
        .call_with(&run, path, chat("hi", false).to_string().into_bytes(), &[("x-retrace-agent", "アリス")])
        .await;
    assert_eq!(named.status, 200, "{}", named.text());
    let send = |headers: Vec<(&'static str, Vec<u8>)>| {
        let mut req = client()
            .post(format!("{}{path}", d.base))
            .header("content-type", "application/json")
            .body(chat("hi", false).to_string());
        for (name, value) in headers {
            req = req.header(name, reqwest::header::HeaderValue::from_bytes(&value).unwrap());
        }
        req.send()
    };
    let id = || run.as_bytes().to_vec();
    let cases = [
        (vec![("x-retrace-run", id()), ("x-retrace-agent", vec![])], "X-Retrace-Agent is empty"),
        (
            vec![("x-retrace-run", id()), ("x-retrace-agent", vec![0xff, 0xfe])],
            "X-Retrace-Agent is not UTF-8",
        ),
        (vec![("x-retrace-run", vec![])], "X-Retrace-Run is empty"),
        (vec![("x-retrace-run", vec![0xe3, 0x82])], "X-Retrace-Run is not UTF-8"),
        (vec![("x-retrace-run", id()), ("x-retrace-role", vec![0xa0])], "X-Retrace-Role is not UTF-8"),
    ];
    for (headers, needle) in cases {
        own_error(&Reply::read(send(headers).await.unwrap()).await, 400, needle);
    }
    let events = d.store.events(&run, 1, 10).unwrap();
    let agents: Vec<&str> = events.iter().map(|e| e.agent_id.as_str()).collect();
    assert_eq!(agents, ["アリス"]);
    assert_eq!(providers.requests(), 1, "no refused call went upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_whose_program_left_calls_unmade_diverges() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    d.call(&run, "/proxy/openai/v1/chat/completions", &chat("one", false)).await;
    d.call(&run, "/proxy/anthropic/v1/messages", &json!({"model": "c", "max_tokens": 5, "messages": []}))
        .await;
    d.finish(&run).await;
    let replay = d.replay_of(&run).await;
    d.call(&replay, "/proxy/openai/v1/chat/completions", &chat("one", false)).await;
    let outcome = d.finish(&replay).await;
    assert_eq!(outcome["divergence"]["code"], "steps_left", "{outcome}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_fails_closed_when_the_store_fails() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let (inner, _home) = sqlite();
    let flaky = Arc::new(Flaky::new(inner));
    let store: Arc<dyn Store> = flaky.clone();
    let d = daemon_over(store, providers.openai_url(), providers.anthropic_url(), |_| {}).await;
    let run = d.new_run().await;
    assert_eq!(d.call(&run, "/proxy/openai/v1/chat/completions", &chat("ok", false)).await.status, 200);
    flaky.fail_commits(true);
    let failed = d
        .call(&run, "/proxy/anthropic/v1/messages", &json!({"model": "c", "max_tokens": 5, "messages": []}))
        .await;
    own_error(&failed, 503, "could not be recorded");
    assert_eq!(failed.json()["type"], "error");
    let stream = d.call(&run, "/proxy/openai/v1/chat/completions", &chat("s", true)).await;
    assert!(stream.status == 503 || stream.broke_off, "a stream that can't be stored never ends cleanly");
    assert!(!stream.text().contains("[DONE]"), "the terminal event is never released: {}", stream.text());
    flaky.fail_commits(false);
    assert_eq!(d.store.run(&run).unwrap().status.to_string(), "failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_recorded_by_another_sequencer_is_refused_naming_it() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    // Created in the store, as `retrace record` does, and recorded by the program's own
    // session (a run created through the API is the daemon's from the start).
    let run = "01anothersequencer00000000".to_owned();
    let meta =
        retrace_core::run::RunMeta::new(run.clone(), retrace_core::run::RunMode::Record, 1_700_000_000_000);
    d.store.create_run(&meta).unwrap();
    let holder = LeaseHolder("the-programs-own-session:4242:1".into());
    let _writer = RunWriter::open(d.store.clone(), &run, holder).unwrap();
    let refused = d.call(&run, "/proxy/openai/v1/chat/completions", &chat("hi", false)).await;
    own_error(&refused, 409, "the-programs-own-session:4242:1");
    assert!(refused.text().contains("one sequencer"), "{}", refused.text());
    assert_eq!(providers.requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_belongs_to_one_process() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    let step = |pid: u32| {
        client()
            .post(format!("{}/api/runs/{run}/agents/planner/steps", d.base))
            .header("x-retrace-process", pid.to_string())
            .json(&json!({"type": "clock", "name": "wall", "output": {"unix_ms": 1}}))
            .send()
    };
    let mine = step(std::process::id()).await.unwrap();
    assert_eq!(mine.status(), 200);
    // Process 1 is alive and is not this one.
    let other = step(1).await.unwrap();
    assert_eq!(other.status(), 409);
    let text = other.text().await.unwrap();
    assert!(text.contains("agent_owned") && text.contains(&std::process::id().to_string()), "{text}");
    let bad = client()
        .post(format!("{}/api/runs/{run}/agents/planner/steps", d.base))
        .body("{\"type\": ")
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let bad = Reply::read(bad).await;
    assert!(bad.text().contains("bad request body"), "{}", bad.text());
    assert_eq!(d.store.last_seq(&run).unwrap(), 1, "only the good step was recorded");
    // A step route takes JSON whatever the Content-Type says, as `POST /api/runs` does:
    // `curl -d` sends a form type, a raw client none at all.
    for content_type in [Some("application/x-www-form-urlencoded"), None] {
        let mut post = client()
            .post(format!("{}/api/runs/{run}/agents/planner/steps", d.base))
            .header("x-retrace-process", std::process::id().to_string())
            .body(r#"{"type": "clock", "name": "wall", "output": {"unix_ms": 2}}"#);
        if let Some(t) = content_type {
            post = post.header("content-type", t);
        }
        let reply = Reply::read(post.send().await.unwrap()).await;
        assert_eq!(reply.status, 200, "{content_type:?}: {}", reply.text());
    }
    assert_eq!(d.store.last_seq(&run).unwrap(), 3);
    // An integer beyond 64 bits would reach the log as the nearest double, two ids sharing one
    // key: refused, naming where it is. One within 64 bits, however long, is kept.
    let wide = r#"{"type": "tool_call", "name": "t", "tool": {"class": "deterministic", "version": "1"},
        "request": {"ids": [1, -1180591620717411303425]}, "output": 1}"#;
    let refused = Reply::read(
        client()
            .post(format!("{}/api/runs/{run}/agents/planner/steps", d.base))
            .header("x-retrace-process", std::process::id().to_string())
            .body(wide)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "not_json", "{}", refused.text());
    assert!(refused.text().contains("-1180591620717411303425 at $.request.ids[1]"), "{}", refused.text());
    let long = wide.replace("-1180591620717411303425", "18446744073709551615");
    let kept = client()
        .post(format!("{}/api/runs/{run}/agents/planner/steps", d.base))
        .header("x-retrace-process", std::process::id().to_string())
        .body(long)
        .send()
        .await
        .unwrap();
    assert_eq!(kept.status(), 200);
    assert_eq!(d.store.last_seq(&run).unwrap(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_for_its_first_call_holds_its_lease() {
    // Created through the API, it has no event yet; another process that opens the store
    // (any `retrace` command) must not take it for a run whose recorder died.
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    assert!(d.store.lease_holder(&run).unwrap().is_some(), "the daemon's session holds the lease");
    assert_eq!(d.store.recover_interrupted().unwrap(), Vec::<String>::new());
    assert_eq!(d.store.run(&run).unwrap().status.as_str(), "running");
    let reply = d.call(&run, "/proxy/openai/v1/chat/completions", &chat("hi", false)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(d.finish(&run).await["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_refused_at_its_start_leaves_no_run_behind() {
    // Its source is still being recorded: 409, and no replay run stays `running` for as long
    // as the daemon lives.
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    let refused = client().post(format!("{}/api/runs/{run}/replay", d.base)).send().await.unwrap();
    let refused = Reply::read(refused).await;
    assert_eq!(refused.status, 409, "{}", refused.text());
    assert!(refused.text().contains("still being recorded"), "{}", refused.text());
    // It names the run asked for, not a replay run made and deleted meanwhile, with a code of
    // its own (QA39 D5).
    assert_eq!(refused.json()["error"]["code"], "run_running", "{}", refused.text());
    let said = refused.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(said.starts_with(&format!("run {run} is still being recorded by ")), "{said}");
    let ids: Vec<String> = d.store.runs().unwrap().into_iter().map(|m| m.id).collect();
    assert_eq!(ids, vec![run.clone()], "only the recording");
    // Once it has finished, it replays.
    assert_eq!(d.finish(&run).await["status"], "ok");
    let replay = d.replay_of(&run).await;
    assert_eq!(d.finish(&replay).await["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recv_timeout_too_long_for_a_duration_waits_and_the_daemon_stays_up() {
    // 1e300 s used to panic the handler (Duration::from_secs_f64): it means no timeout.
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    let base = format!("{}/api/runs/{run}/agents", d.base);
    let waiting = client().post(format!("{base}/reviewer/recv")).json(&json!({"timeout_s": 1e300})).send();
    let waiting = tokio::spawn(waiting);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    d.api(
        &format!("/api/runs/{run}/agents/planner/send"),
        json!({"to": "reviewer", "kind": "note", "body": {"x": 1}}),
    )
    .await;
    let heard: serde_json::Value = waiting.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(heard["message"]["body"], json!({"x": 1}), "{heard}");
    assert_eq!(d.finish(&run).await["status"], "ok");
}

/// A step of a finished run is refused as a second `finish` is: 409, saying it has finished
/// (it was 404 `unknown_run`, as if the run didn't exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_after_finish_is_a_conflict_that_says_so() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    d.finish(&run).await;
    let body = json!({"type": "tool_call", "name": "t", "request": {}, "tool": {"class": "deterministic", "version": "1"}, "output": 1});
    let step =
        client().post(format!("{}/api/runs/{run}/agents/a/steps", d.base)).json(&body).send().await.unwrap();
    let step = Reply::read(step).await;
    assert_eq!(step.status, 409, "{}", step.text());
    assert_eq!(step.json()["error"]["code"], "run_finished", "{}", step.text());
    assert!(step.text().contains("has finished"), "{}", step.text());
    let again = client()
        .post(format!("{}/api/runs/{run}/finish", d.base))
        .json(&json!({"exit_status": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 409);
}

/// The SDK routes refuse what would make a run unusable or the daemon unbounded: a send's
/// parent that is no earlier event (the run would fail `verify` and its export `import`), an
/// agent id that is empty or holds a control character, a body over --max-body, a run name
/// past 256 characters; a finish of an unknown run is 404 `unknown_run` like every route's
/// (QA20 D2-D5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_refuses_what_would_break_a_run_or_the_daemon() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |c| c.max_body = 4096).await;
    let run = d.new_run().await;
    let post = |path: String, body: Vec<u8>| {
        let url = format!("{}{path}", d.base);
        async move {
            let r = client()
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            Reply::read(r).await
        }
    };
    let send = |parent: u64| json!({"to": "b", "body": 1, "parent": parent}).to_string().into_bytes();
    for parent in [0, 99_999] {
        let refused = post(format!("/api/runs/{run}/agents/a/send"), send(parent)).await;
        assert_eq!(refused.status, 400, "{}", refused.text());
        assert!(
            refused.text().contains(&format!("parent {parent} is not an earlier event")),
            "{}",
            refused.text()
        );
    }
    let first = post(format!("/api/runs/{run}/agents/a/send"), send_no_parent()).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let seq = first.json()["seq"].as_u64().unwrap();
    let child = post(format!("/api/runs/{run}/agents/a/send"), send(seq)).await;
    assert_eq!(child.status, 200, "an earlier event is a parent: {}", child.text());

    for agent in ["%20%0A", "a%0Ab", "a%00b"] {
        let refused = post(format!("/api/runs/{run}/agents/{agent}/steps"), b"{}".to_vec()).await;
        assert_eq!(refused.status, 400, "{agent}: {}", refused.text());
        assert!(refused.text().contains("control character"), "{}", refused.text());
    }
    let empty = post(
        format!("/proxy/run/{run}/agent//openai/v1/chat/completions"),
        chat("hi", false).to_string().into_bytes(),
    )
    .await;
    assert_eq!(empty.status, 400, "{}", empty.text());
    assert!(empty.text().contains("the agent id is empty"), "{}", empty.text());

    let big = post(format!("/api/runs/{run}/agents/a/steps"), vec![b' '; 10_000]).await;
    assert_eq!(big.status, 413, "{}", big.text());
    assert_eq!(big.json()["error"]["code"], "too_large", "{}", big.text());
    let long = json!({"name": "n".repeat(300)}).to_string().into_bytes();
    let refused = post("/api/runs".into(), long).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(refused.text().contains("keep it to 256"), "{}", refused.text());

    let unknown = post("/api/runs/01nosuchrun/finish".into(), b"{}".to_vec()).await;
    assert_eq!((unknown.status, unknown.json()["error"]["code"].as_str()), (404, Some("unknown_run")));
    let intent =
        json!({"type": "tool_call", "name": "pay", "request": {"amt": 5}, "tool": {"class": "side_effect"}});
    let started = post(format!("/api/runs/{run}/agents/a/steps"), intent.to_string().into_bytes()).await;
    assert_eq!(started.status, 200, "{}", started.text());
    let step = started.json()["step"].as_str().unwrap().to_owned();
    // Its outcome on another run's route is no step of that run: refused, and the step still
    // waits on its own (schemathesis's stateful phase found a 503 "run marked failed" this way).
    let other = d.new_run().await;
    let outcome = json!({"step": step, "output": {"paid": true}}).to_string().into_bytes();
    let elsewhere = post(format!("/api/runs/{other}/agents/a/steps"), outcome.clone()).await;
    assert_eq!((elsewhere.status, elsewhere.json()["error"]["code"].as_str()), (404, Some("unknown_step")));
    assert_eq!(d.store.run(&other).unwrap().status, retrace_core::run::RunStatus::Running);
    d.finish(&other).await;
    d.finish(&run).await;
    // Its outcome, after the run ended: the run has finished, it isn't failed (QA20 D6).
    let late = json!({"step": step, "output": {"paid": true}}).to_string().into_bytes();
    let late = post(format!("/api/runs/{run}/agents/a/steps"), late).await;
    assert_eq!(
        (late.status, late.json()["error"]["code"].as_str()),
        (409, Some("run_finished")),
        "{}",
        late.text()
    );
    assert_ne!(d.store.run(&run).unwrap().status, retrace_core::run::RunStatus::Failed);
    let again = post(format!("/api/runs/{run}/finish"), b"{}".to_vec()).await;
    assert_eq!((again.status, again.json()["error"]["code"].as_str()), (409, Some("run_finished")));
    let verified = retrace_store::verify::verify_run(&*d.store, &run);
    assert!(verified.is_empty(), "{verified:?}");
}

fn send_no_parent() -> Vec<u8> {
    json!({"to": "b", "body": 0}).to_string().into_bytes()
}

/// A run created by a daemon with another body limit than the default keeps it, and a replay
/// of it through a daemon with the default limit refuses what the recording refused, instead
/// of letting it through to a step the recording doesn't hold (QA32 D4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_keeps_its_body_limit_through_another_daemon() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let (store, _home) = sqlite();
    let small =
        daemon_over(store.clone(), providers.openai_url(), providers.anthropic_url(), |c| c.max_body = 1024)
            .await;
    let run = small.new_run().await;
    assert_eq!(store.run(&run).unwrap().max_body, Some(1024));
    let big = chat(&"x".repeat(2000), false);
    let path = "/proxy/openai/v1/chat/completions";
    assert_eq!(small.call(&run, path, &big).await.status, 413);
    assert_eq!(small.call(&run, path, &chat("small", false)).await.status, 200);
    small.finish(&run).await;
    drop(small);

    let default = daemon_over(store.clone(), providers.openai_url(), providers.anthropic_url(), |_| {}).await;
    let replay = default.replay_of(&run).await;
    assert_eq!(store.run(&replay).unwrap().max_body, Some(1024));
    let refused = default.call(&replay, path, &big).await;
    assert_eq!(refused.status, 413, "{}", refused.text());
    assert_eq!(default.call(&replay, path, &chat("small", false)).await.status, 200);
    assert_eq!(default.finish(&replay).await["status"], "ok");
    // A daemon with the default limit stores none.
    let plain = default.new_run().await;
    assert_eq!(store.run(&plain).unwrap().max_body, None);
}
