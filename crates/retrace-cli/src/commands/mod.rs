//! One module per subcommand.
pub mod agents;
pub mod approve;
pub mod delete;
pub mod demo;
pub mod diff;
pub mod export;
pub mod fork;
pub mod gate;
pub mod gc;
pub mod import;
pub mod knew;
pub mod ledger;
pub mod record;
pub mod replay;
pub mod resolve;
pub mod retain;
pub mod runs;
pub mod serve;
pub mod show;
pub mod simulate;
pub mod vault;
pub mod verify;

use std::sync::Arc;

use retrace_core::run::RunMeta;
use retrace_store::{open_store, Store, StoreConfig, StoreLocation};

use crate::exit::usage_hint;

/// A `--*-timeout S` value: a number of seconds, 0 or more, finite and at most a year (a longer
/// one is not a timeout a person means, and would overflow a `Duration`).
pub(crate) fn seconds(text: &str) -> Result<f64, String> {
    const YEAR: f64 = 365.0 * 24.0 * 3600.0;
    match text.trim().parse::<f64>() {
        Ok(s) if (0.0..=YEAR).contains(&s) => Ok(s),
        Ok(_) => Err(format!("{text} is not between 0 and {YEAR} seconds (a year)")),
        Err(_) => Err(format!("{text} is not a number of seconds")),
    }
}

/// An `--upstream-timeout S` value: as [`seconds`], but more than 0 (an upstream given no
/// time at all fails every call; a small value would be rounded to nothing).
pub(crate) fn positive_seconds(text: &str) -> Result<f64, String> {
    match seconds(text)? {
        s if s >= 0.001 => Ok(s),
        _ => Err(format!("{text} would time out every call: give at least 0.001 seconds")),
    }
}

/// A `--stall-timeout S` value: as [`seconds`], but more than 0 (no time at all declares a
/// stall wherever a step waits for another agent, even in a replay that would go through).
pub(crate) fn stall_seconds(text: &str) -> Result<f64, String> {
    match seconds(text)? {
        s if s > 0.0 => Ok(s),
        _ => Err(format!("{text} would declare a stall wherever an agent waits: give more than 0 seconds")),
    }
}

/// Opens the store named by the environment (RETRACE_STORE / RETRACE_HOME), creating it if
/// there is none: for the commands that record or import.
pub fn store_from_env() -> anyhow::Result<Arc<dyn Store>> {
    let config = StoreConfig::from_env()?;
    if let StoreLocation::Sqlite { path } = &config.location {
        check_folder(path)?;
    }
    open(&config)
}

/// Opens the store named by the environment, which must exist: the commands that read, or
/// change runs already there, never leave an empty store at a mistyped path.
pub fn existing_store_from_env() -> anyhow::Result<Arc<dyn Store>> {
    open(&existing_config_from_env()?)
}

/// [`existing_store_from_env`] for `gc` and `delete`: with `dry_run`, a store this process can't
/// write (a CI artifact) is worked on as a private copy, with a note, since a dry run writes
/// and rolls back; without, it is refused as for any write.
pub fn store_for_collecting(dry_run: bool) -> anyhow::Result<Arc<dyn Store>> {
    let config = existing_config_from_env()?;
    let why = dry_run.then(|| retrace_store::why_read_only(&config)).flatten();
    let Some(why) = why else {
        return open(&config);
    };
    let (store, note) = retrace_store::open_store_private_copy(&config)?;
    eprintln!("retrace: the store is read-only ({why}): the dry run works on a private copy");
    if let Some(note) = note {
        eprintln!("retrace: {note}");
    }
    Ok(store)
}

/// [`existing_store_from_env`] for the commands that only read (`runs`, `show`, `verify`,
/// `export`, `diff`, `knew`, `agents`, `vault audit`, the ledger's): a store this process can't write (a read-only
/// mount, a CI artifact) is read as it is, with a note on stderr, instead of refused.
pub fn readable_store_from_env() -> anyhow::Result<Arc<dyn Store>> {
    let config = existing_config_from_env()?;
    Ok(open_readable(&config)?.0)
}

