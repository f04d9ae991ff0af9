//! [`Intercepted`]: a store that forwards every call to another one, except the writes an
//! [`Interceptor`] wants to see first (creating a run, committing a batch, committing blobs
//! ahead of their events). Fault injection in
//! the conformance suite and the benches' commit counters are interceptors; the forwarding is
//! written once, here, and covers every method of every store trait, the provided ones too, so
//! that a wrapped store never falls back to a slower or different default (its own
//! `put_blobs`, `with_snapshot` and `unrecovered` stay in force).
use std::sync::Arc;

use retrace_core::run::RunMeta;
use retrace_core::{Digest, Event};

use crate::gc::{GcReport, GcRequest};
use crate::ledger::{ApprovalDecision, ApprovalRecord, ReplayOutcome};
use crate::vault::{AuditEntry, AuditRecord, VaultEntry};
use crate::{
    Batch, BlobAt, BlobHint, BlobPut, BlobRef, BlobStore, Cache, CacheEntry, Chains, DeliveryHead, EventHead,
    EventStore, EventSummary, GcStore, HeardWithChains, LeaseHolder, LedgerStore, LocatedEvent, Store,
    StoreResult, VaultStore,
};

/// What an [`Intercepted`] store does instead of forwarding a write; by default, forwards it.
/// A single blob stored on its own (`put_blob`) is not intercepted.
pub trait Interceptor: Send + Sync {
    /// [`EventStore::create_run`] on `inner`.
    fn create_run(&self, inner: &dyn Store, meta: &RunMeta) -> StoreResult<()> {
        inner.create_run(meta)
    }

    /// [`EventStore::commit`] on `inner`.
    fn commit(&self, inner: &dyn Store, batch: &Batch) -> StoreResult<()> {
        inner.commit(batch)
    }

    /// [`EventStore::put_blobs`] on `inner` (blobs committed ahead of their events).
    fn put_blobs(&self, inner: &dyn Store, blobs: &[BlobPut]) -> StoreResult<Vec<Option<BlobAt>>> {
        inner.put_blobs(blobs)
    }
}

/// `inner`, with its run creations and commits going through `hooks`.
pub struct Intercepted<I> {
    inner: Arc<dyn Store>,
    hooks: I,
}

impl<I: Interceptor> Intercepted<I> {
    /// Wraps `inner`.
    pub fn wrap(inner: Arc<dyn Store>, hooks: I) -> Intercepted<I> {
        Intercepted { inner, hooks }
    }

    /// The interceptor, to switch or read it.
    pub fn hooks(&self) -> &I {
        &self.hooks
    }
}

impl<I: std::fmt::Debug> std::fmt::Debug for Intercepted<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intercepted")
            .field("backend", &self.inner.backend())
            .field("hooks", &self.hooks)
            .finish()
    }
}

impl<I: Interceptor> BlobStore for Intercepted<I> {
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
    fn get_blobs(&self, digests: &[Digest]) -> StoreResult<Vec<Vec<u8>>> {
        self.inner.get_blobs(digests)
    }
    fn get_blobs_unverified(&self, blobs: &[BlobRef]) -> StoreResult<Vec<Vec<u8>>> {
        self.inner.get_blobs_unverified(blobs)
    }
}

