//! The store's one error type: a backend-neutral kind, a lower-case message naming what was
//! involved (run, seq, digest, file), and the driver error as `source`.
//!
//! Callers match on [`StoreErrorKind`], never on a SQLite error code: the mapping from driver
//! errors happens here, once ([`StoreError::from_sqlite`], [`StoreError::from_io`]).
use std::error::Error;
use std::fmt;
use std::io;

/// What went wrong, independent of the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreErrorKind {
    /// The run, event or blob does not exist.
    NotFound,
    /// The write contradicts what is stored: a duplicate run, a seq gap or repeat, a lost lease.
    Conflict,
    /// Stored bytes fail their digest or cannot be decoded.
    Corrupt,
    /// Another writer holds the store or the run.
    Busy,
    /// The disk is full.
    Full,
    /// Any other I/O or driver failure.
    Io,
    /// The request itself is wrong: an ambiguous prefix, a bad URL, a digest that doesn't match.
    Invalid,
    /// A write to a store open read-only (a folder this process can't write).
    ReadOnly,
}

impl StoreErrorKind {
    /// A short lower-case name (`not found`, `conflict`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            StoreErrorKind::NotFound => "not found",
            StoreErrorKind::Conflict => "conflict",
            StoreErrorKind::Corrupt => "corrupt",
            StoreErrorKind::Busy => "busy",
            StoreErrorKind::Full => "full",
            StoreErrorKind::Io => "i/o",
            StoreErrorKind::Invalid => "invalid",
            StoreErrorKind::ReadOnly => "read-only",
        }
    }
}

impl fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A store failure: its kind, a message naming what was involved, and the underlying error.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    /// What went wrong, for callers to match on.
    pub kind: StoreErrorKind,
    /// Lower case, naming the run, seq, digest or file involved.
    pub message: String,
    /// The driver or I/O error behind it, if any.
    #[source]
    pub source: Option<Box<dyn Error + Send + Sync>>,
}

/// The result of every store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// The text of an error that was cloned (a `source` can't be cloned, its message can).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct SourceText(String);

impl Clone for StoreError {
    /// Clones kind and message; the `source` is kept as its text.
    fn clone(&self) -> Self {
        StoreError {
            kind: self.kind,
            message: self.message.clone(),
            source: self
                .source
                .as_ref()
                .map(|s| Box::new(SourceText(s.to_string())) as Box<dyn Error + Send + Sync>),
        }
    }
}

impl StoreError {
    /// An error of `kind` with `message` and no source.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> StoreError {
        StoreError { kind, message: message.into(), source: None }
    }

    /// [`StoreErrorKind::NotFound`].
    pub fn not_found(message: impl Into<String>) -> StoreError {
        StoreError::new(StoreErrorKind::NotFound, message)
    }

    /// [`StoreErrorKind::Conflict`].
    pub fn conflict(message: impl Into<String>) -> StoreError {
        StoreError::new(StoreErrorKind::Conflict, message)
    }

    /// [`StoreErrorKind::Corrupt`].
    pub fn corrupt(message: impl Into<String>) -> StoreError {
        StoreError::new(StoreErrorKind::Corrupt, message)
    }

    /// [`StoreErrorKind::Busy`].
    pub fn busy(message: impl Into<String>) -> StoreError {
        StoreError::new(StoreErrorKind::Busy, message)
    }

    /// [`StoreErrorKind::Full`].
    pub fn full(message: impl Into<String>) -> StoreError {
        StoreError::new(StoreErrorKind::Full, message)
    }

    /// [`StoreErrorKind::Io`].
    pub fn io(message: impl Into<String>) -> StoreError {
        StoreError::new(StoreErrorKind::Io, message)
    }

    /// [`StoreErrorKind::Invalid`].
    pub fn invalid(message: impl Into<String>) -> StoreError {
        StoreError::new(StoreErrorKind::Invalid, message)
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl Into<Box<dyn Error + Send + Sync>>) -> StoreError {
        self.source = Some(source.into());
        self
    }

    /// The kind, for matching.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The same error with `context: ` in front of its message.
    pub fn context(mut self, context: impl fmt::Display) -> StoreError {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// Maps a SQLite error met while doing `what` (lower case, naming the run/seq/digest).
    pub fn from_sqlite(err: rusqlite::Error, what: impl fmt::Display) -> StoreError {
        use rusqlite::ErrorCode;
        let (kind, detail) = match &err {
            rusqlite::Error::SqliteFailure(e, _) => match e.code {
                ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => (
                    StoreErrorKind::Busy,
                    "the store is locked by another writer (RETRACE_BUSY_TIMEOUT_MS sets how long to wait)"
                        .to_string(),
                ),
                ErrorCode::DiskFull => (StoreErrorKind::Full, "disk full".to_string()),
                ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => (
                    StoreErrorKind::Corrupt,
                    format!("the database is corrupt or not a retrace store ({err})"),
                ),
                ErrorCode::ConstraintViolation => (StoreErrorKind::Conflict, err.to_string()),
                _ => (StoreErrorKind::Io, err.to_string()),
            },
            rusqlite::Error::QueryReturnedNoRows => (StoreErrorKind::NotFound, err.to_string()),
            rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::Utf8Error(..) => (StoreErrorKind::Corrupt, err.to_string()),
            _ => (StoreErrorKind::Io, err.to_string()),
        };
        StoreError::new(kind, format!("{what}: {detail}")).with_source(err)
    }

    /// Maps an I/O error met while doing `what`; `ENOSPC` becomes [`StoreErrorKind::Full`].
    pub fn from_io(err: io::Error, what: impl fmt::Display) -> StoreError {
        let full = err.raw_os_error() == Some(libc::ENOSPC)
            || err.raw_os_error() == Some(libc::EDQUOT)
            || err.kind() == io::ErrorKind::StorageFull;
        let kind = if full { StoreErrorKind::Full } else { StoreErrorKind::Io };
        let detail = if full { "disk full".to_string() } else { err.to_string() };
        StoreError::new(kind, format!("{what}: {detail}")).with_source(err)
    }
}

