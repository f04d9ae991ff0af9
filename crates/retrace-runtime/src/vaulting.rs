//! The token vault's two uses in a session (SPEC §3, §7; issue 7):
//! - record: every original the masking stage replaced goes into the vault, sealed under
//!   `RETRACE_VAULT_KEY` (no key, no vault writes; masking happens all the same);
//! - replay and fork: where a rule says `replay = "original"`, the program is handed the
//!   original instead of the token. That needs the vault key and a role that may see originals,
//!   and writes one audit entry per run, before it starts.
//!
//! The program gets back exactly the bytes it got in record. Most of the time that is the
//! stored value with its tokens unmasked ([`retrace_core::unmask`]: each original escaped once
//! per level of JSON string around its token). Where unmasking can't give those bytes back (a
//! secret a model streamed across several deltas, escapes an upstream chose that masking
//! rewrote), record keeps the bytes themselves in the vault too, sealed under the digest of
//! the stored blob: a *recorded form*, which replay hands back instead.
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;

use parking_lot::Mutex;
use retrace_core::digest::Digest;
use retrace_core::mask::{MaskRules, Masker, OriginalsSink, ReplayAs};
use retrace_core::unmask::{token_kind, tokens_in, unmask};
use retrace_core::vault::VaultKey;
use retrace_store::vault::{audit_replay_original, open_original, store_originals, RevealError, Revealer};
use retrace_store::Store;

use crate::error::{RuntimeError, RuntimeResult};

/// Record: seals and stores the originals the masking stage found, each token once, and the
/// recorded form of a value that unmasking would not give back.
#[derive(Debug)]
pub(crate) struct Originals {
    key: VaultKey,
    sink: OriginalsSink,
    /// Waiting for the next flush: originals by token, recorded forms by the digest of the
    /// stored value. Held across a flush's write, so a flush that finds nothing left returns
    /// only once what another flush took is in the vault.
    pending: Mutex<Vec<(String, Vec<u8>)>>,
    /// The originals this session masked, by token.
    known: Mutex<HashMap<String, String>>,
    /// The recorded forms this session queued, by name.
    forms: Mutex<HashSet<String>>,
    /// The kinds whose rule replays the original.
    kinds: HashSet<String>,
    /// Whether every rule replays the original: the program is then handed values as they were.
    all_original: bool,
    /// Otherwise, a stage with only the rules that replay the token, which masks what the
    /// program is handed (`None` if it could not be built: no recorded forms are kept then).
    token_only: Option<Masker>,
}

/// How a stored value was masked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MaskedAs {
    /// `Masker::mask_output`: a step's output.
    Output,
    /// `Masker::mask_json`: a request.
    Json,
}

impl Originals {
    /// Originals sealed under `key`; `masker` (the session's stage) reports to
    /// [`Originals::sink`].
    pub(crate) fn new(key: VaultKey, masker: &Masker) -> Originals {
        let kinds = original_kinds(masker.rules());
        let all_original = masker.rules().rules.iter().all(|r| kinds.contains(&r.kind));
        // Only values holding a token of `kinds` have a recorded form.
        let token_only = match kinds.is_empty() || all_original {
            true => None,
            false => masker.restricted(|r| !kinds.contains(&r.kind)).ok(),
        };
        Originals {
            key,
            sink: OriginalsSink::new(),
            pending: Mutex::new(Vec::new()),
            known: Mutex::new(HashMap::new()),
            forms: Mutex::new(HashSet::new()),
            all_original,
            token_only,
            kinds,
        }
    }

    /// Where the masking stage reports what it replaced.
    pub(crate) fn sink(&self) -> OriginalsSink {
        self.sink.clone()
    }

    /// Moves what the masking stage reported since into `pending`, each token once.
    fn absorb(&self, pending: &mut Vec<(String, Vec<u8>)>) {
        let found = self.sink.take();
        if found.is_empty() {
            return;
        }
        let mut known = self.known.lock();
        for (token, original) in found {
            if let std::collections::hash_map::Entry::Vacant(slot) = known.entry(token) {
                pending.push((slot.key().clone(), original.clone().into_bytes()));
                slot.insert(original);
            }
        }
    }

    /// `masked` was stored for `raw`: when it holds a token whose rule replays the original
    /// and unmasking it would not give back what the program is handed in record (`raw`, with
    /// the secrets of rules that replay the token masked), queues that as its recorded form.
    pub(crate) fn keep_form(&self, raw: &[u8], masked: &[u8], how: MaskedAs) {
        if !holds_kind(masked, &self.kinds) {
            return;
        }
        self.absorb(&mut self.pending.lock());
        let handed: Cow<'_, [u8]> = if self.all_original {
            Cow::Borrowed(raw)
        } else {
            // Some rules replay the token but their stage could not be built: no form to trust.
            let Some(stage) = &self.token_only else { return };
            match how {
                MaskedAs::Output => stage.mask_output(raw).bytes,
                MaskedAs::Json => stage.mask_json(raw).bytes,
            }
        };
        let unmasked = {
            let known = self.known.lock();
            let mut original = |token: &str| -> Result<Option<String>, Infallible> {
                Ok(token_kind(token)
                    .filter(|k| self.kinds.contains(*k))
                    .and_then(|_| known.get(token).cloned()))
            };
            unmask(masked, &mut original).unwrap_or_else(|never| match never {})
        };
        if unmasked.as_ref() == handed.as_ref() {
            return;
        }
        let name = form_name(masked);
        if self.forms.lock().insert(name.clone()) {
            self.pending.lock().push((name, handed.into_owned()));
        }
    }

    /// Puts the originals reported since the last call, and the recorded forms queued, into
    /// the vault: before the event holding their tokens is appended.
    pub(crate) fn flush(&self, store: &dyn Store, run: &str) -> RuntimeResult<()> {
        let mut pending = self.pending.lock();
        self.absorb(&mut pending);
        if pending.is_empty() {
            return Ok(());
        }
        let pairs: Vec<(&str, &[u8])> = pending.iter().map(|(t, o)| (t.as_str(), o.as_slice())).collect();
        // Not stored: they stay pending, for the next step to try again.
        store_originals(store, &self.key, Some(run), &pairs).map_err(RuntimeError::Store)?;
        pending.clear();
        Ok(())
    }
}

