//! [`SqliteStore`]: the embedded default store. One SQLite database in WAL mode holds runs,
//! events, leases and blobs up to [`crate::INLINE_BLOB_MAX`]; larger blobs are files in a blob
//! folder, fsynced before the transaction that references them commits.
//!
//! Cache entries live in the same database, so a batch writes its events, blobs and cache
//! entries in one transaction.
//!
//! One write connection (behind a mutex; every write is one `BEGIN IMMEDIATE` transaction)
//! and a small pool of read connections. Several processes may share a store: writers wait
//! up to the busy timeout for each other, then fail with `Busy`. Durability (see
//! [`Durability`] and `sqlite/sync.rs`): SQLite runs at `synchronous=NORMAL`, and `event` fdatasyncs the
//! WAL after each commit before it returns, except that a batch of a run whose lease this
//! store holds is synced in the run's ack log instead (`sqlite/ack_log.rs`); `batch` has a
//! thread fdatasync the WAL at most every 10 ms after commits; `os` never syncs.
//! Schema: [`schema`].
mod ack_log;
mod blobs;
mod cache;
mod checkpoint;
mod deliveries;
mod events;
mod files;
mod flusher;
mod gc;
mod head_blocks;
mod heads;
mod impls;
mod ledger;
mod pack;
mod read_only;
mod rows;
mod runs;
pub mod schema;
mod staged;
mod summaries;
mod sync;
mod tail;
#[doc(hidden)]
pub use sync::on_wal_synced;
mod vault;
mod wal_vfs;

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use retrace_core::Digest;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::error::ResultExt;
use crate::{Durability, SchemaUpgrade, StoreError, StoreErrorKind, StoreResult};

/// Read connections kept open for reuse.
const READ_POOL: usize = 8;

/// Bytes of the database file a read connection maps into memory (`PRAGMA mmap_size`): reads
/// of mapped pages skip a `pread` each. Mapped pages a process has touched count in its
/// resident set, once per connection that touched them, so the map is kept small: a replay
/// reading a long run from start to end would otherwise hold up to this much per connection.
const READ_MMAP_BYTES: u64 = 64 << 20;

/// Page cache of the write connection (`PRAGMA cache_size`), SQLite's default. Kept small
/// because every commit pays for its size: ending a write transaction, SQLite drops cached
/// pages past the database's end by scanning the whole page hash table, which grows with the
/// pages cached (with 32 MB, about 7% of the commit thread's time on the 16-agent bus). Why
/// the whole table: a B-tree balance renumbers pages through the lock-byte page (page 262145
/// at 4 KB pages), which leaves SQLite's page cache believing a page that far out may be
/// cached, so every transaction that split a page ends with a full scan (seen with gdb on
/// SQLite 3.46). With 16 MB, `record`'s 16 acked writers ran about 10% slower; with the scan
/// patched out of SQLite for a measurement, 16-32 MB saved them their ~2 page reads per event
/// but gained only 2-4%.
const WRITER_CACHE_BYTES: u64 = 2 << 20;

/// Page cache of the write connection during a large transaction ([`LARGE_WRITE_BYTES`] or
/// more): one whose dirty pages outgrow the cache spills them into the WAL before it commits
/// and reads index pages back with `pread`, as an import's 4,096-event chunk (about 13 MB of
/// 1 KB events) did, at a third of its time. The cache fills only as pages are used, and is
/// kept until the next small write, so that back-to-back large transactions (an import's)
/// find the index pages the one before them read.
const LARGE_WRITE_CACHE_BYTES: u64 = 32 << 20;

/// Estimated bytes written from which a transaction counts as large.
const LARGE_WRITE_BYTES: usize = 1 << 20;

/// The map of the snapshot connection, the one [`Store::with_snapshot`] (an export, `knew`)
/// reads through: a long or scattered read would otherwise `pread` most pages of a large store
/// (an export of a 270 MB store spent about a fifth of its time there). The store keeps that
/// connection apart from the pool, so its map lasts from one snapshot to the next (setting
/// `mmap_size` again on each would unmap it and make every snapshot fault its pages in anew:
/// `knew` on a 1M-event store took twice as long). SQLite caps it at its compile-time maximum
/// (2 GB by default).
const SNAPSHOT_MMAP_BYTES: u64 = 2 << 30;

/// Snapshot connections kept: one for a snapshot's thread and one for a thread helping it
/// (`knew` reads the head blocks on a second thread, through a map as wide).
const SNAPSHOT_POOL: usize = 2;