/// Adds "while doing what" to driver results: `stmt.execute(..).ctx(|| format!("run {id}"))?`.
pub trait ResultExt<T> {
    /// Maps the error through [`StoreError::from_sqlite`] or [`StoreError::from_io`].
    fn ctx<D: fmt::Display>(self, what: impl FnOnce() -> D) -> StoreResult<T>;
}

impl<T> ResultExt<T> for Result<T, rusqlite::Error> {
    fn ctx<D: fmt::Display>(self, what: impl FnOnce() -> D) -> StoreResult<T> {
        self.map_err(|e| StoreError::from_sqlite(e, what()))
    }
}

impl<T> ResultExt<T> for Result<T, io::Error> {
    fn ctx<D: fmt::Display>(self, what: impl FnOnce() -> D) -> StoreResult<T> {
        self.map_err(|e| StoreError::from_io(e, what()))
    }
}

/// A stretch of seqs as people write it: `seq 8`, or `seqs 8-12`.
pub fn seqs(first: u64, last: u64) -> String {
    match first == last {
        true => format!("seq {first}"),
        false => format!("seqs {first}-{last}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_codes_map_to_neutral_kinds() {
        let failure =
            |code: i32| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), Some("x".into()));
        let kind = |code| StoreError::from_sqlite(failure(code), "committing run r").kind;
        assert_eq!(kind(rusqlite::ffi::SQLITE_BUSY), StoreErrorKind::Busy);
        assert_eq!(kind(rusqlite::ffi::SQLITE_LOCKED), StoreErrorKind::Busy);
        assert_eq!(kind(rusqlite::ffi::SQLITE_FULL), StoreErrorKind::Full);
        assert_eq!(kind(rusqlite::ffi::SQLITE_CORRUPT), StoreErrorKind::Corrupt);
        assert_eq!(kind(rusqlite::ffi::SQLITE_NOTADB), StoreErrorKind::Corrupt);
        assert_eq!(kind(rusqlite::ffi::SQLITE_CONSTRAINT), StoreErrorKind::Conflict);
        let busy = StoreError::from_sqlite(failure(rusqlite::ffi::SQLITE_BUSY), "committing run r");
        assert_eq!(busy.to_string(), "committing run r: the store is locked by another writer (RETRACE_BUSY_TIMEOUT_MS sets how long to wait)");
        let full = StoreError::from_io(io::Error::from_raw_os_error(libc::ENOSPC), "writing f");
        assert_eq!((full.kind, full.to_string().as_str()), (StoreErrorKind::Full, "writing f: disk full"));
        let copy = busy.clone();
        assert_eq!((copy.kind, copy.message), (busy.kind, busy.message));
        assert!(copy.source.is_some());
    }
}
