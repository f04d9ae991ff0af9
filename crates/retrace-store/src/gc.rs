//! Retention and garbage collection (SPEC §4 `retrace retain`, `retrace gc`; §7 "A fork's
//! events").
//!
//! [`retain`] sets a run's tier (a replay has none). [`collect`] plans which runs go ([`plan`],
//! over run metadata only), then asks the backend to delete them and sweep blobs in one atomic
//! step ([`GcStore::collect_garbage`]):
//!
//! **Runs.** A `routine` run expires once it started more than the configured age ago;
//! `incident` and `pinned` runs never do. A run stays while anything keeps it:
//! - it is `running` (never deleted);
//! - its own tier keeps it (not routine, or routine and young enough);
//! - a remaining fork names it as its source: a fork inherits its source's events
//!   `1..fork_at-1` by reference, so a source is kept whole while any fork of it remains. This
//!   gives each run the *effective* tier of SPEC §7: the highest of its own and of every fork
//!   that inherits from it, transitively. (A fork imported whole inherits nothing, but is treated
//!   the same: simplest, and never wrong.)
//! - Replay runs store only their outcome and refer to their source's events: they go with
//!   their source (deleted when it is, or when it is missing), are never kept by their own tier,
//!   and never keep their source, except while `running`: a replay in progress reads its source.
//!
//! **Blobs** (mark and sweep). Kept: every blob a remaining run's events name (`request_ref`,
//! `output_ref`), every blob its fork edits name (`@sha256:…`), everything a kept chained
//! manifest names (transitively), and every blob stored at or after the *cutoff*: the start of
//! the oldest running run, or `now - blob_grace` if earlier. Everything else is deleted, with
//! the cache entries whose output it was; packed segments no blob uses any more and blob files
//! are reclaimed. The vault is not blob-based and is left alone.
//!
//! **Races.** A recording that dedupes onto an existing blob must not lose it. Backends run the
//! whole of [`GcStore::collect_garbage`] (deleting runs, marking, sweeping) as one transaction
//! that excludes commits (SQLite: one `BEGIN IMMEDIATE`; memory: one lock). A commit's batch
//! carries the bytes of every blob its events reference, and the commit checks which are stored
//! inside its own transaction: committed before gc, its references are marked; committed after,
//! it stores again whatever gc swept. What no transaction covers is a blob stored before what
//! references it exists (a fork's edit file, stored before the fork run; a recording's blob
//! stored on its own): the cutoff keeps every blob stored since the oldest running run began,
//! and within the grace period. Blobs of old stores carry no insertion time (`NULL`): they count
//! as old. The plan is checked again inside the transaction: a fork or running replay created
//! since it was made still keeps its source.
mod config;
mod delete;
mod plan;
mod retain;

use retrace_core::run::{RunMeta, RunStatus};

use crate::StoreResult;

pub use config::{RetentionConfig, RetentionConfigError};
pub use delete::{delete, DeleteError};
pub use plan::{blob_cutoff, edit_blobs, plan, settle};
pub use retain::{retain, RetainError, Retained};

/// One day in milliseconds.
pub const DAY_MS: u64 = 24 * 60 * 60 * 1000;

/// Routine runs expire after this many days unless configured (`[retention] routine_days`).
pub const DEFAULT_ROUTINE_DAYS: u64 = 30;

/// Blobs stored this recently are never swept unless configured (`[retention]
/// blob_grace_minutes`): they may be waiting for the run that will reference them.
pub const DEFAULT_BLOB_GRACE_MS: u64 = 60 * 60 * 1000;

/// How to collect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcConfig {
    /// Unix milliseconds now (injected, so tests control age).
    pub now_ms: u64,
    /// A routine run that started longer ago than this has expired.
    pub routine_max_age_ms: u64,
    /// Blobs stored less than this long ago are kept.
    pub blob_grace_ms: u64,
    /// Report what would go, delete nothing.
    pub dry_run: bool,
}

impl GcConfig {
    /// Routine runs expire after `routine_days`; default grace; not a dry run.
    pub fn new(now_ms: u64, routine_days: u64) -> GcConfig {
        GcConfig {
            now_ms,
            routine_max_age_ms: routine_days.saturating_mul(DAY_MS),
            blob_grace_ms: DEFAULT_BLOB_GRACE_MS,
            dry_run: false,
        }
    }

    /// From `[retention]` settings.
    pub fn from_retention(now_ms: u64, retention: &RetentionConfig) -> GcConfig {
        GcConfig {
            blob_grace_ms: retention.blob_grace_minutes.saturating_mul(60_000),
            ..GcConfig::new(now_ms, retention.routine_days)
        }
    }
}

