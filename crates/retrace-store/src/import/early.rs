//! Storing a file's plain blobs while the rest of it is still being read, so that phase 2 of
//! an import (`import/commit.rs`) is left with little more than the events.
//!
//! A trace file holds its events first and its blobs after them, and storing the blobs is most
//! of an import's storing. Once the events have verified, [`Early::start`] starts a thread of
//! the read's scope that stores, in transactions of [`CHUNK_BLOBS`] blobs sorted by digest, each
//! blob line that has verified ([`Early::offer`]), through [`EventStore::put_blobs`](crate::EventStore::put_blobs),
//! and hands back where the store put each one ([`Early::placed`]): the reader then drops the
//! line's bytes (`import/held.rs`). Phase 2 carries those blobs with their places and without
//! their bytes ([`crate::BlobPut::stored`]), so its commits confirm them instead of storing them.
//!
//! What is stored early is exactly what phase 2 would store as plain bytes: every blob but the
//! model calls' requests and the manifest lines (those may become chained manifests, which need
//! the run). No run and no event is stored before the whole file has verified; a
//! file that fails after some blobs may leave those blobs stored, referenced by nothing, for
//! `retrace gc` to sweep once they are older than its blob grace. Nothing is stored early for
//! a run the store already holds whole (a re-import compares events only), for one an import
//! left unfinished whose stored events are not the file's first, or for a fork whose stored
//! source disagrees (phase 2 refuses them).
use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::{Scope, ScopedJoinHandle};

use retrace_core::digest_map::DigestSet;
use retrace_core::{Digest, Event};

use retrace_core::export::ExportHeader;

use super::identity::Mismatched;
use crate::{BlobAt, BlobHint, BlobPut, Store, StoreError, StoreErrorKind};

/// Blobs per early transaction. Each transaction rewrites every page of the blobs' digest
/// index it adds to, and a chunk of new digests reaches most of that index's leaves, so larger
/// chunks write it less often per blob: importing 100k 1 KB events (200k blobs) took 2.37 s
/// with 4,096, 2.1 s with 16,384 and 2.67 s with 1,024 (medians of 6, alternated).
const CHUNK_BLOBS: usize = 16_384;
/// An early transaction ends after the blob that takes it past this many bytes (or a quarter
/// of the import's `chunk_bytes`, if less): with its index pages, it stays within the write
/// connection's page cache for large transactions (32 MB). A 128 MB chunk outgrew it and
/// spilled (2.51 s against 1.99 s for the run above).
///
/// The bytes of the transactions in flight are what an import holds of the blobs it stores
/// early: at most `AHEAD + 2` of them (one being filled, those handed over, one being stored),
/// 24 MB, three quarters of the default chunk. With 16 MB and two handed over, 64 MB were
/// held; imports of 100k 1 KB events (`retrace-bench export --repeats 3`, alternated twice)
/// ran at 52-58k events/s that way and 53-70k this way, of a 117 MB blob-heavy file at 370-512
/// against 335-361 MB/s (both far above their targets on a VM shared with another build).
const CHUNK_BYTES: usize = 8 << 20;
/// Transactions handed over but not yet stored.
const AHEAD: usize = 1;

/// Where each blob of a stored transaction went, as far as the store says.
pub(super) type Placed = Vec<(Digest, Option<BlobAt>)>;

/// Whether to store early for a file whose `events` have verified: the store doesn't hold its
/// run, or holds it unfinished with the file's first events (an import that stopped part way),
/// and a fork's stored source agrees with the events it inherits.
pub(super) fn wanted(
    store: &dyn Store,
    header: &ExportHeader,
    events: &[Event],
    mismatched: &Mismatched,
) -> bool {
    let run_id = &header.run.id;
    let storable = match store.run(run_id) {
        Ok(held) if held.labels.contains_key(super::UNFINISHED_LABEL) => {
            super::commit::stored_prefix(store, run_id, events, mismatched).is_ok()
        }
        Ok(_) => false,
        Err(e) => e.kind == StoreErrorKind::NotFound,
    };
    storable && super::commit::check_sources(store, run_id, events, mismatched).is_ok()
}

