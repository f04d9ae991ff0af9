//! Phase 2 of an import: compare with what the store already holds, then store in chunks.
use retrace_core::digest_map::DigestSet;
use retrace_core::envelope::EventType;
use retrace_core::run::{RunMeta, RunStatus};
use retrace_core::{Digest, Event};

use super::read::Trace;
use super::{ImportError, ImportOutcome};
use crate::{Batch, BlobHint, BlobPut, Store, StoreErrorKind};

/// Events compared per page when the run (or a fork's source) is already stored.
const PAGE: usize = 4096;

/// The label a run carries while its import is under way: created with it (and `running`, with
/// no head), the run gets the file's own header, this label gone, once its last event is
/// stored. An import that failed part way (a full disk, a killed process) leaves the run
/// marked so, never looking whole, and importing the same file again stores what is missing.
pub const UNFINISHED_LABEL: &str = "retrace.unfinished_import";

/// Stores a verified trace, or finds it already present.
pub(super) fn store_trace(
    store: &dyn Store,
    trace: Trace,
    chunk: usize,
) -> Result<ImportOutcome, ImportError> {
    let run_id = trace.header.run.id.clone();
    let stored = |source| ImportError::Store { run_id: run_id.clone(), source };
    check_sources(store, &run_id, &trace.events)?;
    let done = match store.run(&run_id) {
        Ok(held) if held.labels.contains_key(UNFINISHED_LABEL) => {
            stored_prefix(store, &run_id, &trace.events)?
        }
        Ok(held) => {
            compare(store, &run_id, &trace.events)?;
            compare_header(&held, &trace.header.run)?;
            return Ok(ImportOutcome::AlreadyPresent { run_id });
        }
        Err(e) if e.kind == StoreErrorKind::NotFound => {
            let mut importing = trace.header.run.clone();
            importing.status = RunStatus::Running;
            importing.head = None;
            importing.finished_at_ms = None;
            importing.labels.insert(UNFINISHED_LABEL.to_owned(), "stored in part".to_owned());
            store.create_run(&importing).map_err(stored)?;
            0
        }
        Err(e) => return Err(stored(e)),
    };

    let chunks = assign_chunks(&trace, chunk, done);
    let hints = hints(&trace);
    let (event_count, blob_count) = (trace.events.len() as u64, trace.blobs.len() as u64);
    let header = trace.header.run;
    let mut events = trace.events.into_iter().skip(done);
    let early = trace.stored;
    let mut blobs: Vec<Option<BlobPut>> = trace
        .blobs
        .into_iter()
        .zip(hints)
        .map(|(b, hint)| {
            let put = BlobPut::checked(b.digest, b.bytes, hint);
            // Stored while the file was read: the commit confirms it where it is.
            Some(match early.get(&b.digest) {
                Some(&at) => put.stored_at(at),
                None => put,
            })
        })
        .collect();
    // Each batch committed is freed on another thread (its blobs' bytes are most of the file):
    // the commits are the only work left, and they are serial.
    let (freed, free) = std::sync::mpsc::channel::<Batch>();
    std::thread::scope(|scope| {
        scope.spawn(move || free.into_iter().for_each(drop));
        for members in chunks {
            if events.len() == 0 {
                break;
            }
            let batch = Batch {
                run_id: run_id.clone(),
                events: events.by_ref().take(chunk).collect(),
                blobs: members.into_iter().filter_map(|i| blobs[i].take()).collect(),
                cache: Vec::new(),
            };
            // Every blob's digest was checked against its bytes as its line was read (`checked`).
            store.commit(&batch).map_err(stored)?;
            let _ = freed.send(batch);
        }
        // The freeing thread ends when the sender goes (here, or on an early return with the
        // closure's captures), and the scope waits for it.
        drop(freed);
        Ok(())
    })?;
    // Every event is stored: the run becomes the file's (its status, head, labels).
    store.update_run(&header).map_err(stored)?;
    Ok(ImportOutcome::Imported { run_id, events: event_count, blobs: blob_count })
}

