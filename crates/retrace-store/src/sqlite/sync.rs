//! Syncing the `-wal` file ourselves. SQLite's own `synchronous=FULL` syncs it with `fsync`,
//! which on ext4 also commits the file's new mtime to the filesystem journal at every commit;
//! `fdatasync` flushes only the data (and the size, when the WAL grew). So every durability
//! level runs SQLite at `NORMAL` (corruption-safe in WAL mode, syncs only at checkpoints) and:
//! - `Durability::Event`: a batch of a run whose lease the store holds is synced in the run's
//!   ack log ([`super::ack_log`]); every other commit has [`WalSync::sync`] fdatasync the WAL
//!   before the commit returns (so before anything is acknowledged);
//! - `Durability::Batch`: [`Syncer`], a thread, fdatasyncs it at most every 10 ms while commits
//!   happen, so an acknowledged event is on disk within about 10 ms.
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// The WAL of one database, synced on the committing thread (`Durability::Event`).
#[derive(Debug)]
pub(crate) struct WalSync {
    path: PathBuf,
    /// Opened at the first sync. SQLite deletes the WAL only when the database's last
    /// connection closes, and the store's write connection stays open as long as this does, so
    /// the handle names the live WAL (a `TRUNCATE` checkpoint shortens the same file).
    file: Mutex<Option<File>>,
}

impl WalSync {
    /// The WAL of the database at `db`.
    pub(crate) fn new(db: &Path) -> WalSync {
        WalSync { path: wal_path(db), file: Mutex::new(None) }
    }

    /// Flushes everything committed so far to the disk.
    pub(crate) fn sync(&self) -> io::Result<()> {
        let mut file = self.file.lock();
        if file.is_none() {
            *file = Some(File::open(&self.path)?);
        }
        file.as_ref().map_or(Ok(()), File::sync_data)?;
        if let Some(hook) = WAL_SYNCED.get() {
            hook(&self.path);
        }
        Ok(())
    }
}

static WAL_SYNCED: std::sync::OnceLock<fn(&Path)> = std::sync::OnceLock::new();

/// For crash tests: `hook` is called with the path of the `-wal` file after each WAL sync of a
/// store at `Durability::Event` (while the syncing thread holds whatever it held), so a test
/// can copy what a disk would hold if power failed right then. Set once per process; later
/// calls are ignored.
#[doc(hidden)]
pub fn on_wal_synced(hook: fn(&Path)) {
    let _ = WAL_SYNCED.set(hook);
}

/// Opens the file at `path` and fdatasyncs it; a file that doesn't exist has nothing to sync.
pub(crate) fn sync_file_at(path: &Path) -> io::Result<()> {
    match File::open(path) {
        Ok(file) => file.sync_data(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The `-wal` file of the database at `db`.
pub(crate) fn wal_path(db: &Path) -> PathBuf {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    wal.into()
}

/// The longest an acknowledged commit waits for its fsync.
pub(crate) const SYNC_PERIOD: Duration = Duration::from_millis(10);

#[derive(Debug, Default)]
struct State {
    dirty: bool,
    stop: bool,
}

/// The background syncer of one database's WAL.
#[derive(Debug)]
pub(crate) struct Syncer {
    shared: Arc<(Mutex<State>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Syncer {
    /// Starts syncing `wal` (the database path with `-wal` appended) after commits.
    pub(crate) fn start(wal: PathBuf) -> std::io::Result<Syncer> {
        let shared = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("retrace-wal-sync".into())
            .spawn(move || sync_loop(&thread_shared, &wal))?;
        Ok(Syncer { shared, thread: Some(thread) })
    }

    /// A commit happened: sync within [`SYNC_PERIOD`].
    pub(crate) fn committed(&self) {
        let (state, wake) = &*self.shared;
        let mut state = state.lock();
        if !state.dirty {
            state.dirty = true;
            wake.notify_one();
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.shared.0.lock().stop = true;
        self.shared.1.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn sync_loop(shared: &(Mutex<State>, Condvar), wal: &Path) {
    let (state, wake) = shared;
    loop {
        {
            let mut state = state.lock();
            while !state.dirty && !state.stop {
                wake.wait(&mut state);
            }
            if !state.dirty {
                return;
            }
            state.dirty = false;
        }
        // Opened by path each time: SQLite may recreate the WAL after a checkpoint. A failure
        // here can't be reported to anyone; SQLite's own checkpoints fsync as well.
        let _ = sync_file_at(wal);
        std::thread::sleep(SYNC_PERIOD);
    }
}
