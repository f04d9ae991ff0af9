//! Writing a stored run as a `retrace-trace/1` file (format in [`retrace_core::export`]).
//!
//! [`export_run`] makes one pass over the run's events, page by page, writing their canonical
//! lines to a spool (memory, then a temporary file past [`SPOOL_IN_MEMORY`]) while it collects
//! the blobs they reference in order of first reference. Blobs stored as chained manifests are
//! expanded so that every blob a manifest names comes before it. Then the header (which needs
//! both counts), the spooled events and the blob lines go out. Every line is canonical JSON, so
//! exporting a run, importing it elsewhere and exporting it again gives the same bytes.
//!
//! The calling thread reads the store (the snapshot is its own) while a second thread turns
//! what it read into lines: the event pages, then the blobs read a chunk at a time. The bytes
//! don't depend on it, and a failure is reported as a single thread would meet it first.
use std::collections::{HashMap, HashSet};
use std::io::{self, BufWriter, Seek, Write};
use std::sync::mpsc::{sync_channel, Receiver};

use base64::Engine as _;
use retrace_core::canonical::{write_canonical, write_canonical_value, CanonError};
use retrace_core::export::{ExportHeader, FORMAT};
use retrace_core::json::{self, Json};
use retrace_core::{Digest, Event, EventType};

use crate::manifest::Manifest;
use crate::{Store, StoreError, StoreErrorKind};

mod events;

pub use events::{RunEvents, Segment, PAGE};

/// Spooled event lines stay in memory up to this many bytes.
pub const SPOOL_IN_MEMORY: usize = 256 << 20;

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

/// Plain blobs read from the store per [`crate::BlobStore::get_blobs`] call.
const BLOBS_PER_READ: usize = 256;

