//! `Durability::Batch`: a thread that fdatasyncs the `-wal` file at most every 10 ms while
//! commits happen, so an acknowledged event is on disk within about 10 ms.
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

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

fn sync_loop(shared: &(Mutex<State>, Condvar), wal: &PathBuf) {
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
        if let Ok(file) = std::fs::File::open(wal) {
            let _ = file.sync_data();
        }
        std::thread::sleep(SYNC_PERIOD);
    }
}
