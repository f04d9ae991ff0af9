//! WAL checkpoints, off the commit path at every durability level: the write connection runs
//! with a large `wal_autocheckpoint` (a safety valve only), and this thread, with its own
//! connection, runs a `PASSIVE` checkpoint at most every [`CHECKPOINT_PERIOD`] while commits
//! happen. A passive checkpoint never blocks writers or readers.
//!
//! Under `Durability::Event` the writer used to checkpoint itself every 2 MB, so that the WAL
//! restarted and each per-commit `fdatasync` overwrote allocated blocks instead of growing the
//! file (2.3x against 2.9x the raw fsync latency). Commits of a leased run are now synced in its
//! ack log (`super::ack_log`), not in the WAL, and a checkpoint in the commit path, which syncs
//! every WAL frame written since the last one, cost those commits their p99 (measured 3.0-3.7 ms
//! against 1.2-1.7 ms with the checkpoints on this thread). Commits the ack log doesn't take
//! still fdatasync the WAL, now a growing file between restarts: they are rare (run and lease
//! updates, batches with blobs kept as files).
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rusqlite::Connection;

use crate::Durability;

/// The shortest time between two background checkpoints.
pub(crate) const CHECKPOINT_PERIOD: Duration = Duration::from_millis(50);

/// `PRAGMA wal_autocheckpoint` of the write connection (pages) under a background
/// checkpointer: it checkpoints in a commit only when the thread falls this far behind.
pub(crate) const WRITER_AUTOCHECKPOINT_PAGES: u32 = 16 * 1024;

#[derive(Debug, Default)]
struct State {
    dirty: bool,
    stop: bool,
}

/// The background checkpointer of one database.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    shared: Arc<(Mutex<State>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts checkpointing the database at `path`.
    pub(crate) fn start(
        path: PathBuf,
        durability: Durability,
        busy_timeout_ms: u64,
    ) -> std::io::Result<Self> {
        let shared = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("retrace-checkpoint".into())
            .spawn(move || checkpoint_loop(&thread_shared, &path, durability, busy_timeout_ms))?;
        Ok(Checkpointer { shared, thread: Some(thread) })
    }

    /// A commit happened: checkpoint soon.
    pub(crate) fn committed(&self) {
        let (state, wake) = &*self.shared;
        let mut state = state.lock();
        if !state.dirty {
            state.dirty = true;
            wake.notify_one();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.shared.0.lock().stop = true;
        self.shared.1.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn checkpoint_loop(
    shared: &(Mutex<State>, Condvar),
    path: &Path,
    durability: Durability,
    busy_timeout_ms: u64,
) {
    let (state, wake) = shared;
    let mut conn: Option<Connection> = None;
    loop {
        {
            let mut state = state.lock();
            while !state.dirty && !state.stop {
                wake.wait(&mut state);
            }
            if state.stop {
                return;
            }
            state.dirty = false;
        }
        if conn.is_none() {
            conn = super::open_connection(path, durability, busy_timeout_ms, super::Access::ReadWrite).ok();
        }
        // A failure here can't be reported to anyone; the writer's own (rare) automatic
        // checkpoints still bound the WAL.
        if let Some(conn) = &conn {
            let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        }
        let deadline = Instant::now() + CHECKPOINT_PERIOD;
        let mut state = state.lock();
        while !state.stop && !wake.wait_until(&mut state, deadline).timed_out() {}
    }
}
