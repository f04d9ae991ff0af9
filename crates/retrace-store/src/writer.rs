//! [`RunWriter`]: the single sequencer of one run, with group commit.
//!
//! `append` (and `append_cached`, which adds the cache entry the step produced, committed in the
//! same transaction) writes the event's canonical form, then takes one short lock to assign
//! `seq = last + 1`, hash the event onto the chain and queue it; a dedicated thread commits everything waiting as one batch
//! ([`crate::EventStore::commit`]) and then resolves the [`Ticket`]s: an event is acknowledged once
//! its batch committed; [`Ticket::acked`] waits for that as a future (no thread blocked), so
//! agents on an async runtime keep appending while a batch commits and land in the next one.
//! If a commit fails, the writer is poisoned: every pending and future
//! append gets that error, naming the seqs that were lost (recording fails closed).
//!
//! The writer holds the run's lease for its whole life and renews it from the commit thread.
pub(crate) mod lease;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use retrace_core::{Digest, Event};

pub use lease::holder_is_alive;

use crate::cache::check_entry;
use crate::spin;
use crate::{Batch, BlobPut, CacheEntry, LeaseHolder, Store, StoreError, StoreErrorKind, StoreResult};

/// How long the commit thread spins for the next event before it sleeps ([`spin`]): about
/// what a program takes to prepare its next step.
const WORK_SPIN: Duration = Duration::from_micros(200);

/// How long a thread waiting for an acknowledgment spins before it sleeps ([`spin`]): a
/// commit, with its fdatasync under `event` durability.
pub const ACK_SPIN: Duration = Duration::from_micros(1500);

/// An event waiting for its commit, with its blobs and the cache entry it produced.
type Pending = (Event, Vec<BlobPut>, Option<(Digest, CacheEntry)>);

/// Tuning of a [`RunWriter`]; the defaults suit production.
#[derive(Clone, Debug)]
pub struct WriterConfig {
    /// Lease lifetime: a writer silent for this long loses its run.
    pub lease_ttl_ms: u64,
    /// How often the commit thread renews the lease.
    pub renew_every_ms: u64,
    /// The most events one commit carries.
    pub max_batch: usize,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig { lease_ttl_ms: 10_000, renew_every_ms: 2_000, max_batch: 4096 }
    }
}

/// The sequencer of one run: assigns seqs, chains hashes, group-commits. Send + Sync: share it
/// by reference or in an `Arc`.
pub struct RunWriter {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A queued event; [`Ticket::wait`] returns it once acknowledged.
pub struct Ticket {
    /// The seq assigned to the event.
    pub seq: u64,
    event: Event,
    shared: Arc<Shared>,
}

struct Shared {
    store: Arc<dyn Store>,
    run_id: String,
    holder: LeaseHolder,
    config: WriterConfig,
    state: Mutex<State>,
    /// Wakes the commit thread: work queued or closing.
    work: Condvar,
    /// Wakes waiters: a batch committed or the writer was poisoned.
    done: Condvar,
    /// `State::last_seq`, for the commit thread to spin on before it sleeps.
    appended: AtomicU64,
    /// `State::committed`, for waiters to spin on before they sleep.
    acked: AtomicU64,
    /// Set with `State::poison`.
    poisoned: AtomicBool,
}

struct State {
    last_seq: u64,
    head: Option<Digest>,
    queue: VecDeque<Pending>,
    committed: u64,
    /// The hash of event `committed`.
    committed_hash: Option<Digest>,
    poison: Option<StoreError>,
    closing: bool,
    /// Tasks awaiting an acknowledgment, by the seq they wait for.
    wakers: BTreeMap<u64, Waker>,
}

impl RunWriter {
    /// Takes the lease of `run_id` for `holder` and continues after the run's last stored event
    /// (for a fork with no events yet: after the source's event at `fork_at - 1`).
    pub fn open(store: Arc<dyn Store>, run_id: &str, holder: LeaseHolder) -> StoreResult<RunWriter> {
        RunWriter::open_with(store, run_id, holder, WriterConfig::default())
    }