/// Writes run `run_id` to `out`; `progress` receives the number of events written so far.
///
/// The whole export reads one snapshot of the store ([`Store::with_snapshot`]).
pub fn export_run(
    store: &dyn Store,
    run_id: &str,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Result<ExportStats, ExportError> {
    let mut result = None;
    store.with_snapshot(&mut || result = Some(export_inner(store, run_id, &mut *out, &mut *progress)));
    result.expect("with_snapshot runs its function")
}

fn export_inner(
    store: &dyn Store,
    run_id: &str,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Result<ExportStats, ExportError> {
    let stored = |source| ExportError::Store { run_id: run_id.to_owned(), source };
    let run = store.run(run_id).map_err(stored)?;
    let mut pages = RunEvents::new(store, run_id).map_err(stored)?;
    let count = pages.count();
    let (mut spool, refs, requests) = spool_events(run_id, &mut pages, progress)?;

    let plan = plan_blobs(store, run_id, &refs, requests)?;
    let header = ExportHeader {
        format: FORMAT.to_owned(),
        holds_tokens: run.holds_tokens,
        mask_key_fingerprint: run.mask_key_fingerprint.clone(),
        masking_rules: run.masking_rules.clone(),
        run,
        events: count,
        blobs: plan.len() as u64,
    };
    let mut w = CountingWriter { inner: BufWriter::with_capacity(1 << 20, out), bytes: 0 };
    let mut line = Vec::new();
    let value = serde_json::to_value(&header).expect("a header always serializes");
    write_canonical_value(&value, &mut line).map_err(|source| ExportError::Canon {
        run_id: run_id.to_owned(),
        what: "the header".to_owned(),
        source,
    })?;
    line.push(b'\n');
    w.write_all(&line)?;
    spool.seek(io::SeekFrom::Start(0))?;
    io::copy(&mut spool, &mut w)?;
    drop(spool);
    write_blobs(store, run_id, &plan, &mut w)?;
    w.flush()?;
    Ok(ExportStats { events: count, blobs: plan.len() as u64, bytes: w.bytes })
}

/// Event pages in flight between the reading thread and the writing one.
const PAGES_AHEAD: usize = 2;

/// The canonical lines of every event, spooled, with the blobs they reference in order of first
/// reference and the model-call requests among them.
///
/// This thread reads the pages (a snapshot is the reading thread's) and checks their seqs; a
/// second one writes the lines. A failure the writer meets is about an earlier event than any
/// the reader meets after it, so it is the one reported.
fn spool_events(
    run_id: &str,
    pages: &mut RunEvents<'_>,
    progress: &mut dyn FnMut(u64),
) -> Result<(tempfile::SpooledTempFile, Vec<Digest>, HashSet<Digest>), ExportError> {
    let stored = |source| ExportError::Store { run_id: run_id.to_owned(), source };
    let count = pages.count();
    let mut refs = Vec::new();
    let mut referenced = HashSet::new();
    let mut requests = HashSet::new();
    std::thread::scope(|scope| {
        let (to_writer, from_reader) = sync_channel::<Vec<Event>>(PAGES_AHEAD);
        let writer = scope.spawn(move || write_events(run_id, from_reader));
        let mut read = || -> Result<(), ExportError> {
            let mut next = 1u64;
            while let Some(mut page) = pages.next_page().map_err(stored)? {
                let gap = page.iter().zip(next..).position(|(event, want)| event.seq != want);
                let inconsistent = gap.map(|i| {
                    let message =
                        format!("expected seq {}, the store has seq {}", next + i as u64, page[i].seq);
                    ExportError::Inconsistent { run_id: run_id.to_owned(), message }
                });
                page.truncate(gap.unwrap_or(page.len()));
                for event in &page {
                    for digest in [event.request_ref, event.output_ref].into_iter().flatten() {
                        if referenced.insert(digest) {
                            refs.push(digest);
                        }
                    }
                    if let (EventType::ModelCall, Some(request)) = (event.kind, event.request_ref) {
                        requests.insert(request);
                    }
                }
                next += page.len() as u64;
                // The writer hung up: it failed, and says why when joined.
                if to_writer.send(page).is_err() {
                    return Ok(());
                }
                if let Some(err) = inconsistent {
                    return Err(err);
                }
                progress(next - 1);
            }
            if next - 1 != count {
                let message = format!("expected {count} events, the store gave {}", next - 1);
                return Err(ExportError::Inconsistent { run_id: run_id.to_owned(), message });
            }
            Ok(())
        };
        let read = read();
        drop(to_writer);
        let written = writer.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let spool = written?;
        read?;
        Ok((spool, refs, requests))
    })
}

/// Writes the canonical line of every event of every page received to a spool.
fn write_events(run_id: &str, pages: Receiver<Vec<Event>>) -> Result<tempfile::SpooledTempFile, ExportError> {
    let mut spool = tempfile::SpooledTempFile::new(SPOOL_IN_MEMORY);
    let mut lines = Vec::with_capacity(1 << 20);
    for page in pages {
        lines.clear();
        for event in &page {
            event.write_canonical(&mut lines).map_err(|source| ExportError::Canon {
                run_id: run_id.to_owned(),
                what: format!("seq {}", event.seq),
                source,
            })?;
            lines.push(b'\n');
        }
        spool.write_all(&lines)?;
    }
    Ok(spool)
}

/// Writes the blob lines of `plan` to `w`: this thread reads the blobs, `BLOBS_PER_READ` at a
/// time, while a second one writes the lines of the previous read.
fn write_blobs(
    store: &dyn Store,
    run_id: &str,
    plan: &[Planned],
    w: &mut dyn Write,
) -> Result<(), ExportError> {
    let stored = |source| ExportError::Store { run_id: run_id.to_owned(), source };
    std::thread::scope(|scope| {
        let (to_writer, jobs) = sync_channel::<(&[Planned], Vec<Vec<u8>>)>(1);
        let (to_reader, written) = sync_channel::<Result<Vec<u8>, ExportError>>(2);
        scope.spawn(move || {
            for (chunk, fetched) in jobs {
                let lines = blob_lines(run_id, chunk, fetched);
                let failed = lines.is_err();
                if to_reader.send(lines).is_err() || failed {
                    break;
                }
            }
        });
        let mut pending = 0usize;
        let mut failure = None;
        for chunk in plan.chunks(BLOBS_PER_READ) {
            let plain: Vec<Digest> = chunk.iter().filter(|(_, m)| m.is_none()).map(|(d, _)| *d).collect();
            let fetched = match store.get_blobs(&plain) {
                Ok(fetched) => fetched,
                Err(e) => {
                    failure = Some(stored(e));
                    break;
                }
            };
            if to_writer.send((chunk, fetched)).is_err() {
                break;
            }
            pending += 1;
            if pending > 1 {
                match written.recv() {
                    Ok(lines) => w.write_all(&lines?)?,
                    Err(_) => break,
                }
                pending -= 1;
            }
        }
        drop(to_writer);
        // The lines of every blob before a failure here come first, and so may a failure there.
        for lines in written {
            w.write_all(&lines?)?;
        }
        failure.map_or(Ok(()), Err)
    })
}

/// The lines of one chunk of the plan, given the bytes of its plain blobs in order.
fn blob_lines(run_id: &str, chunk: &[Planned], fetched: Vec<Vec<u8>>) -> Result<Vec<u8>, ExportError> {
    let mut fetched = fetched.into_iter();
    let mut lines = Vec::new();
    for (digest, manifest) in chunk {
        match manifest {
            Some(manifest) => manifest_line(run_id, digest, manifest, &mut lines)?,
            None => {
                let bytes = fetched.next().ok_or_else(|| ExportError::Store {
                    run_id: run_id.to_owned(),
                    source: StoreError::corrupt(format!("the store gave no bytes for blob {digest}")),
                })?;
                blob_line(digest, bytes, &mut lines)
            }
        }
    }
    Ok(lines)
}

/// A blob to write: a manifest carries its bytes, a plain blob `None`.
type Planned = (Digest, Option<Vec<u8>>);

/// The blobs to write, in order: each after every blob its manifest names, each once.
///
/// Only blobs stored as [`crate::BlobHint::ModelRequest`] can be manifests: model-call requests
/// (`candidates`) and the bases their manifests build on. The store is asked about those alone,
/// which saves a query per output blob.
fn plan_blobs(
    store: &dyn Store,
    run_id: &str,
    refs: &[Digest],
    mut candidates: HashSet<Digest>,
) -> Result<Vec<Planned>, ExportError> {
    let stored = |source| ExportError::Store { run_id: run_id.to_owned(), source };
    let unreadable = |digest: &Digest, e: StoreError| {
        let message = format!("the manifest of blob {digest} can't be read: {e}");
        ExportError::Inconsistent { run_id: run_id.to_owned(), message }
    };
    let mut plan = Vec::with_capacity(refs.len());
    let mut planned = HashSet::new();
    let mut pending: HashMap<Digest, Vec<u8>> = HashMap::new();
    for &root in refs {
        // Depth-first, post-order, without recursion: manifest chains can be long.
        let mut stack = vec![(root, false)];
        while let Some((digest, expanded)) = stack.pop() {
            if planned.contains(&digest) {
                continue;
            }
            if expanded {
                plan.push((digest, pending.remove(&digest)));
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
                plan.push((digest, None));
                planned.insert(digest);
                continue;
            };
            let decoded = Manifest::decode(&manifest).map_err(|e| unreadable(&digest, e))?;
            candidates.extend(decoded.base);
            let names = crate::manifest::references(&manifest).map_err(|e| unreadable(&digest, e))?;
            stack.push((digest, true));
            stack.extend(names.into_iter().rev().filter(|d| !planned.contains(d)).map(|d| (d, false)));
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
