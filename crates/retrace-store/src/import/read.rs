//! Phase 1 of an import: read every line and verify it, keeping what will be stored (within a
//! bounded memory, and a manifest line as itself, not as the request it stands for: see
//! `import/held.rs`).
//! Lines are parsed and hashed ahead on worker threads (`import/prepare.rs`); every check that
//! spans lines, and every error, is made here in file order.
use std::collections::BTreeSet;
use std::io::{BufRead, Read};
use std::sync::Arc;

use retrace_core::canonical::canonical_value;
use retrace_core::digest_map::{DigestMap, DigestSet, FastHash};
use retrace_core::export::ExportHeader;
use retrace_core::{Digest, Event};

use super::early::{self, Early};
use super::header::{newer_format, read_header};
use super::held::{Held, Keep};
use super::identity::Mismatched;
use super::prepare::{Body, Line, ParsedBlob, ParsedEvent, Pipeline, Prepared};
use super::{ImportError, ImportOptions, Location};
use crate::manifest::{self, Manifest, ManifestSource};
use crate::verify::Causality;
use crate::{Store, StoreError, StoreResult};

/// Events (and blob lines) whose room is taken at once from the header's counts, at most: a
/// header that overstates them costs address space, not memory, up to this bound. Growing the
/// events' vector past 65,536 (the bound before) copied it whole into fresh pages while no
/// other thread had work. Importing 100k 1 KB events on a 2-vCPU VM slow to fault in fresh
/// memory, alternated 4x: 0.1-0.6 s less CPU with this bound, wall 3.16-3.44 s against 3.24-4.30.
const PREALLOCATED: u64 = 1 << 20;

/// A verified trace, ready to store.
pub(super) struct Trace<'s> {
    pub header: ExportHeader,
    pub events: Vec<Event>,
    /// Blob lines in file order: every manifest after the blobs it names.
    pub blobs: Vec<ReadBlob>,
    /// Where each blob is in `blobs`.
    pub index: DigestMap<usize>,
    /// Where the blob lines' bytes are, and what holding them cost.
    pub keep: Keep<'s>,
    /// Events whose content doesn't give their hash (a forced import only).
    pub mismatched: Mismatched,
}

/// One verified blob line.
pub(super) struct ReadBlob {
    pub digest: Digest,
    pub held: Held,
    /// For a manifest line: the digests the manifest names.
    pub names: Option<Vec<Digest>>,
}

impl ReadBlob {
    /// Bytes of the blob as stored: a manifest's rebuilt request.
    pub fn len(&self) -> u64 {
        self.held.len()
    }
}

/// The blob lines of a trace, read so far, as what a manifest among them is rebuilt from.
pub(super) struct TraceSource<'a, 's> {
    pub blobs: &'a [ReadBlob],
    pub index: &'a DigestMap<usize>,
    keep: &'a mut Keep<'s>,
    /// Manifests being rebuilt as another's part (not its base), innermost last.
    nested: usize,
}

impl<'a, 's> TraceSource<'a, 's> {
    /// At most this many manifests are rebuilt inside each other. A manifest names another
    /// as a part only where a model's response has the bytes of a later request's message.
    const NESTED: usize = 4;

    pub fn new(blobs: &'a [ReadBlob], index: &'a DigestMap<usize>, keep: &'a mut Keep<'s>) -> Self {
        TraceSource { blobs, index, keep, nested: 0 }
    }

    fn find(&self, digest: &Digest) -> StoreResult<&'a ReadBlob> {
        let blobs = self.blobs;
        match self.index.get(digest) {
            Some(&i) => Ok(&blobs[i]),
            None => Err(StoreError::not_found(format!("blob {digest} named by a manifest is missing"))),
        }
    }

    /// The request the manifest line `compact` stands for.
    pub fn rebuild(&mut self, compact: &[u8]) -> StoreResult<Vec<u8>> {
        manifest::rebuild_with(compact, self)
    }
}

impl ManifestSource for TraceSource<'_, '_> {
    fn manifest(&mut self, digest: &Digest) -> StoreResult<Option<Vec<u8>>> {
        Ok(match &self.find(digest)?.held {
            Held::Manifest { compact, .. } => Some(compact.to_vec()),
            _ => None,
        })
    }

