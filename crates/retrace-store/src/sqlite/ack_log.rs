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
//! A record is written before its batch commits, and its `fdatasync` runs on the store's sync
//! thread while the batch commits ([`super::flusher`]), so a step waits for the longer of the
//! two, not their sum; if the commit fails the record is withdrawn (zeroed).
//!
//! Ownership is the file's `flock`, held as long as the log is open: the lease can't tell two
//! stores of one process apart, the lock can, and the kernel drops it when its process dies.
//! A log is created under a temporary name, locked, then linked into place, so no one sees it
//! unlocked; a log whose lock is held is never read, recovered or deleted by anyone else.
//!
//! Recovery (`SqliteStore::recover_ack_log`), by whoever takes the lease and, for logs no one
//! holds, by `recover_interrupted`, reads records from offset 0 up to the first one whose
//! checksum fails (a torn append, never acknowledged, or the zeros), skips records whose seqs
//! the database holds (every record left from an earlier lap is among them: the WAL was synced
//! when the lap began), commits the others, syncs the WAL and deletes the log. Releasing the
//! lease syncs the WAL and deletes the log before the lease goes. A record that would leave a
//! gap in the run means the disk lost what it had synced: a `Corrupt` error; the log is kept
//! and `recover_interrupted` leaves the run `running` (taking its lease reports the error).
//!
//! Batches the log doesn't take (a blob over [`crate::INLINE_BLOB_MAX`], which is a synced file
//! already, or a record over [`MAX_RECORD_BYTES`]) are committed with a WAL sync as before.
//!
//! Record layout (little-endian): magic `RTA1`, body length (u32), first seq (u64), last seq
//! (u64), the body, and the SHA-256 of everything before it. Body: run id; events (count,
//! then each as length and JSON, floats as written: not the canonical form, which writes 1.0
//! as 1); blobs (count, then hint byte, length, bytes);
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

use super::flusher::{self, Flusher};
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

/// One run's open ack log, locked (`flock`) for as long as it is open: a log whose lock is
/// free belongs to no live store and may be recovered; one whose lock is held is never touched.
#[derive(Debug)]
pub(crate) struct AckLog {
    /// Shared with the sync thread while a record's `fdatasync` runs there.
    file: Arc<File>,
    path: PathBuf,
    /// Where the next record goes.
    offset: u64,
    /// Set once the lease is being released, or a withdrawal or sync failed: commits then
    /// sync the WAL instead.
    closed: bool,
    /// The seq the next staged batch must start at, once a commit of the run through this
    /// store told it (`None` before: the first batch syncs the WAL). A batch that doesn't
    /// continue the run would fail to commit: it is never staged, so no record of it can be
    /// left behind.
    next: Option<u64>,
}

impl AckLog {
    /// Creates the log at `path`, which must not exist: [`LOG_BYTES`] zeros, synced and locked
    /// under a temporary name, then linked at `path` (`AlreadyExists` if another store got
    /// there first), and the folder synced so the file survives a crash.
    pub(crate) fn create(path: &Path) -> io::Result<AckLog> {
        static CREATED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        // The folder's own entry, in the database's folder (whoever created it).
        let parent = dir.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        File::open(parent)?.sync_all()?;
        let n = CREATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("log");
        let temp = dir.join(format!("{name}{TEMP_MARK}{}-{n}", std::process::id()));
        let made = (|| {
            let mut file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&temp)?;
            // Locked before anything else, so `remove_dead_temps` leaves it alone.
            if !try_lock(&file)? {
                return Err(io::Error::other("a new ack log is locked by someone else"));
            }
            let zeros = vec![0u8; 64 << 10];
            for _ in 0..LOG_BYTES / zeros.len() as u64 {
                file.write_all(&zeros)?;
            }
            file.sync_all()?;
            std::fs::hard_link(&temp, path)?;
            Ok(file)
        })();
        let _ = std::fs::remove_file(&temp);
        let file = made?;
        File::open(dir)?.sync_all()?;
        Ok(AckLog { file: Arc::new(file), path: path.to_path_buf(), offset: 0, closed: false, next: None })
    }

    /// Where the log lives.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the log takes a batch starting at seq `first`: it is open, and the batch
    /// continues what this store committed of the run.
    pub(crate) fn takes(&self, first: u64) -> bool {
        !self.closed && self.next == Some(first)
    }

    /// A batch of the run up to seq `last` committed (through the log or not).
    pub(crate) fn committed(&mut self, last: u64) {
        self.next = Some(last + 1);
    }

    /// Writes `record` ([`encode`]) at the end of the log, without syncing it: the caller starts
    /// its sync ([`AckLog::start_sync`]), commits the batch meanwhile, then hands the sync's
    /// outcome to [`AckLog::synced`] (and calls [`AckLog::withdraw`] if the commit failed).
    /// When the record doesn't fit, `sync_wal` runs first and the record goes at offset 0.
    /// Returns where it went.
    pub(crate) fn stage(
        &mut self,
        record: &[u8],
        sync_wal: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<u64> {
        if self.offset + record.len() as u64 > LOG_BYTES {
            sync_wal()?;
            self.offset = 0;
        }
        self.file.write_all_at(record, self.offset)?;
        Ok(self.offset)
    }

    /// Starts the `fdatasync` of everything written so far on `flusher`'s thread.
    pub(crate) fn start_sync(&self, flusher: &Flusher) -> flusher::Pending {
        flusher.start(&self.file)
    }

    /// The sync of the record staged at `at` (`len` bytes) ended with `synced`: on success the
    /// next record goes after it.
    pub(crate) fn synced(&mut self, at: u64, len: usize, synced: io::Result<()>) -> io::Result<()> {
        if let Err(e) = synced {
            // What reached the disk is unknown (and a second fsync proves nothing): no record
            // may follow this one.
            self.closed = true;
            return Err(e);
        }
        self.offset = at + len as u64;
        Ok(())
    }

    /// Unwrites the record staged at `at` (its batch didn't commit): its magic becomes zeros,
    /// so recovery stops before it, and the next record overwrites it. If that fails, the log
    /// closes: a record of a batch no one stored may remain, and nothing may follow it.
    pub(crate) fn withdraw(&mut self, at: u64) {
        let undone = self.file.write_all_at(&[0; 4], at).and_then(|()| self.file.sync_data());
        if undone.is_err() {
            self.closed = true;
        }
    }

    /// Stops taking records.
    pub(crate) fn close(&mut self) {
        self.closed = true;
    }

    /// Deletes the file (the caller closed the log and synced the WAL: everything the log
    /// holds is durable in the database).
    pub(crate) fn delete(&self) -> io::Result<()> {
        remove_if_same(&self.file, &self.path)
    }
}

