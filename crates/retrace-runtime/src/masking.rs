//! Where a session's masking comes from (SPEC §3, §7): the mask key, the rule set of a new
//! run, and the checks that keep a run's tokens meaningful.
//!
//! - The key is `RETRACE_MASK_KEY`, else `mask.key` in the store's folder (`RETRACE_HOME`, or
//!   the folder of `RETRACE_STORE`'s database), generated once (mode 0600)
//!   with a notice that traces holding tokens replay only under it. A memory store gets a key
//!   that lives as long as the process.
//! - A new recording takes its rules from `[mask]` of `./retrace.toml`, else of the nearest one
//!   above it up to the git top level ([`crate::config_file`]; the defaults when there is no
//!   file or no table) and records them with the run; replay masks with the recorded set,
//!   a fork with the recorded set plus today's.
//! - A run that holds tokens is only opened under the key it was recorded with.
use std::io::Write as _;
use std::path::{Path, PathBuf};

use retrace_core::edit::Edit;
use retrace_core::mask::{MaskKey, MaskRules, Masker, RuleMatch};
use retrace_core::run::RunMeta;
use retrace_store::open::StoreLocation;
use retrace_store::StoreConfig;

use crate::error::{RuntimeError, RuntimeResult};

/// The file under `RETRACE_HOME` that holds a generated mask key.
pub const MASK_KEY_FILE: &str = "mask.key";

pub use crate::config_file::CONFIG_FILE;

/// The mask key of this process, and where it came from.
#[derive(Debug, Clone)]
pub struct ResolvedKey {
    /// The key.
    pub key: MaskKey,
    /// Where it came from, for messages: `RETRACE_MASK_KEY`, a file, or `this process`.
    pub source: String,
    /// Set when the key was generated just now: what the user should know.
    pub notice: Option<String>,
}

/// The mask key for a store: `RETRACE_MASK_KEY`, else the store home's `mask.key` (generated
/// on first use), else (a memory store) a key for this process only.
pub fn resolve_key(store: &StoreConfig) -> RuntimeResult<ResolvedKey> {
    resolve(store, std::env::var("RETRACE_MASK_KEY").ok())
}

/// [`resolve_key`] with `from_env` for the variable's value.
fn resolve(store: &StoreConfig, from_env: Option<String>) -> RuntimeResult<ResolvedKey> {
    if let Some(text) = from_env.filter(|v| !v.trim().is_empty()) {
        let key =
            MaskKey::from_base64(&text).map_err(|e| RuntimeError::Usage(format!("RETRACE_MASK_KEY: {e}")))?;
        // The store's own key is another one: what was recorded here under one opens only under it.
        let file = home_of(store).map(|home| home.join(MASK_KEY_FILE));
        let stored =
            file.as_deref().and_then(|f| MaskKey::from_base64(&std::fs::read_to_string(f).ok()?).ok());
        let notice = match (stored, file) {
            (Some(stored), Some(file)) if stored.fingerprint() != key.fingerprint() => Some(format!(
                "retrace: warning: RETRACE_MASK_KEY ({}) is not the key in {} ({}): runs that hold tokens \
                 open only under the key they were recorded with",
                key.fingerprint(),
                file.display(),
                stored.fingerprint()
            )),
            _ => None,
        };
        return Ok(ResolvedKey { key, source: "RETRACE_MASK_KEY".into(), notice });
    }
    match home_of(store) {
        Some(home) => key_file(&home),
        None => Ok(ResolvedKey {
            key: ephemeral_key(),
            source: "this process (memory store)".into(),
            notice: None,
        }),
    }
}

/// The mask key [`resolve_key`] would use, without generating one: `None` when
/// `RETRACE_MASK_KEY` is unset (or empty) and the store's home holds no `mask.key` (or the
/// store is in memory).
pub fn existing_key(store: &StoreConfig) -> RuntimeResult<Option<MaskKey>> {
    let from_env = std::env::var("RETRACE_MASK_KEY").ok().filter(|v| !v.trim().is_empty());
    if from_env.is_some() {
        return resolve(store, from_env).map(|r| Some(r.key));
    }
    match home_of(store).map(|home| home.join(MASK_KEY_FILE)) {
        Some(file) if file.exists() => key_file(file.parent().unwrap_or(Path::new("."))).map(|r| Some(r.key)),
        _ => Ok(None),
    }
}