    fn bytes(&mut self, digest: &Digest) -> StoreResult<Vec<u8>> {
        match &self.find(digest)?.held {
            Held::Manifest { compact, .. } => {
                if self.nested == Self::NESTED {
                    let message = format!("manifests nest more than {} deep at blob {digest}", Self::NESTED);
                    return Err(StoreError::corrupt(message));
                }
                self.nested += 1;
                let rebuilt = manifest::rebuild_with(compact, self);
                self.nested -= 1;
                rebuilt
            }
            held => Ok(self.keep.bytes(digest, held)?.to_vec()),
        }
    }
}

/// Lines of the input after the header, numbered from 2, parsed and hashed ahead by the
/// pipeline's workers.
struct Lines<'o, 'p, R> {
    pipe: Pipeline<R>,
    number: u64,
    /// Whether the current line ended with `\n` (the last line of a file may not).
    complete: bool,
    opts: &'o mut ImportOptions<'p>,
}

impl<R: BufRead> Lines<'_, '_, R> {
    fn at(&self) -> Location {
        Location { file: self.opts.file_name.clone(), line: self.number }
    }

    /// The next line, or `None` at the end of the input.
    fn next(&mut self) -> Result<Option<Line>, ImportError> {
        let line = self.pipe.next().map_err(|(number, source)| {
            let at = Location { file: self.opts.file_name.clone(), line: number };
            ImportError::Io { at, source }
        })?;
        let Some(line) = line else { return Ok(None) };
        self.number += 1;
        if let Some(progress) = self.opts.progress.as_mut() {
            progress(line.read);
        }
        self.complete = line.complete;
        Ok(Some(line))
    }

    fn malformed(&self, message: impl Into<String>) -> ImportError {
        ImportError::Malformed { at: self.at(), message: message.into() }
    }

    /// A line that failed to parse: truncated when the file ends inside it.
    fn unparsable(&self, what: &str, err: &serde_json::Error) -> ImportError {
        unparsable(self.at(), self.complete, what, err)
    }

    fn verification(&self, seq: Option<u64>, digest: Option<Digest>, message: String) -> ImportError {
        ImportError::Verification { at: self.at(), seq, digest, message }
    }

    /// A verification failure or truncation: the end of the import, unless it is forced, when
    /// it is reported and reading goes on.
    fn forgive(&mut self, err: ImportError) -> Result<(), ImportError> {
        match self.opts.forced.as_mut() {
            Some(report) => {
                report(&err);
                Ok(())
            }
            None => Err(err),
        }
    }
}

/// A line at `at` that failed to parse: truncated when the file ends inside it.
pub(super) fn unparsable(at: Location, complete: bool, what: &str, err: &serde_json::Error) -> ImportError {
    if !complete && err.is_eof() {
        let message = format!("the file ends inside line {}", at.line);
        return ImportError::Truncated { at, message };
    }
    ImportError::Malformed { at, message: format!("{what}: {}", json_message(err)) }
}

/// A serde_json error without its "at line 1 column N" (every line is parsed on its own).
pub(super) fn json_message(err: &serde_json::Error) -> String {
    let text = err.to_string();
    match text.rfind(" at line ") {
        Some(i) => format!("{} (column {})", &text[..i], err.column()),
        None => text,
    }
}

/// The longest header line read: a header holds a run's metadata and masking rules, a few KB.
const MAX_HEADER_BYTES: u64 = 16 << 20;

