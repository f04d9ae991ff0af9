//! The ack log: how `Durability::Event` acknowledges a batch after one small `fdatasync`.
//!
//! Syncing the WAL after a commit costs more than a raw `fdatasync`: a one-event commit
//! writes 7 to 15 WAL frames (about 40 KB), and syncing them measured about 1.4x the raw
//! latency. So while a writer of this process holds a run's lease, a batch of that run is
//! committed to SQLite without a sync, then appended as one checksummed record (the batch
//! itself: events in canonical form, inline blobs, cache entries) to the run's ack log, and
//! that small file is fdatasynced before the batch is acknowledged.
//!
//! The log is a file of [`LOG_BYTES`] zeros written and synced when the lease is taken, so an
//! append overwrites allocated blocks and its `fdatasync` writes no metadata. Records follow
//! each other from offset 0; one that would not fit first syncs the WAL (everything in the log
//! is then durable in SQLite) and starts again at offset 0, leaving older records behind it.
//!
//! Recovery (`SqliteStore::recover_ack_log`, run by whoever takes the lease and for runs
//! whose recorder died) reads records from offset 0 up to the first one whose checksum fails
//! (a torn append, never acknowledged, or the zeros), skips records whose seqs the database
//! holds (every record left from an earlier lap is among them: the WAL was synced when the
//! lap began), commits the others, syncs the WAL and deletes the log. Releasing the lease
//! syncs the WAL and deletes it too. A record that would leave a gap in the run means the
//! disk lost what it had synced: a `Corrupt` error, and the log is kept.
//!
//! Batches the log doesn't take (a blob over [`crate::INLINE_BLOB_MAX`], which is a synced file
//! already, or a record over [`MAX_RECORD_BYTES`]) are committed with a WAL sync as before.
//!
//! Record layout (little-endian): magic `RTA1`, body length (u32), first seq (u64), last seq
//! (u64), the body, and the SHA-256 of everything before it. Body: run id; events (count,
//! then each as length and canonical JSON); blobs (count, then hint byte, length, bytes);
//! cache entries (count, then key, length and JSON of the entry).
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use retrace_core::digest::DigestWriter;
use retrace_core::envelope::{ToolClass, Usage};
use retrace_core::{Digest, Event};
use serde::{Deserialize, Serialize};

use crate::{Batch, BlobHint, BlobPut, CacheEntry, INLINE_BLOB_MAX};

/// Size of a run's ack log.
pub(crate) const LOG_BYTES: u64 = 1 << 20;

/// The largest record the log takes (a quarter of it, so a lap holds at least four).
pub(crate) const MAX_RECORD_BYTES: usize = (LOG_BYTES / 4) as usize;

const MAGIC: &[u8; 4] = b"RTA1";
const HEADER_BYTES: usize = 4 + 4 + 8 + 8;
const CHECKSUM_BYTES: usize = 32;

/// The ack-log folder of the database at `db`.
pub(crate) fn dir_of(db: &Path) -> PathBuf {
    let mut dir = db.as_os_str().to_owned();
    dir.push("-acklog");
    dir.into()
}

/// The ack log of the run with key `run_pk` in `dir`.
pub(crate) fn path_of(dir: &Path, run_pk: i64) -> PathBuf {
    dir.join(run_pk.to_string())
}

/// The run key an ack log's file name gives, if it is one.
pub(crate) fn run_pk_of(name: &str) -> Option<i64> {
    name.parse().ok().filter(|pk: &i64| pk.to_string() == name)
}

/// One run's open ack log.
#[derive(Debug)]
pub(crate) struct AckLog {
    file: File,
    path: PathBuf,
    /// Where the next record goes.
    offset: u64,
}

impl AckLog {
    /// Creates the log at `path` (replacing any file there): [`LOG_BYTES`] zeros, synced, and
    /// its folder synced so the file survives a crash.
    pub(crate) fn create(path: &Path) -> io::Result<AckLog> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let mut file =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        let zeros = vec![0u8; 64 << 10];
        for _ in 0..LOG_BYTES / zeros.len() as u64 {
            file.write_all(&zeros)?;
        }
        file.sync_all()?;
        File::open(dir)?.sync_all()?;
        Ok(AckLog { file, path: path.to_path_buf(), offset: 0 })
    }

    /// Where the log lives.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `record` ([`encode`]) and syncs it. When it doesn't fit, `sync_wal` runs first
    /// and the record goes at offset 0.
    pub(crate) fn append(
        &mut self,
        record: &[u8],
        sync_wal: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        if self.offset + record.len() as u64 > LOG_BYTES {
            sync_wal()?;
            self.offset = 0;
        }
        self.file.write_all_at(record, self.offset)?;
        self.file.sync_data()?;
        self.offset += record.len() as u64;
        Ok(())
    }
}

