//! A store wrapper that counts the commits a recording made, the events they carried and the
//! time spent inside them, forwarding everything to the real store: how well group commit
//! batched (events per commit) and what the store's own share of a step was, beside what the
//! program saw. It can also capture every write, to make them again without the program.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use retrace_core::run::RunMeta;
use retrace_core::{Digest, Event};
use retrace_store::{
    Batch, BlobHint, BlobStore, Cache, CacheEntry, EventStore, LeaseHolder, Store, StoreResult,
};

/// A store that counts commits and the events they carry, forwarding everything.
pub struct Counting {
    inner: Arc<dyn Store>,
    commits: AtomicU64,
    events: AtomicU64,
    /// Nanoseconds spent in the inner store's `commit`.
    commit_nanos: AtomicU64,
    /// Every run created and batch committed, in order, when capturing.
    captured: Option<Mutex<Vec<Captured>>>,
}

/// A write made through a capturing [`Counting`].
pub enum Captured {
    Run(Box<RunMeta>),
    Batch(Batch),
}

/// What a [`Counting`] store counted.
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

impl Counting {
    /// Counts the commits made to `inner`.
    pub fn new(inner: Arc<dyn Store>) -> Counting {
        Counting {
            inner,
            commits: AtomicU64::new(0),
            events: AtomicU64::new(0),
            commit_nanos: AtomicU64::new(0),
            captured: None,
        }
    }

    /// [`Counting::new`], also keeping every run created and batch committed, in order.
    pub fn capturing(inner: Arc<dyn Store>) -> Counting {
        Counting { captured: Some(Mutex::default()), ..Counting::new(inner) }
    }

    /// What was counted so far.
    pub fn counts(&self) -> Commits {
        Commits {
            commits: self.commits.load(Ordering::Relaxed),
            events: self.events.load(Ordering::Relaxed),
            in_store_us: self.commit_nanos.load(Ordering::Relaxed) as f64 / 1e3,
        }
    }

    /// The writes captured so far (none unless [`Counting::capturing`]), taken out.
    pub fn take_captured(&self) -> Vec<Captured> {
        match &self.captured {
            Some(c) => std::mem::take(&mut *c.lock().expect("capture")),
            None => vec![],
        }
    }
}

impl BlobStore for Counting {
    fn put_blob(&self, bytes: &[u8], hint: BlobHint) -> StoreResult<Digest> {
        self.inner.put_blob(bytes, hint)
    }
    fn get_blob(&self, digest: &Digest) -> StoreResult<Vec<u8>> {
        self.inner.get_blob(digest)
    }
    fn has_blob(&self, digest: &Digest) -> StoreResult<bool> {
        self.inner.has_blob(digest)
    }
    fn manifest_of(&self, digest: &Digest) -> StoreResult<Option<Vec<u8>>> {
        self.inner.manifest_of(digest)
    }
}

impl Cache for Counting {
    fn cache_get(&self, key: &Digest) -> StoreResult<Option<CacheEntry>> {
        self.inner.cache_get(key)
    }
    fn cache_put(&self, key: &Digest, entry: &CacheEntry) -> StoreResult<()> {
        self.inner.cache_put(key, entry)
    }
}

