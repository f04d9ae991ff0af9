//! [`MemoryStore`]: the whole [`Store`] in process memory, with the same semantics as SQLite
//! (dense seqs, prefix lookup, leases with liveness, caches), for tests and throwaway runs.
//!
//! Blobs are kept flat: there are no chained manifests here, so `manifest_of` is always `None`.
//! The checks every backend shares (digests of a batch, run prefixes) live here too. The vault
//! and garbage collection are in `memory/vault.rs` and `memory/gc.rs`.
mod gc;
mod ledger;
mod vault;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use retrace_core::run::{RunMeta, RunStatus};
use retrace_core::{Digest, Event, EventType};

use crate::cache::{check_batch, check_entry, missing_blob};
use crate::writer::check_seqs;
use crate::writer::lease::{lease_busy, leaseless_dead, now_ms, Lease};
use crate::{
    Batch, BlobHint, BlobStore, Cache, CacheEntry, EventStore, LeaseHolder, Store, StoreError, StoreResult,
};

/// A store in memory; cheap to create, gone when dropped.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Runs in creation order (`order` is the creation counter).
    runs: HashMap<String, RunEntry>,
    created: u64,
    /// Bytes and insertion time (Unix milliseconds) by digest.
    blobs: HashMap<Digest, (Arc<[u8]>, u64)>,
    leases: HashMap<String, Lease>,
    cache: HashMap<Digest, CacheEntry>,
    vault: HashMap<String, crate::vault::VaultEntry>,
    /// The runs holding each token the vault keeps (see [`crate::vault::VaultStore::vault_put`]).
    vault_refs: HashMap<String, std::collections::HashSet<String>>,
    audit: Vec<crate::vault::AuditRecord>,
    ledger: HashMap<(String, String), retrace_core::ledger::LedgerEntry>,
    /// Per ((project, agent), trace): whether the trace counts in the current clean streak.
    ledger_traces: HashMap<((String, String), Digest), bool>,
    approvals: Vec<crate::ledger::ApprovalRecord>,
}

#[derive(Debug)]
struct RunEntry {
    order: u64,
    meta: RunMeta,
    events: Vec<Event>,
    by_agent: HashMap<String, Vec<u64>>,
    /// The process that will finish the run ([`EventStore::keep_run`]).
    keeper: Option<LeaseHolder>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }
}

impl RunEntry {
    /// The event `seq`, found by binary search (seqs are dense but may start at `fork_at`).
    fn at(&self, seq: u64) -> Option<&Event> {
        let i = self.events.partition_point(|e| e.seq < seq);
        self.events.get(i).filter(|e| e.seq == seq)
    }
}

impl Inner {
    fn run(&self, id: &str) -> StoreResult<&RunEntry> {
        self.runs.get(id).ok_or_else(|| StoreError::not_found(format!("no run {id}")))
    }
}

impl BlobStore for MemoryStore {
    fn put_blob(&self, bytes: &[u8], _hint: BlobHint) -> StoreResult<Digest> {
        let digest = Digest::of(bytes);
        self.inner.lock().blobs.entry(digest).or_insert_with(|| (bytes.into(), now_ms()));
        Ok(digest)
    }

    fn get_blob(&self, digest: &Digest) -> StoreResult<Vec<u8>> {
        let inner = self.inner.lock();
        let (bytes, _) =
            inner.blobs.get(digest).ok_or_else(|| StoreError::not_found(format!("no blob {digest}")))?;
        Ok(bytes.to_vec())
    }

    fn has_blob(&self, digest: &Digest) -> StoreResult<bool> {
        Ok(self.inner.lock().blobs.contains_key(digest))
    }

    fn manifest_of(&self, _digest: &Digest) -> StoreResult<Option<Vec<u8>>> {
        Ok(None)
    }
}

impl EventStore for MemoryStore {
    fn create_run(&self, meta: &RunMeta) -> StoreResult<()> {
        let mut inner = self.inner.lock();
        if inner.runs.contains_key(&meta.id) {
            return Err(StoreError::conflict(format!("run {} already exists", meta.id)));
        }
        inner.created += 1;
        let entry = RunEntry {
            order: inner.created,
            meta: meta.clone(),
            events: Vec::new(),
            by_agent: HashMap::new(),
            keeper: None,
        };
        inner.runs.insert(meta.id.clone(), entry);
        Ok(())
    }

    fn update_run(&self, meta: &RunMeta) -> StoreResult<()> {
        let mut inner = self.inner.lock();
        let entry = inner
            .runs
            .get_mut(&meta.id)
            .ok_or_else(|| StoreError::not_found(format!("no run {}", meta.id)))?;
        entry.meta = meta.clone();
        Ok(())
    }

    fn run(&self, id: &str) -> StoreResult<RunMeta> {
        Ok(self.inner.lock().run(id)?.meta.clone())
    }