    /// [`RunWriter::open`] with explicit tuning.
    pub fn open_with(
        store: Arc<dyn Store>,
        run_id: &str,
        holder: LeaseHolder,
        config: WriterConfig,
    ) -> StoreResult<RunWriter> {
        store.run(run_id)?;
        store.acquire_lease(run_id, &holder, config.lease_ttl_ms)?;
        let (last_seq, head) = match resume_point(store.as_ref(), run_id) {
            Ok(point) => point,
            Err(e) => {
                let _ = store.release_lease(run_id, &holder);
                return Err(e);
            }
        };
        let state = State {
            last_seq,
            head,
            queue: VecDeque::new(),
            committed: last_seq,
            committed_hash: head,
            poison: None,
            closing: false,
            wakers: BTreeMap::new(),
        };
        let shared = Arc::new(Shared {
            store,
            run_id: run_id.to_string(),
            holder,
            config,
            state: Mutex::new(state),
            work: Condvar::new(),
            done: Condvar::new(),
            appended: AtomicU64::new(last_seq),
            acked: AtomicU64::new(last_seq),
            poisoned: AtomicBool::new(false),
        });
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("retrace-writer-{run_id}"))
            .spawn(move || commit_loop(&thread_shared))
            .map_err(|e| StoreError::from_io(e, format!("starting the writer of run {run_id}")));
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                let _ = shared.store.release_lease(run_id, &shared.holder);
                return Err(e);
            }
        };
        Ok(RunWriter { shared, thread: Mutex::new(Some(thread)) })
    }

    /// The run this writer sequences.
    pub fn run_id(&self) -> &str {
        &self.shared.run_id
    }

    /// Assigns the next seq, seals `event` onto the chain and queues it with its blobs. The
    /// event's `run_id` must be this writer's run; `seq`, `prev` and `hash` are overwritten.
    pub fn append(&self, event: Event, blobs: Vec<BlobPut>) -> StoreResult<Ticket> {
        self.append_cached(event, blobs, None)
    }

    /// [`RunWriter::append`], plus the cache entry the step produced (by step key), written in
    /// the same transaction as the event: caching costs the record path no extra commit. The
    /// entry's output must be the event's `output_ref`, and a side effect's output is never
    /// cached (`Invalid`, before any seq is assigned).
    pub fn append_cached(
        &self,
        mut event: Event,
        blobs: Vec<BlobPut>,
        cache: Option<(Digest, CacheEntry)>,
    ) -> StoreResult<Ticket> {
        let run = &self.shared.run_id;
        if event.run_id != *run {
            return Err(StoreError::invalid(format!(
                "an event of run {} was appended to the writer of run {run}",
                event.run_id
            )));
        }
        if let Some((key, entry)) = &cache {
            check_entry(key, entry).map_err(|e| e.context(format!("recording run {run}")))?;
            if event.output_ref != Some(entry.output_ref) {
                return Err(StoreError::invalid(format!(
                    "recording run {run}: cache entry {key} names output {}, but its event ({} by \
                     agent {}) has output {}",
                    entry.output_ref,
                    event.label(),
                    event.agent_id,
                    event.output_ref.map_or("none".to_owned(), |d| d.to_string())
                )));
            }
        }
        // The canonical form, the costly part of sealing, is written before the lock: all the
        // critical section does is hash it after the seq and the chain's head.
        let unsealed = event.unsealed().map_err(|e| {
            StoreError::invalid(format!(
                "an event of run {run} ({} by agent {}) can't be hashed: {e}",
                event.label(),
                event.agent_id
            ))
            .with_source(e)
        })?;
        let mut st = self.shared.state.lock();
        if let Some(poison) = &st.poison {
            return Err(poison.clone());
        }
        if st.closing {
            return Err(StoreError::invalid(format!("the writer of run {run} is closed")));
        }
        let seq = st.last_seq + 1;
        event.seal_with(&unsealed, seq, st.head);
        st.last_seq = seq;
        st.head = Some(event.hash);
        st.queue.push_back((event.clone(), blobs, cache));
        self.shared.appended.store(seq, Ordering::Release);
        self.shared.work.notify_one();
        drop(st);
        Ok(Ticket { seq, event, shared: Arc::clone(&self.shared) })
    }

    /// [`RunWriter::append`], then waits until the event is acknowledged.
    pub fn append_sync(&self, event: Event, blobs: Vec<BlobPut>) -> StoreResult<Event> {
        self.append(event, blobs)?.wait()
    }

    /// A future that resolves once event `seq` (appended earlier) is acknowledged, or with the
    /// error that poisoned the writer.
    pub fn acked(&self, seq: u64) -> Acked {
        Acked { seq, shared: Arc::clone(&self.shared) }
    }

    /// Waits until everything appended so far is acknowledged.
    pub fn flush(&self) -> StoreResult<()> {
        let mut st = self.shared.state.lock();
        let target = st.last_seq;
        self.shared.wait_for(&mut st, target)
    }

    /// The last appended seq and its hash (`(0, None)` for an empty run).
    pub fn head(&self) -> (u64, Option<Digest>) {
        let st = self.shared.state.lock();
        (st.last_seq, st.head)
    }

    /// The last acknowledged seq and its hash: the run's head as stored. It is [`RunWriter::head`]
    /// once everything appended is acknowledged; after a failed commit, the events appended
    /// since are not stored, and this is where the stored run ends.
    pub fn acknowledged(&self) -> (u64, Option<Digest>) {
        let st = self.shared.state.lock();
        (st.committed, st.committed_hash)
    }

    /// Flushes, stops the commit thread and releases the lease.
    pub fn close(self) -> StoreResult<()> {
        self.shutdown()
    }

    /// [`RunWriter::close`] through a shared reference (for writers owned by a shared session):
    /// flushes, stops the commit thread and releases the lease; later calls do nothing.
    pub fn release(&self) -> StoreResult<()> {
        self.shutdown()
    }

    fn shutdown(&self) -> StoreResult<()> {
        let Some(thread) = self.thread.lock().take() else {
            return Ok(());
        };
        let flushed = self.flush();
        self.shared.state.lock().closing = true;
        self.shared.work.notify_all();
        let joined = thread
            .join()
            .map_err(|_| StoreError::io(format!("the writer thread of run {} panicked", self.shared.run_id)));
        let released = self.shared.store.release_lease(&self.shared.run_id, &self.shared.holder);
        flushed.and(joined).and(released)
    }
}

