//! The run writer over any backend: concurrent appends, resumption, poisoning, one holder.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use retrace_core::{Digest, Event, EventType};

use super::{raw, sample_run, MakeStore};
use crate::intercept::{Intercepted, Interceptor};
use crate::{
    Batch, BlobAt, BlobPut, EventStore, LeaseHolder, RunWriter, Store, StoreError, StoreErrorKind,
    StoreResult,
};

fn step(run: &str, agent: &str, i: u64) -> Event {
    let mut e = Event::new(run, agent, EventType::ToolCall);
    e.name = Some("tool".into());
    e.key = Digest::of(format!("{agent} {i}").as_bytes());
    e
}

/// Checks that `run` holds seqs `1..=n`, each chained to the one before.
fn assert_chain(store: &dyn Store, run: &str, n: u64) -> Vec<Event> {
    let events = store.events(run, 1, usize::MAX).unwrap();
    assert_eq!(events.len() as u64, n);
    let mut prev = None;
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1);
        assert_eq!(e.prev, prev, "seq {} links to its predecessor", e.seq);
        assert_eq!(e.compute_hash().unwrap(), e.hash, "seq {} hash", e.seq);
        prev = Some(e.hash);
    }
    events
}

/// 16 threads append at once: seqs are dense and unique, the chain verifies, tickets resolve
/// to the stored events.
pub fn writer_concurrent_appends(make: MakeStore<'_>) {
    fn shareable<T: Send + Sync>() {}
    shareable::<RunWriter>();
    shareable::<crate::Ticket>();
    let store = make();
    store.create_run(&sample_run("busy-run", 1)).unwrap();
    let writer = RunWriter::open(Arc::clone(&store), "busy-run", LeaseHolder::current()).unwrap();
    let per_thread = 100u64;
    let acked: Vec<Event> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..16)
            .map(|t| {
                let writer = &writer;
                s.spawn(move || {
                    let agent = format!("agent{t}");
                    let mut tickets = Vec::new();
                    let mut acked = Vec::new();
                    for i in 0..per_thread {
                        let blob = raw(format!("output {t} {i}").as_bytes());
                        let mut e = step("busy-run", &agent, i);
                        e.output_ref = Some(blob.digest);
                        if i % 10 == 0 {
                            acked.push(writer.append_sync(e, vec![blob]).unwrap());
                        } else {
                            tickets.push(writer.append(e, vec![blob]).unwrap());
                        }
                    }
                    acked.extend(tickets.into_iter().map(|t| t.wait().unwrap()));
                    acked
                })
            })
            .collect();
        threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
    });
    writer.flush().unwrap();
    let n = 16 * per_thread;
    assert_eq!(writer.head().0, n);
    let stored = assert_chain(store.as_ref(), "busy-run", n);
    assert_eq!(writer.head().1, Some(stored[stored.len() - 1].hash));
    for e in &acked {
        assert_eq!(&stored[e.seq as usize - 1], e);
        assert!(store.has_blob(&e.output_ref.unwrap()).unwrap());
    }
    assert_eq!(store.agent_seqs("busy-run", "agent3").unwrap().len() as u64, per_thread);
    writer.close().unwrap();
    assert_eq!(store.lease_holder("busy-run").unwrap(), None, "close releases the lease");
}

/// A writer reopened on a run continues its seqs and its chain.
pub fn writer_resumes_after_reopen(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("resume", 1)).unwrap();
    for round in 0..3 {
        let writer = RunWriter::open(Arc::clone(&store), "resume", LeaseHolder::current()).unwrap();
        for i in 0..5 {
            writer.append(step("resume", "a", round * 5 + i), Vec::new()).unwrap();
        }
        writer.close().unwrap();
    }
    assert_chain(store.as_ref(), "resume", 15);
    let writer = RunWriter::open(Arc::clone(&store), "resume", LeaseHolder::current()).unwrap();
    let wrong_run = writer.append(step("other", "a", 0), Vec::new()).unwrap_err();
    assert_eq!(wrong_run.kind, StoreErrorKind::Invalid);
    assert_eq!(writer.append_sync(step("resume", "a", 100), Vec::new()).unwrap().seq, writer.head().0);
}

