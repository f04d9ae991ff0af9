//! The replay ledger (issue 8): per (project, agent), how its traces replayed, and the signed
//! file `retrace ledger export` writes for a policy to load where the agents run.
//!
//! The file is `retrace-ledger/1` JSON: `{format, exported_at_ms, entries, public_key,
//! signature}`. `signature` is Ed25519 (base64) over the canonical JSON ([`crate::canonical`]) of
//! the file without its `signature` field; `public_key` is the signer's key (base64). A reader
//! trusts a file only when it verifies *and* its key is the one the policy names
//! ([`LedgerFile::verify`]): a file signed by anyone else grants nothing.
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::canonical::canonical_value;

/// The ledger file's format name.
pub const FORMAT: &str = "retrace-ledger/1";

/// One agent's replay record in one project.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// `[project] name` in `retrace.toml`, or the git top-level folder's name.
    pub project: String,
    /// The agent id.
    pub agent: String,
    /// Every replay of a trace holding this agent, repeats included.
    pub replays: u64,
    /// Trace files replayed, each counted once per content hash.
    pub traces_replayed: u64,
    /// Consecutive clean replays since the last divergence.
    pub clean_streak: u64,
    /// Distinct traces (by content hash) among the clean streak's replays.
    pub distinct_traces: u64,
    /// The agent's latest divergence, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_divergence: Option<LastDivergence>,
}

/// Where an agent last diverged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastDivergence {
    /// Unix milliseconds of the replay.
    pub at_ms: u64,
    /// The trace's content hash (`sha256:<hex>`).
    pub trace: String,
    /// The seq it diverged at, when known.
    pub seq: Option<u64>,
    /// The divergence as the gate reported it (`step_mismatch at seq 7`).
    pub detail: String,
}

/// The signed ledger file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerFile {
    /// [`FORMAT`].
    pub format: String,
    /// Unix milliseconds of the export.
    pub exported_at_ms: u64,
    /// Every entry, by (project, agent).
    pub entries: Vec<LedgerEntry>,
    /// The signer's Ed25519 public key, base64.
    pub public_key: String,
    /// Ed25519 signature over the canonical JSON of the file without this field, base64.
    pub signature: String,
}

/// Why a ledger key or file is not usable.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// `RETRACE_LEDGER_KEY` is not a base64 32-byte seed.
    #[error("the ledger key must be a 32-byte Ed25519 seed, base64-encoded: {0}")]
    BadKey(String),
    /// A public key is not base64 of 32 bytes of a valid point.
    #[error("the ledger public key is not a base64 Ed25519 public key: {0}")]
    BadPublicKey(String),
    /// The file is not a ledger.
    #[error("not a {FORMAT} file: {0}")]
    Format(String),
    /// The signature doesn't verify, or the file was signed by another key than the policy's.
    #[error("the ledger's signature does not verify: {0}")]
    Signature(String),
}

/// The signing key of a base64 32-byte seed (`RETRACE_LEDGER_KEY`).
pub fn signing_key(base64_seed: &str) -> Result<SigningKey, LedgerError> {
    let bytes = B64.decode(base64_seed.trim()).map_err(|e| LedgerError::BadKey(e.to_string()))?;
    let seed: [u8; 32] =
        bytes.try_into().map_err(|b: Vec<u8>| LedgerError::BadKey(format!("{} bytes, want 32", b.len())))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// The public key of `key`, base64 (what `[autonomy] ledger_pubkey` holds).
pub fn public_key_base64(key: &SigningKey) -> String {
    B64.encode(key.verifying_key().as_bytes())
}

/// A public key from base64.
pub fn verifying_key(base64_key: &str) -> Result<VerifyingKey, LedgerError> {
    let bytes = B64.decode(base64_key.trim()).map_err(|e| LedgerError::BadPublicKey(e.to_string()))?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|b: Vec<u8>| LedgerError::BadPublicKey(format!("{} bytes, want 32", b.len())))?;
    VerifyingKey::from_bytes(&bytes).map_err(|e| LedgerError::BadPublicKey(e.to_string()))
}

