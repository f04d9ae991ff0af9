//! Retrace's storage: the event log, runs, blobs, caches and leases behind narrow traits.
//!
//! - [`EventStore`]: runs and their events (append-only; an appended event is never mutated),
//!   leases (one sequencer per run), and [`EventStore::commit`], the one atomic write path.
//! - [`BlobStore`]: content-addressed bytes, verified on every read.
//! - [`Cache`]: the LLM and tool caches a fork reuses ([`cache`]), written in the same
//!   transaction as the events that produced them.
//! - [`writer::RunWriter`]: the sequencer of one run. It assigns `seq`, chains hashes and hands
//!   events to a group-commit thread; an event is acknowledged once its transaction commits.
//! - Backends: [`sqlite::SqliteStore`] (the embedded default: one SQLite database in WAL mode
//!   plus a blob folder for blobs over 64 KB) and [`memory::MemoryStore`] (tests). Every backend
//!   passes the same [`conformance`] suite.
//!
//! - [`vault::VaultStore`]: the token vault (originals of masked values, sealed under the vault
//!   key) and its append-only audit log; [`vault::store_originals`] and [`vault::reveal`].
//! - [`ledger::LedgerStore`]: the replay ledger per (project, agent) and the approvals of side
//!   effects held by the autonomy policy.
//! - [`gc::GcStore`]: retention and garbage collection ([`gc::collect`]): expired runs, then
//!   blobs nothing references, in one atomic step.
//!
//! Two trajectories are compared by [`diff`] (`retrace diff`), which reads
//! [`EventStore::summaries`] (digests and counters, not whole envelopes) and loads output blobs
//! only for the changed steps it shows.
//!
//! Errors are backend-neutral ([`StoreErrorKind`]): callers never match on a SQLite error code.
#![warn(missing_docs)]

pub mod cache;
pub mod causal;
pub mod conformance;
pub mod diff;
pub mod error;
pub mod export;
pub mod gc;
pub mod head;
pub mod import;
pub mod intercept;
pub mod ledger;
pub mod manifest;
pub mod memory;
pub mod open;
pub mod spin;
pub mod sqlite;
pub mod summary;
pub mod vault;
pub mod verify;
pub mod writer;

use std::sync::Arc;

use retrace_core::run::RunMeta;
use retrace_core::{Digest, Event, EventType};

pub use cache::{Cache, CacheEntry};
pub use error::{StoreError, StoreErrorKind, StoreResult};
pub use gc::{GcReport, GcRequest, GcStore};
pub use head::{ChainHead, Chains, DeliveryHead, EventHead};
pub use ledger::LedgerStore;
pub use open::{
    open_store, open_store_private_copy, open_store_read_only, why_read_only, Durability, StoreConfig,
    StoreLocation,
};
pub use summary::EventSummary;
pub use vault::VaultStore;
pub use writer::{Acked, RunWriter, Ticket};

/// Blobs of at most this many bytes are stored inside the event's transaction; larger ones are
/// files, written atomically and fsynced before the transaction commits.
pub const INLINE_BLOB_MAX: usize = 64 * 1024;

/// How a blob should be stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlobHint {
    /// Plain bytes.
    Raw,
    /// A model request: stored as a chained manifest when its message list extends an earlier
    /// request of the same run (DESIGN.md "Storage"), else flat.
    ModelRequest,
    /// A model response: when it holds one chat message (`choices[0].message`) or Responses
    /// `output` items, stored as a manifest of those and the rest, so the next request, which
    /// carries them back, finds them stored; else flat.
    ModelResponse,
}

/// A blob to store with a batch. Its digest is the digest of its bytes by construction: the
/// fields are private and only [`BlobPut::new`] (which hashes) makes one outside this crate, so
/// a store never hashes a batch's blobs a second time.
///
/// ```compile_fail
/// # use retrace_store::{BlobHint, BlobPut};
/// let mut put = BlobPut::new(&b"real bytes"[..], BlobHint::Raw);
/// put.digest = retrace_core::Digest::of(b"other bytes"); // private: no lying about a digest
/// ```
#[derive(Clone, Debug)]
pub struct BlobPut {
    digest: Digest,
    bytes: Arc<[u8]>,
    hint: BlobHint,
    /// Where the caller was told the blob is stored ([`BlobPut::stored_at`]).
    at: Option<BlobAt>,
    /// Whether `bytes` are the blob's: false for one carried only to be confirmed
    /// ([`BlobPut::stored`]), whose `bytes` are empty.
    carried: bool,
}

