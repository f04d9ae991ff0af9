//! Where the store lives and how durable it is: [`StoreConfig`] (from the environment, SPEC §3)
//! and [`open_store`], which creates the folders, opens the backend and recovers runs whose
//! recorder died.
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use crate::error::ResultExt;
use crate::memory::MemoryStore;
use crate::sqlite::SqliteStore;
use crate::{Store, StoreError, StoreResult};

/// When `fsync` runs relative to acknowledging an event (DESIGN.md "Data flow > Record").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Before each commit is acknowledged.
    Event,
    /// At least every 10 ms while commits happen (the default).
    #[default]
    Batch,
    /// Never: the OS writes back when it likes.
    Os,
}

impl Durability {
    /// The wire name: `event`, `batch` or `os`.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Event => "event",
            Durability::Batch => "batch",
            Durability::Os => "os",
        }
    }
}

impl FromStr for Durability {
    type Err = StoreError;
    fn from_str(s: &str) -> StoreResult<Durability> {
        match s {
            "event" => Ok(Durability::Event),
            "batch" => Ok(Durability::Batch),
            "os" => Ok(Durability::Os),
            _ => Err(StoreError::invalid(format!("unknown durability {s:?} (want event, batch or os)"))),
        }
    }
}

/// Which backend holds runs and events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreLocation {
    /// A SQLite database file.
    Sqlite {
        /// The database file.
        path: PathBuf,
    },
    /// Process memory (gone at exit).
    Memory,
}

/// Everything needed to open a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Runs and events.
    pub location: StoreLocation,
    /// The folder for blob files over [`crate::INLINE_BLOB_MAX`].
    pub blobs_dir: PathBuf,
    /// When commits are fsynced.
    pub durability: Durability,
    /// How long a writer waits for another process's transaction before `Busy`.
    pub busy_timeout_ms: u64,
}

/// The default wait for another writer.
pub const DEFAULT_BUSY_TIMEOUT_MS: u64 = 5_000;

impl StoreConfig {
    /// The embedded default under `home`: `home/retrace.db` and `home/blobs/`.
    pub fn in_home(home: &Path) -> StoreConfig {
        StoreConfig {
            location: StoreLocation::Sqlite { path: home.join("retrace.db") },
            blobs_dir: home.join("blobs"),
            durability: Durability::default(),
            busy_timeout_ms: DEFAULT_BUSY_TIMEOUT_MS,
        }
    }

    /// A store in memory.
    pub fn memory() -> StoreConfig {
        StoreConfig {
            location: StoreLocation::Memory,
            blobs_dir: PathBuf::new(),
            durability: Durability::default(),
            busy_timeout_ms: DEFAULT_BUSY_TIMEOUT_MS,
        }
    }

    /// From `RETRACE_STORE`, `RETRACE_HOME`, `RETRACE_BLOBS`, `RETRACE_DURABILITY` and
    /// `RETRACE_BUSY_TIMEOUT_MS` (how long a write waits for another process's lock on the
    /// store before it fails as `busy`; default [`DEFAULT_BUSY_TIMEOUT_MS`]).
    pub fn from_env() -> StoreResult<StoreConfig> {
        StoreConfig::from_vars(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// [`StoreConfig::from_env`] reading variables through `var` (for tests).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> StoreResult<StoreConfig> {
        let home = PathBuf::from(var("RETRACE_HOME").unwrap_or_else(|| "./.retrace".to_string()));
        let mut config = StoreConfig::in_home(&home);
        if let Some(url) = var("RETRACE_STORE") {
            config.location = parse_store_url(&url)?;
            match &config.location {
                StoreLocation::Sqlite { path } => {
                    config.blobs_dir = path.parent().unwrap_or(Path::new(".")).join("blobs");
                }
                StoreLocation::Memory => config.blobs_dir = PathBuf::new(),
            }
        }
        if let Some(url) = var("RETRACE_BLOBS") {
            config.blobs_dir = parse_blobs_url(&url)?;
        }
        if let Some(level) = var("RETRACE_DURABILITY") {
            config.durability = level.parse().map_err(|e: StoreError| e.context("RETRACE_DURABILITY"))?;
        }
        if let Some(ms) = var("RETRACE_BUSY_TIMEOUT_MS") {
            // SQLite takes an i32 of milliseconds: about 24 days at most.
            config.busy_timeout_ms = ms.trim().parse().ok().filter(|&n: &u64| n <= i32::MAX as u64).ok_or_else(|| {
                StoreError::invalid(format!(
                    "RETRACE_BUSY_TIMEOUT_MS {ms:?} is not a number of milliseconds up to {} (the default is {DEFAULT_BUSY_TIMEOUT_MS})",
                    i32::MAX
                ))
            })?;
        }
        Ok(config)
    }
}

fn parse_store_url(url: &str) -> StoreResult<StoreLocation> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err(StoreError::invalid(format!("RETRACE_STORE {url:?} names no database file")));
        }
        return Ok(StoreLocation::Sqlite { path: PathBuf::from(path) });
    }
    if url == "memory:" || url == "memory://" {
        return Ok(StoreLocation::Memory);
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Err(StoreError::invalid(
            "RETRACE_STORE: postgres store not built yet (use sqlite:///path/retrace.db)",
        ));
    }
    Err(StoreError::invalid(format!(
        "RETRACE_STORE {url:?} is not a store url (want sqlite:///path/retrace.db)"
    )))
}