/// What a backend is asked to do in one atomic step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcRequest {
    /// Runs to delete (checked again against the runs stored now: see [`settle`]).
    pub runs: Vec<String>,
    /// Of `runs`, the replays a user named (`retrace delete REPLAY`): they go even though their
    /// source remains, which [`settle`] otherwise spares them for.
    pub named: Vec<String>,
    /// Blobs stored at or after this time (Unix milliseconds) are kept.
    pub blob_cutoff_ms: u64,
    /// Compute the report, change nothing.
    pub dry_run: bool,
}

/// What a collection deleted (or, in a dry run, would delete).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// Runs deleted, oldest first.
    pub runs_deleted: Vec<String>,
    /// Events those runs stored.
    pub events_deleted: u64,
    /// Blobs deleted.
    pub blobs_deleted: u64,
    /// Bytes of storage given back: blob files, packed segments no blob uses any more, blobs
    /// kept in their rows, manifests. (SQLite reuses freed pages; the file does not shrink.)
    pub bytes_freed: u64,
    /// Cache entries dropped because their output blob was deleted.
    pub cache_entries_dropped: u64,
    /// Originals deleted from the vault: those no remaining run holds a token of (QA38 D1).
    pub vault_originals_deleted: u64,
}

/// What a compaction ([`GcStore::compact`]) did to the store's files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Compacted {
    /// Bytes of the database's files (the database and its write-ahead log) before.
    pub bytes_before: u64,
    /// The same after: what the store occupies now, but for blob files.
    pub bytes_after: u64,
}

/// What a backend needs for [`collect`].
pub trait GcStore: Send + Sync {
    /// In one atomic step: deletes the runs of `request` that [`settle`] still allows against
    /// the runs stored now (their events, leases and request prefixes), then deletes every blob
    /// no remaining run references and stored before `request.blob_cutoff_ms` (see the module
    /// doc for what references a blob), the cache entries whose output blob went, and the space
    /// those blobs held. With `dry_run`, reports the same and changes nothing.
    ///
    /// A run whose stored record can't be decoded ([`crate::UnreadableRun`]) goes when
    /// `request.runs` names it; otherwise its events' blobs stay as any run's, and so does
    /// every blob its damaged record still names, and, while its status says running, every
    /// blob stored since it began.
    fn collect_garbage(&self, request: &GcRequest) -> StoreResult<GcReport>;

    /// Gives the space deleted rows left back to the file system (SQLite: `VACUUM`, then a
    /// checkpoint that truncates the write-ahead log). It rewrites the whole database while
    /// holding the write lock, so it refuses (`Busy`, naming them) while any run is `running`:
    /// their commits would wait for it, and fail past the busy timeout. A backend with nothing
    /// to give back reports zeros.
    fn compact(&self) -> StoreResult<Compacted>;
}

/// The `Busy` error of [`GcStore::compact`] when any of `runs` is `running`, naming up to three.
pub fn refuse_while_running(runs: &[RunMeta]) -> StoreResult<()> {
    let running: Vec<&str> =
        runs.iter().filter(|m| m.status == RunStatus::Running).map(|m| m.id.as_str()).collect();
    if running.is_empty() {
        return Ok(());
    }
    let named = running.iter().take(3).copied().collect::<Vec<_>>().join(", ");
    let more = match running.len() {
        n if n > 3 => format!(" and {} more", n - 3),
        _ => String::new(),
    };
    let (runs, are, they) = match running.len() {
        1 => ("run", "is", "it has"),
        _ => ("runs", "are", "they have"),
    };
    Err(crate::StoreError::busy(format!(
        "compacting needs the store to itself, and {runs} {named}{more} {are} running: compact once {they} ended"
    )))
}

/// Plans and runs one collection over `store` (the whole of `retrace gc` and of the daemon's
/// `POST /api/gc`).
///
/// A run whose stored record can't be read is kept, with every blob it may use (see
/// [`GcStore::collect_garbage`]): `retrace delete` removes it by id.
pub fn collect(store: &dyn crate::Store, config: &GcConfig) -> StoreResult<GcReport> {
    let (runs, _unreadable) = store.runs_and_unreadable()?;
    let request = GcRequest {
        runs: plan(&runs, config),
        named: vec![],
        blob_cutoff_ms: blob_cutoff(&runs, config),
        dry_run: config.dry_run,
    };
    store.collect_garbage(&request)
}
