//! Where the bytes of a verified blob line wait until phase 2 stores them, in memory bounded by
//! [`ImportOptions::chunk_bytes`](super::ImportOptions::chunk_bytes) rather than by the file.
//!
//! A line the storing thread takes (`import/early.rs`) is held only until it is stored; then
//! its bytes are dropped and it is [`Held::Stored`], its place kept. Any other line (a model
//! request, which phase 2 may chain onto the run's earlier requests, or every line when nothing
//! is stored early) is kept in memory up to an allowance and [`Held::Spilled`] past it, to an
//! unnamed temporary file. A manifest line is kept as its manifest. Whatever is read back, for
//! a manifest that names it or for phase 2 to store, is verified against its digest, and the
//! last few megabytes read back are cached ([`Keep::bytes`]), since the requests of one
//! conversation name the same messages again at every turn.
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::sync::Arc;

use retrace_core::digest_map::DigestMap;
use retrace_core::Digest;

use super::ImportStats;
use crate::{BlobAt, Store, StoreError, StoreResult};

/// What a verified blob line keeps until it is stored.
pub(super) enum Held {
    /// A text or base64 line's bytes, in memory.
    Bytes(Arc<[u8]>),
    /// Stored while the file was read, where `at` says (when the store said): its bytes are
    /// read back from the store if a manifest names it, and phase 2 only confirms it.
    Stored { len: u64, at: Option<BlobAt> },
    /// Written to the import's temporary file, at `offset`.
    Spilled { offset: u64, len: u64 },
    /// A manifest line, in the compact encoding, and the length of the request it stands for.
    /// The request is rebuilt from the lines it names only as it is stored
    /// ([`super::read::TraceSource`]): together, a conversation's requests hold every earlier
    /// turn again at each turn, so holding them whole would take memory quadratic in its length.
    Manifest { compact: Arc<[u8]>, len: u64 },
}

impl Held {
    /// Bytes of the blob as stored: a manifest's rebuilt request.
    pub fn len(&self) -> u64 {
        match self {
            Held::Bytes(bytes) => bytes.len() as u64,
            Held::Stored { len, .. } | Held::Spilled { len, .. } | Held::Manifest { len, .. } => *len,
        }
    }
}

/// The bytes of the blob lines read, as [`Held`], with what they cost ([`ImportStats`]).
pub(super) struct Keep<'s> {
    store: &'s dyn Store,
    /// Lines not stored early are kept in memory up to this many bytes, then spilled.
    allowance: u64,
    /// Bytes of lines kept in memory that are not stored early.
    kept: u64,
    /// Bytes of lines in memory ([`Held::Bytes`]) and of those cached in `recent`.
    held: u64,
    spill: Option<Spill>,
    recent: Recent,
    pub stats: ImportStats,
}

impl<'s> Keep<'s> {
    /// Keeps lines for an import whose transactions write about `chunk_bytes` each: up to half
    /// that in memory for phase 2, a quarter as a cache of bytes read back.
    pub fn new(store: &'s dyn Store, chunk_bytes: u64) -> Self {
        Keep {
            store,
            allowance: chunk_bytes / 2,
            kept: 0,
            held: 0,
            spill: None,
            recent: Recent::new(chunk_bytes / 4),
            stats: ImportStats::default(),
        }
    }

    /// A line taken by the storing thread: held until it is [`stored`](Keep::stored). Counted
    /// towards the peak at the next [`count`](Keep::count), once the lines stored meanwhile
    /// have been dropped.
    pub fn hold(&mut self, bytes: Arc<[u8]>) -> Held {
        self.held += bytes.len() as u64;
        Held::Bytes(bytes)
    }

    /// Counts the bytes held now towards the peak.
    pub fn count(&mut self) {
        self.stats.peak_held_bytes = self.stats.peak_held_bytes.max(self.held);
    }

    /// A line left for phase 2: in memory within the allowance, else spilled.
    pub fn keep(&mut self, bytes: Arc<[u8]>) -> StoreResult<Held> {
        let len = bytes.len() as u64;
        if self.kept + len <= self.allowance {
            self.kept += len;
            self.add(len);
            return Ok(Held::Bytes(bytes));
        }
        let spill = match &mut self.spill {
            Some(spill) => spill,
            None => self.spill.insert(Spill::new().map_err(spill_error)?),
        };
        let offset = spill.write(&bytes).map_err(spill_error)?;
        self.stats.spilled_bytes += len;
        Ok(Held::Spilled { offset, len })
    }