fn parse_blobs_url(url: &str) -> StoreResult<PathBuf> {
    if let Some(path) = url.strip_prefix("file://") {
        if !path.is_empty() {
            return Ok(PathBuf::from(path));
        }
    }
    if url.starts_with("s3://") {
        return Err(StoreError::invalid("RETRACE_BLOBS: the s3 blob store is not built yet"));
    }
    Err(StoreError::invalid(format!("RETRACE_BLOBS {url:?} is not a blob url (want file:///path)")))
}

/// Creates `dir` and the folders above it; a file where a folder goes is said as such
/// (`RETRACE_HOME=/etc/passwd`), not as `create_dir_all`'s "File exists".
fn create_folder(dir: &Path) -> StoreResult<()> {
    if let Some(file) = dir.ancestors().find(|a| a.is_file()) {
        return Err(StoreError::invalid(format!(
            "{} is a file, not a folder: the store needs {} (check RETRACE_HOME / RETRACE_STORE)",
            file.display(),
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))
}

/// Writes a `.gitignore` that ignores everything into `folder`, a store folder this process
/// just made: the default store (`./.retrace`) sits inside the user's project, and its database
/// and its `mask.key` (a secret) must not be committed by a `git add -A` (QA23 D2). And keeps
/// the folder to its owner (mode 0700): the database holds the vault's ciphertexts and its audit
/// log (QA27 S6: world-readable). Best effort: a store works without either.
fn keep_out_of_git(folder: &Path) {
    let text = "# Retrace's store: its database, blobs and mask.key (a secret) stay out of git.\n\
                # Commit exported traces instead: retrace export RUN -o tests/traces/NAME.jsonl\n*\n";
    let _ = std::fs::write(folder.join(".gitignore"), text);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o700));
    }
}

/// Opens the store `config` names, creating its folders, and marks runs whose recorder died as
/// `interrupted` (SPEC §7).
pub fn open_store(config: &StoreConfig) -> StoreResult<Arc<dyn Store>> {
    let store: Arc<dyn Store> = match &config.location {
        StoreLocation::Memory => Arc::new(MemoryStore::new()),
        StoreLocation::Sqlite { path } => {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                let new = !parent.exists();
                create_folder(parent)?;
                if new {
                    keep_out_of_git(parent);
                }
            }
            create_folder(&config.blobs_dir)?;
            // A database file (or its WAL) this process can't write, in a folder it can: said
            // now, naming the file, not as SQLite's bare "attempt to write a readonly database"
            // at the first write (QA31 D2).
            // (A folder it can't write is said when the store opens, as before.)
            let folder_writable = path.exists()
                && path.parent().is_some_and(|f| {
                    tempfile::tempfile_in(if f.as_os_str().is_empty() { Path::new(".") } else { f }).is_ok()
                });
            if folder_writable {
                if let Some(why) = unwritable_file(path) {
                    return Err(StoreError::io(format!(
                        "the store can't be written: {why}; this command writes to it (make it \
                         writable, or copy the folder and point RETRACE_HOME at the copy)"
                    )));
                }
            }
            Arc::new(SqliteStore::open(path, &config.blobs_dir, config.durability, config.busy_timeout_ms)?)
        }
    };
    store.recover_interrupted()?;
    Ok(store)
}

/// Why this process can't write the store `config` names, if it can't: its folder refuses a
/// new file (a read-only mount, an immutable folder), or its database or WAL file refuses to
/// open for writing. A store that doesn't exist yet, or in memory, is writable.
pub fn why_read_only(config: &StoreConfig) -> Option<String> {
    let StoreLocation::Sqlite { path } = &config.location else {
        return None;
    };
    let folder = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => return None,
    };
    if !folder.is_dir() {
        return None;
    }
    if let Err(why) = tempfile::tempfile_in(folder) {
        return Some(format!("its folder {} is not writable: {why}", folder.display()));
    }
    unwritable_file(path)
}

/// Why the database file `path` or its WAL can't be written, if it can't (a file not there can).
fn unwritable_file(path: &Path) -> Option<String> {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    for file in [path, Path::new(&wal)] {
        match std::fs::OpenOptions::new().write(true).open(file) {
            Err(why) if why.kind() != std::io::ErrorKind::NotFound => {
                return Some(format!("{} is not writable: {why}", file.display()));
            }
            _ => {}
        }
    }
    None
}