/// Reads and verifies a whole trace; worker threads parse and hash lines ahead of the checks.
/// Blobs that verify are stored into `store` while the rest is read, when [`early::wanted`].
pub(super) fn read_trace<'s>(
    mut reader: impl BufRead,
    opts: &mut ImportOptions<'_>,
    store: &'s dyn Store,
) -> Result<Trace<'s>, ImportError> {
    let header_at = Location { file: opts.file_name.clone(), line: 1 };
    let mut first = Vec::new();
    let read = (&mut reader)
        .take(MAX_HEADER_BYTES + 1)
        .read_until(b'\n', &mut first)
        .map_err(|source| ImportError::Io { at: header_at.clone(), source })? as u64;
    if read == 0 {
        return Err(ImportError::Truncated { at: header_at, message: "the file is empty".into() });
    }
    if read > MAX_HEADER_BYTES {
        // Read whole, a line of hundreds of MB held that much memory, and more to parse.
        let message = format!(
            "the first line is longer than {} MiB: no trace header is (a header holds the run and its \
             masking rules); this is not a trace file",
            MAX_HEADER_BYTES >> 20
        );
        return Err(ImportError::Malformed { at: header_at, message });
    }
    if let Some(progress) = opts.progress.as_mut() {
        progress(read);
    }
    let complete = first.last() == Some(&b'\n');
    let (header, unknown) = read_header(&first[..first.len() - usize::from(complete)], complete, header_at)?;
    std::thread::scope(|scope| {
        let pipe = Pipeline::start(scope, reader, 2, read, header.events);
        let mut lines = Lines { pipe, number: 1, complete, opts };
        if !unknown.is_empty() {
            let message = format!(
                "the header holds members no {} header has ({}): importing would drop them{}",
                retrace_core::export::FORMAT,
                unknown.join(", "),
                newer_format(&header.format)
            );
            lines.forgive(lines.verification(None, None, message))?;
        }
        read_body(scope, &mut lines, header, store)
    })
}

fn read_body<'scope, 'env, R: BufRead>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    lines: &mut Lines<'_, '_, R>,
    header: ExportHeader,
    store: &'env dyn Store,
) -> Result<Trace<'env>, ImportError> {
    let (events, mismatched) = read_events(lines, &header)?;
    let mut needed: DigestMap<u64> =
        DigestMap::with_capacity_and_hasher(2 * events.len(), FastHash::default());
    for event in events.iter().rev() {
        for digest in [event.request_ref, event.output_ref].into_iter().flatten() {
            needed.insert(digest, event.seq);
        }
    }
    // A fork's edits name blobs too (seq 0: the header's); an event's reference comes first.
    for digest in crate::gc::edit_blobs(&header.run) {
        needed.entry(digest).or_insert(EDIT_SEQ);
    }
    // A forced import of a file cut among its events has no blob lines left to read.
    let cut = (events.len() as u64) < header.events;
    let wanted = !cut && early::wanted(store, &header, &events, &mismatched);
    let chunk_bytes = lines.opts.chunk_bytes;
    let mut early = wanted.then(|| Early::start(scope, store, &events, chunk_bytes));
    let mut keep = Keep::new(store, chunk_bytes);
    let (mut blobs, index, left_out) = match cut {
        true => (Vec::new(), DigestMap::default(), DigestSet::default()),
        false => read_blobs(lines, &header, &needed, early.as_mut(), &mut keep)?,
    };
    // Blank lines at the end (an editor's or a merge tool's `\n`) hold nothing: skipped.
    while let Some(line) = lines.next()? {
        let unparsed = matches!(&line.prepared, Prepared::Event(Err(_)) | Prepared::Blob(Err(_)));
        if unparsed && line.unparsed.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let message = format!(
            "unexpected line after the last blob (the header announces {} events and {} blobs)",
            header.events, header.blobs
        );
        return Err(lines.malformed(message));
    }
    check_references(lines, store, &header, &needed, &blobs, &index, &left_out)?;
    let taken: Vec<_> = events.iter().filter_map(crate::verify::decision_of).collect();
    if let Some(message) = crate::verify::decisions_disagree(&header.run, &taken) {
        let at = Location { file: lines.opts.file_name.clone(), line: 1 };
        lines.forgive(ImportError::Verification { at, seq: None, digest: None, message })?;
    }
    let last = events.last().map(|e| e.hash);
    if let Some(head) = header.run.head.filter(|head| Some(*head) != last) {
        let found = last.map_or("no events".to_owned(), |d| d.to_string());
        let message = format!("the run's head is {head} but its last event's hash is {found}");
        let at = Location { file: lines.opts.file_name.clone(), line: 1 };
        lines.forgive(ImportError::Verification { at, seq: None, digest: None, message })?;
    }
    if let Some(early) = early {
        let placed =
            early.finish().map_err(|source| ImportError::Store { run_id: header.run.id.clone(), source })?;
        place(&mut keep, &mut blobs, &index, placed);
    }
    Ok(Trace { header, events, blobs, index, keep, mismatched })
}

