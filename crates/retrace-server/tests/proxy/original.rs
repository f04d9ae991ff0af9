//! `replay = "original"` through the proxy (SPEC §7, issue 7): a model streams a secret back
//! in many small deltas (a PEM private key with its newlines; a secret with quotes and
//! backslashes), the log holds only tokens, and replay hands the client the very bytes it got
//! in record, in every stream shape and in a whole body, after one audit entry for the run.
use retrace_core::mask::{Detector, MaskKey, MaskRule, MaskRules, ReplayAs, RuleMatch};
use retrace_core::vault::VaultKey;
use retrace_demo::providers::Providers;
use retrace_store::vault::AuditAction;
use serde_json::{json, Value};

use crate::support::daemon;

const PEM: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcw\nggSjAgEAAoIBAQC7VJTUt9Us8cKjMzEfYyji\n-----END PRIVATE KEY-----";
/// Quotes and backslashes, escaped once in an event's JSON and again in the stored document.
const QUOTED: &str = r#"pw="Zq7\"Wx\\Vq9" \path\to"#;

/// The default rules, the private-key detector replaying the original, and a literal rule for
/// [`QUOTED`] that does too.
fn rules() -> MaskRules {
    let mut rules = MaskRules::defaults();
    for rule in &mut rules.rules {
        if rule.matcher == (RuleMatch::Pattern { pattern: Detector::PrivateKey }) {
            rule.replay = ReplayAs::Original;
        }
    }
    rules.rules.push(MaskRule {
        name: "db-password".into(),
        kind: "dbpass".into(),
        matcher: RuleMatch::Literal { value: QUOTED.into() },
        replay: ReplayAs::Original,
    });
    rules
}

/// The calls: each echoes its prompt back in three-character pieces (the simulator's `-echo`
/// models), so each secret spans many deltas and chunks.
fn calls() -> Vec<(&'static str, Value)> {
    let prompt = format!("the deploy key:\n{PEM}\nand the password: {QUOTED}.");
    vec![
        (
            "/proxy/openai/v1/chat/completions",
            json!({"model": "gpt-sim-echo", "stream": true, "messages": [{"role": "user", "content": prompt}]}),
        ),
        (
            "/proxy/anthropic/v1/messages",
            json!({"model": "claude-sim-echo", "max_tokens": 500, "stream": true,
                   "messages": [{"role": "user", "content": prompt}]}),
        ),
        ("/proxy/openai/v1/responses", json!({"model": "gpt-sim-echo", "input": prompt, "stream": true})),
        (
            "/proxy/openai/v1/chat/completions",
            json!({"model": "gpt-sim-echo", "messages": [{"role": "user", "content": prompt}]}),
        ),
    ]
}

const EMAIL: &str = "ada@example.com";

fn mixed_prompt() -> String {
    format!("mail {EMAIL} the key:\n{PEM}")
}

/// A Chat Completions stream's content, deltas joined.
fn content(stream: &str) -> String {
    stream
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_hands_the_client_the_recorded_stream_bytes_where_a_rule_says_original() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |c| {
        c.mask_key = Some(MaskKey::from_bytes([5; 32]));
        c.mask_rules = rules();
        c.vault_key = Some(VaultKey::from_bytes([9; 32]));
    })
    .await;
    let run = d.new_run().await;
    let mut live = Vec::new();
    for (path, body) in calls() {
        let reply = d.call(&run, path, &body).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.text());
        live.push(reply);
    }
    let mixed = json!({"model": "gpt-sim-echo", "stream": true,
                       "messages": [{"role": "user", "content": mixed_prompt()}]});
    let mixed_live = d.call(&run, "/proxy/openai/v1/chat/completions", &mixed).await;
    assert_eq!(content(&mixed_live.text()), mixed_prompt());
    assert_eq!(d.finish(&run).await["status"], "ok");
    providers.stop().await;

    // The secrets came back in record, split across many deltas; the log holds only tokens.
    let escaped = serde_json::to_string(PEM).unwrap();
    for (i, reply) in live[..3].iter().enumerate() {
        assert!(reply.text().matches("data: ").count() > 20, "{}", reply.text());
        // (A Responses stream repeats the whole text in its last event.)
        let whole = reply.text().contains(&escaped[1..escaped.len() - 1]);
        assert!(i == 2 || !whole, "not split: {}", reply.text());
    }
    assert!(live[3].text().contains(&escaped[1..escaped.len() - 1]), "{}", live[3].text());
    let events = d.store.events(&run, 1, 100).unwrap();
    assert_eq!(events.len(), calls().len() + 1);
    for e in &events {
        for blob in [e.request_ref, e.output_ref].into_iter().flatten() {
            let bytes = String::from_utf8_lossy(&d.store.get_blob(&blob).unwrap()).into_owned();
            for secret in ["MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcw", "Zq7", "Vq9", EMAIL] {
                assert!(!bytes.contains(secret), "{secret} stored in {blob}: {bytes}");
            }
            if e.output_ref == Some(blob) {
                let password = e.seq as usize > calls().len() || bytes.contains("rtk_dbpass_");
                assert!(bytes.contains("rtk_privkey_") && password, "{bytes}");
            }
        }
    }

    let replay = d.replay_of(&run).await;
    for ((path, body), recorded) in calls().into_iter().zip(&live) {
        let reply = d.call(&replay, path, &body).await;
        assert_eq!(reply.status, recorded.status, "{path}: {}", reply.text());
        assert_eq!(reply.text(), recorded.text(), "{path}: not the bytes the client got in record");
        assert_eq!(reply.header("x-echo"), recorded.header("x-echo"), "{path}");
    }
    // An email's rule replays the token: the client gets the recorded stream with the email
    // masked and the key whole.
    let reply = d.call(&replay, "/proxy/openai/v1/chat/completions", &mixed).await;
    let email = MaskKey::from_bytes([5; 32]).token("email", EMAIL);
    assert!(!reply.text().contains(EMAIL) && reply.text().contains(&email), "{}", reply.text());
    assert_eq!(content(&reply.text()), mixed_prompt().replace(EMAIL, &email));
    let outcome = d.finish(&replay).await;
    assert_eq!(outcome["status"], "ok", "{outcome}");

    let audit = d.store.audit_list(Some(&replay)).unwrap();
    let handed: Vec<_> = audit.iter().filter(|a| a.entry.action == AuditAction::ReplayOriginal).collect();
    assert_eq!(handed.len(), 1, "one audit entry for the replay run: {audit:?}");
    assert_eq!(audit.len(), 1, "{audit:?}");
    // It names the API's caller (a daemon without tokens: `api`, acting as admin), not the
    // daemon's OS user.
    assert_eq!((handed[0].entry.who.as_str(), handed[0].entry.role.as_str()), ("api", "admin"));
}
