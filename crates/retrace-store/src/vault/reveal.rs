//! Seeing originals: [`reveal`] (a person, one token) and [`audit_replay_original`] (a replay
//! run), each audited before it answers, refusals included. The audit entry is written first:
//! when it can't be, nothing is revealed (fail closed).
use retrace_core::vault::{open, VaultError, VaultKey};

use super::{AuditAction, AuditEntry, VaultStore, ROLE_ADMIN, ROLE_DEBUGGER};
use crate::StoreError;

/// Who asks, and in which role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revealer {
    /// The OS user on the command line; the API token's owner on the daemon.
    pub who: String,
    /// `admin` or `debugger` may see originals; any other role is refused.
    pub role: String,
}

/// One request to reveal the original of a token.
#[derive(Clone, Copy, Debug)]
pub struct Reveal<'a> {
    /// The token, as it appears in the log.
    pub token: &'a str,
    /// Why (required, written to the audit log).
    pub reason: &'a str,
    /// The text of `RETRACE_VAULT_KEY` as found (`None` when unset); parsed here, so that a bad
    /// key is audited like a missing one.
    pub key: Option<&'a str>,
    /// Unix milliseconds now.
    pub at_ms: u64,
}

/// Why an original was not revealed. Every variant but [`RevealError::Store`] was audited as a
/// refusal.
#[derive(Debug, thiserror::Error)]
pub enum RevealError {
    /// No vault key was given.
    #[error("no vault key: set RETRACE_VAULT_KEY to the key the originals were sealed with")]
    NoKey,
    /// The vault key is not 32 bytes of base64.
    #[error("RETRACE_VAULT_KEY is unusable: {0}")]
    BadKey(#[source] VaultError),
    /// No reason was given.
    #[error("a reason is required: it is written to the audit log")]
    NoReason,
    /// The role may not see originals.
    #[error("role {role:?} may not see originals (allowed: admin, debugger)")]
    Role {
        /// The role refused.
        role: String,
    },
    /// What was asked for is not shaped like a token at all.
    /// What was given is not echoed: it is often the original pasted instead of its token.
    #[error("what was given ({chars} characters) is not a token: a token is rtk_<kind>_<26 characters of a-z and 2-7>, such as rtk_email_k3v7q2mzp4xw6ya5tb2nrc7hdq")]
    NotAToken {
        /// How long what was given is.
        chars: usize,
    },
    /// The vault holds no original for the token.
    #[error("the vault holds no original for {token}")]
    UnknownToken {
        /// The token asked for.
        token: String,
    },
    /// The original doesn't open under the key given.
    #[error(transparent)]
    CannotOpen(VaultError),
    /// The store failed (the audit entry included): nothing was revealed.
    #[error("the vault or its audit log could not be used")]
    Store(#[from] StoreError),
}

impl RevealError {
    /// The CLI's exit code: 2 for what the caller must fix in the command or environment (no
    /// key, a bad key, no reason), 1 for a refusal on the merits (role, unknown token, wrong key)
    /// and for a store failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            RevealError::NoKey
            | RevealError::BadKey(_)
            | RevealError::NoReason
            | RevealError::NotAToken { .. } => 2,
            _ => 1,
        }
    }
}

fn allowed(role: &str) -> bool {
    role == ROLE_ADMIN || role == ROLE_DEBUGGER
}

/// Reveals the original of `request.token` to `by`, auditing the attempt whatever comes of it:
/// `reveal` with outcome `ok`, or `reveal_refused` with the reason for the refusal.
pub fn reveal<S: VaultStore + ?Sized>(
    store: &S,
    by: &Revealer,
    request: &Reveal<'_>,
) -> Result<Vec<u8>, RevealError> {
    let attempt = (|| {
        if request.reason.trim().is_empty() {
            return Err(RevealError::NoReason);
        }
        if !allowed(&by.role) {
            return Err(RevealError::Role { role: by.role.clone() });
        }
        if retrace_core::mask::token_len_at(request.token) != Some(request.token.len()) {
            return Err(RevealError::NotAToken { chars: request.token.chars().count() });
        }
        let key =
            VaultKey::from_base64(request.key.ok_or(RevealError::NoKey)?).map_err(RevealError::BadKey)?;
        open_original(store, &key, request.token)
    })();
    let (action, outcome) = match &attempt {
        Ok(_) => (AuditAction::Reveal, "ok".to_owned()),
        Err(RevealError::Store(_)) => return attempt,
        Err(refused) => (AuditAction::RevealRefused, refused.to_string()),
    };
    store.audit_append(&AuditEntry {
        at_ms: request.at_ms,
        who: by.who.clone(),
        role: by.role.clone(),
        action,
        subject: audit_subject(request.token),
        reason: request.reason.to_owned(),
        outcome,
    })?;
    attempt
}

/// What the audit log names as a reveal's subject: the token, or, for something not shaped like
/// one (often the original, pasted instead of its token), only its length.
pub fn audit_subject(token: &str) -> String {
    match retrace_core::mask::token_len_at(token) == Some(token.len()) {
        true => token.to_owned(),
        false => format!("(not a token: {} characters)", token.chars().count()),
    }
}

/// The original of `token` under `key`, without auditing: for a replay run whose one
/// [`audit_replay_original`] entry covers every token it is handed.
pub fn open_original<S: VaultStore + ?Sized>(
    store: &S,
    key: &VaultKey,
    token: &str,
) -> Result<Vec<u8>, RevealError> {
    let entry =
        store.vault_get(token)?.ok_or_else(|| RevealError::UnknownToken { token: token.to_owned() })?;
    open(key, token, &entry.sealed).map_err(RevealError::CannotOpen)
}

/// Audits that replay run `run` will be handed originals (SPEC §7: one entry per replay run):
/// `replay_original` when `by` may see them and a key is set, else `replay_original_refused`
/// and the refusal. Call it once before the run starts, then [`open_original`] per token.
pub fn audit_replay_original<S: VaultStore + ?Sized>(
    store: &S,
    by: &Revealer,
    run: &str,
    reason: &str,
    key: Option<&VaultKey>,
    at_ms: u64,
) -> Result<(), RevealError> {
    let verdict = if !allowed(&by.role) {
        Err(RevealError::Role { role: by.role.clone() })
    } else if key.is_none() {
        Err(RevealError::NoKey)
    } else {
        Ok(())
    };
    let (action, outcome) = match &verdict {
        Ok(()) => (AuditAction::ReplayOriginal, "ok".to_owned()),
        Err(refused) => (AuditAction::ReplayOriginalRefused, refused.to_string()),
    };
    store.audit_append(&AuditEntry {
        at_ms,
        who: by.who.clone(),
        role: by.role.clone(),
        action,
        subject: run.to_owned(),
        reason: reason.to_owned(),
        outcome,
    })?;
    verdict
}