/// Distinguishes stores for [`PINNED`].
static STORE_IDS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The read connection of this thread's [`Store::with_snapshot`], with its store's id: inside
    /// one, this thread's reads use it (and its open read transaction).
    static PINNED: RefCell<Option<(u64, Connection)>> = const { RefCell::new(None) };
}

/// How the store's connections open the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// Reading and writing (creating the file if missing): the store everyone records to.
    ReadWrite,
    /// Reading only ([`SqliteStore::open_read_only`]); `immutable` when there is no WAL to read,
    /// so that SQLite needs no `-shm` file either (it could not create one).
    ReadOnly { immutable: bool },
}

/// Whether a write transaction syncs the WAL under `Durability::Event` before it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WalSyncs {
    Now,
    /// The caller makes the transaction durable another way (an ack log).
    Later,
}

/// The embedded store: one SQLite database in WAL mode plus a blob folder.
#[derive(Debug)]
pub struct SqliteStore {
    /// Unique among the stores of this process (see [`PINNED`]).
    id: u64,
    path: PathBuf,
    label: String,
    durability: Durability,
    busy_timeout_ms: u64,
    files: files::Files,
    writer: Mutex<Connection>,
    /// What the open store keeps in memory: pools and caches, empty at first.
    state: State,
    syncer: Option<sync::Syncer>,
    /// `Durability::Event`: the WAL, synced after every commit.
    wal_sync: Option<sync::WalSync>,
    /// `Durability::Event`: syncs ack-log records while their batches commit.
    flusher: Option<flusher::Flusher>,
    /// `None` in a read-only store.
    checkpointer: Option<checkpoint::Checkpointer>,
    /// How connections open the database.
    access: Access,
    /// Why the store is read-only, for the error of a write (`None`: writable).
    read_only: Option<String>,
    /// Ack logs: written under `Durability::Event`, recovered under every level.
    ack_logs: ack_log::AckLogs,
    /// The schema upgrade opening the store made ([`Store::schema_upgrade`]).
    schema_upgrade: Option<SchemaUpgrade>,
    /// The database file this store opened for writing (device, inode): a write checks that
    /// the path still names it ([`SqliteStore::still_at_path`]). `None`: read-only.
    file_id: Option<(u64, u64)>,
    /// Keeps a [`SqliteStore::temporary`] store's folder alive.
    _temp: Option<tempfile::TempDir>,
}

/// What an open [`SqliteStore`] builds up in memory (every constructor starts it empty).
#[derive(Debug, Default)]
struct State {
    /// Whether the write connection's page cache is [`LARGE_WRITE_CACHE_BYTES`] (changed with
    /// `writer` locked).
    large_cache: AtomicBool,
    /// The write connection's copy of the blobs not yet indexed (locked inside a write
    /// transaction only, after `writer`).
    tail: Mutex<tail::Tail>,
    readers: Mutex<Vec<Connection>>,
    /// The snapshot connections ([`SNAPSHOT_MMAP_BYTES`]) no snapshot holds, at most
    /// [`SNAPSHOT_POOL`].
    snapshots: Mutex<Vec<Connection>>,
    /// Agent name → interned id (ids are never reused, so the cache never goes stale).
    agents: Mutex<HashMap<String, i64>>,
    /// Step name → interned id in `names` (for the head blocks; never reused either).
    names: Mutex<HashMap<String, i64>>,
}

impl SqliteStore {
    /// Opens (creating) the database at `path`, with large blobs under `blobs_dir` (created too).
    pub fn open(
        path: &Path,
        blobs_dir: &Path,
        durability: Durability,
        busy_timeout_ms: u64,
    ) -> StoreResult<SqliteStore> {
        SqliteStore::open_inner(path, blobs_dir, durability, busy_timeout_ms, None)
    }

    /// A store in a new temporary folder, deleted when the store is dropped (for tests and
    /// throwaway replays); durability `os`.
    pub fn temporary() -> StoreResult<SqliteStore> {
        SqliteStore::temporary_with(Durability::Os)
    }

    /// [`SqliteStore::temporary`] at another durability level.
    pub fn temporary_with(durability: Durability) -> StoreResult<SqliteStore> {
        let dir = tempfile::Builder::new()
            .prefix("retrace-store-")
            .tempdir()
            .ctx(|| "creating a temporary store")?;
        let (path, blobs) = (dir.path().join("retrace.db"), dir.path().join("blobs"));
        SqliteStore::open_inner(&path, &blobs, durability, 5_000, Some(dir))
    }

