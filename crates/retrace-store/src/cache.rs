//! The LLM cache and the tool cache: outputs a fork may reuse for a changed or new step (SPEC §7).
//!
//! One table for both, keyed by the step's key (the canonical, masked request; for a tool it
//! covers the tool's name and version). Whether an entry may be used is decided by
//! [`CacheEntry::usable_at`] on the fork's own clock:
//!
//! | entry                      | usable                                              |
//! |----------------------------|-----------------------------------------------------|
//! | model (`class: None`)      | always (no expiry)                                  |
//! | `deterministic` tool       | always (the version is part of the key)             |
//! | `time_bound` tool          | while `stored_at_ms <= now_ms <= stored_at_ms + ttl_s * 1000` |
//! | `side_effect` tool         | never: such entries are refused by every store      |
//!
//! Entries are written with the events that produced them, in the same transaction
//! ([`crate::Batch::cache`], [`crate::RunWriter::append_cached`]); a later put of the same key
//! replaces the earlier one. An entry's output blob is the one its event references.
use retrace_core::envelope::{ToolClass, Usage};
use retrace_core::Digest;

use crate::{StoreError, StoreResult};

/// A cached output: what a step produced, when, and how long it may be reused.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheEntry {
    /// The blob of the output, byte for byte (the one the producing event references).
    pub output_ref: Digest,
    /// Tokens and cost of the live call that produced it (what a hit saves).
    pub usage: Option<Usage>,
    /// When it was produced, in Unix milliseconds on the producing run's clock.
    pub stored_at_ms: u64,
    /// The tool's determinism class; `None` for a model call.
    pub class: Option<ToolClass>,
    /// Lifetime in seconds of a `time_bound` tool's output.
    pub ttl_s: Option<u64>,
    /// The snapshot the provider reported for a model output (`gpt-4o-2024-08-06`), so a step
    /// the cache serves pins the model as the live call did.
    pub snapshot: Option<String>,
}

impl CacheEntry {
    /// Whether the entry may serve a step at `now_ms` (Unix milliseconds on the asking run's
    /// clock): model outputs and deterministic tools always; a time-bound tool only within its
    /// TTL (and never before it was stored, nor without a TTL); a side effect never.
    pub fn usable_at(&self, now_ms: u64) -> bool {
        match self.class {
            None | Some(ToolClass::Deterministic) => true,
            Some(ToolClass::TimeBound) => match (self.ttl_s, now_ms.checked_sub(self.stored_at_ms)) {
                (Some(ttl_s), Some(age_ms)) => age_ms <= ttl_s.saturating_mul(1000),
                _ => false,
            },
            Some(ToolClass::SideEffect) => false,
        }
    }
}

/// Cached outputs by step key.
pub trait Cache: Send + Sync {
    /// The entry stored under `key`, if any (usable or not: ask [`CacheEntry::usable_at`]).
    fn cache_get(&self, key: &Digest) -> StoreResult<Option<CacheEntry>>;
    /// Stores `entry` under `key`, replacing any earlier entry. `Invalid` for a `side_effect`
    /// entry; `NotFound` when its output blob is not stored.
    fn cache_put(&self, key: &Digest, entry: &CacheEntry) -> StoreResult<()>;
}

/// Refuses entries no store keeps: side effects are never cached.
pub(crate) fn check_entry(key: &Digest, entry: &CacheEntry) -> StoreResult<()> {
    if entry.class == Some(ToolClass::SideEffect) {
        return Err(StoreError::invalid(format!(
            "cache entry {key} is a side effect's output, which is never cached"
        )));
    }
    Ok(())
}

/// The `NotFound` error for an entry whose output blob is not stored.
pub(crate) fn missing_blob(key: &Digest, entry: &CacheEntry) -> StoreError {
    StoreError::not_found(format!(
        "cache entry {key} names output blob {}, which is not stored",
        entry.output_ref
    ))
}

/// Checks a batch's cache entries before anything is written: no side effect, and every output
/// blob either in the batch or `stored` (asked only for blobs the batch doesn't carry).
pub(crate) fn check_batch(
    batch: &crate::Batch,
    mut stored: impl FnMut(&Digest) -> StoreResult<bool>,
) -> StoreResult<()> {
    if batch.cache.is_empty() {
        return Ok(());
    }
    let carried: std::collections::HashSet<&Digest> = batch.blobs.iter().map(|b| &b.digest).collect();
    let context = || format!("committing to run {}", batch.run_id);
    for (key, entry) in &batch.cache {
        check_entry(key, entry).map_err(|e| e.context(context()))?;
        if !carried.contains(&entry.output_ref) && !stored(&entry.output_ref)? {
            return Err(missing_blob(key, entry).context(context()));
        }
    }
    Ok(())
}
