//! Access control over real HTTP: each caller (no token, an unknown token, viewer, debugger,
//! admin) against each route, by the one table; the proxy's token travels in X-Retrace-Token
//! while the provider's Authorization reaches the upstream untouched.
use std::net::SocketAddr;

use axum::http::HeaderMap;
use axum::routing::post;
use axum::Json;
use retrace_server::auth::{Role, Tokens};
use serde_json::{json, Value};

use crate::support::{client, daemon_over, sqlite, Daemon, Reply};

pub const VIEWER: &str = "viewer-token-0123456789";
pub const DEBUGGER: &str = "debugger-token-0123456789";
pub const ADMIN: &str = "admin-token-0123456789";
const PROVIDER_KEY: &str = "Bearer sk-provider-key-for-the-upstream";

/// The callers: a name, the token they present, and the role it grants.
const CALLERS: &[(&str, Option<&str>, Option<Role>)] = &[
    ("no token", None, None),
    ("unknown token", Some("not-a-token-this-daemon-knows"), None),
    ("viewer", Some(VIEWER), Some(Role::Viewer)),
    ("debugger", Some(DEBUGGER), Some(Role::Debugger)),
    ("admin", Some(ADMIN), Some(Role::Admin)),
];

/// An upstream that answers every call with the credentials it was sent.
async fn echo_upstream() -> SocketAddr {
    async fn echo(headers: HeaderMap) -> Json<Value> {
        let get = |h: &str| headers.get(h).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let seen = json!({"authorization": get("authorization"), "x-api-key": get("x-api-key"), "x-retrace-token": get("x-retrace-token")});
        Json(json!({
            "id": "chatcmpl-echo", "object": "chat.completion", "model": "echo",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": seen.to_string()}, "finish_reason": "stop"}],
            "seen": seen,
        }))
    }
    let app = axum::Router::new().route("/v1/chat/completions", post(echo)).route("/v1/messages", post(echo));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn guarded() -> Daemon {
    let upstream = echo_upstream().await;
    let (store, home) = sqlite();
    let mut tokens = Tokens::none();
    tokens.add_env(&format!("viewer:{VIEWER},debugger:{DEBUGGER},admin:{ADMIN}")).unwrap();
    let mut d = daemon_over(store, format!("http://{upstream}/v1"), format!("http://{upstream}"), |c| {
        c.tokens = tokens
    })
    .await;
    d._home = Some(home);
    d
}

/// Sends one request as a caller: the token in the header its route family uses.
/// A proxied call names `run` in X-Retrace-Run (the path form names its own).
async fn send(
    d: &Daemon,
    run: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> Reply {
    let url = format!("{}{path}", d.base);
    let mut req = client().request(method.parse().unwrap(), url);
    let proxy = path.starts_with("/proxy/");
    if proxy {
        req = req.header("authorization", PROVIDER_KEY).header("x-api-key", "sk-ant-provider-key");
        req = req.header("anthropic-version", "2023-06-01").header("x-retrace-run", run);
    }
    if let Some(token) = token {
        req = match proxy {
            true => req.header("x-retrace-token", token),
            false => req.header("authorization", format!("Bearer {token}")),
        };
    }
    if let Some(body) = body {
        req = req.header("content-type", "application/json").body(body.to_string());
    }
    Reply::read(req.send().await.unwrap()).await
}

/// Each route (method, path, body) with the least role that may call it (`None`: anyone).
fn routes(run: &str, other: &str, blob: &str) -> Vec<(&'static str, String, Option<Value>, Option<Role>)> {
    let chat = json!({"model": "echo", "messages": [{"role": "user", "content": "hi"}]});
    let agent = format!("/api/runs/{run}/agents/auth-agent");
    let v = Some(Role::Viewer);
    let d = Some(Role::Debugger);
    let a = Some(Role::Admin);
    let token = "rtk_email_abcdefghijklmnopqrstuvwxyz";
    vec![
        ("GET", "/api/health".into(), None, None),
        ("GET", "/api/openapi.json".into(), None, None),
        ("GET", "/api/runs".into(), None, v),
        ("GET", format!("/api/runs/{run}"), None, v),
        ("GET", format!("/api/runs/{run}/events?from=1&limit=5"), None, v),
        ("GET", format!("/api/runs/{run}/export"), None, v),
        ("GET", format!("/api/blobs/{blob}"), None, v),
        ("GET", "/api/no-such-route".into(), None, v),
        ("POST", "/api/runs".into(), Some(json!({})), d),
        ("POST", format!("/api/runs/{run}/replay"), Some(json!({})), d),
        ("POST", format!("/api/runs/{other}/finish"), Some(json!({})), d),
        (
            "POST",
            format!("{agent}/steps"),
            Some(
                json!({"type": "tool_call", "name": "t", "request": {}, "output": 1, "tool": {"class": "deterministic"}}),
            ),
            d,
        ),
        ("POST", format!("{agent}/send"), Some(json!({"to": "b", "body": 1})), d),
        ("POST", format!("{agent}/recv"), Some(json!({"timeout_s": 0})), d),
        ("POST", format!("{agent}/decide"), Some(json!({"action": "approve"})), d),
        ("POST", format!("{agent}/exit"), Some(json!({})), d),
        ("POST", "/proxy/openai/v1/chat/completions".into(), Some(chat.clone()), d),
        ("POST", "/proxy/anthropic/v1/messages".into(), Some(chat.clone()), d),
        ("POST", format!("/proxy/run/{run}/agent/a/openai/v1/chat/completions"), Some(chat.clone()), d),
        ("POST", format!("/proxy/run/{run}/agent/a/anthropic/v1/messages"), Some(chat), d),
        // The daemon has no vault key: an admin's reveal is refused (409) after the table let it in.
        ("POST", "/api/vault/reveal".into(), Some(json!({"token": token, "reason": "auth test"})), a),
        ("GET", "/api/vault/audit".into(), None, a),
        ("GET", format!("/api/vault/audit?token={token}"), None, a),
        ("POST", format!("/api/runs/{other}/retain"), Some(json!({"tier": "incident"})), a),
        ("POST", "/api/gc".into(), Some(json!({"dry_run": true})), a),
        ("POST", format!("/api/runs/{other}/delete"), Some(json!({"dry_run": true})), a),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_role_reaches_exactly_the_routes_of_the_table() {
    let d = guarded().await;
    let run = new_run(&d, DEBUGGER).await;
    let other = new_run(&d, ADMIN).await;
    // One proxied call, so the run has an event and a blob to read.
    let chat = json!({"model": "echo", "messages": []});
    let first =
        send(&d, &run, "POST", "/proxy/openai/v1/chat/completions", Some(&chat), Some(DEBUGGER)).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let blob = d.store.events(&run, 1, 1).unwrap()[0].output_ref.unwrap().to_string();

    let mut checked = 0;
    for (method, path, body, min) in routes(&run, &other, &blob) {
        for (caller, token, role) in CALLERS {
            let reply = send(&d, &run, method, &path, body.as_ref(), *token).await;
            let context = format!("{caller} {method} {path}: {} {}", reply.status, reply.text());
            let allowed = min.is_none_or(|min| role.is_some_and(|r| r >= min));
            if allowed {
                assert!(![401, 403].contains(&reply.status) && reply.status < 500, "{context}");
            } else {
                let want = if role.is_some() { 403 } else { 401 };
                assert_eq!(reply.status, want, "{context}");
                denied_shape(&path, &reply, want, &context);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, routes("r", "o", "b").len() * CALLERS.len());
}

async fn new_run(d: &Daemon, token: &str) -> String {
    let reply = send(d, "", "POST", "/api/runs", Some(&json!({})), Some(token)).await;
    reply.json()["run_id"].as_str().unwrap().to_owned()
}

/// A refusal is JSON `{error: {code, message}}` on the API, and the provider's own error shape
/// with `x-should-retry: false` on the proxy.
fn denied_shape(path: &str, reply: &Reply, status: u16, context: &str) {
    let body = reply.json();
    if path.starts_with("/proxy/") {
        assert_eq!(reply.header("x-should-retry"), Some("false"), "{context}");
        let kind = &body["error"]["type"];
        let want = match status {
            401 => "authentication_error",
            _ => "permission_error",
        };
        assert_eq!(kind, want, "{context}");
        if path.contains("anthropic") {
            assert_eq!(body["type"], "error", "{context}");
        }
    } else {
        let code = if status == 401 { "unauthorized" } else { "forbidden" };
        assert_eq!(body["error"]["code"], code, "{context}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{context}");
        if status == 401 {
            assert_eq!(reply.header("www-authenticate"), Some("Bearer"), "{context}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_takes_its_token_from_x_retrace_token_and_forwards_authorization() {
    let d = guarded().await;
    let run = new_run(&d, DEBUGGER).await;
    let chat = json!({"model": "echo", "messages": [{"role": "user", "content": "hi"}]});
    let path = format!("/proxy/run/{run}/agent/a/openai/v1/chat/completions");
    let reply = send(&d, &run, "POST", &path, Some(&chat), Some(DEBUGGER)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let seen = &reply.json()["seen"];
    assert_eq!(seen["authorization"], PROVIDER_KEY, "the provider's key reaches the upstream untouched");
    assert_eq!(seen["x-api-key"], "sk-ant-provider-key");
    assert_eq!(seen["x-retrace-token"], Value::Null, "the daemon's token stays with the daemon");

    // A Retrace token in Authorization is the provider's business, not a pass on the proxy.
    let r = client()
        .post(format!("{}{path}", d.base))
        .header("authorization", format!("Bearer {DEBUGGER}"))
        .json(&chat)
        .send()
        .await
        .unwrap();
    let r = Reply::read(r).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(r.text().contains("X-Retrace-Token"), "{}", r.text());
    // And X-Retrace-Token is no pass on the API.
    let r =
        client().get(format!("{}/api/runs", d.base)).header("x-retrace-token", ADMIN).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // A stored event never holds the provider's key.
    let events = d.store.events(&run, 1, 10).unwrap();
    let request = d.store.get_blob(&events[0].request_ref.unwrap()).unwrap();
    assert!(!String::from_utf8_lossy(&request).contains("sk-provider"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_scheme_is_case_insensitive_and_a_viewer_sees_its_403_reason() {
    let d = guarded().await;
    let r = client().get(format!("{}/api/runs", d.base)).header("authorization", format!("bearer {VIEWER}"));
    assert_eq!(r.send().await.unwrap().status(), 200);
    let r = send(&d, "", "POST", "/api/runs", Some(&json!({})), Some(VIEWER)).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.json()["error"]["message"], "this needs the debugger role; the token's role is viewer");
}
