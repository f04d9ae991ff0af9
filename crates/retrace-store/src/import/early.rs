//! Storing a file's plain blobs while the rest of it is still being read, so that phase 2 of
//! an import (`import/commit.rs`) is left with little more than the events.
//!
//! A trace file holds its events first and its blobs after them, and storing the blobs is most
//! of an import's storing. Once the events have verified, [`Early::start`] starts a thread of
//! the read's scope that stores, in transactions of [`CHUNK_BLOBS`] blobs sorted by digest, each
//! blob line that has verified ([`Early::offer`]), through [`EventStore::put_blobs`](crate::EventStore::put_blobs),
//! and remembers where the store put each one. Phase 2 then carries those blobs with their
//! places ([`crate::BlobPut::stored_at`]), so its commits confirm them instead of storing them.
//!
//! What is stored early is exactly what phase 2 would store as plain bytes: every blob but the
//! model calls' requests and the manifest lines (those may become chained manifests, which need
//! the run). No run and no event is stored before the whole file has verified; a
//! file that fails after some blobs may leave those blobs stored, referenced by nothing, for
//! `retrace gc` to sweep once they are older than its blob grace. Nothing is stored early for
//! a run the store already holds (a re-import compares events only) or for a fork whose stored
//! source disagrees (phase 2 refuses it).
use std::sync::mpsc::{sync_channel, SyncSender};
use std::thread::{Scope, ScopedJoinHandle};

use retrace_core::digest_map::{DigestMap, DigestSet};
use retrace_core::Event;

use retrace_core::export::ExportHeader;

use super::identity::Mismatched;
use super::read::{Held, ReadBlob};
use crate::{BlobAt, BlobHint, BlobPut, Store, StoreError, StoreErrorKind};

/// Blobs per early transaction. Each transaction rewrites every page of the blobs' digest
/// index it adds to, and a chunk of new digests reaches most of that index's leaves, so larger
/// chunks write it less often per blob: importing 100k 1 KB events (200k blobs) took 2.37 s
/// with 4,096, 2.1 s with 16,384 and 2.67 s with 1,024 (medians of 6, alternated).
const CHUNK_BLOBS: usize = 16_384;
/// An early transaction ends after the blob that takes it past this many bytes: with its
/// index pages, it stays within the write connection's page cache for large transactions (32
/// MB). A 128 MB chunk outgrew it and spilled (2.51 s against 1.99 s for the run above).
const CHUNK_BYTES: usize = 16 << 20;
/// Transactions handed over but not yet stored.
const AHEAD: usize = 2;

/// Where the blobs stored early are, by digest.
pub(super) type Stored = DigestMap<BlobAt>;

/// Whether to store early for a file whose `events` have verified: the store doesn't hold its
/// run, and a fork's stored source agrees with the events it inherits.
pub(super) fn wanted(
    store: &dyn Store,
    header: &ExportHeader,
    events: &[Event],
    mismatched: &Mismatched,
) -> bool {
    let absent = matches!(store.run(&header.run.id), Err(e) if e.kind == StoreErrorKind::NotFound);
    absent && super::commit::check_sources(store, &header.run.id, events, mismatched).is_ok()
}

/// The storing thread, and the blobs not yet handed to it.
pub(super) struct Early<'scope> {
    send: Option<SyncSender<Vec<BlobPut>>>,
    pending: Vec<BlobPut>,
    pending_bytes: usize,
    /// Model requests the events reference: left for phase 2, which may store them as chained
    /// manifests (a model response becomes a manifest only where the file has a manifest line).
    model: DigestSet,
    thread: ScopedJoinHandle<'scope, Result<Stored, StoreError>>,
}

impl<'scope> Early<'scope> {
    /// Starts storing on `scope` for a run whose `events` have verified.
    pub fn start<'env>(scope: &'scope Scope<'scope, 'env>, store: &'env dyn Store, events: &[Event]) -> Self {
        let model = super::commit::model_requests(events).collect();
        let (send, receive) = sync_channel::<Vec<BlobPut>>(AHEAD);
        let builder = std::thread::Builder::new().name("import-store".into());
        let thread = builder
            .spawn_scoped(scope, move || {
                let mut stored = Stored::default();
                for mut chunk in receive {
                    // In digest order, each row's entry in the blobs' digest index lands next
                    // to the one before it, in index pages the previous inserts just used.
                    chunk.sort_unstable_by_key(BlobPut::digest);
                    let places = store.put_blobs(&chunk)?;
                    stored.reserve(chunk.len());
                    for (blob, at) in chunk.iter().zip(places) {
                        stored.extend(at.map(|at| (blob.digest(), at)));
                    }
                }
                Ok(stored)
            })
            .expect("spawning the import's storing thread");
        Early { send: Some(send), pending: Vec::new(), pending_bytes: 0, model, thread }
    }

    /// A blob line that has verified: stored now if it is stored the same way without a run.
    pub fn offer(&mut self, blob: &ReadBlob) {
        let Held::Bytes(bytes) = &blob.held else { return };
        if self.model.contains(&blob.digest) || self.send.is_none() {
            return;
        }
        self.pending_bytes += bytes.len();
        self.pending.push(BlobPut::checked(blob.digest, bytes.clone(), BlobHint::Raw));
        if self.pending.len() >= CHUNK_BLOBS || self.pending_bytes >= CHUNK_BYTES {
            self.hand_over();
        }
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

    /// Stores what is left and waits: where every blob stored early is, or the store's error.
    pub fn finish(mut self) -> Result<Stored, StoreError> {
        if !self.pending.is_empty() {
            self.hand_over();
        }
        drop(self.send.take());
        match self.thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}