impl BlobPut {
    /// A blob of `bytes`, digest computed here.
    pub fn new(bytes: impl Into<Arc<[u8]>>, hint: BlobHint) -> BlobPut {
        let bytes = bytes.into();
        BlobPut { digest: Digest::of(&bytes), bytes, hint, at: None, carried: true }
    }

    /// A blob whose `digest` this crate has just checked against `bytes` (an import).
    pub(crate) fn checked(digest: Digest, bytes: Arc<[u8]>, hint: BlobHint) -> BlobPut {
        BlobPut { digest, bytes, hint, at: None, carried: true }
    }

    /// A blob this crate stored itself through [`EventStore::put_blobs`] (an import's early
    /// blobs), carried again without its bytes: a commit only confirms it, where `at` says or
    /// by its digest, and fails with `NotFound` if it is gone (collected meanwhile), never
    /// storing anything for it. So an import need not hold the bytes of what it stored early.
    pub(crate) fn stored(digest: Digest, at: Option<BlobAt>, hint: BlobHint) -> BlobPut {
        BlobPut { digest, bytes: Arc::from(&[][..]), hint, at, carried: false }
    }

    /// The same blob, said to be stored already where [`EventStore::put_blobs`] put it: a
    /// commit then confirms it there (SQLite: by row id, in insertion order) instead of looking
    /// its digest up. Only a hint, as every [`BlobAt`] is: if the blob isn't there, the commit
    /// looks it up and stores it as usual.
    pub fn stored_at(mut self, at: BlobAt) -> BlobPut {
        self.at = Some(at);
        self
    }

    /// The digest of the bytes.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// The bytes: empty when they are not [`carried`](BlobPut::carries_bytes).
    pub fn bytes(&self) -> &Arc<[u8]> {
        &self.bytes
    }

    /// Whether the blob's bytes are carried: false for a blob this crate stored earlier and
    /// carries again only to be confirmed where it is (an import's early blobs), which a
    /// backend must find stored or refuse the batch (`NotFound`).
    pub fn carries_bytes(&self) -> bool {
        self.carried
    }

    /// How to store it.
    pub fn hint(&self) -> BlobHint {
        self.hint
    }

    /// Where it is said to be stored already, if anywhere ([`BlobPut::stored_at`]).
    pub fn at(&self) -> Option<BlobAt> {
        self.at
    }
}

/// Where a backend keeps a blob, as it says with an event ([`EventStore::events_located`]): a
/// hint that lets it read the blob without looking its digest up ([`BlobStore::get_blobs_unverified`]).
/// Opaque to callers, and only a hint: a backend checks that what it finds there has the digest
/// asked for, and looks the digest up when it doesn't, so a stale or foreign hint costs a lookup,
/// never wrong bytes. (SQLite: the blob's row id.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlobAt(i64);

impl BlobAt {
    /// A hint holding `value` (backends only).
    pub fn new(value: i64) -> BlobAt {
        BlobAt(value)
    }

    /// The value the backend put in.
    pub fn get(self) -> i64 {
        self.0
    }
}

/// A blob to read: its digest, and where its backend keeps it when known ([`BlobAt`]).
pub type BlobRef = (Digest, Option<BlobAt>);

/// A run whose stored record can't be read ([`EventStore::runs_and_unreadable`]).
#[derive(Debug)]
pub struct UnreadableRun {
    /// The run's id.
    pub id: String,
    /// Why its record can't be read.
    pub error: StoreError,
}

/// An event read with where its request and output blobs are kept ([`EventStore::events_located`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LocatedEvent {
    /// The event.
    pub event: Event,
    /// Where its `request_ref` is kept, if the backend says.
    pub request_at: Option<BlobAt>,
    /// Where its `output_ref` is kept, if the backend says.
    pub output_at: Option<BlobAt>,
}