/// For each chunk of the events after the first `done` (stored already, with every blob they
/// need), the blobs (indexes in file order) first needed by that chunk. A manifest's names go
/// with the manifest, before it, so each batch is self-contained.
fn assign_chunks(trace: &Trace, chunk: usize, done: usize) -> Vec<Vec<usize>> {
    const STORED: usize = usize::MAX - 1;
    let index = &trace.index;
    let count = (trace.events.len() - done).div_ceil(chunk).max(1);
    let mut chunk_of = vec![usize::MAX; trace.blobs.len()];
    let mut stack = Vec::new();
    for (i, event) in trace.events.iter().enumerate() {
        let c = if i < done { STORED } else { (i - done) / chunk };
        stack.extend([event.request_ref, event.output_ref].into_iter().flatten());
        while let Some(digest) = stack.pop() {
            let Some(&blob) = index.get(&digest) else { continue };
            if chunk_of[blob] != usize::MAX {
                continue;
            }
            chunk_of[blob] = c;
            stack.extend(trace.blobs[blob].names.iter().flatten());
        }
    }
    let mut chunks = vec![Vec::new(); count];
    for (blob, &c) in chunk_of.iter().enumerate() {
        // Every blob is referenced (read verified it); a stray one goes with the last chunk.
        if c != STORED {
            chunks[c.min(count - 1)].push(blob);
        }
    }
    chunks
}

/// How to store each blob (by its place in `trace.blobs`): model requests and responses as
/// such (so the store may keep them as manifests, as at record), the rest raw.
fn hints(trace: &Trace) -> Vec<BlobHint> {
    let mut hints = vec![None; trace.blobs.len()];
    for request in model_requests(&trace.events) {
        if let Some(&i) = trace.index.get(&request) {
            hints[i] = Some(BlobHint::ModelRequest);
        }
    }
    let outputs: DigestSet = model_calls(&trace.events).filter_map(|e| e.output_ref).collect();
    // A model's output is kept as a manifest only where the file has one (an output stored
    // flat, as before responses had manifests, stays flat, so export -> import -> export gives
    // the same bytes); any other manifest is a request or a base requests build on.
    for (hint, blob) in hints.iter_mut().zip(&trace.blobs).filter(|(_, b)| b.names.is_some()) {
        hint.get_or_insert(match outputs.contains(&blob.digest) {
            true => BlobHint::ModelResponse,
            false => BlobHint::ModelRequest,
        });
    }
    hints.into_iter().map(|h| h.unwrap_or(BlobHint::Raw)).collect()
}

fn model_calls(events: &[Event]) -> impl Iterator<Item = &Event> {
    events.iter().filter(|e| e.kind == EventType::ModelCall)
}

/// The blobs [`hints`] stores as model requests, whatever the file holds: every model call's
/// request. (Every other blob not in a manifest line is stored as plain bytes.)
pub(super) fn model_requests(events: &[Event]) -> impl Iterator<Item = Digest> + '_ {
    model_calls(events).filter_map(|e| e.request_ref)
}

/// The run is stored in part (an import that didn't finish): its events must be the first of
/// the file's, hash for hash. How many it holds.
fn stored_prefix(store: &dyn Store, run_id: &str, events: &[Event]) -> Result<usize, ImportError> {
    let held = held_hashes(store, run_id)?;
    let file: Vec<Digest> = events.iter().take(held.len()).map(|e| e.hash).collect();
    match first_difference(&held, &file) {
        None => Ok(held.len()),
        Some((seq, detail)) => Err(ImportError::Conflict { run_id: run_id.to_owned(), seq, detail }),
    }
}

/// The hashes of every event of a stored run, as exported.
fn held_hashes(store: &dyn Store, run_id: &str) -> Result<Vec<Digest>, ImportError> {
    let stored = |source| ImportError::Store { run_id: run_id.to_owned(), source };
    let mut pages = crate::export::RunEvents::new(store, run_id).map_err(stored)?;
    let mut held = Vec::new();
    while let Some(page) = pages.next_page().map_err(stored)? {
        held.extend(page.iter().map(|e| e.hash));
    }
    Ok(held)
}

