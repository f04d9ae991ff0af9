//! Writing a stored run as a `retrace-trace/1` file (format in [`retrace_core::export`]).
//!
//! [`export_run`] makes one pass over the run's events, page by page, writing their canonical
//! lines to a spool (memory, then a temporary file past [`SPOOL_IN_MEMORY`]) while it collects
//! the blobs they reference in order of first reference. Blobs stored as chained manifests are
//! expanded so that every blob a manifest names comes before it. Then the header (which needs
//! both counts), the spooled events and the blob lines go out. Every line is canonical JSON, so
//! exporting a run, importing it elsewhere and exporting it again gives the same bytes.
//!
//! The calling thread does all the reading (it holds the snapshot); a second thread encodes:
//! it spools the event lines of each page while the next page is read. Then, while the calling
//! thread reads chunks of blobs, an encoder hashes and encodes each chunk into lines and a
//! writer puts out the header, the spooled events and those lines: the blobs are read
//! unverified ([`crate::BlobStore::get_blobs_unverified`]) and verified by the encoder, so the
//! reading thread, the slowest, doesn't hash, and doesn't write. Errors keep file order: the
//! writer's, then the encoder's, about earlier lines, win over the reader's.
use std::io::{self, BufWriter, Seek, Write};
use std::sync::mpsc::{self, Receiver, SyncSender};

use base64::Engine as _;
use retrace_core::canonical::{write_canonical, write_canonical_value, CanonError};
use retrace_core::digest_map::{DigestMap, DigestSet};
use retrace_core::export::{ExportHeader, FORMAT};
use retrace_core::json::{self, Json};
use retrace_core::{Digest, Event, EventType};
use tempfile::SpooledTempFile;

use crate::manifest::Manifest;
use crate::verify::ChainCheck;
use crate::{BlobRef, Store, StoreError, StoreErrorKind, INLINE_BLOB_MAX};

mod events;

pub use events::{holds_inherited, EventCursor, RunEvents, Segment, PAGE};

/// Spooled event lines stay in memory up to this many bytes (then a temporary file holds them).
/// 64 MB holds about 100k events' lines: exporting a 260k-event run peaked at 494 MB resident
/// with 256 MB and at 378 MB with this, in the same time (1.6 s), and the export bench's 100k
/// events ran at the same rate with either (107k–150k events/s, the machine's noise).
pub const SPOOL_IN_MEMORY: usize = 64 << 20;

/// What an export wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// Event lines.
    pub events: u64,
    /// Blob lines (manifests included).
    pub blobs: u64,
    /// Bytes written, header included.
    pub bytes: u64,
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The store could not give what the run references.
    #[error("reading run {run_id} from the store")]
    Store {
        /// The run being exported.
        run_id: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// Writing the output failed (a closed pipe included).
    #[error("writing the export")]
    Io(#[from] io::Error),
    /// An event has no canonical form (it could not have been hashed either).
    #[error("run {run_id}: {what} has no canonical form")]
    Canon {
        /// The run.
        run_id: String,
        /// `seq N` or `the header`.
        what: String,
        /// Why.
        #[source]
        source: CanonError,
    },
    /// The stored run is not exportable as it stands: a seq gap, a manifest that can't be read.
    #[error("run {run_id}: {message} (run `retrace verify {run_id}`)")]
    Inconsistent {
        /// The run.
        run_id: String,
        /// What is wrong.
        message: String,
    },
}

impl ExportError {
    /// The CLI exit code: 1 for a store that holds corrupt data, 2 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            ExportError::Store { source, .. } if source.kind == StoreErrorKind::Corrupt => 1,
            ExportError::Inconsistent { .. } | ExportError::Canon { .. } => 1,
            _ => 2,
        }
    }
}

/// Plain blobs read from the store per [`crate::BlobStore::get_blobs`] call, at most.
const BLOBS_PER_READ: usize = 256;

/// About how many bytes of blobs one read fetches: reads of large blobs take fewer blobs.
const CHUNK_BYTES: usize = 4 << 20;

/// Writes run `run_id` to `out`; `progress` receives the number of events written so far.
///
/// The whole export reads one snapshot of the store ([`Store::with_snapshot`]).
pub fn export_run(
    store: &dyn Store,
    run_id: &str,
    out: &mut (dyn Write + Send),
    progress: &mut dyn FnMut(u64),
) -> Result<ExportStats, ExportError> {
    let mut result = None;
    store.with_snapshot(&mut || result = Some(export_inner(store, run_id, &mut *out, &mut *progress)));
    result.expect("with_snapshot runs its function")
}

