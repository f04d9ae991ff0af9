//! The vault and the audit log: idempotent batch puts, append-only ordered audit, and reveal
//! auditing every attempt.
use retrace_core::vault::{seal_with_nonce, VaultKey};

use super::MakeStore;
use crate::vault::{
    audit_replay_original, reveal, store_originals, AuditAction, AuditEntry, Reveal, RevealError, Revealer,
};

const TOKEN: &str = "rtk_email_abcdefghijklmnopqrstuv2345";

fn entry(subject: &str, action: AuditAction) -> AuditEntry {
    AuditEntry {
        at_ms: 1_700_000_000_000,
        who: "ada".into(),
        role: "admin".into(),
        action,
        subject: subject.into(),
        reason: "incident 42".into(),
        outcome: "ok".into(),
    }
}

/// `vault_put` stores a batch; a token put again keeps its first entry; unknown tokens are `None`.
pub fn vault_put_is_idempotent(make: MakeStore<'_>) {
    let store = make();
    let key = VaultKey::from_bytes([4; 32]);
    let first = seal_with_nonce(&key, TOKEN, [1; 24], b"ada@example.com");
    let other = seal_with_nonce(&key, "rtk_x", [2; 24], b"x");
    assert_eq!(store.vault_put(None, &[(TOKEN.into(), first.clone()), ("rtk_x".into(), other)]).unwrap(), 2);
    let again = seal_with_nonce(&key, TOKEN, [3; 24], b"something else");
    assert_eq!(store.vault_put(None, &[(TOKEN.into(), again)]).unwrap(), 0, "a second put is a no-op");
    let stored = store.vault_get(TOKEN).unwrap().expect("stored");
    assert_eq!(stored.sealed, first);
    assert!(stored.created_at_ms > 0);
    assert_eq!(store.vault_get("rtk_unknown").unwrap(), None);
    assert_eq!(store.vault_put(None, &[]).unwrap(), 0);
    assert_eq!(store_originals(&*store, &key, None, &[("rtk_new", b"v".to_vec())]).unwrap(), 1);
    assert!(store.vault_get("rtk_new").unwrap().is_some());
}

/// The audit log lists entries in append order with increasing ids, filtered by subject.
pub fn audit_appends_in_order(make: MakeStore<'_>) {
    let store = make();
    assert!(store.audit_list(None).unwrap().is_empty());
    let a = store.audit_append(&entry(TOKEN, AuditAction::Reveal)).unwrap();
    let b = store.audit_append(&entry("01hrun", AuditAction::ReplayOriginal)).unwrap();
    let c = store.audit_append(&entry(TOKEN, AuditAction::RevealRefused)).unwrap();
    assert!(a < b && b < c, "{a} {b} {c}");
    let all = store.audit_list(None).unwrap();
    assert_eq!(all.iter().map(|r| r.id).collect::<Vec<_>>(), [a, b, c]);
    assert_eq!(all[1].entry, entry("01hrun", AuditAction::ReplayOriginal));
    let token: Vec<AuditAction> =
        store.audit_list(Some(TOKEN)).unwrap().iter().map(|r| r.entry.action).collect();
    assert_eq!(token, [AuditAction::Reveal, AuditAction::RevealRefused]);
    assert!(store.audit_list(Some("nobody")).unwrap().is_empty());
}

/// `reveal` answers only with a key, a reason, an allowed role and the right key, and audits
/// every attempt, refused ones included.
pub fn reveal_audits_every_attempt(make: MakeStore<'_>) {
    let store = make();
    let key = VaultKey::from_bytes([9; 32]);
    store_originals(&*store, &key, None, &[(TOKEN, b"ada@example.com".to_vec())]).unwrap();
    let admin = Revealer { who: "ada".into(), role: "admin".into() };
    let text = key.to_base64();
    let wrong = VaultKey::from_bytes([8; 32]).to_base64();
    let ask = |by: &Revealer, token: &str, reason: &str, key: Option<&str>| {
        reveal(&*store, by, &Reveal { token, reason, key, at_ms: 5 })
    };
    assert!(matches!(ask(&admin, TOKEN, "why", None), Err(RevealError::NoKey)));
    assert!(matches!(ask(&admin, TOKEN, "why", Some("bad")), Err(RevealError::BadKey(_))));
    assert!(matches!(ask(&admin, TOKEN, "  ", Some(&text)), Err(RevealError::NoReason)));
    let viewer = Revealer { who: "bob".into(), role: "viewer".into() };
    assert!(matches!(ask(&viewer, TOKEN, "why", Some(&text)), Err(RevealError::Role { .. })));
    let unknown = "rtk_email_zzzzzzzzzzzzzzzzzzzzzzzzzz";
    assert!(matches!(ask(&admin, unknown, "why", Some(&text)), Err(RevealError::UnknownToken { .. })));
    let refused = ask(&admin, TOKEN, "why", Some(&wrong)).unwrap_err();
    assert!(matches!(refused, RevealError::CannotOpen(_)), "{refused}");
    assert_eq!(refused.exit_code(), 1);
    assert_eq!(ask(&admin, TOKEN, "incident 42", Some(&text)).unwrap(), b"ada@example.com");
    // Not shaped like a token: refused as such (a usage error), and audited as such, by its
    // length only (it is often the original, pasted instead of its token).
    let malformed = ask(&admin, "sk-proj-PASTEDPASTEDPASTED", "why", Some(&text)).unwrap_err();
    assert!(matches!(malformed, RevealError::NotAToken { .. }), "{malformed}");
    assert_eq!(malformed.exit_code(), 2);

    let log = store.audit_list(None).unwrap();
    let actions: Vec<AuditAction> = log.iter().map(|r| r.entry.action).collect();
    assert_eq!(actions[..6], [AuditAction::RevealRefused; 6]);
    assert_eq!(actions[6..], [AuditAction::Reveal, AuditAction::RevealRefused]);
    assert!(log[7].entry.outcome.contains("(26 characters) is not a token"), "{:?}", log[7]);
    assert_eq!(log[7].entry.subject, "(not a token: 26 characters)");
    assert!(!format!("{:?}", log[7]).contains("PASTED"), "{:?}", log[7]);
    assert!(log[0].entry.outcome.contains("no vault key"), "{:?}", log[0]);
    assert!(log[3].entry.outcome.contains("viewer") && log[3].entry.who == "bob", "{:?}", log[3]);
    assert!(log[5].entry.outcome.contains("does not open"), "{:?}", log[5]);
    assert_eq!((log[6].entry.outcome.as_str(), log[6].entry.reason.as_str()), ("ok", "incident 42"));
    assert!(log.iter().all(|r| !r.entry.outcome.contains("ada@example.com")), "never the original");

    let debugger = Revealer { who: "ci".into(), role: "debugger".into() };
    audit_replay_original(&*store, &debugger, "01hreplay", "gate", Some(&key), 6).unwrap();
    assert!(audit_replay_original(&*store, &debugger, "01hreplay2", "gate", None, 7).is_err());
    let runs: Vec<AuditAction> =
        store.audit_list(Some("01hreplay")).unwrap().iter().map(|r| r.entry.action).collect();
    assert_eq!(runs, [AuditAction::ReplayOriginal]);
    let refused = store.audit_list(Some("01hreplay2")).unwrap();
    assert_eq!(refused[0].entry.action, AuditAction::ReplayOriginalRefused);
}
