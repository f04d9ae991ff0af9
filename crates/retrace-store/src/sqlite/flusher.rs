//! `fdatasync` on a thread of its own, so a commit runs while its ack-log record reaches the
//! disk (`Durability::Event`).
//!
//! An acknowledged step under `event` durability waits for two things that don't depend on
//! each other: the SQLite commit of its batch (no sync, ~50 µs for one event on this project's
//! 2-core VM) and the `fdatasync` of its record in the run's ack log (the disk's flush, ~120 to
//! 240 µs). Done one after the other on the commit thread, the step waited for their sum: the
//! kernel's early writeback of the record (`sync_file_range`) overlapped none of it, since the
//! flush, not the write, is what takes the time. [`Flusher::start`] hands the `fdatasync` to
//! this thread before the commit, and [`Flusher::wait`] collects it after: the step waits for
//! the longer of the two.
//!
//! The caller spins for the result before it sleeps, whatever else spins
//! ([`crate::spin::spin_unlimited`]: the limit on spinners is for threads waiting on the commit
//! thread; this *is* the commit thread, and the thread it waits for is asleep in the kernel):
//! sleeping would cost a wake-up, which on a VM whose idle vCPU halted takes longer than the
//! flush it waits for. Spinning yields the CPU between rounds, so agents preparing their next
//! steps run. But while a crowd of threads waits for acknowledgments ([`crate::spin::crowded`])
//! it sleeps at once: the CPUs are busy with the agents then, so no vCPU halts, and the spin
//! (with its `sched_yield` calls) was a fifth of the commit thread's time. 16 agents recording
//! 64,000 events under `event` durability used 49-51 us of CPU per event instead of 56-62, at
//! the same rate (22.8-23.3k ev/s).
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::spin::spin_unlimited;

/// How long [`Flusher::wait`] spins before it sleeps: longer than a flush usually takes.
const WAIT_SPIN: Duration = Duration::from_millis(2);

/// A started `fdatasync`, collected with [`Flusher::wait`].
#[derive(Debug)]
#[must_use = "a started sync must be waited for"]
pub(crate) struct Pending(u64);

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<(u64, Arc<File>)>,
    /// The ticket the next [`Flusher::start`] gets.
    next: u64,
    /// The failures of finished syncs not yet collected, by ticket.
    failed: HashMap<u64, io::Error>,
    stop: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the thread: a sync queued, or stopping.
    work: Condvar,
    /// Wakes waiters: a sync finished.
    done: Condvar,
    /// Every ticket below this one has finished (syncs run in ticket order).
    finished: AtomicU64,
}

/// The sync thread of one store.
#[derive(Debug)]
pub(crate) struct Flusher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts the thread.
    pub(crate) fn spawn() -> io::Result<Flusher> {
        let shared = Arc::new(Shared::default());
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("retrace-ack-sync".into())
            .spawn(move || flush_loop(&thread_shared))?;
        Ok(Flusher { shared, thread: Some(thread) })
    }

    /// Starts an `fdatasync` of `file`, which covers every write made to it before this call.
    pub(crate) fn start(&self, file: &Arc<File>) -> Pending {
        let mut state = self.shared.state.lock();
        let ticket = state.next;
        state.next += 1;
        state.queue.push_back((ticket, Arc::clone(file)));
        self.shared.work.notify_one();
        Pending(ticket)
    }

    /// Waits until the sync `pending` finished; returns its error, if it failed.
    pub(crate) fn wait(&self, pending: Pending) -> io::Result<()> {
        let ticket = pending.0;
        let finished = || self.shared.finished.load(Ordering::Acquire) > ticket;
        spin_unlimited(WAIT_SPIN, || finished() || crate::spin::crowded());
        let mut state = self.shared.state.lock();
        while !finished() {
            self.shared.done.wait(&mut state);
        }
        state.failed.remove(&ticket).map_or(Ok(()), Err)
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.work.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn flush_loop(shared: &Shared) {
    loop {
        let (ticket, file) = {
            let mut state = shared.state.lock();
            loop {
                if let Some(next) = state.queue.pop_front() {
                    break next;
                }
                if state.stop {
                    return;
                }
                shared.work.wait(&mut state);
            }
        };
        let synced = file.sync_data();
        let mut state = shared.state.lock();
        if let Err(e) = synced {
            state.failed.insert(ticket, e);
        }
        shared.finished.store(ticket + 1, Ordering::Release);
        shared.done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn every_started_sync_is_collected_in_any_order_and_covers_earlier_writes() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::spawn().unwrap();
        let files: Vec<Arc<File>> =
            (0..3).map(|i| Arc::new(File::create(dir.path().join(format!("f{i}"))).unwrap())).collect();
        let mut pending = Vec::new();
        for (i, file) in files.iter().enumerate() {
            (&**file).write_all(format!("record {i}").as_bytes()).unwrap();
            pending.push(flusher.start(file));
        }
        // Collected last first: a later sync's waiter never takes an earlier one's result.
        for p in pending.into_iter().rev() {
            flusher.wait(p).unwrap();
        }
        for i in 0..3 {
            let read = std::fs::read_to_string(dir.path().join(format!("f{i}"))).unwrap();
            assert_eq!(read, format!("record {i}"));
        }
    }

    #[test]
    fn a_failed_sync_is_reported_to_its_own_waiter_only() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = Flusher::spawn().unwrap();
        let good = Arc::new(File::create(dir.path().join("good")).unwrap());
        // fdatasync of a pipe fails with EINVAL.
        let (read_end, _write_end) = pipe();
        let bad = Arc::new(read_end);
        let (a, b, c) = (flusher.start(&good), flusher.start(&bad), flusher.start(&good));
        assert!(flusher.wait(b).is_err());
        flusher.wait(c).unwrap();
        flusher.wait(a).unwrap();
    }

    #[allow(unsafe_code)]
    fn pipe() -> (File, File) {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: `pipe` fills both descriptors, each then owned by exactly one `File`.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1]))
        }
    }
}