fn export_inner(
    store: &dyn Store,
    run_id: &str,
    out: &mut (dyn Write + Send),
    progress: &mut dyn FnMut(u64),
) -> Result<ExportStats, ExportError> {
    let stored = |source| ExportError::Store { run_id: run_id.to_owned(), source };
    let run = store.run(run_id).map_err(stored)?;
    let mut pages = RunEvents::new(store, run_id).map_err(stored)?;
    let count = pages.count();

    // This thread reads (it holds the snapshot); a second one writes the canonical lines.
    let (refs, requests, read, spool) = std::thread::scope(|scope| {
        let (pages_tx, pages_rx) = mpsc::sync_channel::<Vec<Event>>(2);
        let encoder = scope.spawn(move || spool_events(run_id, pages_rx));
        let read = read_events(run_id, &mut pages, count, &pages_tx, progress);
        drop(pages_tx);
        let spool = encoder.join().expect("the event encoder never panics");
        // The encoder's error concerns an earlier event than any error the reader found.
        let spool = spool?;
        read.map(|(refs, requests, ends)| (refs, requests, ends, spool))
    })?;
    // What import checks beyond the chain, checked here too: an export never writes a file
    // its own import refuses (QA40 D2: a run whose last events were gone exported with exit 0).
    let inconsistent = |message| ExportError::Inconsistent { run_id: run_id.to_owned(), message };
    if let Some(head) = run.head.filter(|_| run.status != retrace_core::run::RunStatus::Running) {
        if read.last_hash != Some(head) {
            let found = read.last_hash.map_or("no events".to_owned(), |d| d.to_string());
            return Err(inconsistent(format!(
                "the run's head is {head} but its last event's hash is {found}: events are missing \
                 from its end"
            )));
        }
    }
    if let Some(message) = crate::verify::decisions_disagree(&run, &read.decisions) {
        return Err(inconsistent(message));
    }

    // A fork's edits name blobs no event may reference (a `message:` edit's body): the file
    // carries them too, so a replay of the imported fork can apply its edits again.
    let mut refs = refs;
    let edit_blobs = crate::gc::edit_blobs(&run);
    if !edit_blobs.is_empty() {
        let mut referenced: DigestSet = refs.iter().map(|(d, _)| *d).collect();
        for digest in edit_blobs {
            if referenced.insert(digest) {
                refs.push((digest, None));
            }
        }
    }
    let plan = plan_blobs(store, run_id, &refs, requests)?;
    let run_digest = serde_json::to_value(&run).ok().as_ref().and_then(retrace_core::export::run_digest);
    let header = ExportHeader {
        run_digest,
        format: FORMAT.to_owned(),
        holds_tokens: run.holds_tokens,
        mask_key_fingerprint: run.mask_key_fingerprint.clone(),
        masking_rules: run.masking_rules.clone(),
        run,
        events: count,
        blobs: plan.len() as u64,
    };
    let mut header_line = Vec::with_capacity(4096);
    let value = serde_json::to_value(&header).expect("a header always serializes");
    write_canonical_value(&value, &mut header_line).map_err(|source| ExportError::Canon {
        run_id: run_id.to_owned(),
        what: "the header".to_owned(),
        source,
    })?;
    header_line.push(b'\n');

    let blobs = plan.len() as u64;
    // This thread reads the blobs; an encoder hashes each and encodes its line; the writer
    // puts out the header and the spooled events meanwhile, then the encoded lines.
    let bytes = std::thread::scope(|scope| {
        let (chunks_tx, chunks_rx) = mpsc::sync_channel::<Vec<Fetched>>(2);
        let (lines_tx, lines_rx) = mpsc::sync_channel::<Vec<u8>>(2);
        let encoder = scope.spawn(move || encode_blobs(run_id, chunks_rx, lines_tx));
        let writer = scope.spawn(move || -> io::Result<u64> {
            let mut w = CountingWriter { inner: BufWriter::with_capacity(1 << 20, out), bytes: 0 };
            w.write_all(&header_line)?;
            let mut spool = spool;
            spool.seek(io::SeekFrom::Start(0))?;
            io::copy(&mut spool, &mut w)?;
            drop(spool);
            for lines in lines_rx {
                w.write_all(&lines)?;
            }
            w.flush()?;
            Ok(w.bytes)
        });
        let fetched = fetch_blobs(store, run_id, plan, &chunks_tx);
        drop(chunks_tx);
        // Errors keep file order: the writer's concern earlier lines than the encoder's, whose
        // concern earlier lines than the reader's.
        let encoded = encoder.join().expect("the blob encoder never panics");
        let bytes = writer.join().expect("the blob writer never panics")?;
        encoded?;
        fetched.map(|()| bytes)
    })?;
    Ok(ExportStats { events: count, blobs, bytes })
}