impl Drop for RunWriter {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

impl fmt::Debug for RunWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (seq, _) = self.head();
        f.debug_struct("RunWriter")
            .field("run_id", &self.shared.run_id)
            .field("holder", &self.shared.holder)
            .field("last_seq", &seq)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// The sealed event (seq, prev and hash set), before it is acknowledged.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// Blocks until the batch holding this event committed; returns the event, or the error
    /// that poisoned the writer.
    pub fn wait(self) -> StoreResult<Event> {
        let mut st = self.shared.state.lock();
        self.shared.wait_for(&mut st, self.seq)?;
        Ok(self.event)
    }
}

impl Ticket {
    /// [`Ticket::wait`] as a future: resolves once the batch holding this event committed,
    /// without blocking a thread meanwhile.
    pub async fn acked(self) -> StoreResult<Event> {
        Acked { seq: self.seq, shared: self.shared }.await?;
        Ok(self.event)
    }
}

/// Resolves once its seq is acknowledged ([`RunWriter::acked`], [`Ticket::acked`]).
pub struct Acked {
    seq: u64,
    shared: Arc<Shared>,
}

impl Future for Acked {
    type Output = StoreResult<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<StoreResult<()>> {
        let mut st = self.shared.state.lock();
        if st.committed >= self.seq {
            return Poll::Ready(Ok(()));
        }
        if let Some(poison) = &st.poison {
            return Poll::Ready(Err(poison.clone()));
        }
        match st.wakers.get_mut(&self.seq) {
            Some(w) if w.will_wake(cx.waker()) => {}
            Some(w) => w.clone_from(cx.waker()),
            None => {
                st.wakers.insert(self.seq, cx.waker().clone());
            }
        }
        Poll::Pending
    }
}

impl fmt::Debug for Acked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acked").field("seq", &self.seq).finish_non_exhaustive()
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket").field("seq", &self.seq).finish_non_exhaustive()
    }
}

impl Shared {
    fn wait_for(&self, st: &mut parking_lot::MutexGuard<'_, State>, seq: u64) -> StoreResult<()> {
        let waiter = spin::waiter();
        if st.committed < seq && st.poison.is_none() {
            parking_lot::MutexGuard::unlocked(st, || {
                waiter.spin_until(ACK_SPIN, || {
                    self.acked.load(Ordering::Acquire) >= seq || self.poisoned.load(Ordering::Acquire)
                })
            });
        }
        loop {
            if st.committed >= seq {
                return Ok(());
            }
            if let Some(poison) = &st.poison {
                return Err(poison.clone());
            }
            self.done.wait(st);
        }
    }
}

/// The commit thread: drains the queue in batches, renews the lease, exits once closing and empty.
fn commit_loop(shared: &Shared) {
    let renew_every = Duration::from_millis(shared.config.renew_every_ms.max(1));
    let mut next_renew = Instant::now() + renew_every;
    let mut taken = shared.state.lock().last_seq;
    loop {
        spin::spin_until(WORK_SPIN, || shared.appended.load(Ordering::Acquire) > taken);
        let batch: Vec<Pending> = {
            let mut st = shared.state.lock();
            while st.queue.is_empty() && !st.closing && Instant::now() < next_renew {
                shared.work.wait_until(&mut st, next_renew);
            }
            if st.queue.is_empty() && st.closing {
                return;
            }
            let n = st.queue.len().min(shared.config.max_batch.max(1));
            let batch: Vec<Pending> = st.queue.drain(..n).collect();
            taken = batch.last().map_or(taken, |(e, _, _)| e.seq);
            batch
        };
        if Instant::now() >= next_renew {
            // A poisoned writer stops renewing: its lease lapses and the run can be recovered.
            if shared.state.lock().poison.is_none() {
                renew(shared);
            }
            next_renew = Instant::now() + renew_every;
        }
        if !batch.is_empty() {
            commit(shared, batch);
        }
    }
}