/// A file's events have no holes: every reference is judged.
const NO_HOLES: BTreeSet<u64> = BTreeSet::new();

/// The file's events, and those whose content doesn't give their hash (kept only when forced).
fn read_events<R: BufRead>(
    lines: &mut Lines<'_, '_, R>,
    header: &ExportHeader,
) -> Result<(Vec<Event>, Mismatched), ImportError> {
    let run = &header.run;
    let mut mismatched = Mismatched::new();
    let mut events: Vec<Event> = Vec::with_capacity(header.events.min(PREALLOCATED) as usize);
    let mut prev: Option<Digest> = None;
    let mut causality = Causality::default();
    for expected in 1..=header.events {
        let Some(line) = lines.next()? else {
            let message =
                format!("the header announces {} events, the file holds {}", header.events, expected - 1);
            lines.forgive(ImportError::Truncated { at: lines.at(), message })?;
            break;
        };
        let parsed = match line.prepared {
            Prepared::Event(parsed) => parsed,
            Prepared::Blob(_) => unreachable!("the pipeline prepares event lines as events"),
        };
        let ParsedEvent { event, hash, unknown } = match parsed {
            Ok(parsed) => *parsed,
            Err(e) if looks_like(&line.unparsed, "blob") => {
                let message = format!(
                    "expected event {expected} of the {} the header announces, found a blob line ({})",
                    header.events,
                    json_message(&e)
                );
                return Err(lines.malformed(message));
            }
            Err(e) => match lines.unparsable("not a valid event", &e) {
                err @ ImportError::Truncated { .. } => {
                    lines.forgive(err)?;
                    break;
                }
                err => return Err(err),
            },
        };
        let seq = Some(event.seq);
        if !unknown.is_empty() {
            let newer = newer_format(&header.format);
            let message = format!(
                "seq {} holds members no retrace-trace/1 event has ({}): its hash doesn't cover them, \
                 and importing would drop them{newer}",
                event.seq,
                unknown.join(", ")
            );
            lines.forgive(lines.verification(seq, None, message))?;
        }
        if event.seq != expected {
            let message = if event.seq < expected {
                format!("seq {} is repeated or out of order (expected seq {expected})", event.seq)
            } else {
                format!("expected seq {expected}, found seq {} (out of order or missing)", event.seq)
            };
            return Err(ImportError::Order { at: lines.at(), seq: event.seq, message });
        }
        let own = run.fork_at.is_none_or(|at| event.seq >= at);
        if own && event.run_id != run.id {
            let message = format!("seq {} names run {}, not {}", event.seq, event.run_id, run.id);
            lines.forgive(lines.verification(seq, None, message))?;
        }
        match hash {
            Ok(hash) if hash == event.hash => {}
            Ok(hash) => {
                let message = format!(
                    "hash mismatch at seq {}: the line says {}, its content hashes to {hash}",
                    event.seq, event.hash
                );
                lines.forgive(lines.verification(seq, None, message))?;
                mismatched.insert(event.seq, Some(hash));
            }
            Err(e) => {
                let message = format!("seq {} can't be hashed: {e}", event.seq);
                lines.forgive(lines.verification(seq, None, message))?;
                mismatched.insert(event.seq, None);
            }
        }
        if event.prev != prev {
            let show = |d: Option<Digest>| d.map_or("null".to_owned(), |d| d.to_string());
            let message = format!(
                "chain broken at seq {}: prev is {}, the previous event's hash is {}",
                event.seq,
                show(event.prev),
                show(prev)
            );
            lines.forgive(lines.verification(seq, None, message))?;
        }
        for (_, message) in causality.check(&event, &NO_HOLES) {
            let message = format!("seq {}: {message}", event.seq);
            lines.forgive(lines.verification(seq, None, message))?;
        }
        prev = Some(event.hash);
        events.push(event);
    }
    Ok((events, mismatched))
}

/// Whether `line` is a JSON object with a top-level member `key` (for better messages only).
fn looks_like(line: &[u8], key: &str) -> bool {
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(line)
        .is_ok_and(|map| map.contains_key(key))
}