/// Reads the run's events page by page, checks their seqs and hands each page to the encoder;
/// returns the blobs they reference in order of first reference, and the model calls' requests
/// and outputs (the blobs that may be manifests).
/// What [`read_events`] saw of the run as a whole: its last event's hash and its decisions.
#[derive(Default)]
struct Read {
    last_hash: Option<Digest>,
    decisions: Vec<retrace_core::run::FinalDecision>,
}

fn read_events(
    run_id: &str,
    pages: &mut RunEvents<'_>,
    count: u64,
    encoder: &SyncSender<Vec<Event>>,
    progress: &mut dyn FnMut(u64),
) -> Result<(Vec<BlobRef>, DigestSet, Read), ExportError> {
    let stored = |source| ExportError::Store { run_id: run_id.to_owned(), source };
    // About two blobs an event (a request and an output), room taken at once: each growth of
    // these rehashes or copies what they hold while the encoder waits.
    let room = count.min(1 << 20) as usize * 2;
    let mut refs = Vec::with_capacity(room);
    let mut referenced = DigestSet::with_capacity_and_hasher(room, Default::default());
    let mut requests = DigestSet::default();
    let mut read = Read::default();
    let mut next = 1u64;
    while let Some(located) = pages.next_located_page().map_err(stored)? {
        let gap = located.iter().zip(next..).position(|(l, expected)| l.event.seq != expected);
        let valid = gap.unwrap_or(located.len());
        for l in &located[..valid] {
            for blob in l.blob_refs() {
                if referenced.insert(blob.0) {
                    refs.push(blob);
                }
            }
            if l.event.kind == EventType::ModelCall {
                requests.extend(l.event.request_ref);
                requests.extend(l.event.output_ref);
            }
            read.last_hash = Some(l.event.hash);
            read.decisions.extend(crate::verify::decision_of(&l.event));
        }
        let mut page: Vec<Event> = located.into_iter().map(|l| l.event).collect();
        next += valid as u64;
        if let Some(i) = gap {
            let message = format!("expected seq {next}, the store has seq {}", page[i].seq);
            // The events before it still go to the encoder: an error it finds in one of them
            // comes first.
            page.truncate(i);
            let _ = encoder.send(page);
            return Err(ExportError::Inconsistent { run_id: run_id.to_owned(), message });
        }
        if encoder.send(page).is_err() {
            // The encoder stopped on an error, which the caller reports.
            return Ok((refs, requests, read));
        }
        progress(next - 1);
    }
    if next - 1 != count {
        let message = format!("expected {count} events, the store gave {}", next - 1);
        return Err(ExportError::Inconsistent { run_id: run_id.to_owned(), message });
    }
    Ok((refs, requests, read))
}

/// Checks the hash chain of the events received ([`ChainCheck`]) and writes the canonical line
/// of each to a spool (memory, then a temporary
/// file past [`SPOOL_IN_MEMORY`]).
fn spool_events(run_id: &str, pages: Receiver<Vec<Event>>) -> Result<SpooledTempFile, ExportError> {
    let mut spool = SpooledTempFile::new(SPOOL_IN_MEMORY);
    let mut lines = Vec::with_capacity(1 << 20);
    let mut chain = ChainCheck::new(run_id);
    for page in pages {
        lines.clear();
        for event in &page {
            let computed = event.write_canonical_hashing(&mut lines);
            if let Err(source) = &computed {
                return Err(ExportError::Canon {
                    run_id: run_id.to_owned(),
                    what: format!("seq {}", event.seq),
                    source: source.clone(),
                });
            }
            // A file whose chain is broken would be refused by its own import.
            chain
                .check_hashed(event, computed)
                .map_err(|source| ExportError::Store { run_id: run_id.to_owned(), source })?;
            lines.push(b'\n');
        }
        spool.write_all(&lines)?;
    }
    Ok(spool)
}