/// Whether the log may take `batch`: it has events, and no blob is kept as a file ([`encode`]
/// still refuses a record over [`MAX_RECORD_BYTES`]).
pub(crate) fn takes(batch: &Batch) -> bool {
    let blob_bytes: usize = batch.blobs.iter().map(|b| b.bytes().len()).sum();
    !batch.events.is_empty()
        && batch.blobs.iter().all(|b| b.bytes().len() <= INLINE_BLOB_MAX)
        && blob_bytes <= MAX_RECORD_BYTES
}

/// A cache entry as the log writes it.
#[derive(Serialize, Deserialize)]
struct EntryJson {
    output_ref: Digest,
    usage: Option<Usage>,
    stored_at_ms: u64,
    class: Option<ToolClass>,
    ttl_s: Option<u64>,
}

/// The record of `batch`, or `None` when it would be over [`MAX_RECORD_BYTES`] (or an event or
/// entry can't be encoded; the caller then syncs the WAL instead, where the same problem is
/// reported).
pub(crate) fn encode(batch: &Batch) -> Option<Vec<u8>> {
    let first = batch.events.first()?.seq;
    let last = batch.events.last()?.seq;
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(&last.to_le_bytes());
    put_bytes(&mut out, batch.run_id.as_bytes());
    put_len(&mut out, batch.events.len());
    for event in &batch.events {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        event.write_canonical(&mut out).ok()?;
        let len = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
    put_len(&mut out, batch.blobs.len());
    for blob in &batch.blobs {
        out.push(match blob.hint() {
            BlobHint::Raw => 0,
            BlobHint::ModelRequest => 1,
            BlobHint::ModelResponse => 2,
        });
        put_bytes(&mut out, blob.bytes());
    }
    put_len(&mut out, batch.cache.len());
    for (key, entry) in &batch.cache {
        out.extend_from_slice(key.as_bytes());
        let json = serde_json::to_vec(&EntryJson {
            output_ref: entry.output_ref,
            usage: entry.usage.clone(),
            stored_at_ms: entry.stored_at_ms,
            class: entry.class,
            ttl_s: entry.ttl_s,
        })
        .ok()?;
        put_bytes(&mut out, &json);
    }
    let body = out.len() - HEADER_BYTES;
    if out.len() + CHECKSUM_BYTES > MAX_RECORD_BYTES {
        return None;
    }
    out[4..8].copy_from_slice(&(body as u32).to_le_bytes());
    let mut hasher = DigestWriter::new();
    hasher.update(&out);
    out.extend_from_slice(hasher.finish().as_bytes());
    Some(out)
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(&(len as u32).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// A record whose checksum holds, not yet decoded.
#[derive(Debug)]
pub(crate) struct Record<'a> {
    /// Byte offset in the log.
    pub offset: usize,
    pub first: u64,
    pub last: u64,
    body: &'a [u8],
}

/// The records of a log's bytes, from offset 0 up to the first that is torn, zeros or
/// otherwise fails its checksum.
pub(crate) fn scan(log: &[u8]) -> Vec<Record<'_>> {
    let mut records = Vec::new();
    let mut at = 0;
    while let Some(record) = record_at(log, at) {
        at += HEADER_BYTES + record.body.len() + CHECKSUM_BYTES;
        records.push(record);
    }
    records
}

fn record_at(log: &[u8], at: usize) -> Option<Record<'_>> {
    let header = log.get(at..at + HEADER_BYTES)?;
    if &header[..4] != MAGIC {
        return None;
    }
    let body_len = u32::from_le_bytes(header[4..8].try_into().ok()?) as usize;
    let end = at.checked_add(HEADER_BYTES)?.checked_add(body_len)?;
    let checksum = log.get(end..end.checked_add(CHECKSUM_BYTES)?)?;
    let mut hasher = DigestWriter::new();
    hasher.update(&log[at..end]);
    if hasher.finish().as_bytes() != checksum {
        return None;
    }
    let first = u64::from_le_bytes(header[8..16].try_into().ok()?);
    let last = u64::from_le_bytes(header[16..24].try_into().ok()?);
    (first >= 1 && first <= last).then_some(Record {
        offset: at,
        first,
        last,
        body: &log[at + HEADER_BYTES..end],
    })
}