impl<I: Interceptor> EventStore for Intercepted<I> {
    fn create_run(&self, meta: &RunMeta) -> StoreResult<()> {
        self.hooks.create_run(self.inner.as_ref(), meta)
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
    fn runs_and_unreadable(&self) -> StoreResult<(Vec<RunMeta>, Vec<crate::UnreadableRun>)> {
        self.inner.runs_and_unreadable()
    }
    fn commit(&self, batch: &Batch) -> StoreResult<()> {
        self.hooks.commit(self.inner.as_ref(), batch)
    }
    fn put_blobs(&self, blobs: &[BlobPut]) -> StoreResult<Vec<Option<BlobAt>>> {
        self.hooks.put_blobs(self.inner.as_ref(), blobs)
    }
    fn events(&self, run: &str, from: u64, limit: usize) -> StoreResult<Vec<Event>> {
        self.inner.events(run, from, limit)
    }
    fn events_located(&self, run: &str, from: u64, limit: usize) -> StoreResult<Vec<LocatedEvent>> {
        self.inner.events_located(run, from, limit)
    }
    fn summaries(&self, run: &str, from: u64, limit: usize) -> StoreResult<Vec<EventSummary>> {
        self.inner.summaries(run, from, limit)
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
    fn deliveries_to(&self, run: &str, agent: &str, before: u64) -> StoreResult<Vec<Event>> {
        self.inner.deliveries_to(run, agent, before)
    }
    fn events_at(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<Event>> {
        self.inner.events_at(run, seqs)
    }
    fn heads_at(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<EventHead>> {
        self.inner.heads_at(run, seqs)
    }
    fn chain_heads(&self, run: &str, starts: &[u64], depth: usize) -> StoreResult<Chains> {
        self.inner.chain_heads(run, starts, depth)
    }
    fn delivery_heads_to(&self, run: &str, agent: &str, before: u64) -> StoreResult<Vec<DeliveryHead>> {
        self.inner.delivery_heads_to(run, agent, before)
    }
    fn request_refs_at(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<Option<Digest>>> {
        self.inner.request_refs_at(run, seqs)
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
    fn keep_run(&self, run: &str, keeper: &LeaseHolder) -> StoreResult<()> {
        self.inner.keep_run(run, keeper)
    }
}

impl<I: Interceptor> Cache for Intercepted<I> {
    fn cache_get(&self, key: &Digest) -> StoreResult<Option<CacheEntry>> {
        self.inner.cache_get(key)
    }
    fn cache_put(&self, key: &Digest, entry: &CacheEntry) -> StoreResult<()> {
        self.inner.cache_put(key, entry)
    }
}

impl<I: Interceptor> VaultStore for Intercepted<I> {
    fn vault_put(
        &self,
        run: Option<&str>,
        sealed: &[(String, retrace_core::vault::Sealed)],
    ) -> StoreResult<usize> {
        self.inner.vault_put(run, sealed)
    }
    fn vault_get(&self, token: &str) -> StoreResult<Option<VaultEntry>> {
        self.inner.vault_get(token)
    }
    fn audit_append(&self, entry: &AuditEntry) -> StoreResult<u64> {
        self.inner.audit_append(entry)
    }
    fn audit_list(&self, subject: Option<&str>) -> StoreResult<Vec<AuditRecord>> {
        self.inner.audit_list(subject)
    }
}

impl<I: Interceptor> GcStore for Intercepted<I> {
    fn collect_garbage(&self, request: &GcRequest) -> StoreResult<GcReport> {
        self.inner.collect_garbage(request)
    }
    fn compact(&self) -> StoreResult<crate::gc::Compacted> {
        self.inner.compact()
    }
}

impl<I: Interceptor> LedgerStore for Intercepted<I> {
    fn ledger_record(&self, outcome: &ReplayOutcome) -> StoreResult<retrace_core::ledger::LedgerEntry> {
        self.inner.ledger_record(outcome)
    }
    fn ledger_entries(&self, project: Option<&str>) -> StoreResult<Vec<retrace_core::ledger::LedgerEntry>> {
        self.inner.ledger_entries(project)
    }
    fn approval_request(&self, record: &ApprovalRecord) -> StoreResult<()> {
        self.inner.approval_request(record)
    }
    fn approval_decide(&self, id: &str, decision: &ApprovalDecision) -> StoreResult<ApprovalRecord> {
        self.inner.approval_decide(id, decision)
    }
    fn approval(&self, id: &str) -> StoreResult<Option<ApprovalRecord>> {
        self.inner.approval(id)
    }
    fn approval_for(&self, run: &str, agent: &str, key: &Digest) -> StoreResult<Option<ApprovalRecord>> {
        self.inner.approval_for(run, agent, key)
    }
    fn approvals_undecided(&self) -> StoreResult<Vec<ApprovalRecord>> {
        self.inner.approvals_undecided()
    }
}

impl<I: Interceptor> Store for Intercepted<I> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn request_blobs_at(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<Option<Vec<u8>>>> {
        self.inner.request_blobs_at(run, seqs)
    }
    fn heard_by(
        &self,
        run: &str,
        agent: &str,
        before: u64,
    ) -> StoreResult<Vec<(DeliveryHead, Option<Vec<u8>>)>> {
        self.inner.heard_by(run, agent, before)
    }
    fn heard_with_chains(
        &self,
        run: &str,
        agent: &str,
        before: u64,
        depth: usize,
    ) -> StoreResult<HeardWithChains> {
        self.inner.heard_with_chains(run, agent, before, depth)
    }
    fn with_snapshot(&self, f: &mut dyn FnMut()) {
        self.inner.with_snapshot(f)
    }
    fn unrecovered(&self, run: &str) -> Option<String> {
        self.inner.unrecovered(run)
    }
    fn schema_upgrade(&self) -> Option<crate::SchemaUpgrade> {
        self.inner.schema_upgrade()
    }
}