/// A blob read for writing: its digest, and its manifest or its bytes.
type Fetched = (Digest, Result<Vec<u8>, Vec<u8>>);

/// Reads the planned blobs up to [`BLOBS_PER_READ`] (and about [`CHUNK_BYTES`]) at a time,
/// unverified up to [`INLINE_BLOB_MAX`] (the encoder hashes those), and hands each chunk to the
/// encoder, in order.
fn fetch_blobs(
    store: &dyn Store,
    run_id: &str,
    plan: Vec<Planned>,
    writer: &SyncSender<Vec<Fetched>>,
) -> Result<(), ExportError> {
    // A blob the run's events name and the store lacks: the stored run is damaged.
    let stored = |source: StoreError| {
        let source = match source.kind {
            StoreErrorKind::NotFound => StoreError { kind: StoreErrorKind::Corrupt, ..source },
            _ => source,
        };
        ExportError::Store { run_id: run_id.to_owned(), source }
    };
    let mut plan = plan.into_iter().peekable();
    let mut per_read = BLOBS_PER_READ;
    while plan.peek().is_some() {
        let chunk: Vec<Planned> = plan.by_ref().take(per_read).collect();
        let plain: Vec<BlobRef> = chunk.iter().filter(|(_, m)| m.is_none()).map(|(b, _)| *b).collect();
        let fetched = store.get_blobs_unverified(&plain).map_err(stored)?;
        // Large blobs come fewer at a time, so the chunks in flight stay near CHUNK_BYTES.
        let bytes: usize = fetched.iter().map(Vec::len).sum();
        if !fetched.is_empty() {
            let average = (bytes / fetched.len()).max(1);
            per_read = (CHUNK_BYTES / average).clamp(1, BLOBS_PER_READ);
        }
        let mut fetched = fetched.into_iter();
        let mut blobs = Vec::with_capacity(chunk.len());
        for ((digest, _), manifest) in chunk {
            let blob = match manifest {
                Some(manifest) => Ok(manifest),
                None => Err(fetched.next().ok_or_else(|| {
                    stored(StoreError::corrupt(format!("the store gave no bytes for blob {digest}")))
                })?),
            };
            blobs.push((digest, blob));
        }
        if writer.send(blobs).is_err() {
            // The writer stopped on an error, which the caller reports.
            return Ok(());
        }
    }
    Ok(())
}

/// Encodes the lines of every chunk of blobs received and hands them to the writer, in order;
/// a plain blob only once its bytes hash to its digest (the reader fetched those up to
/// [`INLINE_BLOB_MAX`] unverified).
fn encode_blobs(
    run_id: &str,
    chunks: Receiver<Vec<Fetched>>,
    lines: SyncSender<Vec<u8>>,
) -> Result<(), ExportError> {
    for chunk in chunks {
        let mut buf = Vec::with_capacity(chunk.len() * 1024);
        for (digest, blob) in chunk {
            match blob {
                Ok(manifest) => manifest_line(run_id, &digest, &manifest, &mut buf)?,
                Err(bytes) => {
                    // Larger blobs came verified (`get_blobs_unverified`).
                    let actual = (bytes.len() <= INLINE_BLOB_MAX).then(|| Digest::of(&bytes));
                    if let Some(actual) = actual.filter(|actual| *actual != digest) {
                        let message = format!("blob {digest} is corrupt: its stored bytes hash to {actual}");
                        let source = StoreError::corrupt(message);
                        return Err(ExportError::Store { run_id: run_id.to_owned(), source });
                    }
                    blob_line(&digest, bytes, &mut buf);
                }
            }
        }
        if lines.send(buf).is_err() {
            // The writer stopped on an error, which the caller reports.
            break;
        }
    }
    Ok(())
}

/// A blob to write (with where it is kept, when known): a manifest carries its bytes, a plain
/// blob `None`.
type Planned = (BlobRef, Option<Vec<u8>>);