    /// A held line is stored now, at `at`: its bytes are dropped.
    pub fn stored(&mut self, held: &mut Held, at: Option<BlobAt>) {
        if let Held::Bytes(bytes) = held {
            let len = bytes.len() as u64;
            self.held -= len;
            *held = Held::Stored { len, at };
        }
    }

    /// The bytes of `digest`, held as `held` (not a manifest), read back and verified if they
    /// are not in memory, and cached: what a manifest names.
    pub fn bytes(&mut self, digest: &Digest, held: &Held) -> StoreResult<Arc<[u8]>> {
        self.read(digest, held, true)
    }

    /// [`Keep::bytes`] for a blob to store, which no later line asks for again: not cached.
    pub fn for_storing(&mut self, digest: &Digest, held: &Held) -> StoreResult<Arc<[u8]>> {
        self.read(digest, held, false)
    }

    fn read(&mut self, digest: &Digest, held: &Held, cache: bool) -> StoreResult<Arc<[u8]>> {
        if let Held::Bytes(bytes) = held {
            return Ok(bytes.clone());
        }
        if let Some(bytes) = self.recent.get(digest) {
            return Ok(bytes);
        }
        let (from, bytes) = match held {
            Held::Stored { at, .. } => {
                let read = self.store.get_blobs_unverified(&[(*digest, *at)])?;
                ("the store", read.into_iter().next().unwrap_or_default())
            }
            Held::Spilled { offset, len } => {
                let spill = self.spill.as_mut().ok_or_else(|| StoreError::corrupt("nothing was spilled"))?;
                ("the import's temporary file", spill.read(*offset, *len).map_err(spill_error)?)
            }
            Held::Bytes(_) | Held::Manifest { .. } => {
                return Err(StoreError::corrupt(format!("blob {digest} is a manifest, not bytes")))
            }
        };
        let actual = Digest::of(&bytes);
        if actual != *digest {
            return Err(StoreError::corrupt(format!(
                "blob {digest} read back from {from} hashes to {actual}"
            )));
        }
        self.stats.read_back_bytes += bytes.len() as u64;
        let bytes: Arc<[u8]> = bytes.into();
        if cache {
            let (added, freed) = self.recent.insert(*digest, bytes.clone());
            self.held -= freed;
            self.add(added);
        }
        Ok(bytes)
    }

    fn add(&mut self, len: u64) {
        self.held += len;
        self.count();
    }
}

fn spill_error(err: io::Error) -> StoreError {
    StoreError::from_io(err, "keeping blob lines in a temporary file")
}

/// An unnamed temporary file that lines are appended to and read back from.
struct Spill {
    file: BufWriter<File>,
    end: u64,
}

impl Spill {
    fn new() -> io::Result<Spill> {
        Ok(Spill { file: BufWriter::with_capacity(1 << 20, tempfile::tempfile()?), end: 0 })
    }

    /// Appends `bytes`; where they start.
    fn write(&mut self, bytes: &[u8]) -> io::Result<u64> {
        let offset = self.end;
        self.file.write_all(bytes)?;
        self.end += bytes.len() as u64;
        Ok(offset)
    }

    fn read(&mut self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        self.file.flush()?;
        let file = self.file.get_mut();
        let mut bytes = vec![0; len as usize];
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(&mut bytes)?;
        file.seek(SeekFrom::Start(self.end))?;
        Ok(bytes)
    }
}

/// Bytes read back lately, up to a budget, the oldest dropped first.
struct Recent {
    budget: u64,
    bytes: u64,
    map: DigestMap<Arc<[u8]>>,
    order: VecDeque<Digest>,
}

impl Recent {
    fn new(budget: u64) -> Recent {
        Recent { budget, bytes: 0, map: DigestMap::default(), order: VecDeque::new() }
    }

    fn get(&self, digest: &Digest) -> Option<Arc<[u8]>> {
        self.map.get(digest).cloned()
    }

    /// Caches `bytes` if they fit: the bytes added and those dropped to make room.
    fn insert(&mut self, digest: Digest, bytes: Arc<[u8]>) -> (u64, u64) {
        let len = bytes.len() as u64;
        if len > self.budget || self.map.contains_key(&digest) {
            return (0, 0);
        }
        let mut freed = 0;
        while self.bytes + len > self.budget {
            let Some(oldest) = self.order.pop_front() else { break };
            if let Some(gone) = self.map.remove(&oldest) {
                freed += gone.len() as u64;
                self.bytes -= gone.len() as u64;
            }
        }
        self.map.insert(digest, bytes);
        self.order.push_back(digest);
        self.bytes += len;
        (len, freed)
    }
}