/// A new random mask key that lives only in this process (a store in memory's, or one for a
/// store nothing can be recorded into).
pub fn ephemeral_key() -> MaskKey {
    MaskKey::from_bytes(rand::random())
}

/// The folder a store keeps its mask key in: the SQLite database's folder.
pub fn home_of(store: &StoreConfig) -> Option<PathBuf> {
    match &store.location {
        // `sqlite://retrace.db` names a file in the current folder: its parent is "".
        StoreLocation::Sqlite { path } => {
            Some(path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf())
        }
        StoreLocation::Memory => None,
    }
}

/// Reads `home/mask.key`, generating it (mode 0600) when absent. Processes starting at once
/// on a new home each generate one, and all use the first to land ([`publish_key`]).
fn key_file(home: &Path) -> RuntimeResult<ResolvedKey> {
    let path = home.join(MASK_KEY_FILE);
    let source = path.display().to_string();
    let read = |path: &Path| -> RuntimeResult<MaskKey> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| RuntimeError::Usage(format!("can't read the mask key {}: {e}", path.display())))?;
        MaskKey::from_base64(&text).map_err(|e| RuntimeError::Usage(format!("{}: {e}", path.display())))
    };
    if path.exists() {
        return Ok(ResolvedKey { key: read(&path)?, source, notice: None });
    }
    std::fs::create_dir_all(home)
        .map_err(|e| RuntimeError::Usage(format!("can't create {}: {e}", home.display())))?;
    let key = MaskKey::from_bytes(rand::random());
    match publish_key(home, &path, &key) {
        Ok(true) => {
            let notice = format!(
                "retrace: generated a mask key at {source} ({}); traces that hold masked tokens replay \
                 only under this key: give other machines and CI its contents as RETRACE_MASK_KEY (a secret)",
                key.fingerprint()
            );
            Ok(ResolvedKey { key, source, notice: Some(notice) })
        }
        // Another process generated it first: use theirs.
        Ok(false) => Ok(ResolvedKey { key: read(&path)?, source, notice: None }),
        Err(e) => Err(RuntimeError::Usage(format!("can't create the mask key {source}: {e}"))),
    }
}

/// Puts `key` at `path` whole or not at all; false when another process's key was there first.
///
/// A reader must never see a key in part, which it would take for a broken key: so the key is
/// written to a temporary file beside `path` (mode 0600) and synced, then moved to `path` only
/// if nothing is there (`persist_noclobber`: `renameat2` with `RENAME_NOREPLACE`, or a hard
/// link and an unlink), so the name appears with all its bytes, and of two processes
/// generating keys at once the first to land wins and the other reads it. The folder is synced
/// too, so the name survives a crash with the file.
fn publish_key(home: &Path, path: &Path, key: &MaskKey) -> std::io::Result<bool> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(".mask.key.").suffix(".tmp");
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600));
    let mut file = builder.tempfile_in(home)?;
    file.write_all(format!("{}\n", key.to_base64()).as_bytes())?;
    file.as_file().sync_all()?;
    match file.persist_noclobber(path) {
        Ok(_) => {}
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(e.error),
    }
    #[cfg(unix)]
    std::fs::File::open(home)?.sync_all()?;
    Ok(true)
}