/// After a failed commit the writer is poisoned: the pending tickets and every later append
/// get the error, which names the seqs; nothing after the failure is stored.
pub fn writer_poisoned_after_failing_commit(make: MakeStore<'_>) {
    let store = Arc::new(Flaky::new(make()));
    store.create_run(&sample_run("poisoned", 1)).unwrap();
    let writer = RunWriter::open(store.clone(), "poisoned", LeaseHolder::current()).unwrap();
    let stored = writer.append_sync(step("poisoned", "a", 1), Vec::new()).unwrap();
    store.fail_commits(true);
    let err = writer.append(step("poisoned", "a", 2), Vec::new()).unwrap().wait().unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Io);
    assert!(err.message.contains("poisoned") && err.message.contains("at seq 2"), "{err}");
    assert!(err.message.contains("injected failure"), "{err}");
    store.fail_commits(false);
    let later = writer.append(step("poisoned", "a", 3), Vec::new()).unwrap_err();
    assert_eq!((later.kind, later.message.as_str()), (err.kind, err.message.as_str()));
    assert!(writer.flush().is_err());
    // The run's head as stored is the last acknowledged event, not the one that failed.
    assert_eq!(writer.head().0, 2, "the failed event took a seq");
    assert_eq!(writer.acknowledged(), (1, Some(stored.hash)));
    assert!(writer.close().is_err());
    assert_eq!(store.last_seq("poisoned").unwrap(), 1);
}

/// A second writer on a run whose lease is held elsewhere is `Busy`, and so is a second writer
/// of the same process when each holds as [`LeaseHolder::unique`]: the refused one leaves the
/// first its lease and its seqs.
pub fn writer_refuses_second_holder(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("owned", 1)).unwrap();
    let first = RunWriter::open(Arc::clone(&store), "owned", LeaseHolder::current()).unwrap();
    let second = RunWriter::open(Arc::clone(&store), "owned", LeaseHolder("elsewhere:1:1".into()));
    assert_eq!(second.unwrap_err().kind, StoreErrorKind::Busy);
    drop(first);
    assert_eq!(store.lease_holder("owned").unwrap(), None, "dropping releases the lease");

    let first = RunWriter::open(Arc::clone(&store), "owned", LeaseHolder::unique()).unwrap();
    let held = store.lease_holder("owned").unwrap().expect("the first writer holds the run");
    first.append_sync(step("owned", "a", 0), vec![]).unwrap();
    let second = RunWriter::open(Arc::clone(&store), "owned", LeaseHolder::unique()).unwrap_err();
    assert_eq!(second.kind, StoreErrorKind::Busy, "{second}");
    assert!(second.message.contains(&held.0), "the refusal names the holder: {second}");
    assert_eq!(store.lease_holder("owned").unwrap(), Some(held), "the refused writer left the lease alone");
    first.append_sync(step("owned", "a", 1), vec![]).unwrap();
    first.close().unwrap();
    assert_eq!(store.last_seq("owned").unwrap(), 2);
    assert_eq!(store.lease_holder("owned").unwrap(), None);
    let missing = RunWriter::open(Arc::clone(&store), "missing", LeaseHolder::current());
    assert_eq!(missing.unwrap_err().kind, StoreErrorKind::NotFound);
}

/// A store whose commits fail while switched on ([`Flaky::fail_commits`]): fault injection
/// over a real backend, for tests that recording fails closed.
pub type Flaky = Intercepted<FailCommits>;

/// The switch of a [`Flaky`] store: while on, every commit (and every commit of blobs ahead of
/// their events) fails.
#[derive(Debug, Default)]
pub struct FailCommits(AtomicBool);

impl FailCommits {
    fn check(&self) -> StoreResult<()> {
        match self.0.load(Ordering::SeqCst) {
            true => Err(StoreError::io("injected failure")),
            false => Ok(()),
        }
    }
}

impl Interceptor for FailCommits {
    fn commit(&self, inner: &dyn Store, batch: &Batch) -> StoreResult<()> {
        self.check()?;
        inner.commit(batch)
    }

    fn put_blobs(&self, inner: &dyn Store, blobs: &[BlobPut]) -> StoreResult<Vec<Option<BlobAt>>> {
        self.check()?;
        inner.put_blobs(blobs)
    }
}

impl Flaky {
    /// Wraps `inner`; commits succeed until [`Flaky::fail_commits`].
    pub fn new(inner: Arc<dyn Store>) -> Flaky {
        Intercepted::wrap(inner, FailCommits::default())
    }

    /// Makes every later commit fail (`true`) or succeed again (`false`).
    pub fn fail_commits(&self, on: bool) {
        self.hooks().0.store(on, Ordering::SeqCst);
    }
}
