//! The admin routes over real HTTP: only an admin token reaches them, and a refused caller
//! changes nothing; a reveal is in the audit log before it is answered, refusals included, and
//! the log is served back; gc over HTTP is `retrace gc` (a dry run deletes nothing, an expired
//! routine run goes with its blobs, an `incident` run stays), and retain over HTTP changes what
//! it does.
use retrace_core::vault::VaultKey;
use retrace_demo::providers::Providers;
use retrace_server::auth::Tokens;
use retrace_server::ServerConfig;
use retrace_store::vault::{store_originals, AuditAction};
use retrace_store::Store;
use serde_json::{json, Value};

use crate::auth::{ADMIN, DEBUGGER, VIEWER};
use crate::support::{chat, client, daemon, daemon_over, sqlite, Daemon, Reply};

/// An admin token the tokens file names `alice`.
const ALICE: &str = "alice-admin-token-0123456789";
const EMAIL: &str = "rtk_email_abcdefghijklmnopqrstuvwxyz";
const BINARY: &str = "rtk_secret_zyxwvutsrqponmlkjihgfedcba";

fn vault_key(byte: u8) -> VaultKey {
    VaultKey::from_bytes([byte; 32])
}

/// Tokens of every role, the file's `alice` among them; blobs are swept as soon as nothing
/// references them (no grace), so a test sees gc free them.
fn admin_config(config: &mut ServerConfig) {
    let mut tokens = Tokens::none();
    tokens.add_env(&format!("viewer:{VIEWER},debugger:{DEBUGGER},admin:{ADMIN}")).unwrap();
    tokens.add_file("tokens", &format!("# who reveals\nadmin {ALICE} alice\n")).unwrap();
    config.tokens = tokens;
    config.vault_key = Some(vault_key(1));
    config.retention.blob_grace_minutes = 0;
}

/// Sends `body` to an API path with `token` as the bearer.
async fn call(d: &Daemon, method: &str, path: &str, body: Option<Value>, token: Option<&str>) -> Reply {
    raw(d, method, path, body.map(|b| b.to_string()), token).await
}

/// Sends `body` as it is (JSON or not) to an API path with `token` as the bearer.
async fn raw(d: &Daemon, method: &str, path: &str, body: Option<String>, token: Option<&str>) -> Reply {
    let mut req = client().request(method.parse().unwrap(), format!("{}{path}", d.base));
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    if let Some(body) = body {
        req = req.header("content-type", "application/json").body(body);
    }
    Reply::read(req.send().await.unwrap()).await
}

/// The error code of a refusal, after checking its status and shape.
fn error_code(reply: &Reply, status: u16) -> String {
    assert_eq!(reply.status, status, "{}", reply.text());
    let body = reply.json();
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    body["error"]["code"].as_str().unwrap_or_default().to_owned()
}

