//! The parallel half of reading a trace: lines are read in chunks on the caller's thread, and
//! worker threads parse them and do the hashing that needs no other line (each event's hash of
//! its own content, each text or base64 blob's digest). The results come back in file order;
//! everything that depends on earlier lines (seqs, the chain, duplicates, manifests) and every
//! error message stays with the caller, in `read.rs`, so what an import reports, and in what
//! order, doesn't depend on how many threads verified it.
use std::collections::VecDeque;
use std::io::{self, BufRead};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::Scope;

use base64::Engine as _;
use retrace_core::canonical::CanonError;
use retrace_core::{Digest, Event};
use serde::Deserialize;

use super::text_line;

/// Lines per chunk handed to a worker.
const CHUNK_LINES: usize = 256;
/// A chunk ends after the line that takes it past this many bytes.
const CHUNK_BYTES: usize = 1 << 20;
/// Chunks read ahead per worker.
const AHEAD_PER_WORKER: usize = 2;

/// A blob line: exactly one of `text`, `base64`, `manifest`.
#[derive(Deserialize)]
struct BlobLine {
    blob: Digest,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    base64: Option<String>,
    #[serde(default)]
    manifest: Option<serde_json::Value>,
}

/// A parsed event line and the hash its content gives.
pub(super) struct ParsedEvent {
    pub event: Event,
    pub hash: Result<Digest, CanonError>,
    /// Members of the line no field of [`Event`] holds ([`unknown_fields`]).
    pub unknown: Vec<String>,
}

/// A parsed blob line: the digest it claims and what its body holds.
pub(super) struct ParsedBlob {
    pub digest: Digest,
    pub body: Body,
}

/// The body of a blob line.
pub(super) enum Body {
    /// `text` or `base64`, decoded, with the digest of the bytes.
    Bytes { what: &'static str, bytes: Arc<[u8]>, actual: Digest },
    /// `base64` that doesn't decode.
    BadBase64(String),
    /// A manifest, rebuilt by the caller (it names earlier blobs).
    Manifest(serde_json::Value),
    /// Not exactly one of the three.
    NotOne,
}

/// What a worker made of one line.
pub(super) enum Prepared {
    Event(Result<Box<ParsedEvent>, serde_json::Error>),
    Blob(Result<Box<ParsedBlob>, serde_json::Error>),
}

/// One line as the caller gets it.
pub(super) struct Line {
    /// The line's bytes without its `\n`, kept only when it didn't parse (for the message).
    pub unparsed: Vec<u8>,
    /// Whether it ended with `\n` (the last line of a file may not).
    pub complete: bool,
    /// Bytes read up to the end of this line.
    pub read: u64,
    pub prepared: Prepared,
}

/// Lines read but not yet prepared: `ends[i]` is where line `first + i` ends in `buf`.
struct Chunk {
    first: u64,
    buf: Vec<u8>,
    ends: Vec<usize>,
    /// Whether the last line ended with `\n`.
    complete: bool,
    /// Bytes read up to the end of the chunk.
    read: u64,
}

/// What follows the last chunk read.
enum End {
    /// More to read.
    Open,
    /// The end of the input.
    Eof,
    /// Reading failed after the lines before it.
    Failed(Option<io::Error>),
}

/// Lines in file order, prepared by `workers` threads of a [`Scope`].
pub(super) struct Pipeline<R> {
    reader: R,
    /// The first line number the pipeline reads (after the header).
    next_line: u64,
    read: u64,
    jobs: Vec<Sender<Chunk>>,
    results: Vec<Receiver<Vec<Line>>>,
    sent: usize,
    received: usize,
    ready: VecDeque<Line>,
    end: End,
}

impl<R: BufRead> Pipeline<R> {
    /// Starts the workers on `scope`; line `first` (after `read` bytes) is the next one of
    /// `reader`, and the `events` lines from line 2 on are event lines.
    pub fn start<'scope>(
        scope: &'scope Scope<'scope, '_>,
        reader: R,
        first: u64,
        read: u64,
        events: u64,
    ) -> Pipeline<R> {
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
        let (mut jobs, mut results) = (Vec::new(), Vec::new());
        for _ in 0..workers {
            let (job_tx, job_rx) = channel::<Chunk>();
            let (result_tx, result_rx) = channel();
            let builder = std::thread::Builder::new().name("import-parse".into());
            let work = move || {
                for chunk in job_rx {
                    if result_tx.send(prepare(chunk, events)).is_err() {
                        break;
                    }
                }
            };
            builder.spawn_scoped(scope, work).expect("spawning an import worker");
            jobs.push(job_tx);
            results.push(result_rx);
        }
        Pipeline {
            reader,
            next_line: first,
            read,
            jobs,
            results,
            sent: 0,
            received: 0,
            ready: VecDeque::new(),
            end: End::Open,
        }
    }

    /// The next line, `None` at the end of the input, or the error that ended reading at
    /// line `number`.
    pub fn next(&mut self) -> Result<Option<Line>, (u64, io::Error)> {
        loop {
            if let Some(line) = self.ready.pop_front() {
                return Ok(Some(line));
            }
            self.fill();
            if self.received < self.sent {
                let worker = self.received % self.results.len();
                let lines = self.results[worker].recv().expect("a worker prepares every chunk it is sent");
                self.received += 1;
                self.ready.extend(lines);
                continue;
            }
            return match &mut self.end {
                End::Open | End::Eof => Ok(None),
                End::Failed(error) => {
                    let error = error.take().unwrap_or_else(|| io::Error::other("reading failed"));
                    Err((self.next_line, error))
                }
            };
        }
    }