impl LedgerFile {
    /// Signs `entries` under `key`.
    pub fn sign(entries: Vec<LedgerEntry>, exported_at_ms: u64, key: &SigningKey) -> LedgerFile {
        let mut file = LedgerFile {
            format: FORMAT.into(),
            exported_at_ms,
            entries,
            public_key: public_key_base64(key),
            signature: String::new(),
        };
        let signature = key.sign(&file.signed_bytes());
        file.signature = B64.encode(signature.to_bytes());
        file
    }

    /// The bytes the signature covers: the canonical JSON of the file without `signature`.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut value = serde_json::to_value(self).expect("a ledger serializes");
        if let Some(fields) = value.as_object_mut() {
            fields.remove("signature");
        }
        canonical_value(&value).expect("a ledger is canonical JSON")
    }

    /// Parses a ledger file.
    pub fn parse(bytes: &[u8]) -> Result<LedgerFile, LedgerError> {
        let file: LedgerFile =
            serde_json::from_slice(bytes).map_err(|e| LedgerError::Format(e.to_string()))?;
        if file.format != FORMAT {
            return Err(LedgerError::Format(format!("format {:?}", file.format)));
        }
        Ok(file)
    }

    /// Checks that the file is signed by `trusted` (the policy's `ledger_pubkey`, base64).
    pub fn verify(&self, trusted: &str) -> Result<(), LedgerError> {
        let trusted = verifying_key(trusted)?;
        let own = verifying_key(&self.public_key)?;
        if own != trusted {
            return Err(LedgerError::Signature(
                "signed by another key than the policy's ledger_pubkey".into(),
            ));
        }
        let bytes = B64.decode(self.signature.trim()).map_err(|e| LedgerError::Signature(e.to_string()))?;
        let signature = Signature::from_slice(&bytes).map_err(|e| LedgerError::Signature(e.to_string()))?;
        trusted.verify(&self.signed_bytes(), &signature).map_err(|_| {
            LedgerError::Signature(
                "the contents were changed after signing, or the signature is forged".into(),
            )
        })
    }

    /// The entry of (`project`, `agent`), if any.
    pub fn entry(&self, project: &str, agent: &str) -> Option<&LedgerEntry> {
        self.entries.iter().find(|e| e.project == project && e.agent == agent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(b: u8) -> String {
        B64.encode([b; 32])
    }

    fn entry() -> LedgerEntry {
        LedgerEntry {
            project: "retrace".into(),
            agent: "planner".into(),
            replays: 4,
            traces_replayed: 3,
            clean_streak: 2,
            distinct_traces: 2,
            last_divergence: None,
        }
    }

    #[test]
    fn a_signed_ledger_round_trips_and_verifies() {
        let key = signing_key(&seed(7)).unwrap();
        let file = LedgerFile::sign(vec![entry()], 1_700_000_000_000, &key);
        let text = serde_json::to_vec_pretty(&file).unwrap();
        let back = LedgerFile::parse(&text).unwrap();
        assert_eq!(back, file);
        back.verify(&public_key_base64(&key)).unwrap();
        assert_eq!(back.entry("retrace", "planner").unwrap().clean_streak, 2);
    }

    #[test]
    fn edited_or_foreign_ledgers_do_not_verify() {
        let key = signing_key(&seed(7)).unwrap();
        let trusted = public_key_base64(&key);
        let mut edited = LedgerFile::sign(vec![entry()], 1, &key);
        edited.entries[0].clean_streak = 1_000;
        assert!(matches!(edited.verify(&trusted), Err(LedgerError::Signature(_))));
        // An agent signing its own ledger with its own key is not trusted.
        let forged = LedgerFile::sign(vec![entry()], 1, &signing_key(&seed(8)).unwrap());
        let err = forged.verify(&trusted).unwrap_err();
        assert!(err.to_string().contains("another key"), "{err}");
        assert!(matches!(signing_key("short"), Err(LedgerError::BadKey(_))));
        assert!(matches!(LedgerFile::parse(b"{}"), Err(LedgerError::Format(_))));
    }
}
