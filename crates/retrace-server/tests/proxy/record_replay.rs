//! Recorded responses come back byte for byte in replay, with the upstream stopped.
use std::collections::HashMap;

use retrace_demo::providers::Providers;
use retrace_server::proxy::document::{ClientGone, Recorded, RecordedBody, StreamEnd};
use serde_json::{json, Value};

use crate::support::{chat, client, daemon};

const OPENAI: &str = "/proxy/openai/v1";

fn every_endpoint() -> Vec<(&'static str, Value)> {
    vec![
        ("/proxy/openai/v1/chat/completions", chat("hello", false)),
        (
            "/proxy/openai/v1/chat/completions",
            json!({"model": "gpt-sim", "stream": true, "stream_options": {"include_usage": true},
                   "messages": [{"role": "user", "content": "hello"}]}),
        ),
        ("/proxy/openai/v1/responses", json!({"model": "gpt-sim", "input": "hi"})),
        ("/proxy/openai/v1/responses", json!({"model": "gpt-sim", "input": "hi", "stream": true})),
        (
            "/proxy/openai/v1/embeddings",
            json!({"model": "emb-sim", "input": ["a", "b"], "encoding_format": "base64"}),
        ),
        (
            "/proxy/anthropic/v1/messages",
            json!({"model": "claude-sim", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "/proxy/anthropic/v1/messages",
            json!({"model": "claude-sim", "max_tokens": 50, "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_replays_byte_for_byte_with_the_upstream_stopped() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    let mut live = Vec::new();
    for (path, body) in every_endpoint() {
        let reply = d.call(&run, path, &body).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.text());
        assert!(!reply.broke_off);
        live.push(reply);
    }
    assert_eq!(d.finish(&run).await["status"], "ok");
    assert_eq!(providers.requests(), live.len());
    providers.stop().await;

    for round in 0..2 {
        let replay = d.replay_of(&run).await;
        for ((path, body), recorded) in every_endpoint().into_iter().zip(&live) {
            let reply = d.call(&replay, path, &body).await;
            assert_eq!(reply.status, recorded.status, "round {round} {path}: {}", reply.text());
            assert_eq!(reply.text(), recorded.text(), "round {round} {path}");
            assert_eq!(reply.header("content-type"), recorded.header("content-type"));
            assert_eq!(
                reply.header("x-request-id"),
                recorded.header("x-request-id"),
                "recorded headers replay"
            );
        }
        let outcome = d.finish(&replay).await;
        assert_eq!(outcome["status"], "ok", "{outcome}");
    }
    assert!(retrace_store::verify::verify_run(d.store.as_ref(), &run).is_empty());

    // What was stored: raw bodies, snapshots, token counts; never the API keys.
    let events = d.store.events(&run, 1, 100).unwrap();
    assert_eq!(events.len(), 7);
    let stream = &events[1];
    assert_eq!(stream.name.as_deref(), Some("openai/v1/chat/completions"));
    assert_eq!(stream.model.as_ref().unwrap().snapshot.as_deref(), Some("gpt-sim-2026-11-01"));
    assert_eq!(stream.usage.as_ref().map(|u| u.output_tokens), Some(6));
    let doc = Recorded::decode(&d.store.get_blob(&stream.output_ref.unwrap()).unwrap()).unwrap();
    let RecordedBody::Stream { chunks, end, .. } = doc.body else { panic!("a stream") };
    assert_eq!(end, StreamEnd::Complete);
    assert!(chunks.len() >= 2 && String::from_utf8_lossy(&chunks.last().unwrap().1).contains("[DONE]"));
    assert_eq!(events[6].params.as_ref().unwrap()["anthropic-version"], "2023-06-01");
    for e in &events {
        for r in [e.request_ref, e.output_ref].into_iter().flatten() {
            let bytes = String::from_utf8_lossy(&d.store.get_blob(&r).unwrap()).into_owned();
            assert!(!bytes.contains("never-stored"), "an API key was stored: {bytes}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_replay_whatever_order_they_race_in() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = std::sync::Arc::new(daemon(&providers, |_| {}).await);
    let run = d.new_run().await;
    // 6 distinct prompts, each asked 4 times, all at once.
    let calls: Vec<(String, bool)> = (0..24).map(|i| (format!("prompt {}", i % 6), i % 3 == 0)).collect();
    let record = calls.iter().cloned().map(|(p, s)| {
        let (d, run) = (d.clone(), run.clone());
        tokio::spawn(async move {
            (p.clone(), s, d.call(&run, &format!("{OPENAI}/chat/completions"), &chat(&p, s)).await)
        })
    });
    let mut recorded: HashMap<(String, bool), Vec<String>> = HashMap::new();
    for h in record.collect::<Vec<_>>() {
        let (p, s, reply) = h.await.unwrap();
        assert_eq!(reply.status, 200);
        recorded.entry((p, s)).or_default().push(reply.text());
    }
    // The first calls raced to open the run's session: exactly one took the lease, and kept it.
    let holder = d.store.lease_holder(&run).unwrap();
    assert!(holder.is_some(), "the recording lost its lease to a session opened twice");
    d.finish(&run).await;
    // Concurrent steps of one agent: its Lamport clock still increases with seq.
    let problems = retrace_store::verify::verify_run(d.store.as_ref(), &run);
    assert!(problems.is_empty(), "{problems:?}");
    providers.stop().await;
    for round in 0..3 {
        let replay = d.replay_of(&run).await;
        let mut order = calls.clone();
        order.rotate_left(round * 7 + 1);
        order.reverse();
        let handles: Vec<_> = order
            .into_iter()
            .map(|(p, s)| {
                let (d, replay) = (d.clone(), replay.clone());
                tokio::spawn(async move {
                    (p.clone(), s, d.call(&replay, &format!("{OPENAI}/chat/completions"), &chat(&p, s)).await)
                })
            })
            .collect();
        let mut replayed: HashMap<(String, bool), Vec<String>> = HashMap::new();
        for h in handles {
            let (p, s, reply) = h.await.unwrap();
            assert_eq!(reply.status, 200, "round {round}: {}", reply.text());
            replayed.entry((p, s)).or_default().push(reply.text());
        }
        for (k, mut v) in replayed {
            let mut want = recorded[&k].clone();
            v.sort();
            want.sort();
            assert_eq!(v, want, "round {round}: identical calls get the recorded answers");
        }
        assert_eq!(d.finish(&replay).await["status"], "ok");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_calls_replay_in_recorded_order() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    let mut live = Vec::new();
    for _ in 0..5 {
        live.push(d.call(&run, &format!("{OPENAI}/chat/completions"), &chat("same", false)).await.text());
    }
    d.finish(&run).await;
    let replay = d.replay_of(&run).await;
    for want in &live {
        assert_eq!(
            &d.call(&replay, &format!("{OPENAI}/chat/completions"), &chat("same", false)).await.text(),
            want
        );
    }
    // A sixth identical call is more than the log holds.
    let extra = d.call(&replay, &format!("{OPENAI}/chat/completions"), &chat("same", false)).await;
    assert_eq!(extra.status, 409, "{}", extra.text());
    assert!(extra.text().contains("unexpected_step"), "{}", extra.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_only_once_its_event_is_stored() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    for (i, stream) in [(1, true), (2, false), (3, true)] {
        let reply = d.call(&run, &format!("{OPENAI}/chat/completions"), &chat("ack?", stream)).await;
        assert_eq!(reply.status, 200);
        // No waiting: the terminal event (or the whole body) left the proxy after the ack.
        assert_eq!(d.store.last_seq(&run).unwrap(), i, "event {i} stored before the reply ended");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_loses_nothing() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    let body =
        json!({"model": "gpt-sim-slow", "stream": true, "messages": [{"role": "user", "content": "x"}]});
    let mut r = crate::support::client()
        .post(format!("{}{OPENAI}/chat/completions", d.base))
        .header("x-retrace-run", &run)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.chunk().await.unwrap().is_some(), "the first chunk arrives");
    drop(r);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while d.store.last_seq(&run).unwrap() == 0 {
        assert!(std::time::Instant::now() < deadline, "the call was never recorded");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let event = d.store.event(&run, 1).unwrap();
    let doc = Recorded::decode(&d.store.get_blob(&event.output_ref.unwrap()).unwrap()).unwrap();
    let RecordedBody::Stream { chunks, end, .. } = doc.body else { panic!("a stream") };
    assert_eq!(end, StreamEnd::Complete, "recorded to its end although the client left");
    assert!(String::from_utf8_lossy(&chunks.last().unwrap().1).contains("[DONE]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_opened_by_racing_calls_keeps_its_lease() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = std::sync::Arc::new(daemon(&providers, |_| {}).await);
    for round in 0..10 {
        let run = d.new_run().await;
        let calls: Vec<_> = (0..8)
            .map(|i| {
                let (d, run) = (d.clone(), run.clone());
                tokio::spawn(async move {
                    d.call(&run, &format!("{OPENAI}/chat/completions"), &chat(&format!("{i}"), false)).await
                })
            })
            .collect();
        for c in calls {
            assert_eq!(c.await.unwrap().status, 200);
        }
        let holder = d.store.lease_holder(&run).unwrap();
        assert!(holder.is_some(), "round {round}: the recording lost its lease to a session opened twice");
        d.finish(&run).await;
    }
}

/// `X-Retrace-Role` (an unmodified program's default header) and the SDK's
/// `POST .../agents/{agent}/role` set the role recorded on the agent's model calls; a bad role is
/// refused in the provider's shape and nothing is recorded of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_role_is_recorded_on_the_agents_model_calls() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let run = d.new_run().await;
    let path = format!("{OPENAI}/chat/completions");
    let by_header = d
        .call_with(
            &run,
            &path,
            chat("one", false).to_string().into_bytes(),
            &[("x-retrace-agent", "writer"), ("x-retrace-role", "drafting")],
        )
        .await;
    assert_eq!(by_header.status, 200, "{}", by_header.text());
    d.api(&format!("/api/runs/{run}/agents/critic/role"), json!({"role": "review"})).await;
    let by_sdk = d
        .call_with(&run, &path, chat("two", false).to_string().into_bytes(), &[("x-retrace-agent", "critic")])
        .await;
    assert_eq!(by_sdk.status, 200, "{}", by_sdk.text());
    let too_long = "r".repeat(129);
    let refused = d
        .call_with(
            &run,
            &path,
            chat("three", false).to_string().into_bytes(),
            &[("x-retrace-agent", "critic"), ("x-retrace-role", &too_long)],
        )
        .await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(refused.text().contains("X-Retrace-Role: role is 129 characters long"), "{}", refused.text());
    let empty = crate::support::client()
        .post(format!("{}/api/runs/{run}/agents/critic/role", d.base))
        .json(&json!({"role": ""}))
        .send()
        .await
        .unwrap();
    assert_eq!(empty.status(), 400);

    let events = d.store.events(&run, 1, 10).unwrap();
    let roles: Vec<(&str, Option<&str>)> =
        events.iter().map(|e| (e.agent_id.as_str(), e.role.as_deref())).collect();
    assert_eq!(roles, [("writer", Some("drafting")), ("critic", Some("review"))]);
    assert_eq!(providers.requests(), 2, "the refused call never went upstream");
}

/// A chat completions request for `run` from a client that waits `timeout_ms` at most, to a
/// simulator that answers after `delay` ms.
fn impatient(base: &str, run: &str, body: &str, delay: &str, timeout_ms: u64) -> reqwest::RequestBuilder {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(timeout_ms))
        .build()
        .unwrap()
        .post(format!("{base}{OPENAI}/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test-never-stored")
        .header("x-retrace-run", run)
        .header("x-sim-delay-ms", delay)
        .body(body.to_owned())
}

/// A client that gave up waiting (its timeout) before the upstream answered: in replay it must
/// give up again, not get at once the answer it never had and take another path (QA10 D1).
/// Its patient retry gets the recorded answer, as in record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_client_gave_up_on_is_held_in_replay_until_it_gives_up_again() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    let body = chat("take your time", false).to_string();
    let impatient = |run: &str, delay: &str| impatient(&d.base, run, &body, delay, 300).send();
    let run = d.new_run().await;
    let gave_up = impatient(&run, "1000").await.expect_err("the upstream takes longer than the client waits");
    assert!(gave_up.is_timeout(), "{gave_up}");
    let patient =
        d.call_with(&run, &format!("{OPENAI}/chat/completions"), body.clone().into_bytes(), &[]).await;
    assert_eq!(patient.status, 200, "{}", patient.text());
    assert_eq!(d.finish(&run).await["status"], "ok");
    let first = d.store.event(&run, 1).unwrap();
    let document = d.store.get_blob(&first.output_ref.unwrap()).unwrap();
    let gone = ClientGone::of(&document).expect("the document says the client left");
    assert!(gone.answered_ms.is_none() && (250..1000).contains(&gone.left_ms), "{gone:?}");
    let stopped = Recorded::decode(&document).unwrap();
    assert_eq!(stopped.status, 504, "the proxy's own answer: the call was stopped when the client left");

    for round in 0..2 {
        let replay = d.replay_of(&run).await;
        let began = std::time::Instant::now();
        let gave_up =
            impatient(&replay, "0").await.expect_err("replay holds the answer as long as the upstream took");
        assert!(gave_up.is_timeout(), "round {round}: {gave_up}");
        assert!(began.elapsed() < std::time::Duration::from_millis(900), "the client's own timeout ended it");
        let again =
            d.call_with(&replay, &format!("{OPENAI}/chat/completions"), body.clone().into_bytes(), &[]).await;
        assert_eq!(again.text(), patient.text(), "round {round}");
        assert_eq!(d.finish(&replay).await["status"], "ok", "round {round}");
    }
    providers.stop().await;
}

/// A replay's hold for a client that left can outlast `--stall-timeout` (a client that waited a
/// minute in record is held two in replay): another agent waiting meanwhile for what comes after
/// it is not a stall. Here the stall timeout is 300 ms and the client waits 800 ms; agent `b`
/// waits throughout for the message the program sends after its patient retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_answer_is_not_a_stall_for_agents_waiting_on_what_follows_it() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |c| c.stall_timeout = std::time::Duration::from_millis(300)).await;
    let body = chat("take your time", false).to_string();
    let impatient = |run: &str, delay: &str| impatient(&d.base, run, &body, delay, 800).send();
    let recv = |run: &str| {
        let url = format!("{}/api/runs/{run}/agents/b/recv", d.base);
        tokio::spawn(async move {
            let r = client().post(url).json(&json!({"timeout_s": 30})).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        })
    };
    let program = |run: String, delay: &'static str| {
        let (d, impatient, recv, body) = (&d, &impatient, &recv, body.clone());
        async move {
            let waiting = recv(&run);
            let gave_up = impatient(&run, delay).await.expect_err("the client gives up");
            assert!(gave_up.is_timeout(), "{gave_up}");
            let patient =
                d.call_with(&run, &format!("{OPENAI}/chat/completions"), body.into_bytes(), &[]).await;
            assert_eq!(patient.status, 200, "{}", patient.text());
            d.api(&format!("/api/runs/{run}/agents/default/send"), json!({"to": "b", "body": "done"})).await;
            let (status, heard) = waiting.await.unwrap();
            assert_eq!((status, &heard["message"]["body"]), (200, &json!("done")), "{heard}");
            d.finish(&run).await
        }
    };
    let run = d.new_run().await;
    assert_eq!(program(run.clone(), "2000").await["status"], "ok");
    let replay = d.replay_of(&run).await;
    let outcome = program(replay, "0").await;
    assert_eq!(outcome["status"], "ok", "{outcome}");
    providers.stop().await;
}

/// A client that leaves in the middle of a stream (a read timeout between two chunks): recorded
/// whole, as a call whose client left, and replayed with the chunks at their recorded times, so
/// a client with the same read timeout leaves again at the same chunk instead of getting the
/// whole answer at once (QA11 D3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_client_left_midway_is_replayed_at_its_recorded_pace() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |_| {}).await;
    // `-slow`: the simulator spaces its chunks 20 ms apart; the client waits 10 ms for each.
    let body =
        json!({"model": "gpt-sim-slow", "stream": true, "messages": [{"role": "user", "content": "slowly"}]});
    let read = |run: String| {
        let (base, body) = (d.base.clone(), body.to_string());
        async move {
            let mut r = client()
                .post(format!("{base}{OPENAI}/chat/completions"))
                .header("content-type", "application/json")
                .header("authorization", "Bearer sk-test-never-stored")
                .header("x-retrace-run", run)
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let mut got = Vec::new();
            loop {
                match tokio::time::timeout(std::time::Duration::from_millis(10), r.chunk()).await {
                    Err(_) => return (got, "timed out"),
                    Ok(Ok(Some(chunk))) => got.push(chunk),
                    Ok(Ok(None)) => return (got, "ended"),
                    Ok(Err(_)) => return (got, "broke off"),
                }
            }
        }
    };
    let run = d.new_run().await;
    let (live, how) = read(run.clone()).await;
    assert_eq!(how, "timed out");
    assert_eq!(d.finish(&run).await["status"], "ok");
    let event = d.store.event(&run, 1).unwrap();
    let document = d.store.get_blob(&event.output_ref.unwrap()).unwrap();
    let gone = ClientGone::of(&document).expect("the document says the client left");
    assert!(gone.answered_ms.is_some_and(|head| gone.left_ms >= head), "{gone:?}");
    let Recorded { body: RecordedBody::Stream { end, .. }, .. } = Recorded::decode(&document).unwrap() else {
        panic!("a stream")
    };
    assert_eq!(end, StreamEnd::Complete, "recorded whole although the client left");

    for round in 0..2 {
        let replay = d.replay_of(&run).await;
        let (again, how) = read(replay.clone()).await;
        assert_eq!((again.concat(), how), (live.concat(), "timed out"), "round {round}");
        assert_eq!(d.finish(&replay).await["status"], "ok");
    }
    providers.stop().await;
}