    fn find_run(&self, id_or_prefix: &str) -> StoreResult<RunMeta> {
        case_folding(id_or_prefix, |id| self.find_run_as_given(id))
    }

    fn runs(&self) -> StoreResult<Vec<RunMeta>> {
        let inner = self.inner.lock();
        let mut entries: Vec<&RunEntry> = inner.runs.values().collect();
        entries.sort_by_key(|e| (e.meta.started_at_ms, e.order));
        Ok(entries.into_iter().map(|e| e.meta.clone()).collect())
    }

    fn commit(&self, batch: &Batch) -> StoreResult<()> {
        let mut inner = self.inner.lock();
        if !batch.events.is_empty() {
            let entry = inner.run(&batch.run_id)?;
            let last = entry.events.last().map_or(0, |e| e.seq);
            check_seqs(&batch.run_id, last, entry.meta.fork_at, &batch.events)?;
        }
        check_batch(batch, |d| Ok(inner.blobs.contains_key(d)))?;
        // A blob carried without its bytes is confirmed only: it must be stored.
        if let Some(gone) =
            batch.blobs.iter().find(|b| !b.carries_bytes() && !inner.blobs.contains_key(&b.digest))
        {
            return Err(StoreError::not_found(format!(
                "blob {}, stored earlier without a run, is gone",
                gone.digest
            )));
        }
        let now = now_ms();
        for blob in batch.blobs.iter().filter(|b| b.carries_bytes()) {
            inner.blobs.entry(blob.digest).or_insert_with(|| (Arc::clone(&blob.bytes), now));
        }
        for (key, entry) in &batch.cache {
            inner.cache.insert(*key, entry.clone());
        }
        if let Some(entry) = inner.runs.get_mut(&batch.run_id) {
            for event in &batch.events {
                entry.by_agent.entry(event.agent_id.clone()).or_default().push(event.seq);
                entry.events.push(event.clone());
            }
        }
        Ok(())
    }

    fn events(&self, run: &str, from: u64, limit: usize) -> StoreResult<Vec<Event>> {
        let inner = self.inner.lock();
        let events = &inner.run(run)?.events;
        let start = events.partition_point(|e| e.seq < from);
        Ok(events[start..].iter().take(limit).cloned().collect())
    }

    fn event(&self, run: &str, seq: u64) -> StoreResult<Event> {
        let inner = self.inner.lock();
        let entry = inner.run(run)?;
        entry.at(seq).cloned().ok_or_else(|| {
            StoreError::not_found(format!(
                "run {run} has no event {seq} (its last seq is {})",
                entry.events.last().map_or(0, |e| e.seq)
            ))
        })
    }

    fn last_seq(&self, run: &str) -> StoreResult<u64> {
        Ok(self.inner.lock().run(run)?.events.last().map_or(0, |e| e.seq))
    }

    fn agent_seqs(&self, run: &str, agent: &str) -> StoreResult<Vec<u64>> {
        Ok(self.inner.lock().run(run)?.by_agent.get(agent).cloned().unwrap_or_default())
    }

    fn deliveries_to(&self, run: &str, agent: &str, before: u64) -> StoreResult<Vec<Event>> {
        let inner = self.inner.lock();
        let entry = inner.run(run)?;
        let seqs = entry.by_agent.get(agent).map(Vec::as_slice).unwrap_or_default();
        Ok(seqs
            .iter()
            .take_while(|s| **s < before)
            .filter_map(|s| entry.at(*s))
            .filter(|e| e.kind == EventType::Deliver)
            .cloned()
            .collect())
    }