fn renew(shared: &Shared) {
    let renewed = shared.store.renew_lease(&shared.run_id, &shared.holder, shared.config.lease_ttl_ms);
    // A lost lease means another recorder may own the run now: stop. Transient errors
    // (a busy store) are retried at the next renewal, well before the lease expires.
    if let Err(e) = renewed {
        if matches!(e.kind, StoreErrorKind::Conflict | StoreErrorKind::NotFound) {
            let mut st = shared.state.lock();
            let e = e.context(format!("recording run {} lost its lease", shared.run_id));
            st.poison.get_or_insert(e);
            shared.poisoned.store(true, Ordering::Release);
            st.queue.clear();
            let woken = std::mem::take(&mut st.wakers);
            shared.done.notify_all();
            drop(st);
            woken.into_values().for_each(Waker::wake);
        }
    }
}

fn commit(shared: &Shared, pending: Vec<Pending>) {
    let (first, last) = (pending[0].0.seq, pending[pending.len() - 1].0.seq);
    let mut batch = Batch {
        run_id: shared.run_id.clone(),
        events: Vec::with_capacity(pending.len()),
        blobs: Vec::new(),
        cache: Vec::new(),
    };
    for (event, blobs, cache) in pending {
        batch.events.push(event);
        batch.blobs.extend(blobs);
        batch.cache.extend(cache);
    }
    let result = catch_unwind(AssertUnwindSafe(|| shared.store.commit(&batch)))
        .unwrap_or_else(|_| Err(StoreError::io("the store panicked while committing")));
    let mut st = shared.state.lock();
    let woken = match result {
        Ok(()) => {
            st.committed = last;
            st.committed_hash = batch.events.last().map(|e| e.hash);
            shared.acked.store(last, Ordering::Release);
            let later = st.wakers.split_off(&(last + 1));
            std::mem::replace(&mut st.wakers, later)
        }
        Err(e) => {
            let run = &shared.run_id;
            let e = e.context(format!("recording run {run} failed at {}", crate::error::seqs(first, last)));
            st.poison.get_or_insert(e);
            shared.poisoned.store(true, Ordering::Release);
            st.queue.clear();
            std::mem::take(&mut st.wakers)
        }
    };
    shared.done.notify_all();
    drop(st);
    woken.into_values().for_each(Waker::wake);
}

/// Where a writer continues: the run's last stored event, or for a fork with no events of its
/// own the source's event before the fork point.
fn resume_point(store: &dyn Store, run_id: &str) -> StoreResult<(u64, Option<Digest>)> {
    let last = store.last_seq(run_id)?;
    if last > 0 {
        return Ok((last, Some(resolve_event(store, run_id, last)?.hash)));
    }
    let meta = store.run(run_id)?;
    match (meta.fork_at, meta.source_run) {
        (Some(at), Some(source)) if at > 1 => Ok((at - 1, Some(resolve_event(store, &source, at - 1)?.hash))),
        _ => Ok((0, None)),
    }
}

/// Event `seq` of `run`, following forks that inherit it by reference from their source.
fn resolve_event(store: &dyn Store, run: &str, seq: u64) -> StoreResult<Event> {
    let mut run = run.to_string();
    for _ in 0..64 {
        match store.event(&run, seq) {
            Err(e) if e.kind == StoreErrorKind::NotFound => {
                let meta = store.run(&run)?;
                match (meta.fork_at, meta.source_run) {
                    (Some(at), Some(source)) if seq < at => run = source,
                    _ => return Err(e),
                }
            }
            other => return other,
        }
    }
    Err(StoreError::corrupt(format!("run {run}: fork lineage deeper than 64 runs")))
}

/// Checks that `events` continue run `run` densely after `last` (Conflict otherwise). An empty
/// run may also start at its `fork_at`, whose earlier events it inherits by reference.
pub(crate) fn check_seqs(run: &str, last: u64, fork_at: Option<u64>, events: &[Event]) -> StoreResult<()> {
    let Some(first) = events.first().map(|e| e.seq) else {
        return Ok(());
    };
    let fork_start = last == 0 && fork_at == Some(first);
    if first != last + 1 && !fork_start {
        return Err(StoreError::conflict(if first <= last {
            format!("run {run}: seq {first} is already stored (the last stored seq is {last})")
        } else {
            format!(
                "run {run}: seq {first} would leave a gap (the last stored seq is {last}, want {})",
                last + 1
            )
        }));
    }
    for pair in events.windows(2) {
        if pair[1].seq != pair[0].seq + 1 {
            return Err(StoreError::conflict(format!(
                "run {run}: seqs in a batch must be dense, but seq {} follows seq {}",
                pair[1].seq, pair[0].seq
            )));
        }
    }
    Ok(())
}