impl LocatedEvent {
    /// The event's request and output blobs, each with its hint, in that order.
    pub fn blob_refs(&self) -> impl Iterator<Item = BlobRef> + '_ {
        let request = self.event.request_ref.map(|d| (d, self.request_at));
        let output = self.event.output_ref.map(|d| (d, self.output_at));
        request.into_iter().chain(output)
    }
}

/// Events, blobs and cache entries written in one transaction.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// The run the events belong to (inherited fork events carry their source's `run_id`).
    pub run_id: String,
    /// Events in seq order, sealed (seq, prev and hash set).
    pub events: Vec<Event>,
    /// Blobs the events reference (already-stored blobs may be repeated; they are skipped; one
    /// that doesn't [carry its bytes](BlobPut::carries_bytes) must be stored).
    pub blobs: Vec<BlobPut>,
    /// Cache entries the events produced, by step key, in order (a later entry of the same key
    /// replaces an earlier one). Each entry's output blob must be in `blobs` or already stored.
    pub cache: Vec<(Digest, CacheEntry)>,
}

/// Who holds a run's lease: `host:pid:start-time`, so a dead holder on this host is seen at once;
/// a writer's holder adds `#n` to tell it from the process's other writers
/// ([`LeaseHolder::unique`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseHolder(pub String);

/// Content-addressed bytes.
pub trait BlobStore: Send + Sync {
    /// Stores `bytes` on their own (outside any batch) and returns their digest.
    fn put_blob(&self, bytes: &[u8], hint: BlobHint) -> StoreResult<Digest>;
    /// The bytes of `digest`, verified; `NotFound` when absent, `Corrupt` when they don't match.
    fn get_blob(&self, digest: &Digest) -> StoreResult<Vec<u8>>;
    /// Whether `digest` is stored.
    fn has_blob(&self, digest: &Digest) -> StoreResult<bool>;
    /// If `digest` is stored as a chained manifest, the manifest's own bytes (for exports).
    fn manifest_of(&self, digest: &Digest) -> StoreResult<Option<Vec<u8>>>;
    /// The verified bytes of each of `digests`, in the order given (the first missing or
    /// corrupt blob fails the whole call, as [`BlobStore::get_blob`] would). Backends answer
    /// this in one read transaction; the default asks for each blob.
    fn get_blobs(&self, digests: &[Digest]) -> StoreResult<Vec<Vec<u8>>> {
        digests.iter().map(|d| self.get_blob(d)).collect()
    }
    /// [`BlobStore::get_blobs`] for a caller that hashes every blob of up to [`INLINE_BLOB_MAX`]
    /// bytes it gets and refuses one that doesn't match its digest, so the store need not:
    /// export does, on its encoder thread, which takes the hashing off the thread that reads.
    /// Larger blobs, and those the backend rebuilds (manifests), are still verified here (beside
    /// reading a large file the hash costs little, and the encoder has enough to do with large
    /// blobs). Each blob comes with where the backend keeps it, when known ([`BlobAt`], from
    /// [`EventStore::events_located`]), which spares a lookup by digest. The default ignores
    /// the hints and verifies everything.
    fn get_blobs_unverified(&self, blobs: &[BlobRef]) -> StoreResult<Vec<Vec<u8>>> {
        let digests: Vec<Digest> = blobs.iter().map(|(digest, _)| *digest).collect();
        self.get_blobs(&digests)
    }
}