/// Opens the store `config` names, read-only as it is when this process can't write it (with
/// a note on stderr): the store, and why it is read-only if it is.
fn open_readable(config: &StoreConfig) -> anyhow::Result<(Arc<dyn Store>, Option<String>)> {
    let why = match retrace_store::why_read_only(config) {
        Some(why) => why,
        None => match open(config) {
            Ok(store) => return Ok((store, None)),
            // A disk with no room left for the WAL index: reading needs none of it, and moving
            // runs off that disk (`export -o /elsewhere`) is what its user wants to do.
            Err(e) if is_full(&e) => format!("its disk is full ({})", first_line(&e)),
            Err(e) => return Err(e),
        },
    };
    let (store, copied) = retrace_store::open_store_read_only(config, &why)?;
    eprintln!("retrace: reading the store read-only, as it was left ({why})");
    if let Some(note) = copied {
        eprintln!("retrace: {note}");
    }
    Ok((store, Some(why)))
}

/// Whether `e` is the store's disk being full.
fn is_full(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|e| e.downcast_ref::<retrace_store::StoreError>())
        .any(|e| e.kind == retrace_store::StoreErrorKind::Full)
}

/// The first line of `e`'s message.
fn first_line(e: &anyhow::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_owned()
}

/// The store `serve` runs over: the one the environment names, created if there is none, or,
/// when it exists and this process can't write it (a CI artifact, a read-only mount), read as
/// it is so its runs can still be browsed: why it is read-only, then.
pub fn served_store_from_env() -> anyhow::Result<(Arc<dyn Store>, Option<String>)> {
    let config = StoreConfig::from_env()?;
    if let StoreLocation::Sqlite { path } = &config.location {
        check_folder(path)?;
        if path.is_file() {
            return open_readable(&config);
        }
    }
    Ok((open(&config)?, None))
}

/// What to say when the store the environment names doesn't exist yet (a SQLite file not
/// made), else `None`.
pub fn missing_store_from_env() -> anyhow::Result<Option<String>> {
    let config = StoreConfig::from_env()?;
    if let StoreLocation::Sqlite { path } = &config.location {
        check_folder(path)?;
        if !path.is_file() {
            return Ok(Some(format!("no store at {}: nothing has been recorded there", path.display())));
        }
    }
    Ok(None)
}

/// The store the environment names, refused unless it exists.
fn existing_config_from_env() -> anyhow::Result<StoreConfig> {
    let config = StoreConfig::from_env()?;
    if let StoreLocation::Sqlite { path } = &config.location {
        check_folder(path)?;
        if !path.is_file() {
            return Err(usage_hint(
                format!("no store at {}: nothing has been recorded there", path.display()),
                "record a run first (`retrace demo`, `retrace record -- CMD`), or point RETRACE_HOME \
                 (a folder, default ./.retrace) or RETRACE_STORE (sqlite:///path/retrace.db) at a store",
            ));
        }
    }
    Ok(config)
}

/// Refuses a database path whose folder is a file (RETRACE_HOME set to a file's name).
fn check_folder(db: &std::path::Path) -> anyhow::Result<()> {
    match db.parent().filter(|p| p.exists() && !p.is_dir()) {
        Some(folder) => Err(usage_hint(
            format!("the store's folder {} is a file", folder.display()),
            "RETRACE_HOME names a folder (created if missing); RETRACE_STORE a database file",
        )),
        None => Ok(()),
    }
}

/// Opens `config` for writing, saying what to do about a store this user can't write (the
/// commands that only read open it with [`readable_store_from_env`]).
///
/// Opening an older store upgrades its schema: that is said on stderr, since older builds of
/// retrace can't open the store afterwards.
pub(crate) fn open(config: &StoreConfig) -> anyhow::Result<Arc<dyn Store>> {
    let store = open_store(config).map_err(|e| {
        let text = e.to_string().to_lowercase();
        match text.contains("readonly") || text.contains("read-only") || text.contains("permission denied") {
            true => {
                let hint = "this command writes to the store, so its folder and files must be writable \
                            by you (SQLite keeps its -wal and -shm files beside the database): check \
                            their owner and mode, or copy the store (`retrace export` / `import`); \
                            runs, show, verify, export, diff and knew read a store they can't write";
                usage_hint(format!("{e:#}"), hint)
            }
            false => e.into(),
        }
    })?;
    if let Some(upgrade) = store.schema_upgrade() {
        eprintln!("retrace: {upgrade}");
    }
    Ok(store)
}

#[derive(Clone)]
/// The masking of new recordings, once per process: the store's mask key (generated into
/// `RETRACE_HOME/mask.key` on first use, with a notice) and `./retrace.toml`'s rules.
pub struct MaskSetup {
    /// The mask key.
    pub key: retrace_core::mask::MaskKey,
    /// The rules for new recordings.
    pub rules: retrace_core::mask::MaskRules,
}

