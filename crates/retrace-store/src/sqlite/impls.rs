//! The store traits on [`SqliteStore`]: `BlobStore`, `EventStore` and `Store`. Each method
//! delegates to the module that holds its SQL (`blobs.rs`, `events.rs`, `runs.rs`, ...); what
//! is here is the wiring, the blob reads' row hints and the read snapshot a caller pins.
use retrace_core::run::RunMeta;
use retrace_core::{Digest, Event};

use super::{blobs, set_mmap, staged, tail, SqliteStore, Unpin, PINNED, SNAPSHOT_MMAP_BYTES};
use crate::{
    Batch, BlobAt, BlobHint, BlobPut, BlobStore, EventStore, LeaseHolder, SchemaUpgrade, Store, StoreResult,
};

impl BlobStore for SqliteStore {
    fn put_blob(&self, bytes: &[u8], hint: BlobHint) -> StoreResult<Digest> {
        let digest = Digest::of(bytes);
        self.write(&format!("storing blob {digest}"), |tx| {
            let mut tail = self.caught_up_tail(tx, tail::MERGE_AT)?;
            let mut staged = staged::Staged::new(&self.files, &mut tail);
            blobs::put(tx, &mut staged, None, &digest, bytes, hint)?;
            staged.finish(tx)
        })?;
        Ok(digest)
    }

    fn get_blob(&self, digest: &Digest) -> StoreResult<Vec<u8>> {
        match self.located(std::slice::from_ref(digest)).pop() {
            Some(at @ (_, Some(_))) => self
                .get_many(&[at], blobs::Check::Digest)?
                .pop()
                .ok_or_else(|| crate::StoreError::corrupt(format!("blob {digest} was read as nothing"))),
            _ => self.read(|conn| blobs::get(conn, &self.files, digest)),
        }
    }

    fn has_blob(&self, digest: &Digest) -> StoreResult<bool> {
        self.read(|conn| blobs::has(conn, digest))
    }

    fn manifest_of(&self, digest: &Digest) -> StoreResult<Option<Vec<u8>>> {
        self.read(|conn| blobs::manifest_of(conn, digest))
    }

    fn get_blobs(&self, digests: &[Digest]) -> StoreResult<Vec<Vec<u8>>> {
        self.get_many(&self.located(digests), blobs::Check::Digest)
    }

    fn get_blobs_unverified(&self, blobs: &[crate::BlobRef]) -> StoreResult<Vec<Vec<u8>>> {
        self.get_many(blobs, blobs::Check::Caller)
    }
}

impl SqliteStore {
    /// `digests`, each with its row id where this store's write connection holds it in its
    /// copy of the tail: a hint, checked against the row's digest when read, that saves a
    /// scan of the tail (skipped while a write transaction holds the copy).
    fn located(&self, digests: &[Digest]) -> Vec<crate::BlobRef> {
        let tail = self.state.tail.try_lock();
        let at = |d: &Digest| tail.as_ref().and_then(|t| t.get(d)).map(BlobAt::new);
        digests.iter().map(|d| (*d, at(d))).collect()
    }

    /// [`BlobStore::get_blobs`] in one read transaction, checked as `check` says.
    fn get_many<B: blobs::Wanted>(&self, wanted: &[B], check: blobs::Check) -> StoreResult<Vec<Vec<u8>>> {
        if wanted.len() <= 1 {
            return self.read(|conn| blobs::get_many(conn, &self.files, wanted, check));
        }
        self.read_one_snapshot(
            || format!("reading blobs of {}", self.label),
            |conn| blobs::get_many(conn, &self.files, wanted, check),
        )
    }
}

