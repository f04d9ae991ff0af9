//! Masked values in record and replay (SPEC §6, §7; issue 7): in record the program gets its
//! own values back and only the stored bytes hold tokens; the originals go into the vault; a
//! replayed output holding a token feeds the next request and the keys still match, under
//! `replay = "token"` (the program gets the token) and under `replay = "original"` (the program
//! gets the original back byte for byte, once the run is audited). On SQLite files.
use std::sync::Arc;

use retrace_core::mask::{MaskKey, MaskRule, MaskRules, ReplayAs, RuleMatch};
use retrace_core::run::RunStatus;
use retrace_core::vault::VaultKey;
use retrace_runtime::{Outcome, RuntimeError, Session, SessionOptions, ToolSpec};
use retrace_store::open::StoreConfig;
use retrace_store::vault::AuditAction;
use retrace_store::Store;
use serde_json::{json, Value};

const EMAIL: &str = "dana.original@example.com";

fn rules(replay: ReplayAs) -> MaskRules {
    MaskRules {
        rules: vec![MaskRule {
            name: "dana".into(),
            kind: "email".into(),
            matcher: RuleMatch::Literal { value: EMAIL.into() },
            replay,
        }],
    }
}

fn options(replay: ReplayAs, vault: bool) -> SessionOptions {
    SessionOptions {
        mask_rules: rules(replay),
        mask_key: Some(MaskKey::from_bytes([3; 32])),
        vault_key: vault.then(|| VaultKey::from_bytes([9; 32])),
        ..SessionOptions::default()
    }
}

/// Looks a customer up, then drafts a mail to the address it got: the second request holds the
/// first step's output. Returns (what the lookup gave, what the draft tool was asked).
fn program(session: &Session) -> Result<(Value, Value), RuntimeError> {
    let agent = session.agent("clerk");
    let customer: Value =
        agent.tool("crm.lookup", &json!({"id": 7}), ToolSpec::deterministic("1"), || {
            Ok::<_, String>(json!({"email": EMAIL, "tier": "gold"}))
        })?;
    let draft_args = json!({"to": customer["email"], "subject": "renewal"});
    let _: Value = agent.tool("mail.draft", &draft_args, ToolSpec::deterministic("1"), || {
        Ok::<_, String>(json!({"draft": "d-1"}))
    })?;
    Ok((customer, draft_args))
}

fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = retrace_store::open_store(&StoreConfig::in_home(dir.path())).unwrap();
    (dir, store)
}

fn record(store: &Arc<dyn Store>, replay: ReplayAs) -> String {
    let session = Session::record(store.clone(), options(replay, true)).unwrap();
    let (customer, args) = program(&session).unwrap();
    // Record hands the program its own values.
    assert_eq!(customer["email"], EMAIL);
    assert_eq!(args["to"], EMAIL);
    let report = session.finish(Outcome { exit_status: Some(0) }).unwrap();
    report.run_id
}