/// [`MaskSetup`] from the environment.
pub fn mask_from_env() -> anyhow::Result<MaskSetup> {
    use retrace_runtime::masking;
    static NOTICE: std::sync::Once = std::sync::Once::new();
    let resolved = masking::resolve_key(&StoreConfig::from_env()?)?;
    if let Some(notice) = resolved.notice {
        NOTICE.call_once(|| eprintln!("{notice}"));
    }
    Ok(MaskSetup { key: resolved.key, rules: masking::rules_from_cwd()? })
}

/// [`MaskSetup`] for masking what a command only writes down (a reveal's or an approval's
/// reason): the store's key when it has one, else a key of this process alone, none written
/// (QA27 S3: `vault reveal` made a new `mask.key` in a store whose key was lost, which `replay`
/// then named as this machine's key).
pub fn mask_without_new_key() -> anyhow::Result<MaskSetup> {
    use retrace_runtime::masking;
    let key = masking::existing_key(&StoreConfig::from_env()?)?.unwrap_or_else(masking::ephemeral_key);
    Ok(MaskSetup { key, rules: masking::rules_from_cwd()? })
}

/// [`MaskSetup`] for re-executing `source` (`replay`, `fork`): as [`mask_from_env`], except that
/// a store with no mask key yet is not given one when `source` (or a run it forks from) holds
/// tokens: a key generated now could never match them. Refused as `gate` refuses it, naming the
/// key the run needs (QA14 D2: a new key was generated, then named as "this machine's key").
pub fn mask_for_source(store: &dyn Store, source: &RunMeta) -> anyhow::Result<MaskSetup> {
    let config = StoreConfig::from_env()?;
    if retrace_runtime::masking::existing_key(&config)?.is_none() {
        let missing = match retrace_runtime::masking::home_of(&config) {
            Some(home) => format!("RETRACE_MASK_KEY is unset and {} has no mask.key", home.display()),
            None => "RETRACE_MASK_KEY is unset".to_owned(),
        };
        refuse_tokens_without_key(store, source, &missing)?;
    }
    let mask = mask_from_env()?;
    check_mask_key(source, &mask.key)?;
    Ok(mask)
}

/// Refuses a run that holds tokens, or re-executes one that does, when no mask key is set
/// (`missing` says how): replayed under a new key its tokens would never match. Said as a key
/// not set (the commonest CI mistake: the secret not configured), naming the key the run needs.
pub fn refuse_tokens_without_key(store: &dyn Store, source: &RunMeta, missing: &str) -> anyhow::Result<()> {
    let mut run = Some(source.clone());
    while let Some(meta) = run.take() {
        if meta.holds_tokens {
            let made_under = match &meta.mask_key_fingerprint {
                Some(fp) => format!("mask key {fp}"),
                None => "a mask key it doesn't name".into(),
            };
            return Err(usage_hint(
                format!(
                    "run {} holds masked tokens made under {made_under}, and no mask key is set: {missing}",
                    meta.id
                ),
                mask_key_hint(&meta),
            ));
        }
        run = meta.source_run.as_deref().and_then(|id| store.run(id).ok());
    }
    Ok(())
}

/// Refuses to re-execute `source`, which holds tokens, under a mask key other than the one it
/// was recorded with ([`retrace_runtime::masking::check_key`]), saying which key to set.
pub fn check_mask_key(source: &RunMeta, key: &retrace_core::mask::MaskKey) -> anyhow::Result<()> {
    retrace_runtime::masking::check_key(source, Some(key))
        .map_err(|e| usage_hint(e.to_string(), mask_key_hint(source)))
}

/// What to set for a run recorded under another mask key.
fn mask_key_hint(run: &RunMeta) -> String {
    let fix = match &run.mask_key_fingerprint {
        Some(fp) => format!("the key with fingerprint {fp}"),
        None => "the key it was recorded with".into(),
    };
    format!(
        "set RETRACE_MASK_KEY to {fix} (the recording machine's mask.key, in RETRACE_HOME or beside \
         RETRACE_STORE's database; in CI, a secret)"
    )
}

/// [`MaskSetup`] for a store this process can't write (`serve` over a CI artifact): its mask key
/// if it can be read, else one of this process's own. Nothing can be recorded into the store,
/// so the key never masks anything stored; a key file that isn't there (it is generated on a
/// store's first use) is not an error.
pub fn mask_for_read_only() -> anyhow::Result<MaskSetup> {
    match mask_from_env() {
        Ok(mask) => Ok(mask),
        Err(_) => Ok(MaskSetup {
            key: retrace_runtime::masking::ephemeral_key(),
            rules: retrace_runtime::masking::rules_from_cwd()?,
        }),
    }
}