/// The vault name of the recorded form of stored value `masked`: its blob digest.
fn form_name(masked: &[u8]) -> String {
    Digest::of(masked).to_string()
}

/// Whether `bytes` hold a token of one of `kinds`.
fn holds_kind(bytes: &[u8], kinds: &HashSet<String>) -> bool {
    !kinds.is_empty()
        && tokens_in(bytes).into_iter().any(|t| token_kind(t).is_some_and(|k| kinds.contains(k)))
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
    /// Whether `rules` hand any original back (so a replay under them opens a `Reveal`).
    pub(crate) fn needed(rules: &MaskRules) -> bool {
        !original_kinds(rules).is_empty()
    }

    /// The reveal of run `run_id` masked with `rules`: none when no rule says `original`.
    /// Otherwise it needs `key` and a role that may see originals (`by`'s, else the OS user's
    /// as `admin`), and audits the run once (a refusal too) before anything runs.
    pub(crate) fn open(
        store: &dyn Store,
        rules: &MaskRules,
        key: Option<&VaultKey>,
        by: Option<&Revealer>,
        run_id: &str,
        at_ms: u64,
    ) -> RuntimeResult<Option<Reveal>> {
        let kinds = original_kinds(rules);
        if kinds.is_empty() {
            return Ok(None);
        }
        // The runtime on a local store acts as `admin`, audited under the OS user (SPEC §3);
        // the daemon names its caller.
        let local = Revealer { who: os_user(), role: "admin".into() };
        audit_replay_original(
            store,
            by.unwrap_or(&local),
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

    /// `bytes` (a recorded request, output or message) as the program got them in record: their
    /// recorded form when the vault keeps one, else with each token of an `original` kind
    /// unmasked ([`retrace_core::unmask`]). Tokens of other kinds stay.
    pub(crate) fn apply(&self, store: &dyn Store, bytes: Vec<u8>) -> RuntimeResult<Vec<u8>> {
        if !holds_kind(&bytes, &self.kinds) {
            return Ok(bytes);
        }
        if let Some(form) = self.sealed(store, &form_name(&bytes), false)? {
            return Ok(form);
        }
        let mut original = |token: &str| -> RuntimeResult<Option<String>> {
            match token_kind(token) {
                Some(kind) if self.kinds.contains(kind) => match self.sealed(store, token, true)? {
                    Some(o) => Ok(Some(String::from_utf8_lossy(&o).into_owned())),
                    None => Err(RuntimeError::Usage(format!(
                        "can't hand back the original of {token}: the vault holds no original for it"
                    ))),
                },
                _ => Ok(None),
            }
        };
        Ok(unmask(&bytes, &mut original)?.into_owned())
    }

    /// What the vault holds under `name` (a token or a recorded form), opened; `None` when it
    /// holds nothing there. Originals of tokens are kept for the next asks (`cache`).
    fn sealed(&self, store: &dyn Store, name: &str, cache: bool) -> RuntimeResult<Option<Vec<u8>>> {
        if let Some(o) = self.opened.lock().get(name) {
            return Ok(Some(o.clone()));
        }
        let opened = match open_original(store, &self.key, name) {
            Ok(o) => o,
            Err(RevealError::UnknownToken { .. }) => return Ok(None),
            Err(e) => {
                return Err(RuntimeError::Usage(format!("can't hand back the original of {name}: {e}")))
            }
        };
        if cache {
            self.opened.lock().insert(name.to_owned(), opened.clone());
        }
        Ok(Some(opened))
    }
}

fn sorted(kinds: &HashSet<String>) -> Vec<String> {
    let mut v: Vec<String> = kinds.iter().cloned().collect();
    v.sort();
    v
}

/// The OS user: `$USER`, else `$LOGNAME`, else the name `/etc/passwd` gives this process's
/// uid (a container or a cron job often sets neither variable), else `uid N`.
pub fn os_user() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
        .unwrap_or_else(|| {
            let uid = current_uid();
            let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
            user_named(&passwd, &uid).unwrap_or_else(|| format!("uid {uid}"))
        })
}

/// The name of `uid` in the text of an `/etc/passwd` (`name:password:uid:...` lines).
fn user_named(passwd: &str, uid: &str) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        (fields.nth(1)? == uid && !name.is_empty()).then(|| name.to_owned())
    })
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_uid_is_named_from_passwd() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nci:x:1001:1001::/home/ci:/bin/sh\n";
        assert_eq!(super::user_named(passwd, "1001").as_deref(), Some("ci"));
        assert_eq!(super::user_named(passwd, "0").as_deref(), Some("root"));
        assert_eq!(super::user_named(passwd, "7"), None);
    }
}