    fn open_inner(
        path: &Path,
        blobs_dir: &Path,
        durability: Durability,
        busy_timeout_ms: u64,
        temp: Option<tempfile::TempDir>,
    ) -> StoreResult<SqliteStore> {
        SqliteStore::open_writable(path, blobs_dir, durability, busy_timeout_ms, temp)
            .map_err(|e| read_only_folder(path, e))
    }

    fn open_writable(
        path: &Path,
        blobs_dir: &Path,
        durability: Durability,
        busy_timeout_ms: u64,
        temp: Option<tempfile::TempDir>,
    ) -> StoreResult<SqliteStore> {
        let label = path.display().to_string();
        std::fs::create_dir_all(blobs_dir)
            .ctx(|| format!("creating the blob folder {}", blobs_dir.display()))?;
        let began = std::time::Instant::now();
        let (writer, segment_bytes, upgraded_from) = open_writer(path, durability, busy_timeout_ms, &label)?;
        // SQLite keeps the WAL beside the file a symlink names (it resolves the path): so must
        // the WAL's syncs and the ack logs, or they would look beside the link, find no WAL
        // and sync nothing. The connection above created the file if it was missing.
        let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let path = resolved.as_path();
        let schema_upgrade = upgraded_from.map(|from| SchemaUpgrade {
            store: label.clone(),
            from,
            to: schema::SCHEMA_VERSION,
            took: began.elapsed(),
        });
        let syncer = match durability {
            Durability::Batch => Some(
                sync::Syncer::start(sync::wal_path(path))
                    .ctx(|| format!("starting the WAL syncer of {label}"))?,
            ),
            Durability::Event | Durability::Os => None,
        };
        let wal_sync = (durability == Durability::Event).then(|| sync::WalSync::new(path));
        let flusher = match durability {
            Durability::Event => Some(
                flusher::Flusher::spawn().ctx(|| format!("starting the ack-log sync thread of {label}"))?,
            ),
            Durability::Batch | Durability::Os => None,
        };
        writer
            .query_row(
                &format!("PRAGMA wal_autocheckpoint = {}", checkpoint::WRITER_AUTOCHECKPOINT_PAGES),
                [],
                |_| Ok(()),
            )
            .ctx(|| format!("configuring {label}"))?;
        writer
            .execute_batch(&format!("PRAGMA cache_size = -{}", WRITER_CACHE_BYTES >> 10))
            .ctx(|| format!("configuring {label}"))?;
        let checkpointer = checkpoint::Checkpointer::start(path.to_path_buf(), durability, busy_timeout_ms)
            .ctx(|| format!("starting the checkpointer of {label}"))?;
        let files = files::Files::new(blobs_dir.to_path_buf(), durability != Durability::Os, segment_bytes);
        Ok(SqliteStore {
            id: STORE_IDS.fetch_add(1, Ordering::Relaxed),
            path: path.to_path_buf(),
            label,
            durability,
            busy_timeout_ms,
            files,
            writer: Mutex::new(writer),
            state: State::default(),
            syncer,
            wal_sync,
            flusher,
            checkpointer: Some(checkpointer),
            access: Access::ReadWrite,
            read_only: None,
            ack_logs: ack_log::AckLogs::new(path),
            schema_upgrade,
            file_id: file_id(path),
            _temp: temp,
        })
    }

    /// Fails when the store's path no longer names the database file this store opened (it was
    /// deleted or replaced under a running recorder): SQLite would go on committing into the
    /// unlinked file, every step acknowledged and all of it gone at exit, with the run reported
    /// `ok` (QA24 D3). Checked inside every write transaction, before it commits: one `stat`.
    fn still_at_path(&self, what: &str) -> StoreResult<()> {
        let Some(opened) = self.file_id else { return Ok(()) };
        if file_id(&self.path) == Some(opened) {
            return Ok(());
        }
        Err(StoreError::new(
            StoreErrorKind::Io,
            format!(
                "{what}: the database file {} was deleted or replaced while this process had it open: \
                 nothing written now could be found there, so recording stops (its runs up to now are in \
                 the file that was deleted or replaced)",
                self.path.display()
            ),
        ))
    }