/// Opens the store `config` names for reading only, as it is, `why` ([`why_read_only`])
/// saying in the error of any write why it can't be written. Nothing is created, upgraded or
/// recovered (see [`SqliteStore::open_read_only`]). A store in memory opens as usual.
///
/// Also returns a note for the user when the store is read from a temporary copy (a WAL that
/// SQLite can't read in place), naming its size.
pub fn open_store_read_only(
    config: &StoreConfig,
    why: &str,
) -> StoreResult<(Arc<dyn Store>, Option<String>)> {
    match &config.location {
        StoreLocation::Memory => Ok((open_store(config)?, None)),
        StoreLocation::Sqlite { path } => {
            let store = SqliteStore::open_read_only(path, &config.blobs_dir, why)?;
            let note = store.read_only_copy().map(|copy| {
                let bytes = std::fs::metadata(copy).map(|m| m.len()).unwrap_or(0);
                format!(
                    "{} has a WAL but no -shm file beside it, which SQLite needs to read the WAL and \
                     can't create there: read from a copy of both ({:.1} MB) in {}",
                    path.display(),
                    bytes as f64 / 1e6,
                    copy.parent().unwrap_or(copy).display()
                )
            });
            Ok((Arc::new(store), note))
        }
    }
}

/// A writable private copy of the store `config` names ([`SqliteStore::open_private_copy`]),
/// recovered as [`open_store`] recovers, and a note naming its size: what a dry run over a
/// store this process can't write works on. A store in memory opens as usual.
pub fn open_store_private_copy(config: &StoreConfig) -> StoreResult<(Arc<dyn Store>, Option<String>)> {
    match &config.location {
        StoreLocation::Memory => Ok((open_store(config)?, None)),
        StoreLocation::Sqlite { path } => {
            let store: Arc<dyn Store> = Arc::new(SqliteStore::open_private_copy(path, &config.blobs_dir)?);
            store.recover_interrupted()?;
            let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            let note =
                format!("working on a private copy of {} ({:.1} MB)", path.display(), bytes as f64 / 1e6);
            Ok((store, Some(note)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreErrorKind;

    fn config(vars: &[(&str, &str)]) -> StoreResult<StoreConfig> {
        StoreConfig::from_vars(|name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
    }

    /// A store folder this process makes ignores itself for git; a folder that was there
    /// (the user's own) gets no file of ours.
    #[test]
    fn a_new_store_folder_keeps_itself_out_of_git() {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let tmp = tempfile::tempdir().unwrap();
            let home = tmp.path().join("private");
            open_store(&StoreConfig::in_home(&home)).unwrap();
            let mode = std::fs::metadata(&home).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "a new store folder is its owner's alone");
        }
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("project").join(".retrace");
        let config = StoreConfig::in_home(&home);
        drop(open_store(&config).unwrap());
        let ignore = std::fs::read_to_string(home.join(".gitignore")).unwrap();
        assert!(ignore.lines().any(|l| l == "*"), "{ignore}");
        let mine = dir.path().join("mine");
        std::fs::create_dir(&mine).unwrap();
        drop(open_store(&StoreConfig::in_home(&mine)).unwrap());
        assert!(!mine.join(".gitignore").exists());
    }

    #[test]
    fn environment_selects_the_store() {
        let home = config(&[("RETRACE_HOME", "/h")]).unwrap();
        assert_eq!(home.location, StoreLocation::Sqlite { path: "/h/retrace.db".into() });
        assert_eq!(home.blobs_dir, PathBuf::from("/h/blobs"));
        assert_eq!(home.durability, Durability::Batch);
        let url = config(&[("RETRACE_STORE", "sqlite:///d/x.db"), ("RETRACE_DURABILITY", "event")]).unwrap();
        assert_eq!(url.location, StoreLocation::Sqlite { path: "/d/x.db".into() });
        assert_eq!((url.blobs_dir.as_path(), url.durability), (Path::new("/d/blobs"), Durability::Event));
        let blobs = config(&[("RETRACE_BLOBS", "file:///b")]).unwrap();
        assert_eq!(blobs.blobs_dir, PathBuf::from("/b"));
        let default = config(&[]).unwrap();
        assert_eq!(default.location, StoreLocation::Sqlite { path: "./.retrace/retrace.db".into() });
        let pg = config(&[("RETRACE_STORE", "postgres://u@h/db")]).unwrap_err();
        assert_eq!(pg.kind, StoreErrorKind::Invalid);
        assert!(pg.message.contains("postgres store not built yet"), "{pg}");
        assert_eq!(config(&[]).unwrap().busy_timeout_ms, DEFAULT_BUSY_TIMEOUT_MS);
        assert_eq!(config(&[("RETRACE_BUSY_TIMEOUT_MS", "60000")]).unwrap().busy_timeout_ms, 60_000);
        assert!(config(&[("RETRACE_BUSY_TIMEOUT_MS", "2147483648")]).is_err(), "more than SQLite takes");
        let bad = config(&[("RETRACE_BUSY_TIMEOUT_MS", "5s")]).unwrap_err();
        assert!(
            bad.message.contains("RETRACE_BUSY_TIMEOUT_MS \"5s\" is not a number of milliseconds"),
            "{bad}"
        );
        assert!(config(&[("RETRACE_DURABILITY", "sometimes")])
            .unwrap_err()
            .message
            .contains("event, batch or os"));
    }
}
