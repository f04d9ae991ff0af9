//! The token vault and its audit log (SPEC §3 `RETRACE_VAULT_KEY`, §4 `retrace vault`, §7
//! "Masked values in replay").
//!
//! The vault maps a mask token (`rtk_<kind>_<26 base32>`) to its original, sealed under the vault
//! key ([`retrace_core::vault`]); the store never sees the key nor an original in clear. The
//! audit log is append-only: one [`AuditEntry`] per attempt to see an original, allowed or
//! refused, naming who, in which role, why, and what came of it.
//!
//! What the rest of Retrace calls:
//! - the runtime, for originals it found while masking: [`store_originals`];
//! - `retrace vault reveal` and the daemon's `POST /api/vault/reveal`: [`reveal`], which audits
//!   every attempt, refused ones included, before it answers;
//! - a replay run under a rule with `replay = "original"`: [`audit_replay_original`], once per
//!   replay run, then [`open_original`] for each token it hands back.
mod reveal;

use retrace_core::vault::{seal, Sealed, VaultKey};
use serde::{Deserialize, Serialize};

use crate::{StoreError, StoreResult};

pub use reveal::{
    audit_replay_original, audit_subject, open_original, reveal, Reveal, RevealError, Revealer,
};

/// The role that may reveal originals on the command line (SPEC §3: the CLI on a local store
/// acts as `admin`).
pub const ROLE_ADMIN: &str = "admin";
/// The role a replay needs to be handed originals (SPEC §7).
pub const ROLE_DEBUGGER: &str = "debugger";

/// A sealed original as the vault holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VaultEntry {
    /// The nonce and ciphertext.
    pub sealed: Sealed,
    /// Unix milliseconds when it was first stored.
    pub created_at_ms: u64,
}

/// What an audited attempt was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditAction {
    /// A person revealed an original (`retrace vault reveal`).
    Reveal,
    /// A reveal that was refused (no key, no reason, unknown token, wrong key, role).
    RevealRefused,
    /// A replay run was handed originals (SPEC §7: one entry per replay run).
    ReplayOriginal,
    /// A replay run that asked for originals and was refused.
    ReplayOriginalRefused,
}

impl AuditAction {
    /// The wire name (`reveal`, `reveal_refused`, `replay_original`, `replay_original_refused`).
    pub fn as_str(self) -> &'static str {
        match self {
            AuditAction::Reveal => "reveal",
            AuditAction::RevealRefused => "reveal_refused",
            AuditAction::ReplayOriginal => "replay_original",
            AuditAction::ReplayOriginalRefused => "replay_original_refused",
        }
    }

    /// The action named `name`, if any.
    pub fn parse(name: &str) -> Option<AuditAction> {
        [
            AuditAction::Reveal,
            AuditAction::RevealRefused,
            AuditAction::ReplayOriginal,
            AuditAction::ReplayOriginalRefused,
        ]
        .into_iter()
        .find(|a| a.as_str() == name)
    }
}

impl std::fmt::Display for AuditAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One attempt to see originals, as appended to the audit log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Unix milliseconds of the attempt.
    pub at_ms: u64,
    /// Who asked: the OS user on the command line, the token's owner on the API.
    pub who: String,
    /// The role they acted in (`admin`, `debugger`, ...).
    pub role: String,
    /// What they asked for, and whether it was refused.
    pub action: AuditAction,
    /// The token revealed, or the replay run handed originals.
    pub subject: String,
    /// The reason they gave (may be empty on a refused attempt: that can be why).
    pub reason: String,
    /// `ok`, or why it was refused.
    pub outcome: String,
}

/// An audit entry with its place in the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// 1, 2, 3...: the order of appends (never reused).
    pub id: u64,
    /// The entry.
    #[serde(flatten)]
    pub entry: AuditEntry,
}

/// The vault of sealed originals and the append-only audit log.
pub trait VaultStore: Send + Sync {
    /// Stores sealed originals by token, in one transaction. A token already in the vault keeps
    /// its first entry (the same token always stands for the same secret under one mask key),
    /// so putting it again is a no-op. Returns how many tokens were new.
    ///
    /// `run` is the run whose events hold these tokens: each token is kept as that run's, and
    /// a garbage collection that deletes the last run holding a token deletes its original
    /// (QA38 D1: deleting a run left its secrets revealable). An entry put with no run is
    /// nobody's, and stays.
    fn vault_put(&self, run: Option<&str>, sealed: &[(String, Sealed)]) -> StoreResult<usize>;
    /// The sealed original of `token`, if the vault holds it.
    fn vault_get(&self, token: &str) -> StoreResult<Option<VaultEntry>>;
    /// Appends `entry` to the audit log; returns its id. Entries are never changed or removed.
    fn audit_append(&self, entry: &AuditEntry) -> StoreResult<u64>;
    /// The audit log in append order, only the entries about `subject` (a token or a run)
    /// when given.
    fn audit_list(&self, subject: Option<&str>) -> StoreResult<Vec<AuditRecord>>;
}

/// Seals each `(token, original)` under `key` and puts them into the vault in one transaction,
/// as `run`'s ([`VaultStore::vault_put`]): what the runtime calls with the originals it
/// replaced while masking. Tokens already in the vault are left as they are. Returns how many
/// tokens were new.
///
/// Generic over the store so that any `&dyn Store` (or a concrete store) can be passed.
pub fn store_originals<S, T, B>(
    store: &S,
    key: &VaultKey,
    run: Option<&str>,
    originals: &[(T, B)],
) -> StoreResult<usize>
where
    S: VaultStore + ?Sized,
    T: AsRef<str>,
    B: AsRef<[u8]>,
{
    if originals.is_empty() {
        return Ok(0);
    }
    let sealed: Vec<(String, Sealed)> = originals
        .iter()
        .map(|(token, original)| {
            let token = token.as_ref();
            if token.is_empty() {
                return Err(StoreError::invalid("a vault entry needs a token"));
            }
            Ok((token.to_owned(), seal(key, token, original.as_ref())))
        })
        .collect::<StoreResult<_>>()?;
    store.vault_put(run, &sealed)
}
