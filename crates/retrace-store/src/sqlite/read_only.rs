//! Reading a store this process can't write (a read-only mount, a CI artifact), as it is:
//! [`SqliteStore::open_read_only`], with no thread, upgrade or recovery of its own.
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::{ack_log, files, open_connection, schema, sync, Access, SqliteStore, State, STORE_IDS};
use crate::error::ResultExt;
use crate::{Durability, StoreError, StoreResult};

impl SqliteStore {
    /// Opens the database at `path` for reading only, as it is: for a store whose folder can't
    /// be written (a read-only mount, a CI artifact), `why` saying so in the error of any write.
    ///
    /// Nothing is created, upgraded or recovered: the store must exist at this build's schema
    /// version, runs whose recorder died are seen as it left them (`running`), and an ack log
    /// no store applied is named by [`crate::Store::unrecovered`] but not read. Without a WAL
    /// beside it, the file is opened `immutable` (SQLite then needs no `-shm` file, which it
    /// couldn't create). A WAL left beside it (a store copied while open, or whose last process
    /// was killed) holds commits the file doesn't: it is read in place when its `-shm` file is
    /// there too, and otherwise from a private copy of the database and the WAL in a temporary
    /// folder ([`SqliteStore::read_only_copy`]), since SQLite can't read a WAL without one.
    pub fn open_read_only(path: &Path, blobs_dir: &Path, why: &str) -> StoreResult<SqliteStore> {
        let label = path.display().to_string();
        if !path.is_file() {
            return Err(StoreError::not_found(format!("no store at {label}")));
        }
        let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let path = resolved.as_path();
        let wal = sync::wal_path(path);
        let has_wal = std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0);
        let (durability, busy_timeout_ms) = (Durability::Os, crate::open::DEFAULT_BUSY_TIMEOUT_MS);
        let open_checked = |db: &Path, access: Access| {
            let conn = open_connection(db, durability, busy_timeout_ms, access)?;
            let segment_bytes = schema::check_read_only(&conn, &label)?;
            Ok::<_, StoreError>((conn, segment_bytes))
        };
        let (access, (opened, segment_bytes), temp) = match has_wal {
            false => {
                let access = Access::ReadOnly { immutable: true };
                (access, open_checked(path, access)?, None)
            }
            true => {
                let access = Access::ReadOnly { immutable: false };
                match open_checked(path, access) {
                    Ok(opened) => (access, opened, None),
                    Err(_) => {
                        let (temp, copy) = copy_with_wal(path)?;
                        (access, open_checked(&copy, access)?, Some((temp, copy)))
                    }
                }
            }
        };
        let files = files::Files::new(blobs_dir.to_path_buf(), false, segment_bytes);
        let (read_path, temp) = match temp {
            Some((temp, copy)) => (copy, Some(temp)),
            None => (path.to_path_buf(), None),
        };
        Ok(SqliteStore {
            id: STORE_IDS.fetch_add(1, Ordering::Relaxed),
            path: read_path,
            label,
            durability,
            busy_timeout_ms,
            files,
            writer: Mutex::new(opened),
            state: State::default(),
            syncer: None,
            wal_sync: None,
            flusher: None,
            checkpointer: None,
            access,
            read_only: Some(why.to_owned()),
            ack_logs: ack_log::AckLogs::new(path),
            schema_upgrade: None,
            file_id: None,
            _temp: temp,
        })
    }

    /// The temporary copy a read-only store is read from, if [`SqliteStore::open_read_only`]
    /// made one (a WAL it couldn't read in place).
    pub fn read_only_copy(&self) -> Option<&Path> {
        self._temp.as_ref().filter(|_| self.read_only.is_some()).map(|_| self.path.as_path())
    }

    /// Why the store is read-only, if it is ([`SqliteStore::open_read_only`]).
    pub fn read_only(&self) -> Option<&str> {
        self.read_only.as_deref()
    }
}

impl SqliteStore {
    /// A writable private copy of the store at `path` (its database and any WAL, copied into a
    /// temporary folder deleted with the store), large blobs still read from `blobs_dir`: for
    /// what a read-only store can only be asked by writing and rolling back (a dry run of
    /// garbage collection), never for a change meant to last.
    pub fn open_private_copy(path: &Path, blobs_dir: &Path) -> StoreResult<SqliteStore> {
        let (temp, copy) = copy_with_wal(path)?;
        SqliteStore::open_inner(&copy, blobs_dir, Durability::Os, 5_000, Some(temp))
    }
}

/// Copies the database at `db` and its WAL, if there is one, into a new temporary folder
/// (deleted with the returned handle): for a read-only store whose WAL SQLite can't read in
/// place, and for a private copy.
fn copy_with_wal(db: &Path) -> StoreResult<(tempfile::TempDir, PathBuf)> {
    let temp = tempfile::Builder::new()
        .prefix("retrace-copy-")
        .tempdir()
        .ctx(|| "creating a temporary folder for a copy of the store")?;
    let copy = temp.path().join("retrace.db");
    std::fs::copy(db, &copy).ctx(|| format!("copying {} to {}", db.display(), copy.display()))?;
    let wal = sync::wal_path(db);
    if wal.is_file() {
        let copy_wal = sync::wal_path(&copy);
        std::fs::copy(&wal, &copy_wal)
            .ctx(|| format!("copying {} to {}", wal.display(), copy_wal.display()))?;
    }
    Ok((temp, copy))
}

/// `path` as the path of a `file:` URI: every byte but letters, digits, `/` and `-._~`
/// percent-encoded (a `?`, `#` or `%` in a folder name would otherwise end or garble it).
pub(super) fn uri_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::new();
    for &b in path.as_os_str().as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'.' | b'_' | b'~' => uri.push(b as char),
            _ => uri.push_str(&format!("%{b:02X}")),
        }
    }
    uri
}