/// The run is stored already: its events must be the file's, hash for hash. Both are the run as
/// exported: a fork recorded here stores only its own events and inherits the rest from its
/// source, while its file holds them all.
fn compare(store: &dyn Store, run_id: &str, events: &[Event]) -> Result<(), ImportError> {
    let held = held_hashes(store, run_id)?;
    let file: Vec<Digest> = events.iter().map(|e| e.hash).collect();
    match first_difference(&held, &file) {
        None => Ok(()),
        Some((seq, detail)) => Err(ImportError::Conflict { run_id: run_id.to_owned(), seq, detail }),
    }
}

/// The run is stored already with the file's events: what it recorded beyond them (its
/// outcome, its command, what it forked from) must be the file's too. Its name, labels and
/// retention tier are the store's own to change, and are not compared.
fn compare_header(held: &RunMeta, file: &RunMeta) -> Result<(), ImportError> {
    const FIELDS: [(&str, &str); 9] = [
        ("mode", "mode"),
        ("status", "status"),
        ("exit status", "exit_status"),
        ("decisions", "decisions"),
        ("command", "command"),
        ("source run", "source_run"),
        ("fork point", "fork_at"),
        ("edits", "edits"),
        ("head", "head"),
    ];
    let as_json = |meta: &RunMeta| serde_json::to_value(meta).unwrap_or_default();
    let (stored, filed) = (as_json(held), as_json(file));
    let shown = |v: Option<&serde_json::Value>| v.map_or_else(|| "null".to_owned(), ToString::to_string);
    match FIELDS.into_iter().find(|(_, key)| stored.get(key) != filed.get(key)) {
        None => Ok(()),
        Some((field, key)) => Err(ImportError::HeaderConflict {
            run_id: held.id.clone(),
            field,
            stored: shown(stored.get(key)),
            file: shown(filed.get(key)),
        }),
    }
}

/// A fork's inherited events must equal its source's events where the source is stored.
pub(super) fn check_sources(store: &dyn Store, own: &str, events: &[Event]) -> Result<(), ImportError> {
    let mut start = 0;
    while start < events.len() {
        let source = &events[start].run_id;
        let len = events[start..].iter().take_while(|e| &e.run_id == source).count();
        let group = &events[start..start + len];
        start += len;
        if source == own {
            continue;
        }
        match store.run(source) {
            Ok(_) => {}
            Err(e) if e.kind == StoreErrorKind::NotFound => continue,
            Err(source) => return Err(ImportError::Store { run_id: own.to_owned(), source }),
        }
        let first = group[0].seq;
        let held = stored_hashes(store, source, first, group.len())?;
        let file: Vec<Digest> = group.iter().map(|e| e.hash).collect();
        if let Some((offset, detail)) = first_difference(&held, &file) {
            let seq = first + offset - 1;
            let detail = format!("the fork {own} inherits it: {detail}");
            return Err(ImportError::Conflict { run_id: source.clone(), seq, detail });
        }
    }
    Ok(())
}

/// Hashes of up to `limit` stored events of `run` from seq `from`, read page by page.
fn stored_hashes(store: &dyn Store, run: &str, from: u64, limit: usize) -> Result<Vec<Digest>, ImportError> {
    let stored = |source| ImportError::Store { run_id: run.to_owned(), source };
    let mut hashes = Vec::new();
    let mut next = from;
    while hashes.len() < limit {
        let page = store.events(run, next, PAGE.min(limit - hashes.len())).map_err(stored)?;
        let Some(last) = page.last() else { break };
        next = last.seq + 1;
        let full = page.len() == PAGE;
        hashes.extend(page.iter().map(|e| e.hash));
        if !full {
            break;
        }
    }
    Ok(hashes)
}

/// The first 1-based position where two hash lists differ, and how.
fn first_difference(held: &[Digest], file: &[Digest]) -> Option<(u64, String)> {
    if let Some(i) = held.iter().zip(file).position(|(a, b)| a != b) {
        let detail = format!("hash {} in the store, {} in the file", held[i], file[i]);
        return Some((i as u64 + 1, detail));
    }
    (held.len() != file.len()).then(|| {
        let detail = format!("the store holds {} events, the file {}", held.len(), file.len());
        (held.len().min(file.len()) as u64 + 1, detail)
    })
}