    /// Reads and sends chunks until enough are in flight or the input ends.
    fn fill(&mut self) {
        let ahead = AHEAD_PER_WORKER * self.jobs.len();
        while matches!(self.end, End::Open) && self.sent - self.received < ahead {
            let Some(chunk) = self.read_chunk() else { break };
            let worker = self.sent % self.jobs.len();
            self.jobs[worker].send(chunk).expect("workers live as long as the pipeline");
            self.sent += 1;
        }
    }

    fn read_chunk(&mut self) -> Option<Chunk> {
        // Room for a chunk's bytes and the line that takes it past them, without regrowing.
        let buf = Vec::with_capacity(CHUNK_BYTES + (64 << 10));
        let ends = Vec::with_capacity(CHUNK_LINES);
        let mut chunk = Chunk { first: self.next_line, buf, ends, complete: true, read: 0 };
        while chunk.ends.len() < CHUNK_LINES && chunk.buf.len() < CHUNK_BYTES {
            match self.reader.read_until(b'\n', &mut chunk.buf) {
                Ok(0) => {
                    self.end = End::Eof;
                    break;
                }
                Ok(n) => {
                    self.read += n as u64;
                    self.next_line += 1;
                    chunk.ends.push(chunk.buf.len());
                    chunk.complete = chunk.buf.last() == Some(&b'\n');
                }
                Err(e) => {
                    // Bytes of the line that failed are not part of any line.
                    chunk.buf.truncate(chunk.ends.last().copied().unwrap_or(0));
                    self.end = End::Failed(Some(e));
                    break;
                }
            }
        }
        chunk.read = self.read;
        (!chunk.ends.is_empty()).then_some(chunk)
    }
}

/// The members of event line `line` that its event's canonical form, `canonical`, lacks:
/// parsing drops them and the hash doesn't cover them, so content added to a trace would pass
/// unseen and vanish from its re-export. None for a line in canonical form, as every export
/// writes it, which is checked first; members whose value is null are not counted (an absent
/// optional field, written out).
fn unknown_fields(canonical: &[u8], line: &[u8]) -> Vec<String> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if canonical == line {
        return Vec::new();
    }
    let parsed = (serde_json::from_slice(line), serde_json::from_slice(canonical));
    let (Ok(serde_json::Value::Object(written)), Ok(serde_json::Value::Object(known))) = parsed else {
        return Vec::new();
    };
    written.iter().filter(|(k, v)| !known.contains_key(*k) && !v.is_null()).map(|(k, _)| k.clone()).collect()
}

/// Parses and hashes every line of `chunk` (the `events` lines from line 2 on are events).
fn prepare(chunk: Chunk, events: u64) -> Vec<Line> {
    let mut lines = Vec::with_capacity(chunk.ends.len());
    let mut start = 0;
    let last = chunk.ends.len() - 1;
    let mut read = chunk.read - (chunk.buf.len() as u64);
    for (i, &end) in chunk.ends.iter().enumerate() {
        let complete = i < last || chunk.complete;
        let bytes = &chunk.buf[start..end - usize::from(complete)];
        read += (end - start) as u64;
        let number = chunk.first + i as u64;
        let prepared = match number >= 2 && number - 2 < events {
            true => Prepared::Event(serde_json::from_slice::<Event>(bytes).map(|event| {
                // One write of the canonical form gives the hash and the check for members
                // the event doesn't hold.
                let mut canonical = Vec::with_capacity(bytes.len() + 64);
                let hash = event.write_canonical_hashing(&mut canonical);
                let unknown = match hash {
                    Ok(_) => unknown_fields(&canonical, bytes),
                    Err(_) => Vec::new(),
                };
                Box::new(ParsedEvent { event, hash, unknown })
            })),
            false => match text_line::read(bytes) {
                Some((digest, text)) => {
                    Prepared::Blob(Ok(Box::new(ParsedBlob { digest, body: self::bytes("text", text) })))
                }
                None => Prepared::Blob(
                    serde_json::from_slice::<BlobLine>(bytes).map(|line| Box::new(decode(line))),
                ),
            },
        };
        let failed = match &prepared {
            Prepared::Event(parsed) => parsed.is_err(),
            Prepared::Blob(parsed) => parsed.is_err(),
        };
        let unparsed = if failed { bytes.to_vec() } else { Vec::new() };
        lines.push(Line { unparsed, complete, read, prepared });
        start = end;
    }
    lines
}

/// Decodes a blob line's text or base64 and hashes it; a manifest is left to the caller.
fn decode(line: BlobLine) -> ParsedBlob {
    let body = match (line.text, line.base64, line.manifest) {
        (Some(text), None, None) => bytes("text", text.into_bytes()),
        (None, Some(encoded), None) => {
            match base64::engine::general_purpose::STANDARD.decode(encoded.as_bytes()) {
                Ok(decoded) => bytes("base64", decoded),
                Err(e) => Body::BadBase64(e.to_string()),
            }
        }
        (None, None, Some(manifest)) => Body::Manifest(manifest),
        _ => Body::NotOne,
    };
    ParsedBlob { digest: line.blob, body }
}

fn bytes(what: &'static str, bytes: Vec<u8>) -> Body {
    let actual = Digest::of(&bytes);
    Body::Bytes { what, bytes: bytes.into(), actual }
}