/// The rule set for new recordings: `[mask]` of the `retrace.toml` that applies to `dir` (its
/// own, else the nearest above it up to the git top level), or the defaults.
pub fn rules_in(dir: &Path) -> RuntimeResult<MaskRules> {
    let path = crate::config_file::config_dir(dir).join(CONFIG_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => retrace_core::mask::config::parse_toml(&text)
            .map_err(|e| RuntimeError::Usage(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(MaskRules::defaults()),
        Err(e) => Err(RuntimeError::Usage(format!("can't read {}: {e}", path.display()))),
    }
}

/// The rule set for new recordings, from `./retrace.toml`, else the nearest above it up to the
/// git top level.
pub fn rules_from_cwd() -> RuntimeResult<MaskRules> {
    rules_in(Path::new("."))
}

/// Refuses to open `run` under `key` when the run holds tokens made under another key
/// (SPEC §3: exit 2, naming both fingerprints).
pub fn check_key(run: &RunMeta, key: Option<&MaskKey>) -> RuntimeResult<()> {
    if !run.holds_tokens {
        return Ok(());
    }
    let ours = key.map(MaskKey::fingerprint);
    match (&run.mask_key_fingerprint, &ours) {
        (Some(theirs), Some(ours)) if theirs == ours => Ok(()),
        (theirs, ours) => Err(RuntimeError::Usage(format!(
            "run {} holds masked tokens made under mask key {}, but this machine's key is {}: \
             replaying it would never match its keys. Set RETRACE_MASK_KEY to the key the run was \
             recorded with",
            run.id,
            theirs.as_deref().unwrap_or("(none recorded)"),
            ours.as_deref().unwrap_or("(none)"),
        ))),
    }
}

/// Refuses to join a recording in progress under a key other than the one it started with.
pub fn check_joining_key(run: &RunMeta, key: Option<&MaskKey>) -> RuntimeResult<()> {
    match &run.mask_key_fingerprint {
        Some(_) => check_key(&RunMeta { holds_tokens: true, ..run.clone() }, key),
        None => Ok(()),
    }
}

/// Fills a session's masking from the environment and `./retrace.toml`: the key of
/// [`resolve_key`] (its notice, if any, on standard error) and, unless set already, the rules
/// of [`rules_from_cwd`].
pub fn fill_from_env(options: &mut crate::SessionOptions, store: &StoreConfig) -> RuntimeResult<()> {
    if options.mask_key.is_none() {
        let resolved = resolve_key(store)?;
        if let Some(notice) = &resolved.notice {
            eprintln!("{notice}");
        }
        options.mask_key = Some(resolved.key);
    }
    if options.mask_rules.is_empty() {
        options.mask_rules = rules_from_cwd()?;
    }
    if options.vault_key.is_none() {
        options.vault_key = vault_key_from_env()?;
    }
    Ok(())
}

/// The warning a fork prints when today's rules mask more than its source's.
pub fn fork_rules_warning(added: &[String]) -> String {
    format!(
        "retrace: this fork masks with rules its source was not recorded with ({}); unchanged steps \
         that hold newly masked values will run as changed",
        added.join(", ")
    )
}

/// The masking stage for `rules` under `key`; a run opened with no key at all gets a key for
/// this process (it holds no tokens, or [`check_key`] would have refused it). A run's recorded
/// literal rules hold only their values' digests: the values come from today's `retrace.toml`
/// ([`rules_from_cwd`]), and one it lacks is refused, naming the rule.
pub fn masker(rules: MaskRules, key: Option<&MaskKey>) -> RuntimeResult<Masker> {
    let sealed = |r: &retrace_core::mask::MaskRule| matches!(r.matcher, RuleMatch::LiteralDigest { .. });
    match rules.rules.iter().any(sealed) {
        true => masker_with(rules, &rules_from_cwd()?, key),
        false => masker_with(rules, &MaskRules::default(), key),
    }
}

/// [`masker`] with today's rules given (`today`: a session's own options), where a recorded
/// literal rule's value comes from.
pub fn masker_with(rules: MaskRules, today: &MaskRules, key: Option<&MaskKey>) -> RuntimeResult<Masker> {
    let rules = rules.with_literals(today, key);
    let key = key.cloned().unwrap_or_else(|| MaskKey::from_bytes(rand::random()));
    Masker::new(rules, Some(key)).map_err(|e| RuntimeError::Usage(e.to_string()))
}

/// A fork's rule set: the source's recorded rules, then today's rules the source lacks. The
/// second value names the added rules (steps holding newly masked values will run as changed).
pub fn fork_rules(recorded: &MaskRules, today: &MaskRules) -> (MaskRules, Vec<String>) {
    let mut rules = recorded.clone();
    let mut added = Vec::new();
    for rule in &today.rules {
        if !recorded.holds(rule) {
            added.push(rule.name.clone());
            rules.rules.push(rule.clone());
        }
    }
    (rules, added)
}

/// `RETRACE_VAULT_KEY`, when set.
pub fn vault_key_from_env() -> RuntimeResult<Option<retrace_core::vault::VaultKey>> {
    match std::env::var(retrace_core::vault::VAULT_KEY_ENV).ok().filter(|v| !v.trim().is_empty()) {
        None => Ok(None),
        Some(text) => retrace_core::vault::VaultKey::from_base64(&text)
            .map(Some)
            .map_err(|e| RuntimeError::Usage(format!("{}: {e}", retrace_core::vault::VAULT_KEY_ENV))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_is_private_and_stable() {
        let dir = tempfile::tempdir().unwrap();
        let first = key_file(dir.path()).unwrap();
        assert!(first.notice.as_deref().unwrap().contains(&first.key.fingerprint()));
        let again = key_file(dir.path()).unwrap();
        assert!(again.notice.is_none());
        assert_eq!(again.key.fingerprint(), first.key.fingerprint());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(MASK_KEY_FILE)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_key_from_the_environment_other_than_the_stores_is_warned_of() {
        let dir = tempfile::tempdir().unwrap();
        let store = StoreConfig::in_home(dir.path());
        let stored = resolve(&store, None).unwrap().key;
        let same = resolve(&store, Some(stored.to_base64())).unwrap();
        assert!(same.notice.is_none() && same.key.fingerprint() == stored.fingerprint());
        let other = MaskKey::from_bytes([9; 32]);
        let warned = resolve(&store, Some(other.to_base64())).unwrap();
        assert_eq!(warned.key.fingerprint(), other.fingerprint(), "the variable's key is used");
        let notice = warned.notice.unwrap();
        assert!(notice.contains(&other.fingerprint()) && notice.contains(&stored.fingerprint()), "{notice}");
        // No key file yet: nothing to differ from, and none is made.
        let empty = tempfile::tempdir().unwrap();
        assert!(resolve(&StoreConfig::in_home(empty.path()), Some(other.to_base64()))
            .unwrap()
            .notice
            .is_none());
        assert!(!empty.path().join(MASK_KEY_FILE).exists());
    }

    #[test]
    fn a_run_with_tokens_needs_its_own_key() {
        let (a, b) = (MaskKey::from_bytes([1; 32]), MaskKey::from_bytes([2; 32]));
        let mut run = RunMeta::new("r1", retrace_core::run::RunMode::Record, 0);
        run.mask_key_fingerprint = Some(a.fingerprint());
        check_key(&run, Some(&b)).unwrap();
        run.holds_tokens = true;
        check_key(&run, Some(&a)).unwrap();
        let err = check_key(&run, Some(&b)).unwrap_err().to_string();
        assert!(err.contains(&a.fingerprint()) && err.contains(&b.fingerprint()), "{err}");
        assert!(check_key(&run, None).is_err());
    }

    #[test]
    fn fork_rules_keep_the_recorded_ones_first() {
        let rules = MaskRules::defaults();
        let (same, added) = fork_rules(&rules, &rules);
        assert_eq!(same, rules);
        assert!(added.is_empty());
        let (union, added) = fork_rules(&MaskRules::default(), &rules);
        assert_eq!(union, rules);
        assert_eq!(added.len(), rules.rules.len());
    }
}

/// An upstream URL as a run records it: without its userinfo (`user:password@`, which a
/// gateway's basic auth puts there), and with the masking rules applied to the rest (a key in
/// the query). The URL the proxy calls is the one given; only what is persisted changes.
pub fn stored_upstream(url: &str, masker: &Masker) -> String {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let authority_end = url[after_scheme..].find(['/', '?', '#']).map_or(url.len(), |i| after_scheme + i);
    let without_userinfo = match url[after_scheme..authority_end].rfind('@') {
        Some(at) => format!("{}{}", &url[..after_scheme], &url[after_scheme + at + 1..]),
        None => url.to_owned(),
    };
    masker.mask_url(&without_userinfo).0.into_owned()
}

/// `edit` as a fork stores it: what it says in its own text (a parameter's value, a model
/// name, an agent) masked like any input, and the number of tokens that put in. A masked edit
/// applies its tokens: a fork sends the token where the value as typed was (as an `@FILE` edit's
/// masked content hands the program tokens), so the caller warns when this is not 0.
pub fn masked_edit(edit: &Edit, masker: &Masker) -> (Edit, usize) {
    let mut count = 0;
    let mut text = |s: &str| {
        let (masked, n) = masker.mask_text(s);
        count += n;
        masked.into_owned()
    };
    let masked = match edit {
        Edit::Prompt { agent, version } => Edit::Prompt { agent: text(agent), version: text(version) },
        Edit::Model { agent, name, snapshot } => {
            Edit::Model { agent: text(agent), name: text(name), snapshot: snapshot.as_deref().map(&mut text) }
        }
        Edit::Param { agent, name, value } => {
            let (agent, name) = (text(agent), text(name));
            let raw = serde_json::to_vec(value).expect("a JSON value serializes");
            let value = match masker.mask_json(&raw) {
                m if m.tokens > 0 => {
                    count += m.tokens;
                    serde_json::from_slice(&m.bytes).unwrap_or_else(|_| value.clone())
                }
                _ => value.clone(),
            };
            Edit::Param { agent, name, value }
        }
        other => other.clone(),
    };
    (masked, count)
}

/// The warning for an edit [`masked_edit`] put tokens in, as stored (masked), without a prefix.
pub fn masked_edit_warning(stored: &Edit, tokens: usize) -> String {
    format!(
        "edit {stored}: {} matched a masking rule and {} stored as \
         tokens: the fork sends the tokens, not the values as typed",
        retrace_core::terminal::count(tokens, "value"),
        if tokens == 1 { "is" } else { "are" }
    )
}

#[cfg(test)]
mod masked_edit_tests {
    use retrace_core::mask::{MaskKey, MaskRules};

    use super::*;

    #[test]
    fn a_secret_in_an_edit_is_stored_as_its_token_and_other_edits_stay() {
        let key = MaskKey::from_bytes([7; 32]);
        let m = masker(MaskRules::defaults(), Some(&key)).unwrap();
        let email = key.token("email", "ada@example.com");
        let edit: Edit = "param:planner.user=ada@example.com".parse().unwrap();
        let (stored, n) = masked_edit(&edit, &m);
        assert_eq!((stored.to_string(), n), (format!("param:planner.user={email}"), 1));
        assert_eq!(stored.to_string().parse::<Edit>().unwrap(), stored, "it parses back as stored");
        let json: Edit = r#"param:planner.metadata={"to":"ada@example.com","n":2}"#.parse().unwrap();
        let (stored, n) = masked_edit(&json, &m);
        assert_eq!(n, 1);
        assert!(stored.to_string().contains(&email) && stored.to_string().contains(r#""n":2"#), "{stored}");
        for plain in [
            "param:planner.temperature=0.2",
            "model:planner=gpt-4o@gpt-4o-2024-08-06",
            "prompt:planner=v3",
            "swap:3,5",
        ] {
            let edit: Edit = plain.parse().unwrap_or_else(|e| panic!("{plain}: {e}"));
            assert_eq!(masked_edit(&edit, &m), (edit, 0), "{plain}");
        }
    }
}

#[cfg(test)]
mod stored_upstream_tests {
    use retrace_core::mask::{MaskKey, MaskRules};

    use super::*;

    #[test]
    fn credentials_in_an_upstream_url_are_not_stored() {
        let key = MaskKey::from_bytes([5; 32]);
        let masker = masker(MaskRules::defaults(), Some(&key)).unwrap();
        let stored = |url: &str| stored_upstream(url, &masker);
        assert_eq!(stored("http://victor:S3cret@127.0.0.1:18100/v1"), "http://127.0.0.1:18100/v1");
        assert_eq!(stored("https://token@gw.example/v1?x=1"), "https://gw.example/v1?x=1");
        assert_eq!(stored("https://api.openai.com/v1"), "https://api.openai.com/v1");
        // An `@` after the host is not userinfo.
        assert_eq!(stored("http://h/v1/a@b"), "http://h/v1/a@b");
        let keyed = stored("http://h/v1?api_key=sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t");
        assert!(!keyed.contains("sk-proj-Ab3d") && keyed.starts_with("http://h/v1?api_key=rtk_"), "{keyed}");
    }
}