    /// Refuses `what`, a write, in a read-only store.
    fn writable(&self, what: &str) -> StoreResult<()> {
        match &self.read_only {
            None => Ok(()),
            Some(why) => Err(StoreError::new(
                StoreErrorKind::ReadOnly,
                format!(
                    "{what}: the store {} is open read-only ({why}); copy its folder somewhere \
                 writable and point RETRACE_HOME at the copy to change it",
                    self.label
                ),
            )),
        }
    }

    /// A new connection to the database, opened as the store's are.
    fn connect(&self) -> StoreResult<Connection> {
        open_connection(&self.path, self.durability, self.busy_timeout_ms, self.access)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The folder of blob files.
    pub fn blobs_dir(&self) -> &Path {
        &self.files.dir
    }

    /// Where the file of a large blob `digest` lives (whether or not it exists).
    pub fn blob_file(&self, digest: &Digest) -> PathBuf {
        self.files.dir.join(files::Files::relative_path(digest))
    }

    /// Copies the WAL into the database and truncates it (`PRAGMA wal_checkpoint(TRUNCATE)`),
    /// trying again for up to the busy timeout while the background checkpointer or a reader
    /// keeps it from finishing (SQLite reports that as a result, not an error).
    pub fn checkpoint(&self) -> StoreResult<()> {
        self.writable("checkpointing")?;
        let conn = self.writer.lock();
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(self.busy_timeout_ms);
        loop {
            let busy: i64 = conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
                .ctx(|| format!("checkpointing {}", self.label))?;
            if busy == 0 || std::time::Instant::now() >= deadline {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction on the write connection; `what` names the
    /// operation in errors (lower case, naming the run/seqs).
    fn write<T>(&self, what: &str, f: impl FnOnce(&Connection) -> StoreResult<T>) -> StoreResult<T> {
        self.write_sized(what, 0, f)
    }

    /// [`SqliteStore::write`] of a transaction that writes about `bytes`: from
    /// [`LARGE_WRITE_BYTES`] on, with a page cache of [`LARGE_WRITE_CACHE_BYTES`] for its length.
    fn write_sized<T>(
        &self,
        what: &str,
        bytes: usize,
        f: impl FnOnce(&Connection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        self.write_with(what, bytes, WalSyncs::Now, f)
    }

    /// [`SqliteStore::write_sized`], with the WAL synced under `Durability::Event` only when
    /// `sync` says so (the caller syncs an ack log instead).
    fn write_with<T>(
        &self,
        what: &str,
        bytes: usize,
        sync: WalSyncs,
        f: impl FnOnce(&Connection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        self.writable(what)?;
        let mut conn = self.writer.lock();
        let large = bytes >= LARGE_WRITE_BYTES;
        if large != self.state.large_cache.load(Ordering::Relaxed) {
            let size = if large { LARGE_WRITE_CACHE_BYTES } else { WRITER_CACHE_BYTES };
            // Only the speed of commits depends on the cache's size: a small write goes on
            // with the large cache if it can't be shrunk.
            match conn.execute_batch(&format!("PRAGMA cache_size = -{}", size >> 10)).ctx(|| what) {
                Ok(()) => self.state.large_cache.store(large, Ordering::Relaxed),
                Err(e) if large => return Err(e),
                Err(_) => {}
            }
        }
        let value = (|| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).ctx(|| what)?;
            let value = f(&tx)?;
            self.still_at_path(what)?;
            tx.commit().ctx(|| what)?;
            Ok(value)
        })()
        // What the transaction noted in the tail's copy was rolled back with it.
        .inspect_err(|_| self.state.tail.lock().invalidate())?;
        if let (Some(wal), WalSyncs::Now) = (&self.wal_sync, sync) {
            // Committed but not yet durable: the caller must not acknowledge it.
            wal.sync().ctx(|| format!("{what}: syncing the WAL {}-wal", self.label))?;
        }
        if let Some(syncer) = &self.syncer {
            syncer.committed();
        }
        if let Some(checkpointer) = &self.checkpointer {
            checkpointer.committed();
        }
        Ok(value)
    }

    /// The tail's copy, caught up inside the write transaction `tx` and merged first when it
    /// holds `merge_at` rows ([`tail::MERGE_AT`], or [`tail::BULK_MERGE_AT`] for blobs stored
    /// on their own; see [`tail`]).
    fn caught_up_tail(
        &self,
        tx: &Connection,
        merge_at: usize,
    ) -> StoreResult<parking_lot::MutexGuard<'_, tail::Tail>> {
        let mut tail = self.state.tail.lock();
        tail.catch_up(tx)?;
        if tail.len() >= merge_at {
            self.merge_tail(tx)?;
            tail.cache_rows = 0;
            tail.catch_up(tx)?;
        }
        Ok(tail)
    }

    /// [`tail::merge`] inside the write transaction `tx`, with the large page cache: the
    /// index leaves it rewrites stay in the cache until the commit, instead of spilling.
    fn merge_tail(&self, tx: &Connection) -> StoreResult<()> {
        self.grow_cache(tx)?;
        tail::merge(tx)
    }

    /// Counts `added` cache entries appended in `tx`, and merges `cache_log` once this
    /// connection has appended [`tail::CACHE_MERGE_AT`] since its last merge.
    fn merge_cache_if_full(&self, tx: &Connection, added: usize) -> StoreResult<()> {
        let mut tail = self.state.tail.lock();
        tail.cache_rows += added as i64;
        if tail.cache_rows < tail::CACHE_MERGE_AT {
            return Ok(());
        }
        tail.cache_rows = 0;
        self.grow_cache(tx)?;
        tail::merge_cache(tx)
    }

    /// Gives the write connection the large page cache for the rest of this transaction (the
    /// next small write shrinks it again).
    fn grow_cache(&self, tx: &Connection) -> StoreResult<()> {
        if !self.state.large_cache.load(Ordering::Relaxed) {
            tx.execute_batch(&format!("PRAGMA cache_size = -{}", LARGE_WRITE_CACHE_BYTES >> 10))
                .ctx(|| "growing the page cache to merge the indexes")?;
            self.state.large_cache.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Flushes the WAL to the disk now, whatever the durability level (nothing to do when
    /// there is no WAL).
    fn sync_wal(&self) -> std::io::Result<()> {
        match &self.wal_sync {
            Some(wal) => wal.sync(),
            None => sync::sync_file_at(&sync::wal_path(&self.path)),
        }
    }

    /// Runs `f` on a pooled read connection (this thread's snapshot connection inside
    /// [`Store::with_snapshot`]).
    fn read<T>(&self, f: impl FnOnce(&Connection) -> StoreResult<T>) -> StoreResult<T> {
        let mut f = Some(f);
        let pinned = PINNED.with(|p| match &*p.borrow() {
            Some((id, conn)) if *id == self.id => f.take().map(|f| f(conn)),
            _ => None,
        });
        if let Some(value) = pinned {
            return value;
        }
        let f = f.expect("f is taken only when pinned");
        let conn = self.reader()?;
        let value = f(&conn);
        self.release_reader(conn);
        value
    }

    /// [`SqliteStore::read`], with every statement of `f` reading one snapshot: inside a read
    /// transaction of its own unless the connection is in one already (a pinned snapshot).
    /// `what` names the work for errors. A connection left in a transaction by an error is not
    /// pooled again.
    pub(crate) fn read_one_snapshot<T>(
        &self,
        what: impl Fn() -> String,
        f: impl FnOnce(&Connection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        self.read(|conn| {
            let own = conn.is_autocommit();
            if own {
                conn.execute_batch("BEGIN").ctx(&what)?;
            }
            let value = f(conn)?;
            if own {
                conn.execute_batch("COMMIT").ctx(&what)?;
            }
            Ok(value)
        })
    }

    /// A read connection from the pool, or a new one.
    fn reader(&self) -> StoreResult<Connection> {
        let pooled = self.state.readers.lock().pop();
        match pooled {
            Some(conn) => Ok(conn),
            None => {
                let conn = self.connect()?;
                set_mmap(&conn, READ_MMAP_BYTES)
                    .ctx(|| format!("configuring a read connection of {}", self.label))?;
                Ok(conn)
            }
        }
    }

    /// Returns a read connection to the pool (not one left inside a transaction).
    fn release_reader(&self, conn: Connection) {
        if !conn.is_autocommit() {
            return;
        }
        let mut pool = self.state.readers.lock();
        if pool.len() < READ_POOL {
            pool.push(conn);
        }
    }
}

/// Ends this thread's snapshot of store `id` when dropped (panics included).
struct Unpin<'a> {
    store: &'a SqliteStore,
}

impl Drop for Unpin<'_> {
    fn drop(&mut self) {
        let taken = PINNED.with(|p| p.borrow_mut().take());
        if let Some((id, conn)) = taken {
            debug_assert_eq!(id, self.store.id);
            if conn.execute_batch("COMMIT").is_ok() {
                let mut kept = self.store.state.snapshots.lock();
                if kept.len() < SNAPSHOT_POOL {
                    kept.push(conn);
                }
            }
        }
    }
}

/// Opens the write connection and brings the schema up to date ([`schema::migrate`]): the
/// connection, the database's segment size, and the version it upgraded from.
///
/// Several processes opening a store that doesn't exist yet race to create it, and SQLite
/// answers some of the steps with `SQLITE_BUSY` at once, without calling the busy handler: a
/// connection that holds a shared lock and wants a write lock another is about to take (SQLite
/// gives up rather than deadlock), and the switch to WAL, which needs the database alone. Those
/// steps are tried again, on a fresh connection (one refused part way may hold a lock or a
/// transaction) after a short sleep, until the busy timeout has passed, as any other wait for
/// another writer is.
fn open_writer(
    path: &Path,
    durability: Durability,
    busy_timeout_ms: u64,
    label: &str,
) -> StoreResult<(Connection, usize, Option<i64>)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(busy_timeout_ms);
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        let opened =
            open_connection(path, durability, busy_timeout_ms, Access::ReadWrite).and_then(|writer| {
                schema::migrate(&writer, label).map(|(segment, from)| (writer, segment, from))
            });
        match opened {
            Err(e) if e.kind == StoreErrorKind::Busy && std::time::Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// Sets how many bytes of the database file `conn` maps (`PRAGMA mmap_size`).
fn set_mmap(conn: &Connection, bytes: u64) -> rusqlite::Result<()> {
    conn.query_row(&format!("PRAGMA mmap_size = {bytes}"), [], |_| Ok(())).optional().map(|_| ())
}

/// `error`, opening the store at `path` for writing, said plainly when the store's folder can't
/// be written (a read-only mount, an artifact folder): SQLite's own words for that are "unable
/// to open database file". The commands that only read open such a store with
/// [`SqliteStore::open_read_only`] instead, and the error says which they are.
/// Free space under which an I/O error opening the store is taken for a full disk.
const FULL_BELOW: u64 = 64 << 10;

fn read_only_folder(path: &Path, error: StoreError) -> StoreError {
    let folder = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => return error,
    };
    // SQLite reports a disk with no room left for the WAL index (`-shm`) as a bare I/O error
    // (`xShmMap`): say what it is.
    if error.kind == StoreErrorKind::Io && files::free_bytes(folder).is_some_and(|free| free < FULL_BELOW) {
        let message = format!(
            "{}: the disk holding {} is full; make room there (or point RETRACE_HOME at another disk)",
            error.message,
            folder.display()
        );
        return StoreError::new(StoreErrorKind::Full, message).with_source(error);
    }
    match tempfile::tempfile_in(folder) {
        Err(why) if folder.is_dir() => StoreError::io(format!(
            "the store's folder {} is not writable ({why}), and this writes to the store: copy the \
             folder somewhere writable and point RETRACE_HOME at the copy (runs, show, verify, \
             export, diff, knew, agents, vault audit, serve and the ledger's read it as it is)",
            folder.display()
        ))
        .with_source(error),
        _ => error,
    }
}

fn open_connection(
    path: &Path,
    durability: Durability,
    busy_timeout_ms: u64,
    access: Access,
) -> StoreResult<Connection> {
    let label = path.display().to_string();
    let conn = match access {
        Access::ReadWrite => {
            let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            match wal_vfs::register() {
                Ok(()) => Connection::open_with_flags_and_vfs(path, flags, wal_vfs::NAME),
                // Without it the store is only slower: SQLite's own VFS writes frame by frame.
                Err(_) => Connection::open_with_flags(path, flags),
            }
        }
        Access::ReadOnly { immutable } => {
            let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_URI
                | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            let query = if immutable { "?immutable=1" } else { "?mode=ro" };
            Connection::open_with_flags(format!("file:{}{query}", read_only::uri_path(path)), flags)
        }
    }
    .ctx(|| format!("opening the store {label}"))?;
    conn.set_prepared_statement_cache_capacity(32);
    schema::configure(&conn, durability, busy_timeout_ms, &label)?;
    Ok(conn)
}

/// The device and inode of the file at `path`, if it is there.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}
