//! The token vault's two uses in a session (SPEC §3, §7; issue 7):
//! - record: every original the masking stage replaced goes into the vault, sealed under
//!   `RETRACE_VAULT_KEY` (no key, no vault writes; masking happens all the same);
//! - replay and fork: where a rule says `replay = "original"`, the program is handed the
//!   original instead of the token. That needs the vault key and a role that may see originals,
//!   and writes one audit entry per run, before it starts.
use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;
use retrace_core::mask::{token_len_at, MaskRules, OriginalsSink, ReplayAs, TOKEN_PREFIX};
use retrace_core::vault::VaultKey;
use retrace_store::vault::{audit_replay_original, open_original, store_originals, Revealer};
use retrace_store::Store;

use crate::error::{RuntimeError, RuntimeResult};

/// Record: seals and stores the originals the masking stage found, each token once.
#[derive(Debug)]
pub(crate) struct Originals {
    key: VaultKey,
    sink: OriginalsSink,
    stored: Mutex<HashSet<String>>,
}

impl Originals {
    /// Originals sealed under `key`; the masking stage reports to [`Originals::sink`].
    pub(crate) fn new(key: VaultKey) -> Originals {
        Originals { key, sink: OriginalsSink::new(), stored: Mutex::new(HashSet::new()) }
    }

    /// Where the masking stage reports what it replaced.
    pub(crate) fn sink(&self) -> OriginalsSink {
        self.sink.clone()
    }

    /// Puts the originals reported since the last call, and not stored yet by this session,
    /// into the vault: before the event holding their tokens is appended.
    pub(crate) fn flush(&self, store: &dyn Store) -> RuntimeResult<()> {
        let found = self.sink.take();
        if found.is_empty() {
            return Ok(());
        }
        let fresh: Vec<(String, String)> = {
            let mut stored = self.stored.lock();
            found.into_iter().filter(|(token, _)| stored.insert(token.clone())).collect()
        };
        if fresh.is_empty() {
            return Ok(());
        }
        let pairs: Vec<(&str, &[u8])> = fresh.iter().map(|(t, o)| (t.as_str(), o.as_bytes())).collect();
        store_originals(store, &self.key, &pairs).map_err(|e| {
            // Not stored: a later step may try again.
            let mut stored = self.stored.lock();
            for (token, _) in &fresh {
                stored.remove(token);
            }
            RuntimeError::Store(e)
        })?;
        Ok(())
    }
}

/// Replay and fork: hands the program the originals of the tokens whose rule says `original`.
#[derive(Debug)]
pub(crate) struct Reveal {
    key: VaultKey,
    kinds: HashSet<String>,
    opened: Mutex<HashMap<String, Vec<u8>>>,
}

/// The token kinds whose rule replays the original.
pub fn original_kinds(rules: &MaskRules) -> HashSet<String> {
    rules.rules.iter().filter(|r| r.replay == ReplayAs::Original).map(|r| r.kind.clone()).collect()
}

impl Reveal {
    /// The reveal of run `run_id` masked with `rules`: none when no rule says `original`.
    /// Otherwise it needs `key` and a role that may see originals, and audits the run once
    /// (a refusal too) before anything runs.
    pub(crate) fn open(
        store: &dyn Store,
        rules: &MaskRules,
        key: Option<&VaultKey>,
        run_id: &str,
        at_ms: u64,
    ) -> RuntimeResult<Option<Reveal>> {
        let kinds = original_kinds(rules);
        if kinds.is_empty() {
            return Ok(None);
        }
        // The runtime on a local store acts as `admin`, audited under the OS user (SPEC §3).
        let by = Revealer { who: os_user(), role: "admin".into() };
        audit_replay_original(
            store,
            &by,
            run_id,
            "replay hands the program originals (replay = \"original\")",
            key,
            at_ms,
        )
        .map_err(|e| {
            RuntimeError::Usage(format!(
                "run {run_id}: masking rules for {} replay the original, which needs the vault: {e}",
                sorted(&kinds).join(", ")
            ))
        })?;
        let key = key.cloned().expect("audit_replay_original refuses a missing key");
        Ok(Some(Reveal { key, kinds, opened: Mutex::new(HashMap::new()) }))
    }

    /// `bytes` (a recorded request, output or message, JSON) with each token of an `original`
    /// kind replaced by its original, JSON-escaped into the string that held the token.
    pub(crate) fn apply(&self, store: &dyn Store, bytes: Vec<u8>) -> RuntimeResult<Vec<u8>> {
        let prefix = TOKEN_PREFIX.as_bytes();
        if !bytes.windows(prefix.len()).any(|w| w == prefix) {
            return Ok(bytes);
        }
        let mut out = Vec::with_capacity(bytes.len());
        let mut at = 0;
        while at < bytes.len() {
            let rest = &bytes[at..];
            let Some(len) = token_at(rest) else {
                out.push(bytes[at]);
                at += 1;
                continue;
            };
            let token = std::str::from_utf8(&rest[..len]).expect("tokens are ASCII");
            let kind = &token[TOKEN_PREFIX.len()..token.rfind('_').expect("tokens have a kind")];
            if self.kinds.contains(kind) {
                let original = self.original(store, token)?;
                let text = String::from_utf8_lossy(&original);
                let escaped = serde_json::to_string(&text).expect("strings serialize");
                out.extend_from_slice(&escaped.as_bytes()[1..escaped.len() - 1]);
            } else {
                out.extend_from_slice(token.as_bytes());
            }
            at += len;
        }
        Ok(out)
    }

    fn original(&self, store: &dyn Store, token: &str) -> RuntimeResult<Vec<u8>> {
        if let Some(o) = self.opened.lock().get(token) {
            return Ok(o.clone());
        }
        let original = open_original(store, &self.key, token)
            .map_err(|e| RuntimeError::Usage(format!("can't hand back the original of {token}: {e}")))?;
        self.opened.lock().insert(token.to_owned(), original.clone());
        Ok(original)
    }
}

/// If `bytes` start with a token, its length.
fn token_at(bytes: &[u8]) -> Option<usize> {
    if !bytes.starts_with(TOKEN_PREFIX.as_bytes()) {
        return None;
    }
    let window = &bytes[..bytes.len().min(96)];
    let text = match std::str::from_utf8(window) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&window[..e.valid_up_to()]).ok()?,
    };
    token_len_at(text)
}

fn sorted(kinds: &HashSet<String>) -> Vec<String> {
    let mut v: Vec<String> = kinds.iter().cloned().collect();
    v.sort();
    v
}

/// The OS user: `$USER`, else `$LOGNAME`, else the uid.
pub fn os_user() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| format!("uid {}", current_uid()))
}

fn current_uid() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_owned())
        })
        .unwrap_or_else(|| "?".into())
}