impl EventStore for SqliteStore {
    fn create_run(&self, meta: &RunMeta) -> StoreResult<()> {
        self.create_run_impl(meta)
    }
    fn update_run(&self, meta: &RunMeta) -> StoreResult<()> {
        self.update_run_impl(meta)
    }
    fn run(&self, id: &str) -> StoreResult<RunMeta> {
        self.run_impl(id)
    }
    fn find_run(&self, id_or_prefix: &str) -> StoreResult<RunMeta> {
        crate::memory::case_folding(id_or_prefix, |id| self.find_run_impl(id))
    }
    fn runs(&self) -> StoreResult<Vec<RunMeta>> {
        self.runs_impl()
    }
    fn runs_and_unreadable(&self) -> StoreResult<(Vec<RunMeta>, Vec<crate::UnreadableRun>)> {
        self.runs_and_unreadable_impl()
    }
    fn commit(&self, batch: &Batch) -> StoreResult<()> {
        self.commit_impl(batch)
    }
    fn put_blobs(&self, blobs: &[BlobPut]) -> StoreResult<Vec<Option<BlobAt>>> {
        self.put_blobs_impl(blobs)
    }
    fn events(&self, run: &str, from: u64, limit: usize) -> StoreResult<Vec<Event>> {
        self.events_impl(run, from, limit)
    }
    fn events_located(&self, run: &str, from: u64, limit: usize) -> StoreResult<Vec<crate::LocatedEvent>> {
        self.events_located_impl(run, from, limit)
    }
    fn summaries(&self, run: &str, from: u64, limit: usize) -> StoreResult<Vec<crate::EventSummary>> {
        self.summaries_impl(run, from, limit)
    }
    fn event(&self, run: &str, seq: u64) -> StoreResult<Event> {
        self.event_impl(run, seq)
    }
    fn last_seq(&self, run: &str) -> StoreResult<u64> {
        self.last_seq_impl(run)
    }
    fn agent_seqs(&self, run: &str, agent: &str) -> StoreResult<Vec<u64>> {
        self.agent_seqs_impl(run, agent)
    }
    fn deliveries_to(&self, run: &str, agent: &str, before: u64) -> StoreResult<Vec<Event>> {
        self.deliveries_to_impl(run, agent, before)
    }
    fn events_at(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<Event>> {
        self.events_at_impl(run, seqs)
    }
    fn heads_at(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<crate::EventHead>> {
        self.heads_at_impl(run, seqs)
    }
    fn chain_heads(&self, run: &str, starts: &[u64], depth: usize) -> StoreResult<crate::Chains> {
        self.chain_heads_impl(run, starts, depth)
    }
    fn delivery_heads_to(
        &self,
        run: &str,
        agent: &str,
        before: u64,
    ) -> StoreResult<Vec<crate::DeliveryHead>> {
        self.delivery_heads_impl(run, agent, before)
    }
    fn request_refs_at(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<Option<Digest>>> {
        self.request_refs_at_impl(run, seqs)
    }
    fn acquire_lease(&self, run: &str, holder: &LeaseHolder, ttl_ms: u64) -> StoreResult<()> {
        self.acquire_lease_impl(run, holder, ttl_ms)
    }
    fn renew_lease(&self, run: &str, holder: &LeaseHolder, ttl_ms: u64) -> StoreResult<()> {
        self.renew_lease_impl(run, holder, ttl_ms)
    }
    fn release_lease(&self, run: &str, holder: &LeaseHolder) -> StoreResult<()> {
        self.release_lease_impl(run, holder)
    }
    fn lease_holder(&self, run: &str) -> StoreResult<Option<LeaseHolder>> {
        self.lease_holder_impl(run)
    }
    fn recover_interrupted(&self) -> StoreResult<Vec<String>> {
        self.recover_interrupted_impl()
    }
    fn keep_run(&self, run: &str, keeper: &LeaseHolder) -> StoreResult<()> {
        self.keep_run_impl(run, keeper)
    }
}

impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }
    fn schema_upgrade(&self) -> Option<SchemaUpgrade> {
        self.schema_upgrade.clone()
    }
    fn unrecovered(&self, run: &str) -> Option<String> {
        self.unrecovered_impl(run)
    }

    fn request_blobs_at(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<Option<Vec<u8>>>> {
        self.request_blobs_at_impl(run, seqs)
    }

    fn heard_by(
        &self,
        run: &str,
        agent: &str,
        before: u64,
    ) -> StoreResult<Vec<(crate::DeliveryHead, Option<Vec<u8>>)>> {
        self.heard_impl(run, agent, before)
    }

    fn heard_with_chains(
        &self,
        run: &str,
        agent: &str,
        before: u64,
        depth: usize,
    ) -> StoreResult<crate::HeardWithChains> {
        self.heard_with_chains_impl(run, agent, before, depth)
    }

    fn with_snapshot(&self, f: &mut dyn FnMut()) {
        if PINNED.with(|p| p.borrow().is_some()) {
            return f();
        }
        let kept = self.state.snapshots.lock().pop();
        let conn = match kept {
            Some(conn) => conn,
            None => {
                let Ok(conn) = self.connect() else {
                    return f();
                };
                // A failed pragma only loses the speed-up; the snapshot is what matters.
                let _ = set_mmap(&conn, SNAPSHOT_MMAP_BYTES);
                conn
            }
        };
        if conn.execute_batch("BEGIN").is_err() {
            return f();
        }
        PINNED.with(|p| *p.borrow_mut() = Some((self.id, conn)));
        let _unpin = Unpin { store: self };
        f()
    }
}