/// The storing thread, and the blobs not yet handed to it.
pub(super) struct Early<'scope> {
    send: Option<SyncSender<Vec<BlobPut>>>,
    pending: Vec<BlobPut>,
    pending_bytes: usize,
    chunk_bytes: usize,
    /// Model requests the events reference: left for phase 2, which may store them as chained
    /// manifests (a model response becomes a manifest only where the file has a manifest line).
    model: DigestSet,
    placed: Receiver<Placed>,
    thread: ScopedJoinHandle<'scope, Result<(), StoreError>>,
}

impl<'scope> Early<'scope> {
    /// Starts storing on `scope` for a run whose `events` have verified, in transactions of
    /// up to about a quarter of `chunk_bytes` (the import's, see [`CHUNK_BYTES`]).
    pub fn start<'env>(
        scope: &'scope Scope<'scope, 'env>,
        store: &'env dyn Store,
        events: &[Event],
        chunk_bytes: u64,
    ) -> Self {
        let model = super::commit::model_requests(events).collect();
        let (send, receive) = sync_channel::<Vec<BlobPut>>(AHEAD);
        let (placing, placed) = channel::<Placed>();
        let builder = std::thread::Builder::new().name("import-store".into());
        let thread = builder
            .spawn_scoped(scope, move || {
                let (mut blobs, mut bytes) = (0usize, 0usize);
                for mut chunk in receive {
                    // In digest order, each row's entry in the blobs' digest index lands next
                    // to the one before it, in index pages the previous inserts just used.
                    chunk.sort_unstable_by_key(BlobPut::digest);
                    let places = store.put_blobs(&chunk).map_err(|e| left_behind(e, blobs, bytes))?;
                    blobs += chunk.len();
                    bytes += chunk.iter().map(|b| b.bytes().len()).sum::<usize>();
                    let _ = placing.send(chunk.iter().map(BlobPut::digest).zip(places).collect());
                }
                Ok(())
            })
            .expect("spawning the import's storing thread");
        let chunk_bytes = CHUNK_BYTES.min(usize::try_from(chunk_bytes / 4).unwrap_or(usize::MAX)).max(1);
        Early { send: Some(send), pending: Vec::new(), pending_bytes: 0, chunk_bytes, model, placed, thread }
    }

    /// A plain blob line that has verified: whether it is taken, to be stored now (it is
    /// stored the same way without a run).
    pub fn offer(&mut self, digest: Digest, bytes: &Arc<[u8]>) -> bool {
        if self.model.contains(&digest) || self.send.is_none() {
            return false;
        }
        self.pending_bytes += bytes.len();
        self.pending.push(BlobPut::checked(digest, bytes.clone(), BlobHint::Raw));
        if self.pending.len() >= CHUNK_BLOBS || self.pending_bytes >= self.chunk_bytes {
            self.hand_over();
        }
        true
    }

    /// Where the blobs of each transaction stored since the last call went.
    pub fn placed(&self) -> impl Iterator<Item = Placed> + '_ {
        self.placed.try_iter()
    }

    fn hand_over(&mut self) {
        let chunk = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let Some(send) = &self.send else { return };
        // The thread has stopped on an error, which `finish` reports: stop sending.
        if send.send(chunk).is_err() {
            self.send = None;
        }
    }

    /// Stores what is left and waits: where the blobs of the transactions not yet
    /// [`placed`](Early::placed) went, or the store's error.
    pub fn finish(mut self) -> Result<Vec<Placed>, StoreError> {
        if !self.pending.is_empty() {
            self.hand_over();
        }
        drop(self.send.take());
        match self.thread.join() {
            Ok(result) => result?,
            Err(panic) => std::panic::resume_unwind(panic),
        }
        Ok(self.placed.try_iter().collect())
    }
}

/// The store's error, saying what the import stored before it: `blobs` blobs of `bytes`
/// bytes that no run references yet (another import of the file reuses them; `retrace gc`
/// removes them once they are older than its blob grace).
fn left_behind(mut e: StoreError, blobs: usize, bytes: usize) -> StoreError {
    if blobs > 0 {
        let mb = bytes as f64 / (1024.0 * 1024.0);
        e.message = format!(
            "{} (before it, this import had stored {blobs} of the file's blobs, {mb:.1} MiB, which its run \
             doesn't reference yet: importing the file again reuses them; otherwise `retrace gc` removes \
             those no run references once they are older than its blob grace)",
            e.message
        );
    }
    e
}
