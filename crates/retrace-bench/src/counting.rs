//! Counting what a recording commits: a [`Tally`] on an [`Intercepted`] store counts the commits,
//! the events they carried and the time spent inside them, forwarding everything to the real
//! store: how well group commit batched (events per commit) and what the store's own share of a
//! step was, beside what the program saw. It can also capture every write, to make them again
//! without the program.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use retrace_core::run::RunMeta;
use retrace_store::intercept::{Intercepted, Interceptor};
use retrace_store::{Batch, Store, StoreResult};

/// A store whose commits are counted.
pub type Counting = Intercepted<Tally>;

/// Counts `inner`'s commits.
pub fn counting(inner: Arc<dyn Store>) -> Counting {
    Intercepted::wrap(inner, Tally::default())
}

/// [`counting`], also keeping every run created and batch committed, in order.
pub fn capturing(inner: Arc<dyn Store>) -> Counting {
    Intercepted::wrap(inner, Tally { captured: Some(Mutex::default()), ..Tally::default() })
}

/// The commits counted so far, and the writes captured.
#[derive(Debug, Default)]
pub struct Tally {
    commits: AtomicU64,
    events: AtomicU64,
    /// Nanoseconds spent in the inner store's `commit`.
    commit_nanos: AtomicU64,
    /// Every run created and batch committed, in order, when capturing.
    captured: Option<Mutex<Vec<Captured>>>,
}

/// A write made through a capturing [`Tally`].
#[derive(Debug)]
pub enum Captured {
    Run(Box<RunMeta>),
    Batch(Batch),
}

/// What a [`Tally`] counted.
#[derive(Clone, Copy, Debug)]
pub struct Commits {
    /// Commits made.
    pub commits: u64,
    /// Events they carried.
    pub events: u64,
    /// Time inside the real store's `commit`, all commits together (µs).
    pub in_store_us: f64,
}

impl Commits {
    /// Events per commit: how well group commit batched.
    pub fn per_commit(&self) -> f64 {
        self.events as f64 / self.commits.max(1) as f64
    }

    /// Time inside the store's commits per event (µs).
    pub fn us_per_event(&self) -> f64 {
        self.in_store_us / self.events.max(1) as f64
    }
}

impl Tally {
    /// What was counted so far.
    pub fn counts(&self) -> Commits {
        Commits {
            commits: self.commits.load(Ordering::Relaxed),
            events: self.events.load(Ordering::Relaxed),
            in_store_us: self.commit_nanos.load(Ordering::Relaxed) as f64 / 1e3,
        }
    }

    /// The writes captured so far (none unless [`capturing`]), taken out.
    pub fn take_captured(&self) -> Vec<Captured> {
        match &self.captured {
            Some(c) => std::mem::take(&mut *c.lock().expect("capture")),
            None => vec![],
        }
    }
}

impl Interceptor for Tally {
    fn create_run(&self, inner: &dyn Store, meta: &RunMeta) -> StoreResult<()> {
        if let Some(c) = &self.captured {
            c.lock().expect("capture").push(Captured::Run(Box::new(meta.clone())));
        }
        inner.create_run(meta)
    }

    fn commit(&self, inner: &dyn Store, batch: &Batch) -> StoreResult<()> {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.events.fetch_add(batch.events.len() as u64, Ordering::Relaxed);
        if let Some(c) = &self.captured {
            c.lock().expect("capture").push(Captured::Batch(batch.clone()));
        }
        let began = Instant::now();
        let committed = inner.commit(batch);
        self.commit_nanos.fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
        committed
    }
}