/// The blobs stored early, `placed` where the store said: their bytes are dropped.
fn place(
    keep: &mut Keep<'_>,
    blobs: &mut [ReadBlob],
    index: &DigestMap<usize>,
    placed: impl IntoIterator<Item = early::Placed>,
) {
    for (digest, at) in placed.into_iter().flatten() {
        if let Some(&i) = index.get(&digest) {
            keep.stored(&mut blobs[i].held, at);
        }
    }
}

fn read_blobs<R: BufRead>(
    lines: &mut Lines<'_, '_, R>,
    header: &ExportHeader,
    needed: &DigestMap<u64>,
    mut early: Option<&mut Early<'_>>,
    keep: &mut Keep<'_>,
) -> Result<(Vec<ReadBlob>, DigestMap<usize>, DigestSet), ImportError> {
    let mut blobs: Vec<ReadBlob> = Vec::with_capacity(header.blobs.min(PREALLOCATED) as usize);
    let mut left_out = DigestSet::default();
    let mut index: DigestMap<usize> =
        DigestMap::with_capacity_and_hasher(blobs.capacity(), FastHash::default());
    for number in 1..=header.blobs {
        let Some(line) = lines.next()? else {
            let mut message =
                format!("the header announces {} blobs, the file holds {}", header.blobs, number - 1);
            let first_missing =
                needed.iter().filter(|(d, _)| !index.contains_key(*d)).map(|(d, seq)| (*seq, *d)).min();
            if let Some((seq, digest)) = first_missing {
                message.push_str(&format!("; blob {digest}, referenced by seq {seq}, is missing"));
            }
            lines.forgive(ImportError::Truncated { at: lines.at(), message })?;
            break;
        };
        let parsed = match line.prepared {
            Prepared::Blob(parsed) => parsed,
            Prepared::Event(_) => unreachable!("the pipeline prepares blob lines as blobs"),
        };
        let parsed = match parsed {
            Ok(parsed) => *parsed,
            Err(e) if looks_like(&line.unparsed, "seq") => {
                let message = format!(
                    "expected blob {number} of the {}, found an event line \
                     (the header announces {} events; {})",
                    header.blobs,
                    header.events,
                    json_message(&e)
                );
                return Err(lines.malformed(message));
            }
            Err(e) => match lines.unparsable("not a valid blob line", &e) {
                err @ ImportError::Truncated { .. } => {
                    lines.forgive(err)?;
                    break;
                }
                err => return Err(err),
            },
        };
        let digest = parsed.digest;
        if let Some(&first) = index.get(&digest) {
            let first_line = 2 + header.events + first as u64;
            return Err(lines.malformed(format!("blob {digest} appears twice (first on line {first_line})")));
        }
        match decode_blob(lines, parsed, &blobs, &index, keep) {
            Ok(blob) => {
                let i = blobs.len();
                index.insert(digest, i);
                blobs.push(blob);
                let blob = &mut blobs[i];
                if let Held::Bytes(bytes) = &blob.held {
                    let bytes = bytes.clone();
                    let taken = early.as_deref_mut().is_some_and(|early| early.offer(digest, &bytes));
                    blob.held = match taken {
                        true => keep.hold(bytes),
                        false => keep
                            .keep(bytes)
                            .map_err(|source| ImportError::Store { run_id: header.run.id.clone(), source })?,
                    };
                }
                // What was stored while this line was handed over is dropped before the bytes
                // held are counted.
                if let Some(early) = early.as_deref() {
                    place(keep, &mut blobs, &index, early.placed());
                }
                keep.count();
            }
            // Forced: a blob that doesn't verify is left out (events referencing it then
            // reference a missing blob, which `retrace verify` reports).
            Err(err @ ImportError::Verification { .. }) => {
                lines.forgive(err)?;
                left_out.insert(digest);
            }
            Err(err) => return Err(err),
        }
    }
    Ok((blobs, index, left_out))
}