impl EventStore for Counting {
    fn create_run(&self, meta: &RunMeta) -> StoreResult<()> {
        if let Some(c) = &self.captured {
            c.lock().expect("capture").push(Captured::Run(Box::new(meta.clone())));
        }
        self.inner.create_run(meta)
    }
    fn update_run(&self, meta: &RunMeta) -> StoreResult<()> {
        self.inner.update_run(meta)
    }
    fn run(&self, id: &str) -> StoreResult<RunMeta> {
        self.inner.run(id)
    }
    fn find_run(&self, id_or_prefix: &str) -> StoreResult<RunMeta> {
        self.inner.find_run(id_or_prefix)
    }
    fn runs(&self) -> StoreResult<Vec<RunMeta>> {
        self.inner.runs()
    }
    fn commit(&self, batch: &Batch) -> StoreResult<()> {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.events.fetch_add(batch.events.len() as u64, Ordering::Relaxed);
        if let Some(c) = &self.captured {
            c.lock().expect("capture").push(Captured::Batch(batch.clone()));
        }
        let began = Instant::now();
        let committed = self.inner.commit(batch);
        self.commit_nanos.fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
        committed
    }
    fn events(&self, run: &str, from: u64, limit: usize) -> StoreResult<Vec<Event>> {
        self.inner.events(run, from, limit)
    }
    fn event(&self, run: &str, seq: u64) -> StoreResult<Event> {
        self.inner.event(run, seq)
    }
    fn last_seq(&self, run: &str) -> StoreResult<u64> {
        self.inner.last_seq(run)
    }
    fn agent_seqs(&self, run: &str, agent: &str) -> StoreResult<Vec<u64>> {
        self.inner.agent_seqs(run, agent)
    }
    fn acquire_lease(&self, run: &str, holder: &LeaseHolder, ttl_ms: u64) -> StoreResult<()> {
        self.inner.acquire_lease(run, holder, ttl_ms)
    }
    fn renew_lease(&self, run: &str, holder: &LeaseHolder, ttl_ms: u64) -> StoreResult<()> {
        self.inner.renew_lease(run, holder, ttl_ms)
    }
    fn release_lease(&self, run: &str, holder: &LeaseHolder) -> StoreResult<()> {
        self.inner.release_lease(run, holder)
    }
    fn lease_holder(&self, run: &str) -> StoreResult<Option<LeaseHolder>> {
        self.inner.lease_holder(run)
    }
    fn recover_interrupted(&self) -> StoreResult<Vec<String>> {
        self.inner.recover_interrupted()
    }
}

impl retrace_store::VaultStore for Counting {
    fn vault_put(&self, sealed: &[(String, retrace_core::vault::Sealed)]) -> StoreResult<usize> {
        self.inner.vault_put(sealed)
    }
    fn vault_get(&self, token: &str) -> StoreResult<Option<retrace_store::vault::VaultEntry>> {
        self.inner.vault_get(token)
    }
    fn audit_append(&self, entry: &retrace_store::vault::AuditEntry) -> StoreResult<u64> {
        self.inner.audit_append(entry)
    }
    fn audit_list(&self, subject: Option<&str>) -> StoreResult<Vec<retrace_store::vault::AuditRecord>> {
        self.inner.audit_list(subject)
    }
}

impl retrace_store::GcStore for Counting {
    fn collect_garbage(&self, request: &retrace_store::GcRequest) -> StoreResult<retrace_store::GcReport> {
        self.inner.collect_garbage(request)
    }
}

impl retrace_store::LedgerStore for Counting {
    fn ledger_record(
        &self,
        o: &retrace_store::ledger::ReplayOutcome,
    ) -> StoreResult<retrace_core::ledger::LedgerEntry> {
        self.inner.ledger_record(o)
    }
    fn ledger_entries(&self, project: Option<&str>) -> StoreResult<Vec<retrace_core::ledger::LedgerEntry>> {
        self.inner.ledger_entries(project)
    }
    fn approval_request(&self, r: &retrace_store::ledger::ApprovalRecord) -> StoreResult<()> {
        self.inner.approval_request(r)
    }
    fn approval_decide(
        &self,
        id: &str,
        d: &retrace_store::ledger::ApprovalDecision,
    ) -> StoreResult<retrace_store::ledger::ApprovalRecord> {
        self.inner.approval_decide(id, d)
    }
    fn approval(&self, id: &str) -> StoreResult<Option<retrace_store::ledger::ApprovalRecord>> {
        self.inner.approval(id)
    }
    fn approval_for(
        &self,
        run: &str,
        agent: &str,
        key: &retrace_core::Digest,
    ) -> StoreResult<Option<retrace_store::ledger::ApprovalRecord>> {
        self.inner.approval_for(run, agent, key)
    }
}

impl Store for Counting {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
}