/// Runs, their events and leases.
pub trait EventStore: Send + Sync {
    /// Creates a run; `Conflict` when the id exists.
    fn create_run(&self, meta: &RunMeta) -> StoreResult<()>;
    /// Replaces a run's metadata; `NotFound` when absent.
    fn update_run(&self, meta: &RunMeta) -> StoreResult<()>;
    /// A run by exact id.
    fn run(&self, id: &str) -> StoreResult<RunMeta>;
    /// A run by id or unique id prefix (at least 4 characters); `NotFound` or `Invalid` (ambiguous).
    fn find_run(&self, id_or_prefix: &str) -> StoreResult<RunMeta>;
    /// Every run, oldest first.
    fn runs(&self) -> StoreResult<Vec<RunMeta>>;
    /// [`EventStore::runs`], with each run whose stored record can't be read set apart (its id
    /// and why) instead of failing the whole list: for the commands that list or check a whole
    /// store (`runs`, `verify --all`), which one damaged row must not blind.
    fn runs_and_unreadable(&self) -> StoreResult<(Vec<RunMeta>, Vec<UnreadableRun>)> {
        Ok((self.runs()?, Vec::new()))
    }
    /// Atomically appends a batch of events, their blobs and cache entries. Seqs must continue
    /// the run densely (`Conflict` otherwise); blobs larger than [`INLINE_BLOB_MAX`] are durable
    /// files first; a side effect's cache entry is `Invalid`, one whose output blob is neither in
    /// the batch nor stored is `NotFound` (and the whole batch is refused).
    fn commit(&self, batch: &Batch) -> StoreResult<()>;
    /// Stores blobs on their own, outside any run (so a model request is stored flat), in one
    /// transaction, and says where each is kept, in order, as far as the backend knows: a later
    /// [`commit`](EventStore::commit) that carries them again with
    /// [`BlobPut::stored_at`] confirms them there instead of looking them up. An import stores
    /// a file's blobs this way while it is still reading the rest. The default commits a
    /// batch without events and knows nothing.
    fn put_blobs(&self, blobs: &[BlobPut]) -> StoreResult<Vec<Option<BlobAt>>> {
        let batch =
            Batch { run_id: String::new(), events: Vec::new(), blobs: blobs.to_vec(), cache: Vec::new() };
        self.commit(&batch)?;
        Ok(vec![None; blobs.len()])
    }
    /// Events of `run` with `seq >= from`, in seq order, at most `limit`.
    fn events(&self, run: &str, from: u64, limit: usize) -> StoreResult<Vec<Event>>;
    /// [`EventStore::events`], each event with where its request and output blobs are kept,
    /// as far as the backend knows ([`BlobAt`]): what export reads, to fetch those blobs
    /// without looking each digest up. The default knows nothing.
    fn events_located(&self, run: &str, from: u64, limit: usize) -> StoreResult<Vec<LocatedEvent>> {
        let events = self.events(run, from, limit)?;
        Ok(events
            .into_iter()
            .map(|event| LocatedEvent { event, request_at: None, output_at: None })
            .collect())
    }
    /// [`EventStore::events`] as [`EventSummary`]s: what comparing runs reads. Backends read
    /// only what a summary holds; the default summarizes whole events.
    fn summaries(&self, run: &str, from: u64, limit: usize) -> StoreResult<Vec<EventSummary>> {
        Ok(self.events(run, from, limit)?.into_iter().map(EventSummary::from).collect())
    }
    /// One event.
    fn event(&self, run: &str, seq: u64) -> StoreResult<Event>;
    /// The last seq stored for `run` (0 when none).
    fn last_seq(&self, run: &str) -> StoreResult<u64>;
    /// Seqs of `agent`'s events in `run`, in order (served from an index).
    fn agent_seqs(&self, run: &str, agent: &str) -> StoreResult<Vec<u64>>;
    /// The `deliver` events to `agent` in `run` with seq < `before`, in seq order. Backends
    /// serve this from an index of deliveries; the default walks the agent's events.
    fn deliveries_to(&self, run: &str, agent: &str, before: u64) -> StoreResult<Vec<Event>> {
        let seqs: Vec<u64> = self.agent_seqs(run, agent)?.into_iter().filter(|s| *s < before).collect();
        Ok(self.events_at(run, &seqs)?.into_iter().filter(|e| e.kind == EventType::Deliver).collect())
    }
    /// The events of `run` at `seqs`, in the order given (`NotFound` for a seq that isn't there).
    /// Backends answer this in one query; the default asks for each event.
    fn events_at(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<Event>> {
        seqs.iter().map(|s| self.event(run, *s)).collect()
    }
    /// [`EventStore::events_at`] as [`EventHead`]s: what following causal chains reads.
    /// Backends read only what a head holds (SQLite: a covering index); the default reads
    /// whole events.
    fn heads_at(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<EventHead>> {
        Ok(self.events_at(run, seqs)?.iter().map(EventHead::from).collect())
    }
    /// The heads of every event on the causal chains of `starts`: each start and its causal
    /// parents, up to `depth` links from a start (the start is its chain's first link), each
    /// once; `NotFound` for a seq on a chain that isn't there. What `retrace knew` follows.
    /// SQLite reads its packed head blocks; the default follows the chains a level at a time
    /// with [`EventStore::heads_at`].
    fn chain_heads(&self, run: &str, starts: &[u64], depth: usize) -> StoreResult<Chains> {
        let mut chains = Chains::default();
        head::chain_heads_by_level(self, run, starts, depth, &mut chains)?;
        Ok(chains)
    }
    /// [`EventStore::deliveries_to`] as [`DeliveryHead`]s: what `retrace knew` lists. Backends
    /// read only what a delivery head holds; the default reads whole events.
    fn delivery_heads_to(&self, run: &str, agent: &str, before: u64) -> StoreResult<Vec<DeliveryHead>> {
        Ok(self.deliveries_to(run, agent, before)?.iter().map(DeliveryHead::from).collect())
    }
    /// The `request_ref` of each event of `run` at `seqs`, in the order given (`NotFound` for a
    /// seq that isn't there). Backends read only that column; the default reads whole events.
    fn request_refs_at(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<Option<Digest>>> {
        Ok(self.events_at(run, seqs)?.into_iter().map(|e| e.request_ref).collect())
    }
    /// Takes the lease of `run` for `holder`; `Busy` naming the live holder when held.
    fn acquire_lease(&self, run: &str, holder: &LeaseHolder, ttl_ms: u64) -> StoreResult<()>;
    /// Extends the lease (no-op when `holder` no longer holds it: returns `Conflict`).
    fn renew_lease(&self, run: &str, holder: &LeaseHolder, ttl_ms: u64) -> StoreResult<()>;
    /// Releases the lease.
    fn release_lease(&self, run: &str, holder: &LeaseHolder) -> StoreResult<()>;
    /// The current holder of `run`'s lease, if any and alive.
    fn lease_holder(&self, run: &str) -> StoreResult<Option<LeaseHolder>>;
    /// Marks every `running` run whose lease is dead as `interrupted`; returns their ids. A run
    /// that holds no lease is dead when its keeper ([`EventStore::keep_run`]) is, or, with none,
    /// once a grace of 10 s since it started has passed.
    fn recover_interrupted(&self) -> StoreResult<Vec<String>>;
    /// Names `keeper` as the process that will finish `run`, which it created `running`: while
    /// that process lives, the run is not taken for one whose recorder died for want of a
    /// lease. A replay holds none, nor does a recording before its first step. Backends
    /// without keepers leave it to the grace.
    fn keep_run(&self, run: &str, keeper: &LeaseHolder) -> StoreResult<()> {
        let _ = (run, keeper);
        Ok(())
    }
}

/// What [`Store::heard_with_chains`] answers: each delivery with its message's request bytes,
/// and the causal chains of the sends heard.
pub type HeardWithChains = (Vec<(DeliveryHead, Option<Vec<u8>>)>, Chains);

/// A whole store: events, blobs, caches, the vault, garbage collection and the ledger.
pub trait Store: EventStore + BlobStore + Cache + VaultStore + GcStore + LedgerStore {
    /// The backend's name (`sqlite`, `memory`, ...).
    fn backend(&self) -> &'static str;
    /// The bytes of the request blob of each event of `run` at `seqs`, in the order given, each
    /// verified: `None` for an event with no request or whose blob is missing or corrupt;
    /// `NotFound` for a seq that isn't there. What `retrace knew` reads message bodies from.
    /// SQLite reads the events and their blobs in one query; the default asks
    /// [`EventStore::request_refs_at`], then [`BlobStore::get_blobs`] (each blob alone when that
    /// fails).
    fn request_blobs_at(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<Option<Vec<u8>>>> {
        let refs = self.request_refs_at(run, seqs)?;
        let digests: Vec<Digest> = refs.iter().flatten().copied().collect();
        let blobs: Vec<Option<Vec<u8>>> = match self.get_blobs(&digests) {
            Ok(all) => all.into_iter().map(Some).collect(),
            Err(_) => digests.iter().map(|d| self.get_blob(d).ok()).collect(),
        };
        let mut blobs = blobs.into_iter();
        Ok(refs.iter().map(|r| r.and_then(|_| blobs.next().flatten())).collect())
    }
    /// The deliveries to `agent` in `run` before seq `before`, as
    /// [`EventStore::delivery_heads_to`], each with the request blob of the event it delivered
    /// as [`Store::request_blobs_at`] reads it (`None` for a delivery with no causal parent).
    /// What `retrace knew` lists. SQLite reads both from one table clustered by agent; the
    /// default asks those two methods.
    fn heard_by(
        &self,
        run: &str,
        agent: &str,
        before: u64,
    ) -> StoreResult<Vec<(DeliveryHead, Option<Vec<u8>>)>> {
        let heads = self.delivery_heads_to(run, agent, before)?;
        let mut sends: Vec<u64> = heads.iter().filter_map(|d| d.causal_parent).collect();
        sends.sort_unstable();
        sends.dedup();
        let blobs = self.request_blobs_at(run, &sends)?;
        let by_send: std::collections::HashMap<u64, Option<Vec<u8>>> = sends.into_iter().zip(blobs).collect();
        Ok(heads
            .into_iter()
            .map(|d| {
                let blob = d.causal_parent.and_then(|s| by_send.get(&s).cloned().flatten());
                (d, blob)
            })
            .collect())
    }
    /// [`Store::heard_by`], and the heads of every event on the causal chains of the sends
    /// heard, `depth` links each, as [`EventStore::chain_heads`] answers for them: what
    /// `retrace knew` reads. SQLite follows chains of messages through its `deliveries` rows;
    /// the default asks those two methods.
    fn heard_with_chains(
        &self,
        run: &str,
        agent: &str,
        before: u64,
        depth: usize,
    ) -> StoreResult<HeardWithChains> {
        let heard = self.heard_by(run, agent, before)?;
        let mut sends: Vec<u64> = heard.iter().filter_map(|(d, _)| d.causal_parent).collect();
        sends.sort_unstable();
        sends.dedup();
        let chains = self.chain_heads(run, &sends, depth)?;
        Ok((heard, chains))
    }
    /// Runs `f` with every read this thread makes of the store served from one consistent
    /// snapshot (one read transaction), as a long read such as an export wants. Writes from
    /// other threads or processes proceed; `f` doesn't see them. The default just runs `f`.
    fn with_snapshot(&self, f: &mut dyn FnMut()) {
        f()
    }
    /// Why `run` may lack events its recorder was acknowledged for, when the backend knows:
    /// SQLite names an ack log no recorder holds that recovery could not apply. `None` by
    /// default.
    fn unrecovered(&self, run: &str) -> Option<String> {
        let _ = run;
        None
    }
    /// The schema upgrade opening this store made, if it made one: an older store brought to
    /// this build's schema, which older builds then refuse to open. `None` by default.
    fn schema_upgrade(&self) -> Option<SchemaUpgrade> {
        None
    }
}

/// A store's schema brought up to date by opening it ([`Store::schema_upgrade`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaUpgrade {
    /// The store (its database file, as it was named).
    pub store: String,
    /// The schema version it had.
    pub from: i64,
    /// The version it has now: this build's.
    pub to: i64,
    /// How long the upgrade took.
    pub took: std::time::Duration,
}

impl std::fmt::Display for SchemaUpgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "upgraded the store {} from schema version {} to {} in {:.1} s; builds of retrace older \
             than this one can't open it any more",
            self.store,
            self.from,
            self.to,
            self.took.as_secs_f64()
        )
    }
}