fn decode_blob<R: BufRead>(
    lines: &Lines<'_, '_, R>,
    line: ParsedBlob,
    blobs: &[ReadBlob],
    index: &DigestMap<usize>,
    keep: &mut Keep<'_>,
) -> Result<ReadBlob, ImportError> {
    let digest = line.digest;
    let (what, held, actual, names): (&str, Held, Digest, _) = match line.body {
        Body::Bytes { what, bytes, actual } => (what, Held::Bytes(bytes), actual, None),
        Body::BadBase64(e) => return Err(lines.malformed(format!("blob {digest}: bad base64: {e}"))),
        Body::Manifest(manifest) => {
            let bad = |e: StoreError| lines.malformed(format!("blob {digest}: bad manifest: {e}"));
            let manifest = canonical_value(&manifest)
                .map_err(|e| lines.malformed(format!("blob {digest}: bad manifest: {e}")))?;
            let names = manifest::references(&manifest).map_err(bad)?;
            if let Some(missing) = names.iter().find(|d| !index.contains_key(d)) {
                let message = format!(
                    "the manifest of blob {digest} names blob {missing}, which no earlier line holds"
                );
                return Err(lines.verification(None, Some(digest), message));
            }
            let compact: Arc<[u8]> = Manifest::decode(&manifest).map_err(bad)?.encode().into();
            let (actual, len) = manifest::digest_with(&compact, &mut TraceSource::new(blobs, index, keep))
                .map_err(|e| {
                    lines.verification(
                        None,
                        Some(digest),
                        format!("blob {digest}: the manifest can't be rebuilt: {e}"),
                    )
                })?;
            ("manifest", Held::Manifest { compact, len }, actual, Some(names))
        }
        Body::NotOne => {
            let message = format!("blob {digest}: a blob line holds exactly one of text, base64 or manifest");
            return Err(lines.malformed(message));
        }
    };
    if actual != digest {
        let message = format!("digest mismatch for blob {digest}: its {what} hashes to {actual}");
        return Err(lines.verification(None, Some(digest), message));
    }
    Ok(ReadBlob { digest, held, names })
}

/// The seq [`check_references`] gives a blob that only a fork's edit names (the header's line is
/// 1, an event's is its seq + 1).
const EDIT_SEQ: u64 = 0;

/// Every blob an event or a fork's edit references is present (`left_out`: the lines a forced import left out
/// because they don't verify), and every blob is referenced.
fn check_references<R: BufRead>(
    lines: &mut Lines<'_, '_, R>,
    store: &dyn Store,
    header: &ExportHeader,
    needed: &DigestMap<u64>,
    blobs: &[ReadBlob],
    held: &DigestMap<usize>,
    left_out: &DigestSet,
) -> Result<(), ImportError> {
    let file = lines.opts.file_name.clone();
    let mut missing: Vec<(u64, Digest)> =
        needed.iter().filter(|(d, _)| !held.contains_key(d)).map(|(&d, &seq)| (seq, d)).collect();
    missing.sort();
    for (seq, digest) in missing {
        let at = Location { file: file.clone(), line: seq + 1 };
        let by = match seq {
            EDIT_SEQ => {
                // Files exported before forks carried their edits' blobs lack them: one that
                // the store holds already (the fork comes home) is still whole here.
                if !left_out.contains(&digest) && store.has_blob(&digest).unwrap_or(false) {
                    continue;
                }
                let edit = header.run.edits.iter().find(|e| e.contains(&digest.to_string()));
                format!("the fork's edit {}", edit.map_or("", String::as_str))
            }
            _ => format!("seq {seq}"),
        };
        let message = match left_out.contains(&digest) {
            true => format!("{by} references blob {digest}, whose line was left out: it doesn't verify"),
            false => format!("{by} references blob {digest}, which is not in the file"),
        };
        lines.forgive(ImportError::Verification { at, seq: Some(seq), digest: Some(digest), message })?;
    }
    let named: DigestSet = blobs.iter().filter_map(|b| b.names.as_ref()).flatten().copied().collect();
    let strays = blobs
        .iter()
        .enumerate()
        .filter(|(_, b)| !needed.contains_key(&b.digest) && !named.contains(&b.digest));
    for (i, blob) in strays {
        let digest = blob.digest;
        let at = Location { file: file.clone(), line: 2 + header.events + i as u64 };
        let message = format!("blob {digest} is referenced by no event or manifest");
        lines.forgive(ImportError::Verification { at, seq: None, digest: Some(digest), message })?;
    }
    Ok(())
}