/// What a temporary log's name holds between the run key and the creator.
const TEMP_MARK: &str = ".new-";

/// Takes an exclusive `flock` on `file` without waiting: `false` when another open file holds
/// it (in this process or another; the kernel drops it when its holder dies).
#[allow(unsafe_code)]
fn try_lock(file: &File) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call on a file descriptor this `File` owns for the whole call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        true => Ok(false),
        false => Err(e),
    }
}

/// Whether `path` names the file `file` has open.
fn is_same(file: &File, path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let (open, named) = match std::fs::metadata(path) {
        Ok(named) => (file.metadata()?, named),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    Ok(open.dev() == named.dev() && open.ino() == named.ino())
}

/// Deletes `path` if it still names `file` (locked by the caller).
fn remove_if_same(file: &File, path: &Path) -> io::Result<()> {
    match is_same(file, path)? {
        true => match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
        false => Ok(()),
    }
}

/// A log on disk that no live store holds, locked by the caller for recovery.
#[derive(Debug)]
pub(crate) struct Found {
    file: File,
    path: PathBuf,
}

impl Found {
    /// Its bytes (at most a log's size; a longer file is not a log this store wrote).
    pub(crate) fn bytes(&self) -> io::Result<Vec<u8>> {
        use std::io::Read;
        let mut bytes = Vec::with_capacity(LOG_BYTES as usize);
        (&self.file).take(LOG_BYTES).read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// Where it lives.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Deletes it (the caller synced the WAL first).
    pub(crate) fn remove(self) -> io::Result<()> {
        remove_if_same(&self.file, &self.path)
    }
}

/// What [`claim`] found at a log's path.
#[derive(Debug)]
pub(crate) enum Claim {
    /// No log.
    Absent,
    /// A log a live store holds.
    Busy,
    /// A log to recover.
    Found(Found),
}

/// Looks at the log at `path` and locks it if no one holds it.
pub(crate) fn claim(path: &Path) -> io::Result<Claim> {
    for _ in 0..8 {
        let file = match std::fs::OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Claim::Absent),
            Err(e) => return Err(e),
        };
        if !try_lock(&file)? {
            return Ok(Claim::Busy);
        }
        // Deleted or replaced between the open and the lock: look again.
        if is_same(&file, path)? {
            return Ok(Claim::Found(Found { file, path: path.to_path_buf() }));
        }
    }
    Ok(Claim::Busy)
}