impl Record<'_> {
    /// The batch this record holds, its events' hashes checked; the error says what is wrong.
    pub(crate) fn decode(&self) -> Result<Batch, String> {
        let mut body = Reader(self.body);
        let run_id = String::from_utf8(body.bytes()?.to_vec()).map_err(|_| "a run id that is not UTF-8")?;
        let mut batch = Batch { run_id, ..Batch::default() };
        for _ in 0..body.len()? {
            let bytes = body.bytes()?;
            let event: Event =
                serde_json::from_slice(bytes).map_err(|e| format!("an event that doesn't decode: {e}"))?;
            match event.compute_hash() {
                Ok(hash) if hash == event.hash => batch.events.push(event),
                _ => return Err(format!("seq {} whose hash doesn't match its content", event.seq)),
            }
        }
        for _ in 0..body.len()? {
            let hint = match body.take(1)?[0] {
                0 => BlobHint::Raw,
                1 => BlobHint::ModelRequest,
                2 => BlobHint::ModelResponse,
                other => return Err(format!("a blob of unknown kind {other}")),
            };
            batch.blobs.push(BlobPut::new(body.bytes()?.to_vec(), hint));
        }
        for _ in 0..body.len()? {
            let key = Digest::from_slice(body.take(32)?).ok_or("a short cache key")?;
            let entry: EntryJson = serde_json::from_slice(body.bytes()?)
                .map_err(|e| format!("a cache entry that doesn't decode: {e}"))?;
            let EntryJson { output_ref, usage, stored_at_ms, class, ttl_s } = entry;
            batch.cache.push((key, CacheEntry { output_ref, usage, stored_at_ms, class, ttl_s }));
        }
        let seqs = (batch.events.first().map(|e| e.seq), batch.events.last().map(|e| e.seq));
        if seqs != (Some(self.first), Some(self.last)) || !body.0.is_empty() {
            return Err(format!(
                "a body that doesn't match its header (seqs {}..={})",
                self.first, self.last
            ));
        }
        Ok(batch)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("a body cut short".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn len(&mut self) -> Result<usize, String> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")) as usize)
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.len()?;
        self.take(n)
    }
}

/// The ack logs of one store: the folder, and the logs of runs whose lease this store holds.
#[derive(Debug)]
pub(crate) struct AckLogs {
    dir: PathBuf,
    open: Mutex<HashMap<String, Arc<Mutex<AckLog>>>>,
}

impl AckLogs {
    /// The ack logs of the database at `db` (nothing is created yet).
    pub(crate) fn new(db: &Path) -> AckLogs {
        AckLogs { dir: dir_of(db), open: Mutex::new(HashMap::new()) }
    }

    /// The folder of the logs.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the log of `run` (key `run_pk`) and keeps it open for [`AckLogs::get`].
    pub(crate) fn open(&self, run: &str, run_pk: i64) -> io::Result<()> {
        let log = AckLog::create(&path_of(&self.dir, run_pk))?;
        self.open.lock().insert(run.to_owned(), Arc::new(Mutex::new(log)));
        Ok(())
    }

    /// The open log of `run`, if this store holds one.
    pub(crate) fn get(&self, run: &str) -> Option<Arc<Mutex<AckLog>>> {
        self.open.lock().get(run).cloned()
    }

    /// Stops logging `run`; the closed log, if there was one (its file is left in place).
    pub(crate) fn close(&self, run: &str) -> Option<Arc<Mutex<AckLog>>> {
        self.open.lock().remove(run)
    }

    /// The run keys of the logs in the folder (none when it doesn't exist).
    pub(crate) fn on_disk(&self) -> io::Result<Vec<i64>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut pks = Vec::new();
        for entry in entries {
            if let Some(pk) = entry?.file_name().to_str().and_then(run_pk_of) {
                pks.push(pk);
            }
        }
        pks.sort_unstable();
        Ok(pks)
    }
}
