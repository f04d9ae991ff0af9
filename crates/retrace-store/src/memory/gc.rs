//! Garbage collection of [`MemoryStore`]: everything under its one lock, so no commit
//! interleaves (see [`crate::gc`]). Blobs are flat here: no manifests, no segments.
use std::collections::HashSet;

use retrace_core::Digest;

use super::MemoryStore;
use crate::gc::{edit_blobs, refuse_while_running, settle, Compacted, GcReport, GcRequest, GcStore};
use crate::StoreResult;

impl GcStore for MemoryStore {
    fn collect_garbage(&self, request: &GcRequest) -> StoreResult<GcReport> {
        let mut inner = self.inner.lock();
        let mut entries: Vec<_> = inner.runs.values().collect();
        entries.sort_by_key(|e| (e.meta.started_at_ms, e.order));
        let metas: Vec<_> = entries.iter().map(|e| e.meta.clone()).collect();
        let doomed =
            settle(&metas, request.runs.iter().cloned().collect(), &request.named.iter().cloned().collect());
        let gone: HashSet<&str> = doomed.iter().map(String::as_str).collect();

        let mut keep: HashSet<Digest> = HashSet::new();
        let mut events_deleted = 0;
        for entry in inner.runs.values() {
            if gone.contains(entry.meta.id.as_str()) {
                events_deleted += entry.events.len() as u64;
                continue;
            }
            keep.extend(edit_blobs(&entry.meta));
            for e in &entry.events {
                keep.extend(e.request_ref.iter().chain(&e.output_ref));
            }
        }
        let swept: Vec<(Digest, u64)> = inner
            .blobs
            .iter()
            .filter(|(d, (_, at))| !keep.contains(*d) && *at < request.blob_cutoff_ms)
            .map(|(d, (bytes, _))| (*d, bytes.len() as u64))
            .collect();
        let swept_set: HashSet<Digest> = swept.iter().map(|(d, _)| *d).collect();
        let dropped: Vec<Digest> =
            inner.cache.iter().filter(|(_, e)| swept_set.contains(&e.output_ref)).map(|(k, _)| *k).collect();
        // A token's original goes with the last run that held it; one nobody held stays.
        let unheld: Vec<String> = inner
            .vault_refs
            .iter()
            .filter(|(_, runs)| !runs.is_empty() && runs.iter().all(|r| gone.contains(r.as_str())))
            .map(|(token, _)| token.clone())
            .filter(|token| inner.vault.contains_key(token))
            .collect();
        let report = GcReport {
            dry_run: request.dry_run,
            runs_deleted: doomed.clone(),
            events_deleted,
            blobs_deleted: swept.len() as u64,
            bytes_freed: swept.iter().map(|(_, n)| n).sum(),
            cache_entries_dropped: dropped.len() as u64,
            vault_originals_deleted: unheld.len() as u64,
        };
        if request.dry_run {
            return Ok(report);
        }
        for id in &doomed {
            inner.runs.remove(id);
            inner.leases.remove(id);
        }
        // A deleted run's held side effects go with it (QA27 D2: a reason stayed behind).
        inner.approvals.retain(|a| !doomed.contains(&a.run));
        for digest in &swept_set {
            inner.blobs.remove(digest);
        }
        for key in &dropped {
            inner.cache.remove(key);
        }
        for runs in inner.vault_refs.values_mut() {
            runs.retain(|r| !doomed.contains(r));
        }
        inner.vault_refs.retain(|_, runs| !runs.is_empty());
        for token in &unheld {
            inner.vault.remove(token);
        }
        Ok(report)
    }

    fn compact(&self) -> StoreResult<Compacted> {
        let metas: Vec<_> = self.inner.lock().runs.values().map(|e| e.meta.clone()).collect();
        refuse_while_running(&metas)?;
        // Nothing deleted holds space here: a deleted run's memory went with it.
        Ok(Compacted::default())
    }
}