/// Deletes the temporary files of log creations that died (their lock is free).
pub(crate) fn remove_dead_temps(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(|n| n.contains(TEMP_MARK)) {
            if let Ok(file) = File::open(entry.path()) {
                if try_lock(&file).unwrap_or(false) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }
}

/// Whether the log may take `batch`: it has events, and no blob is kept as a file or carried
/// without its bytes ([`encode`] still refuses a record over [`MAX_RECORD_BYTES`]).
pub(crate) fn takes(batch: &Batch) -> bool {
    let blob_bytes: usize = batch.blobs.iter().map(|b| b.bytes().len()).sum();
    !batch.events.is_empty()
        && batch.blobs.iter().all(|b| b.carries_bytes() && b.bytes().len() <= INLINE_BLOB_MAX)
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
    /// Absent in records written before schema 15.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    snapshot: Option<String>,
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
        // Not the canonical form, which writes 1.0 as 1: the event as the writer sealed it.
        serde_json::to_writer(&mut out, event).ok()?;
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
            snapshot: entry.snapshot.clone(),
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
            let EntryJson { output_ref, usage, stored_at_ms, class, ttl_s, snapshot } = entry;
            batch.cache.push((key, CacheEntry { output_ref, usage, stored_at_ms, class, ttl_s, snapshot }));
        }
        let seqs = (batch.events.first().map(|e| e.seq), batch.events.last().map(|e| e.seq));
        if seqs != (Some(self.first), Some(self.last)) || !body.0.is_empty() {
            return Err(format!(
                "a body that doesn't match its header ({})",
                crate::error::seqs(self.first, self.last)
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

    /// Creates the log of `run` (key `run_pk`) and keeps it open for [`AckLogs::get`]
    /// (`AlreadyExists` when another store holds one).
    /// Its first batch must start at seq `next` (a fork's first, at its fork point, syncs the
    /// WAL instead).
    pub(crate) fn open(&self, run: &str, run_pk: i64, next: u64) -> io::Result<()> {
        let mut log = AckLog::create(&path_of(&self.dir, run_pk))?;
        log.next = Some(next);
        self.open.lock().insert(run.to_owned(), Arc::new(Mutex::new(log)));
        Ok(())
    }

    /// The open log of `run`, if this store holds one.
    pub(crate) fn get(&self, run: &str) -> Option<Arc<Mutex<AckLog>>> {
        self.open.lock().get(run).cloned()
    }

    /// Stops logging `run`: the log, if there was one, no longer in the table (a commit
    /// that got it before still may, until the caller closes it).
    pub(crate) fn take(&self, run: &str) -> Option<Arc<Mutex<AckLog>>> {
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use retrace_core::EventType;

    use super::*;

    fn batch(first: u64, n: u64) -> Batch {
        let mut prev = None;
        let events = (first..first + n)
            .map(|seq| {
                let mut e = Event::new("r", "agent", EventType::ToolCall);
                e.seq = seq;
                e.params = Some([("temperature".to_string(), serde_json::json!(1.0))].into_iter().collect());
                e.seal(prev).unwrap();
                prev = Some(e.hash);
                e
            })
            .collect();
        let blobs = vec![BlobPut::new(vec![7u8; 100], BlobHint::ModelResponse)];
        Batch { run_id: "r".into(), events, blobs, cache: Vec::new() }
    }

    #[test]
    fn a_record_decodes_to_its_batch_floats_and_all() {
        let original = batch(3, 2);
        let record = encode(&original).unwrap();
        let records = scan(&record);
        assert_eq!((records.len(), records[0].first, records[0].last), (1, 3, 4));
        let decoded = records[0].decode().unwrap();
        assert_eq!(decoded.events, original.events, "1.0 stays 1.0");
        assert_eq!(decoded.blobs[0].bytes(), original.blobs[0].bytes());
        assert_eq!(decoded.blobs[0].hint(), BlobHint::ModelResponse);
    }

    #[test]
    fn a_scan_reads_a_new_lap_then_what_is_left_of_the_old_one_and_stops_at_a_torn_record() {
        let (new, old, torn) =
            (encode(&batch(9, 1)).unwrap(), encode(&batch(3, 2)).unwrap(), encode(&batch(10, 1)).unwrap());
        let mut log = new.clone();
        log.extend_from_slice(&old);
        let seqs: Vec<(u64, u64)> = scan(&log).iter().map(|r| (r.first, r.last)).collect();
        assert_eq!(seqs, vec![(9, 9), (3, 4)]);
        let mut log = new.clone();
        log.extend_from_slice(&torn[..torn.len() - 1]);
        log.push(torn[torn.len() - 1] ^ 1);
        log.extend_from_slice(&old);
        assert_eq!(scan(&log).len(), 1, "nothing after a torn record is read");
    }

    proptest! {
        #[test]
        fn scanning_and_decoding_any_bytes_never_panics(
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
            cut in any::<usize>(),
        ) {
            let mut log = encode(&batch(1, 3)).unwrap();
            log.extend_from_slice(&encode(&batch(4, 1)).unwrap());
            for (at, byte) in flips {
                let at = at % log.len();
                log[at] ^= byte;
            }
            log.truncate(cut % (log.len() + 1));
            for record in scan(&log) {
                let _ = record.decode();
            }
        }
    }
}