    fn events_at(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<Event>> {
        let inner = self.inner.lock();
        let entry = inner.run(run)?;
        seqs.iter()
            .map(|s| {
                entry
                    .at(*s)
                    .cloned()
                    .ok_or_else(|| StoreError::not_found(format!("run {run} has no event {s}")))
            })
            .collect()
    }

    fn acquire_lease(&self, run: &str, holder: &LeaseHolder, ttl_ms: u64) -> StoreResult<()> {
        let mut inner = self.inner.lock();
        inner.run(run)?;
        let now = now_ms();
        if let Some(lease) = inner.leases.get(run) {
            if lease.holder != *holder && lease.is_live(now) {
                return Err(lease_busy(run, lease, now));
            }
        }
        let lease = Lease { holder: holder.clone(), expires_at_ms: now + ttl_ms };
        inner.leases.insert(run.to_string(), lease);
        Ok(())
    }

    fn renew_lease(&self, run: &str, holder: &LeaseHolder, ttl_ms: u64) -> StoreResult<()> {
        let mut inner = self.inner.lock();
        inner.run(run)?;
        match inner.leases.get_mut(run) {
            Some(lease) if lease.holder == *holder => {
                lease.expires_at_ms = now_ms() + ttl_ms;
                Ok(())
            }
            _ => Err(StoreError::conflict(format!("{holder} no longer holds the lease of run {run}"))),
        }
    }

    fn release_lease(&self, run: &str, holder: &LeaseHolder) -> StoreResult<()> {
        let mut inner = self.inner.lock();
        if inner.leases.get(run).is_some_and(|l| l.holder == *holder) {
            inner.leases.remove(run);
        }
        Ok(())
    }

    fn lease_holder(&self, run: &str) -> StoreResult<Option<LeaseHolder>> {
        let inner = self.inner.lock();
        inner.run(run)?;
        let now = now_ms();
        Ok(inner.leases.get(run).filter(|l| l.is_live(now)).map(|l| l.holder.clone()))
    }

    fn keep_run(&self, run: &str, keeper: &LeaseHolder) -> StoreResult<()> {
        let mut inner = self.inner.lock();
        let entry = inner.runs.get_mut(run).ok_or_else(|| StoreError::not_found(format!("no run {run}")))?;
        entry.keeper = Some(keeper.clone());
        Ok(())
    }

    fn recover_interrupted(&self) -> StoreResult<Vec<String>> {
        let mut inner = self.inner.lock();
        let now = now_ms();
        let Inner { runs, leases, .. } = &mut *inner;
        let mut recovered: Vec<(u64, String)> = Vec::new();
        for (id, entry) in runs.iter_mut() {
            if entry.meta.status != RunStatus::Running {
                continue;
            }
            let dead = match leases.get(id) {
                Some(lease) => !lease.is_live(now),
                None => leaseless_dead(entry.keeper.as_ref(), entry.meta.started_at_ms, now),
            };
            if dead {
                entry.meta.status = RunStatus::Interrupted;
                leases.remove(id);
                recovered.push((entry.order, id.clone()));
            }
        }
        recovered.sort();
        Ok(recovered.into_iter().map(|(_, id)| id).collect())
    }
}

impl Cache for MemoryStore {
    fn cache_get(&self, key: &Digest) -> StoreResult<Option<CacheEntry>> {
        Ok(self.inner.lock().cache.get(key).cloned())
    }

    fn cache_put(&self, key: &Digest, entry: &CacheEntry) -> StoreResult<()> {
        check_entry(key, entry)?;
        let mut inner = self.inner.lock();
        if !inner.blobs.contains_key(&entry.output_ref) {
            return Err(missing_blob(key, entry));
        }
        inner.cache.insert(*key, entry.clone());
        Ok(())
    }
}

impl MemoryStore {
    /// The run `id_or_prefix` names, its case as given.
    fn find_run_as_given(&self, id_or_prefix: &str) -> StoreResult<RunMeta> {
        let inner = self.inner.lock();
        if let Some(entry) = inner.runs.get(id_or_prefix) {
            return Ok(entry.meta.clone());
        }
        check_prefix(id_or_prefix)?;
        let mut found: Vec<&str> =
            inner.runs.keys().filter(|id| id.starts_with(id_or_prefix)).map(String::as_str).collect();
        found.sort_unstable();
        match found.as_slice() {
            [] => Err(StoreError::not_found(format!("no run matches {id_or_prefix}"))),
            [one] => Ok(inner.runs[*one].meta.clone()),
            [a, b, ..] => Err(ambiguous(id_or_prefix, a, b)),
        }
    }
}

impl Store for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }
}

/// Prefix lookups need at least 4 characters.
pub(crate) fn check_prefix(prefix: &str) -> StoreResult<()> {
    if prefix.chars().count() < 4 {
        return Err(StoreError::invalid(format!(
            "no run {prefix:?}, and a run prefix needs at least 4 characters"
        )));
    }
    Ok(())
}

/// Finds a run by `find(id_or_prefix)`, and, when nothing matches an id or prefix holding
/// capitals, by its lower-case form: run ids are lower-case ULIDs, which are case-insensitive,
/// and one pasted from an upper-casing UI should still be found. An id stored with capitals
/// (imported) is still found as given.
pub(crate) fn case_folding(
    id_or_prefix: &str,
    find: impl Fn(&str) -> StoreResult<RunMeta>,
) -> StoreResult<RunMeta> {
    match find(id_or_prefix) {
        Err(e) if e.kind == crate::StoreErrorKind::NotFound => {
            let lower = id_or_prefix.to_ascii_lowercase();
            match lower != id_or_prefix {
                true => find(&lower).map_err(|_| e),
                false => Err(e),
            }
        }
        other => other,
    }
}

/// The `Invalid` error for a prefix that matches two runs or more.
pub(crate) fn ambiguous(prefix: &str, a: &str, b: &str) -> StoreError {
    // Run ids begin with their start time, so runs made minutes apart share their first 8 or
    // 9 characters: say how many tell these two apart (QA23 S2).
    let shared = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    StoreError::invalid(format!(
        "run prefix {prefix} is ambiguous: it matches {a}, {b} and maybe more (give at least {} characters of the id)",
        shared + 1
    ))
}