fn stored_bytes(store: &Arc<dyn Store>, run: &str) -> Vec<u8> {
    let events = store.events(run, 1, 100).unwrap();
    let mut all = Vec::new();
    for e in events {
        for blob in [e.request_ref, e.output_ref].into_iter().flatten() {
            all.extend(store.get_blob(&blob).unwrap());
        }
    }
    all
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn under_token_the_replayed_token_feeds_the_next_request_and_keys_match() {
    let (_dir, store) = store();
    let run = record(&store, ReplayAs::Token);
    let stored = stored_bytes(&store, &run);
    assert!(!contains(&stored, EMAIL), "the original reached the store");
    assert!(contains(&stored, "rtk_email_"));
    assert!(store.run(&run).unwrap().holds_tokens);
    // The original went into the vault, sealed.
    let token = MaskKey::from_bytes([3; 32]).token("email", EMAIL);
    assert!(store.vault_get(&token).unwrap().is_some(), "no vault entry for {token}");

    let replay = Session::replay(store.clone(), &run, options(ReplayAs::Token, false)).unwrap();
    let (customer, args) = program(&replay).unwrap();
    assert_eq!(customer["email"], token.as_str());
    assert_eq!(args["to"], token.as_str());
    let report = replay.finish(Outcome { exit_status: Some(0) }).unwrap();
    assert_eq!(report.status, RunStatus::Ok);
}

#[test]
fn under_original_the_program_gets_the_original_and_the_run_is_audited() {
    let (_dir, store) = store();
    let run = record(&store, ReplayAs::Original);
    assert!(!contains(&stored_bytes(&store, &run), EMAIL));

    let replay = Session::replay(store.clone(), &run, options(ReplayAs::Original, true)).unwrap();
    let replay_id = replay.run_id();
    let (customer, args) = program(&replay).unwrap();
    assert_eq!(customer, json!({"email": EMAIL, "tier": "gold"}), "not the original, byte for byte");
    assert_eq!(args["to"], EMAIL);
    let report = replay.finish(Outcome { exit_status: Some(0) }).unwrap();
    assert_eq!(report.status, RunStatus::Ok);

    let audit = store.audit_list(Some(&replay_id)).unwrap();
    let entries: Vec<_> = audit.iter().filter(|a| a.entry.action == AuditAction::ReplayOriginal).collect();
    assert_eq!(entries.len(), 1, "one audit entry per replay run: {audit:?}");
}

#[test]
fn under_original_without_the_vault_key_replay_is_refused_and_the_refusal_audited() {
    let (_dir, store) = store();
    let run = record(&store, ReplayAs::Original);
    let err = Session::replay(store.clone(), &run, options(ReplayAs::Original, false)).unwrap_err();
    assert!(err.to_string().contains("vault"), "{err}");
    let refused = store.audit_list(None).unwrap();
    assert!(refused.iter().any(|a| a.entry.action == AuditAction::ReplayOriginalRefused), "{refused:?}");
}

#[test]
fn a_run_holding_tokens_is_refused_under_another_mask_key() {
    let (_dir, store) = store();
    let run = record(&store, ReplayAs::Token);
    let mut other = options(ReplayAs::Token, false);
    other.mask_key = Some(MaskKey::from_bytes([4; 32]));
    let err = Session::replay(store.clone(), &run, other).unwrap_err().to_string();
    assert!(err.contains(&MaskKey::from_bytes([3; 32]).fingerprint()), "{err}");
    assert!(err.contains(&MaskKey::from_bytes([4; 32]).fingerprint()), "{err}");
}

const PEM: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----";

/// The email rule replays the token, the private-key detector the original.
fn mixed_options(vault: bool) -> SessionOptions {
    let mut options = options(ReplayAs::Token, vault);
    options.mask_rules.rules.push(MaskRule {
        name: "private-key".into(),
        kind: "privkey".into(),
        matcher: RuleMatch::Pattern { pattern: retrace_core::mask::Detector::PrivateKey },
        replay: ReplayAs::Original,
    });
    options
}

/// A tool output holding both secrets, the key also inside a string that holds JSON.
fn deploy(session: &Session) -> Result<Value, RuntimeError> {
    let agent = session.agent("deployer");
    agent.tool("vault.fetch", &json!({"env": "prod"}), ToolSpec::deterministic("1"), || {
        let config = json!({"owner": EMAIL, "key": PEM}).to_string();
        Ok::<_, String>(json!({"owner": EMAIL, "key": PEM, "config": config, "note": "a \"quoted\" \\ path"}))
    })
}

#[test]
fn under_mixed_rules_the_program_gets_each_original_or_token_as_its_rule_says() {
    let (_dir, store) = store();
    let session = Session::record(store.clone(), mixed_options(true)).unwrap();
    let live = deploy(&session).unwrap();
    let run = session.finish(Outcome { exit_status: Some(0) }).unwrap().run_id;
    let stored = stored_bytes(&store, &run);
    assert!(!contains(&stored, "MIIEvQ") && !contains(&stored, EMAIL));

    let replay = Session::replay(store.clone(), &run, mixed_options(true)).unwrap();
    let replay_id = replay.run_id();
    let got = deploy(&replay).unwrap();
    assert_eq!(replay.finish(Outcome { exit_status: Some(0) }).unwrap().status, RunStatus::Ok);
    // The key comes back, escaped right at each level; the email stays a token.
    let token = MaskKey::from_bytes([3; 32]).token("email", EMAIL);
    let want: Value =
        serde_json::from_str(&serde_json::to_string(&live).unwrap().replace(EMAIL, &token)).unwrap();
    assert_eq!(got, want);
    assert_eq!(got["key"], PEM);
    let audit = store.audit_list(Some(&replay_id)).unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
}