/// The blobs to write, in order: each after every blob its manifest names, each once.
///
/// Only blobs stored as [`crate::BlobHint::ModelRequest`] or [`crate::BlobHint::ModelResponse`]
/// can be manifests: model calls' requests and outputs (`candidates`) and the bases their
/// manifests build on. The store is asked about those alone,
/// which saves a query per output blob.
fn plan_blobs(
    store: &dyn Store,
    run_id: &str,
    refs: &[BlobRef],
    mut candidates: DigestSet,
) -> Result<Vec<Planned>, ExportError> {
    let stored = |source| ExportError::Store { run_id: run_id.to_owned(), source };
    let unreadable = |digest: &Digest, e: StoreError| {
        let message = format!("the manifest of blob {digest} can't be read: {e}");
        ExportError::Inconsistent { run_id: run_id.to_owned(), message }
    };
    let mut plan = Vec::with_capacity(refs.len());
    let mut planned = DigestSet::with_capacity_and_hasher(refs.len(), Default::default());
    let mut pending: DigestMap<Vec<u8>> = DigestMap::default();
    for &(root, at) in refs {
        // Depth-first, post-order, without recursion: manifest chains can be long. Only the
        // roots come with where they are kept; the blobs their manifests name are looked up.
        let mut stack = vec![(root, at, false)];
        while let Some((digest, at, expanded)) = stack.pop() {
            if planned.contains(&digest) {
                continue;
            }
            if expanded {
                plan.push(((digest, at), pending.remove(&digest)));
                planned.insert(digest);
                continue;
            }
            if pending.contains_key(&digest) {
                let message = format!("the manifest of blob {digest} refers to itself");
                return Err(ExportError::Inconsistent { run_id: run_id.to_owned(), message });
            }
            let manifest = match candidates.contains(&digest) {
                true => store.manifest_of(&digest).map_err(stored)?,
                false => None,
            };
            let Some(manifest) = manifest else {
                plan.push(((digest, at), None));
                planned.insert(digest);
                continue;
            };
            let decoded = Manifest::decode(&manifest).map_err(|e| unreadable(&digest, e))?;
            candidates.extend(decoded.base);
            let names = crate::manifest::references(&manifest).map_err(|e| unreadable(&digest, e))?;
            stack.push((digest, at, true));
            stack.extend(names.into_iter().rev().filter(|d| !planned.contains(d)).map(|d| (d, None, false)));
            pending.insert(digest, manifest);
        }
    }
    Ok(plan)
}

/// `{"blob":…,"text":…}` for UTF-8 bytes, else `{"base64":…,"blob":…}`; keys in canonical order.
fn blob_line(digest: &Digest, bytes: Vec<u8>, line: &mut Vec<u8>) {
    match String::from_utf8(bytes) {
        Ok(text) => {
            line.extend_from_slice(b"{\"blob\":\"");
            line.extend_from_slice(digest.to_string().as_bytes());
            line.extend_from_slice(b"\",\"text\":");
            write_canonical(&Json::String(text), line).expect("a string is always canonical");
            line.extend_from_slice(b"}\n");
        }
        Err(e) => {
            let bytes = e.into_bytes();
            line.extend_from_slice(b"{\"base64\":\"");
            let start = line.len();
            line.resize(start + base64::encoded_len(bytes.len(), true).unwrap_or(0), 0);
            let written = base64::engine::general_purpose::STANDARD
                .encode_slice(&bytes, &mut line[start..])
                .expect("buffer sized by encoded_len");
            line.truncate(start + written);
            line.extend_from_slice(b"\",\"blob\":\"");
            line.extend_from_slice(digest.to_string().as_bytes());
            line.extend_from_slice(b"\"}\n");
        }
    }
}

/// `{"blob":…,"manifest":<canonical manifest>}`.
fn manifest_line(
    run_id: &str,
    digest: &Digest,
    manifest: &[u8],
    line: &mut Vec<u8>,
) -> Result<(), ExportError> {
    let bad = |message: String| ExportError::Inconsistent { run_id: run_id.to_owned(), message };
    let parsed =
        json::parse(manifest).map_err(|e| bad(format!("the manifest of blob {digest} is not JSON: {e}")))?;
    line.extend_from_slice(b"{\"blob\":\"");
    line.extend_from_slice(digest.to_string().as_bytes());
    line.extend_from_slice(b"\",\"manifest\":");
    write_canonical(&parsed, line)
        .map_err(|e| bad(format!("the manifest of blob {digest} has no canonical form: {e}")))?;
    line.extend_from_slice(b"}\n");
    Ok(())
}

/// Counts the bytes that pass through.
struct CountingWriter<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