/// A finished recorded run with one proxied call (so it has blobs), made as a debugger.
async fn recorded(d: &Daemon, prompt: &str) -> String {
    let run = call(d, "POST", "/api/runs", Some(json!({})), Some(DEBUGGER)).await.json()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let body = chat(prompt, false).to_string().into_bytes();
    let reply =
        d.call_with(&run, "/proxy/openai/v1/chat/completions", body, &[("x-retrace-token", DEBUGGER)]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let finished =
        call(d, "POST", &format!("/api/runs/{run}/finish"), Some(json!({"exit_status": 0})), Some(DEBUGGER))
            .await;
    assert_eq!(finished.json()["status"], "ok", "{}", finished.text());
    run
}

fn blobs_of(store: &dyn Store, run: &str) -> Vec<retrace_core::Digest> {
    let events = store.events(run, 1, 100).unwrap();
    events.iter().flat_map(|e| [e.request_ref, e.output_ref]).flatten().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_admin_reaches_the_admin_routes_and_a_refused_caller_changes_nothing() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, admin_config).await;
    store_originals(&*d.store, &vault_key(1), None, &[(EMAIL, "ada@example.com")]).unwrap();
    let run = recorded(&d, "kept").await;
    let routes = [
        ("POST", format!("/api/runs/{run}/retain"), Some(json!({"tier": "pinned"}))),
        ("POST", "/api/gc".to_owned(), Some(json!({"dry_run": false, "older_than_days": 0}))),
        ("POST", "/api/vault/reveal".to_owned(), Some(json!({"token": EMAIL, "reason": "INC-1"}))),
        ("GET", "/api/vault/audit".to_owned(), None),
    ];
    for (method, path, body) in &routes {
        for (caller, token, status) in
            [("no token", None, 401), ("viewer", Some(VIEWER), 403), ("debugger", Some(DEBUGGER), 403)]
        {
            let reply = call(&d, method, path, body.clone(), token).await;
            assert_eq!(reply.status, status, "{caller} {method} {path}: {}", reply.text());
        }
    }
    // Nothing the refused callers asked for happened: no reveal, the tier is the same, and gc
    // deleted nothing. But each attempt to see an original is in the audit log, with its role
    // and its token's fingerprint, or, for a caller with no token, saying so (QA38 S1: it was
    // not audited).
    let audited: Vec<(String, String, String, String)> = d
        .store
        .audit_list(None)
        .unwrap()
        .into_iter()
        .map(|r| (r.entry.who, r.entry.role, r.entry.action.as_str().to_owned(), r.entry.outcome))
        .collect();
    let fingerprint = |t: &str| format!("api token {}", retrace_core::Digest::of(t.as_bytes()).short());
    assert_eq!(
        audited,
        [
            (
                "(no api token)".into(),
                "none".into(),
                "reveal_refused".into(),
                "no valid api token (401)".into()
            ),
            (
                fingerprint(VIEWER),
                "viewer".into(),
                "reveal_refused".into(),
                "this needs the admin role; the token's role is viewer".into()
            ),
            (
                fingerprint(DEBUGGER),
                "debugger".into(),
                "reveal_refused".into(),
                "this needs the admin role; the token's role is debugger".into()
            ),
        ]
    );
    assert_eq!(d.store.run(&run).unwrap().retention.as_str(), "routine");
    assert!(blobs_of(&*d.store, &run).iter().all(|b| d.store.get_blob(b).is_ok()));

    // A malformed body is no way round the role nor the audit log (QA10 D6): 403, audited.
    for body in [json!({}), json!({"token": EMAIL})] {
        let reply = call(&d, "POST", "/api/vault/reveal", Some(body.clone()), Some(DEBUGGER)).await;
        assert_eq!(reply.status, 403, "{body}: {}", reply.text());
    }
    let subjects: Vec<String> =
        d.store.audit_list(None).unwrap().into_iter().skip(3).map(|r| r.entry.subject).collect();
    assert_eq!(subjects, ["(a request that is not a reveal body)".to_owned(), EMAIL.to_owned()]);

    // An admin reaches every one of them.
    let mut answers = Vec::new();
    for (method, path, body) in &routes {
        let reply = call(&d, method, path, body.clone(), Some(ADMIN)).await;
        assert_eq!(reply.status, 200, "admin {method} {path}: {}", reply.text());
        answers.push(reply.json());
    }
    assert_eq!(answers[0], json!({"run": run, "retention": "pinned", "previous": "routine"}));
    assert_eq!(answers[1]["runs_deleted"], json!([]), "a pinned run stays: {}", answers[1]);
    assert_eq!(answers[2], json!({"token": EMAIL, "original": "ada@example.com"}));
    assert_eq!(
        answers[3].as_array().map(Vec::len),
        Some(6),
        "the five refused and the one revealed: {}",
        answers[3]
    );
    assert_eq!(d.store.run(&run).unwrap().retention.as_str(), "pinned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reveal_is_audited_before_it_is_answered_and_the_log_is_served() {
    let (store, _home) = sqlite();
    store_originals(
        &*store,
        &vault_key(1),
        None,
        &[(EMAIL, &b"ada@example.com"[..]), (BINARY, &[0xff, 0x00, 0xfe][..])],
    )
    .unwrap();
    let nowhere = || "http://127.0.0.1:9".to_owned();
    let d = daemon_over(store.clone(), nowhere(), nowhere(), admin_config).await;
    let audited = || store.audit_list(None).unwrap();
    let reveal = |token: &str, reason: Option<&str>| {
        let mut body = json!({"token": token});
        if let Some(reason) = reason {
            body["reason"] = json!(reason);
        }
        body
    };

    // Allowed: alice's token is named by the tokens file, the other admin token is not.
    let r = call(
        &d,
        "POST",
        "/api/vault/reveal",
        Some(reveal(EMAIL, Some("INC-7: which customer?"))),
        Some(ALICE),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"token": EMAIL, "original": "ada@example.com"}));
    assert_eq!(audited().len(), 1, "the entry is there by the time the answer is");
    let r = call(&d, "POST", "/api/vault/reveal", Some(reveal(BINARY, Some("INC-7"))), Some(ADMIN)).await;
    assert_eq!(r.json(), json!({"token": BINARY, "original": "/wD+", "encoding": "base64"}));

    // Refused, and audited all the same, each before its answer.
    let refusals: [(Option<Value>, u16, &str); 3] = [
        (Some(reveal(EMAIL, None)), 400, "missing_reason"),
        (Some(reveal(EMAIL, Some("  "))), 400, "missing_reason"),
        (Some(reveal("rtk_email_zzzzzzzzzzzzzzzzzzzzzzzzzz", Some("INC-7"))), 404, "unknown_token"),
    ];
    for (body, status, code) in refusals {
        let before = audited().len();
        let r = call(&d, "POST", "/api/vault/reveal", body, Some(ALICE)).await;
        assert_eq!(error_code(&r, status), code);
        assert!(r.json()["error"]["message"].as_str().unwrap().contains("audit log"), "{}", r.text());
        assert_eq!(audited().len(), before + 1, "{code} is audited");
    }
    // A daemon whose vault key is not the one the originals were sealed with, and one with none.
    for (key, code) in [(Some(vault_key(2)), "cannot_open"), (None, "no_vault_key")] {
        let other = daemon_over(store.clone(), nowhere(), nowhere(), |c| {
            admin_config(c);
            c.vault_key = key;
        })
        .await;
        let before = audited().len();
        let r =
            call(&other, "POST", "/api/vault/reveal", Some(reveal(EMAIL, Some("INC-8"))), Some(ALICE)).await;
        assert_eq!(error_code(&r, 409), code);
        assert_eq!(audited().len(), before + 1, "{code} is audited");
    }
    // A body that doesn't parse names no token: 400, and nothing to audit.
    let before = audited().len();
    let bad_bodies = [
        "{\"token\":".to_owned(),
        String::new(),
        json!({"reason": "no token"}).to_string(),
        json!({"token": EMAIL, "reason": "x", "as": "root"}).to_string(),
    ];
    for bad in bad_bodies {
        let r = raw(&d, "POST", "/api/vault/reveal", Some(bad), Some(ADMIN)).await;
        assert_eq!(error_code(&r, 400), "bad_request");
    }
    assert_eq!(audited().len(), before);

    // The log, as the API serves it: who, in which role, what, and what came of it.
    let log = call(&d, "GET", "/api/vault/audit", None, Some(ADMIN)).await.json();
    let rows: Vec<(String, String, String, String, String)> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let field = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
            (field("who"), field("role"), field("action"), field("subject"), field("outcome"))
        })
        .collect();
    let (ok, refused) = (AuditAction::Reveal.as_str(), AuditAction::RevealRefused.as_str());
    let who: Vec<(&str, &str, &str)> =
        rows.iter().map(|(who, role, action, _, _)| (who.as_str(), role.as_str(), action.as_str())).collect();
    assert_eq!(
        who,
        [
            ("alice", "admin", ok),
            (
                format!("api token {}", retrace_core::Digest::of(ADMIN.as_bytes()).short()).as_str(),
                "admin",
                ok
            ),
            ("alice", "admin", refused),
            ("alice", "admin", refused),
            ("alice", "admin", refused),
            ("alice", "admin", refused),
            ("alice", "admin", refused),
        ]
    );
    assert_eq!(rows[0].4, "ok");
    assert!(rows[2].4.contains("reason"), "{:?}", rows[2]);
    assert!(rows[4].4.contains("holds no original"), "{:?}", rows[4]);
    assert!(rows[5].4.contains("does not open"), "{:?}", rows[5]);
    assert!(rows[6].4.contains("no vault key"), "{:?}", rows[6]);
    assert_eq!(
        log,
        serde_json::to_value(store.audit_list(None).unwrap()).unwrap(),
        "what `vault audit --json` prints"
    );

    let mine = call(&d, "GET", &format!("/api/vault/audit?token={BINARY}"), None, Some(ADMIN)).await.json();
    assert_eq!(mine.as_array().map(Vec::len), Some(1), "{mine}");
    assert_eq!(mine[0]["reason"], "INC-7");
    let r = call(&d, "GET", &format!("/api/vault/audit?token={BINARY}&run=01x"), None, Some(ADMIN)).await;
    assert_eq!(error_code(&r, 400), "bad_request");
    let r = call(&d, "GET", "/api/vault/audit?subject=x", None, Some(ADMIN)).await;
    assert_eq!(error_code(&r, 400), "bad_request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_without_tokens_audits_its_reveals_as_api_in_role_admin() {
    let (store, _home) = sqlite();
    store_originals(&*store, &vault_key(1), None, &[(EMAIL, "ada@example.com")]).unwrap();
    let nowhere = "http://127.0.0.1:9".to_owned();
    let d = daemon_over(store.clone(), nowhere.clone(), nowhere, |c| c.vault_key = Some(vault_key(1))).await;
    let r =
        call(&d, "POST", "/api/vault/reveal", Some(json!({"token": EMAIL, "reason": "local"})), None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let entry = &store.audit_list(None).unwrap()[0].entry;
    assert_eq!((entry.who.as_str(), entry.role.as_str(), entry.reason.as_str()), ("api", "admin", "local"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_over_http_is_retrace_gc_and_retain_over_http_changes_what_it_deletes() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, admin_config).await;
    let expired = recorded(&d, "an expired routine run").await;
    let incident = recorded(&d, "the run that explains an incident").await;
    let r = call(
        &d,
        "POST",
        &format!("/api/runs/{}/retain", &incident[..10]),
        Some(json!({"tier": "incident"})),
        Some(ADMIN),
    )
    .await;
    assert_eq!(r.json(), json!({"run": incident, "retention": "incident", "previous": "routine"}));
    let gc = |dry_run: bool| json!({"dry_run": dry_run, "older_than_days": 0});

    // A dry run reports and deletes nothing.
    let planned = call(&d, "POST", "/api/gc", Some(gc(true)), Some(ADMIN)).await.json();
    assert_eq!(planned["dry_run"], true);
    assert_eq!(planned["runs_deleted"], json!([expired]), "{planned}");
    assert_eq!(planned["routine_days"], 0);
    assert!(planned["bytes_freed"].as_u64().unwrap() > 0, "{planned}");
    for run in [&expired, &incident] {
        assert!(d.store.run(run).is_ok());
        assert!(blobs_of(&*d.store, run).iter().all(|b| d.store.get_blob(b).is_ok()));
    }

    // The real one deletes what the dry run said, frees its bytes, and keeps the incident.
    let doomed = blobs_of(&*d.store, &expired);
    let done = call(&d, "POST", "/api/gc", Some(gc(false)), Some(ADMIN)).await.json();
    assert_eq!(done["dry_run"], false);
    for field in ["runs_deleted", "events_deleted", "blobs_deleted", "bytes_freed"] {
        assert_eq!(done[field], planned[field], "{field}: {done} vs {planned}");
    }
    assert!(done["blobs_deleted"].as_u64().unwrap() > 0, "{done}");
    let gone = call(&d, "GET", &format!("/api/runs/{expired}"), None, Some(VIEWER)).await;
    assert_eq!(error_code(&gone, 404), "unknown_run");
    assert!(doomed.iter().all(|b| d.store.get_blob(b).is_err()), "the expired run's blobs are swept");
    let kept = call(&d, "GET", &format!("/api/runs/{incident}/events"), None, Some(VIEWER)).await;
    let stored = d.store.events(&incident, 1, 100).unwrap().len() as u64;
    assert_eq!((kept.json()["count"].as_u64(), stored > 0), (Some(stored), true), "{}", kept.text());
    assert!(blobs_of(&*d.store, &incident).iter().all(|b| d.store.get_blob(b).is_ok()));
    let again = call(&d, "POST", "/api/gc", Some(gc(false)), Some(ADMIN)).await.json();
    assert_eq!(
        (again["runs_deleted"].clone(), again["bytes_freed"].clone()),
        (json!([]), json!(0)),
        "{again}"
    );

    // Back to routine over HTTP, and the next gc takes it; the daemon's own expiry (30 days
    // by default) would not have.
    let r = call(
        &d,
        "POST",
        &format!("/api/runs/{incident}/retain"),
        Some(json!({"tier": "routine"})),
        Some(ADMIN),
    )
    .await;
    assert_eq!(r.json()["previous"], "incident");
    let by_default = call(&d, "POST", "/api/gc", Some(json!({"dry_run": true})), Some(ADMIN)).await.json();
    assert_eq!(
        (by_default["runs_deleted"].clone(), by_default["routine_days"].clone()),
        (json!([]), json!(30))
    );
    let last = call(&d, "POST", "/api/gc", Some(gc(false)), Some(ADMIN)).await.json();
    assert_eq!(last["runs_deleted"], json!([incident]), "{last}");
    assert_eq!(d.store.runs().unwrap(), vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retain_and_gc_refuse_bad_input_with_400_and_unknown_runs_with_404() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, admin_config).await;
    let run = recorded(&d, "q").await;
    let replay = call(&d, "POST", &format!("/api/runs/{run}/replay"), Some(json!({})), Some(DEBUGGER)).await;
    let replay = replay.json()["run_id"].as_str().unwrap().to_owned();
    let retain = |run: &str| format!("/api/runs/{run}/retain");
    let pinned = json!({"tier": "pinned"}).to_string();
    let cases: Vec<(String, Option<String>, u16, &str)> = vec![
        (retain(&run), Some(json!({"tier": "forever"}).to_string()), 400, "bad_request"),
        (retain(&run), Some(json!({"tier": "Incident"}).to_string()), 400, "bad_request"),
        (retain(&run), Some("{}".into()), 400, "bad_request"),
        (retain(&run), None, 400, "bad_request"),
        (retain(&run), Some("{\"tier\": ".into()), 400, "bad_request"),
        (retain(&run), Some(json!({"tier": "pinned", "until": "2030"}).to_string()), 400, "bad_request"),
        (retain(&replay), Some(pinned.clone()), 400, "replay_has_no_tier"),
        (retain("01nosuchrun000000000000000"), Some(pinned.clone()), 404, "unknown_run"),
        ("/api/gc".into(), Some("{}".into()), 400, "bad_request"),
        ("/api/gc".into(), None, 400, "bad_request"),
        ("/api/gc".into(), Some("{\"dry_run\": tru".into()), 400, "bad_request"),
        ("/api/gc".into(), Some(json!({"dry_run": "yes"}).to_string()), 400, "bad_request"),
        (
            "/api/gc".into(),
            Some(json!({"dry_run": true, "older_than_days": -1}).to_string()),
            400,
            "bad_request",
        ),
        ("/api/gc".into(), Some(json!({"dry_run": true, "keep": 1}).to_string()), 400, "bad_request"),
    ];
    for (path, body, status, code) in cases {
        let context = format!("{path} {body:?}");
        let r = raw(&d, "POST", &path, body, Some(ADMIN)).await;
        assert_eq!(r.status, status, "{context}: {}", r.text());
        assert_eq!(error_code(&r, status), code, "{context}");
    }
    let r = call(&d, "POST", &retain(&replay), Some(json!({"tier": "pinned"})), Some(ADMIN)).await;
    assert!(r.text().contains(&run), "names the source to retain instead: {}", r.text());
    // None of it changed a tier or deleted a run.
    assert!(d.store.runs().unwrap().iter().all(|r| r.retention.as_str() == "routine"));
    assert_eq!(d.store.runs().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_over_http_is_retrace_delete_and_refuses_a_run_in_use() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, admin_config).await;
    let doomed = recorded(&d, "a run recorded with a secret pasted in").await;
    let kept = recorded(&d, "another run").await;
    let pinned = json!({"tier": "pinned"});
    call(&d, "POST", &format!("/api/runs/{doomed}/retain"), Some(pinned), Some(ADMIN)).await;
    let replay =
        call(&d, "POST", &format!("/api/runs/{doomed}/replay"), Some(json!({})), Some(DEBUGGER)).await;
    let replay = replay.json()["run_id"].as_str().unwrap().to_owned();
    let delete = |run: &str| format!("/api/runs/{run}/delete");

    // While its replay runs, the run is in use; bad bodies and unknown runs are refused too.
    let busy = call(&d, "POST", &delete(&doomed), Some(json!({"dry_run": false})), Some(ADMIN)).await;
    assert_eq!(error_code(&busy, 409), "run_in_use");
    assert!(busy.text().contains(&replay), "names the replay: {}", busy.text());
    let bad = raw(&d, "POST", &delete(&doomed), Some("{}".into()), Some(ADMIN)).await;
    assert_eq!(error_code(&bad, 400), "bad_request");
    let nobody = delete("01nosuchrun000000000000000");
    let unknown = call(&d, "POST", &nobody, Some(json!({"dry_run": true})), Some(ADMIN)).await;
    assert_eq!(error_code(&unknown, 404), "unknown_run");
    let viewer = call(&d, "POST", &delete(&doomed), Some(json!({"dry_run": false})), Some(VIEWER)).await;
    assert_eq!(viewer.status, 403);
    assert_eq!(d.store.runs().unwrap().len(), 3, "nothing went");

    let finished =
        call(&d, "POST", &format!("/api/runs/{replay}/finish"), Some(json!({})), Some(DEBUGGER)).await;
    assert!(finished.status < 300, "{}", finished.text());
    let planned = call(&d, "POST", &delete(&doomed[..10]), Some(json!({"dry_run": true})), Some(ADMIN)).await;
    let planned = planned.json();
    assert_eq!(planned["runs_deleted"], json!([doomed, replay]), "a pinned run goes when named: {planned}");
    let blobs = blobs_of(&*d.store, &doomed);
    let done = call(&d, "POST", &delete(&doomed), Some(json!({"dry_run": false})), Some(ADMIN)).await.json();
    for field in ["runs_deleted", "events_deleted", "blobs_deleted", "bytes_freed"] {
        assert_eq!(done[field], planned[field], "{field}: {done} vs {planned}");
    }
    assert!(done["blobs_deleted"].as_u64().unwrap() > 0, "{done}");
    assert!(blobs.iter().all(|b| d.store.get_blob(b).is_err()), "the run's own blobs are swept");
    let ids: Vec<String> = d.store.runs().unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(ids, std::slice::from_ref(&kept));
    assert!(blobs_of(&*d.store, &kept).iter().all(|b| d.store.get_blob(b).is_ok()));
}

/// `compact` in `POST /api/gc` is `retrace gc --compact`: refused with 409 `run_in_use` while a
/// run is running, before anything is deleted; once none is, it collects, then reports the
/// database's size before and after (null in a dry run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_over_http_compacts_only_when_no_run_is_running() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, admin_config).await;
    let expired = recorded(&d, "an expired routine run").await;
    let open = call(&d, "POST", "/api/runs", Some(json!({})), Some(DEBUGGER)).await.json()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let gc = |dry_run: bool| json!({"dry_run": dry_run, "older_than_days": 0, "compact": true});

    let refused = call(&d, "POST", "/api/gc", Some(gc(false)), Some(ADMIN)).await;
    assert_eq!(error_code(&refused, 409), "run_in_use");
    assert!(refused.text().contains(&open), "{}", refused.text());
    assert!(d.store.run(&expired).is_ok(), "a refused compaction deletes nothing");

    let finished = call(
        &d,
        "POST",
        &format!("/api/runs/{open}/finish"),
        Some(json!({"exit_status": 0})),
        Some(DEBUGGER),
    )
    .await;
    assert_eq!(finished.json()["status"], "ok", "{}", finished.text());
    let planned = call(&d, "POST", "/api/gc", Some(gc(true)), Some(ADMIN)).await.json();
    assert_eq!(planned["compacted"], serde_json::Value::Null, "{planned}");
    let done = call(&d, "POST", "/api/gc", Some(gc(false)), Some(ADMIN)).await.json();
    assert!(done["runs_deleted"].as_array().unwrap().contains(&json!(expired)), "{done}");
    let (before, after) = (
        done["compacted"]["bytes_before"].as_u64().unwrap(),
        done["compacted"]["bytes_after"].as_u64().unwrap(),
    );
    assert!(after > 0 && after <= before, "{done}");
    assert_eq!(d.store.runs().unwrap().iter().filter(|r| r.id == expired).count(), 0);
}

/// A reveal with no token, or one no role holds, is 401 and in the audit log too (QA38 S1: a
/// probe with a guessed or revoked token left no trace); the reason it gave is not kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reveal_without_a_valid_token_is_audited_too() {
    let (store, _home) = sqlite();
    let nowhere = || "http://127.0.0.1:9".to_owned();
    let d = daemon_over(store.clone(), nowhere(), nowhere(), admin_config).await;
    let attempts =
        [(None, "(no api token)"), (Some("not-a-token-anyone-holds-0000"), "(an unknown api token)")];
    for (token, who) in attempts {
        let body = json!({"token": EMAIL, "reason": "probe ada@example.com"});
        let r = call(&d, "POST", "/api/vault/reveal", Some(body), token).await;
        assert_eq!(r.status, 401, "{}", r.text());
        let last = store.audit_list(None).unwrap().pop().expect("audited");
        let e = &last.entry;
        assert_eq!((e.who.as_str(), e.action, e.subject.as_str()), (who, AuditAction::RevealRefused, EMAIL));
        assert_eq!(e.reason, "", "a reason nobody vouched for is not kept");
    }
    assert_eq!(store.audit_list(None).unwrap().len(), 2);
}
