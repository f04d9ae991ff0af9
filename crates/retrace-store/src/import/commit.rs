//! Phase 2 of an import: compare with what the store already holds, then store in chunks.
use std::collections::HashSet;

use retrace_core::digest_map::DigestSet;
use retrace_core::envelope::EventType;
use retrace_core::run::{RunMeta, RunMode, RunStatus};
use retrace_core::{Digest, Event};

use super::held::Held;
use super::identity::{first_difference, Identity, Mismatched};
use super::read::{Trace, TraceSource};
use super::{ImportError, ImportOutcome, ImportStats};
use crate::gc::{retain, RetainError};
use crate::{Batch, BlobHint, BlobPut, LeaseHolder, Store, StoreErrorKind};

/// Events compared per page when the run (or a fork's source) is already stored.
const PAGE: usize = 4096;

/// The label a run carries while its import is under way: created with it (and `running`, with
/// no head), the run gets the file's own header, this label gone, once its last event is
/// stored. An import that failed part way (a full disk, a killed process) leaves the run
/// marked so, never looking whole, and importing the same file again stores what is missing.
pub const UNFINISHED_LABEL: &str = "retrace.unfinished_import";

/// Stores a verified trace, or finds it already present; `stats` says what its blobs' bytes
/// cost in memory.
///
/// Other imports of the same file may run at once (in other processes): whichever creates the
/// run or commits a stretch of its events first wins, and a loser that finds what it was about
/// to store stored already looks at the run again ([`Racing::recheck`]) and carries on from
/// there, so the same file imported twice at once is stored once and neither import fails.
pub(super) fn store_trace(
    store: &dyn Store,
    trace: Trace<'_>,
    chunk: usize,
    budget: u64,
    stats: &mut ImportStats,
) -> Result<ImportOutcome, ImportError> {
    *stats = trace.keep.stats.clone();
    let run_id = trace.header.run.id.clone();
    let stored = |source| ImportError::Store { run_id: run_id.clone(), source };
    check_sources(store, &run_id, &trace.events, &trace.mismatched)?;
    check_forks(store, &run_id, &trace.events, &trace.mismatched)?;
    let (mut done, mut raced) = match starting_point(store, &trace)? {
        (Start::Present, _) => return already_present(store, &trace.header.run),
        (Start::At(done), raced) => (done, raced),
    };

    let chunks = assign_chunks(&trace, chunk, budget, done);
    let hints = hints(&trace);
    let (event_count, blob_count) = (trace.events.len() as u64, trace.blobs.len() as u64);
    let Trace { header, events, blobs, index, mut keep, mismatched } = trace;
    let header = header.run;
    let total = events.len();
    let mut events = events.into_iter();
    // The blob at `i`, to store: a manifest line's request rebuilt now, from the lines it names.
    let mut put = |i: usize| -> Result<BlobPut, ImportError> {
        let blob = &blobs[i];
        let bytes = match &blob.held {
            // Stored while the file was read: the commit confirms it where it is.
            &Held::Stored { at, .. } => return Ok(BlobPut::stored(blob.digest, at, hints[i])),
            Held::Manifest { compact, .. } => {
                TraceSource::new(&blobs, &index, &mut keep).rebuild(compact).map_err(stored)?.into()
            }
            held => keep.for_storing(&blob.digest, held).map_err(stored)?,
        };
        // Every blob's digest was checked against its bytes as its line was read (`checked`),
        // and again as it was read back.
        Ok(BlobPut::checked(blob.digest, bytes, hints[i]))
    };
    let mut peak_batch = 0u64;
    let mut wrote = false;
    // Each batch committed is freed on another thread (its rebuilt requests may be large): the
    // commits are the only work left, and they are serial.
    let (freed, free) = std::sync::mpsc::channel::<Batch>();
    let present = std::thread::scope(|scope| {
        scope.spawn(move || free.into_iter().for_each(drop));
        let mut end = done;
        for members in chunks {
            end += members.events;
            // Events another import stored meanwhile (with the blobs they need) are dropped.
            skip_to(&mut events, total, done);
            if events.len() == 0 || end <= done {
                continue;
            }
            let mut batch = Batch {
                run_id: run_id.clone(),
                events: events.by_ref().take(end - done).collect(),
                blobs: members.blobs.into_iter().map(&mut put).collect::<Result<_, _>>()?,
                cache: Vec::new(),
            };
            let bytes = batch.blobs.iter().map(|b| b.bytes().len() as u64).sum::<u64>();
            peak_batch = peak_batch.max(bytes);
            let racing = Racing { run_id: &run_id, header: &header, mismatched: &mismatched };
            match racing.commit(store, &mut batch, done, events.as_slice())? {
                Landed::Stored => (done, wrote) = (end, true),
                Landed::Ahead { upto } => (done, raced) = (upto, true),
                Landed::Present => return Ok(true),
            }
            let _ = freed.send(batch);
        }
        // The freeing thread ends when the sender goes (here, or on an early return with the
        // closure's captures), and the scope waits for it.
        drop(freed);
        Ok::<_, ImportError>(false)
    })?;
    *stats = ImportStats { peak_batch_bytes: peak_batch, ..keep.stats.clone() };
    // The blob lines' bytes, most of the file, are freed on another thread too (here, if none
    // can start).
    let _ = std::thread::Builder::new().name("import-free".into()).spawn(move || drop(blobs));
    if present {
        return already_present(store, &header);
    }
    let finished = finish(store, &header)?;
    match wrote || (finished && !raced) {
        true => Ok(ImportOutcome::Imported { run_id, events: event_count, blobs: blob_count }),
        // Another import of the file stored every event: this one stored nothing.
        false => already_present(store, &header),
    }
}

/// The store holds the run already, with the file's events: nothing is written, except that a
/// file whose retention tier is stronger than the stored run's (pinned over routine, say)
/// raises it, so a run kept for an incident where it was exported is kept here too. A weaker
/// tier in the file changes nothing: the store's was set here on purpose.
fn already_present(store: &dyn Store, header: &RunMeta) -> Result<ImportOutcome, ImportError> {
    let stored = |source| ImportError::Store { run_id: header.id.clone(), source };
    let held = store.run(&header.id).map_err(stored)?;
    let raised = match header.retention > held.retention && held.mode != RunMode::Replay {
        true => Some(retain(store, held, header.retention).map_err(|e| match e {
            RetainError::Store(source) => stored(source),
            RetainError::Replay { .. } => unreachable!("replay runs are not raised"),
        })?),
        false => None,
    };
    Ok(ImportOutcome::AlreadyPresent { run_id: header.id.clone(), raised })
}

/// Every event is stored: the run becomes the file's (its status, head, labels); true when
/// this import wrote that. Another import of the file, which stored the events or some of
/// them, may have done so meanwhile: then the run's header must be the file's, as when the run
/// is found whole (a file whose header differs is a conflict, not a second writer of it).
fn finish(store: &dyn Store, header: &RunMeta) -> Result<bool, ImportError> {
    let stored = |source| ImportError::Store { run_id: header.id.clone(), source };
    let held = store.run(&header.id).map_err(stored)?;
    if !held.labels.contains_key(UNFINISHED_LABEL) {
        compare_header(&held, header)?;
        return Ok(false);
    }
    // A file exported from an unfinished import (before `export` refused one) carries the mark:
    // here the run is whole.
    let mut header = header.clone();
    header.labels.remove(UNFINISHED_LABEL);
    store.update_run(&header).map_err(stored)?;
    Ok(true)
}

/// Where storing a trace starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    /// The store holds the run whole, the same as the file: nothing to store.
    Present,
    /// The store holds the file's first this many events (0: the run was created just now);
    /// the rest are to be stored.
    At(usize),
}

/// Where storing `trace` starts: the run found whole, found stored in part (an import that
/// didn't finish, or one running now), or created. The run created by another import between
/// looking and creating (the store refuses a second `create_run`) is looked at again, as found;
/// the flag says so.
fn starting_point(store: &dyn Store, trace: &Trace<'_>) -> Result<(Start, bool), ImportError> {
    let run_id = &trace.header.run.id;
    let stored = |source| ImportError::Store { run_id: run_id.clone(), source };
    if let Some(start) = existing(store, trace)? {
        return Ok((start, false));
    }
    let mut importing = trace.header.run.clone();
    importing.status = RunStatus::Running;
    importing.head = None;
    importing.finished_at_ms = None;
    importing.labels.insert(UNFINISHED_LABEL.to_owned(), "stored in part".to_owned());
    match store.create_run(&importing) {
        // Started long ago, as the file says, and holding no lease: only this process being
        // alive tells others that the import is under way, not dead.
        Ok(()) => {
            store.keep_run(run_id, &LeaseHolder::current()).map_err(stored)?;
            Ok((Start::At(0), false))
        }
        Err(e) if e.kind == StoreErrorKind::Conflict => match existing(store, trace)? {
            Some(start) => Ok((start, true)),
            None => Err(stored(e)),
        },
        Err(e) => Err(stored(e)),
    }
}

/// How the stored run `trace` names compares with the file, `None` when it isn't stored: whole
/// and the same (events and header), or the same as far as a run stored in part goes. A
/// difference is a conflict.
fn existing(store: &dyn Store, trace: &Trace<'_>) -> Result<Option<Start>, ImportError> {
    let run_id = &trace.header.run.id;
    match store.run(run_id) {
        Ok(held) if held.labels.contains_key(UNFINISHED_LABEL) => {
            stored_prefix(store, run_id, &trace.events, &trace.mismatched).map(|done| Some(Start::At(done)))
        }
        Ok(held) => {
            compare(store, run_id, trace)?;
            compare_header(&held, &trace.header.run)?;
            Ok(Some(Start::Present))
        }
        Err(e) if e.kind == StoreErrorKind::NotFound => Ok(None),
        Err(source) => Err(ImportError::Store { run_id: run_id.clone(), source }),
    }
}

/// Drops the events before the file's `to`th from `events`, the file's `total` events of which
/// the rest are left.
fn skip_to(events: &mut std::vec::IntoIter<Event>, total: usize, to: usize) {
    let at = total - events.len();
    if to > at {
        events.nth(to - at - 1);
    }
}

/// What a commit that may race another import of the same file came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Landed {
    /// This import stored the batch (what was left of it).
    Stored,
    /// Another import stored the whole batch, and the store holds the file's first `upto`
    /// events, the same as the file's; the run is still unfinished.
    Ahead {
        /// How many of the file's events the store holds.
        upto: usize,
    },
    /// Another import stored the whole run, the same as the file, header and all.
    Present,
}

/// What a commit refused as a conflict is checked against: whether it lost a race to another
/// import of the same file.
struct Racing<'a> {
    run_id: &'a str,
    header: &'a RunMeta,
    mismatched: &'a Mismatched,
}

impl Racing<'_> {
    /// Commits `batch`, whose first event is the file's `from`th and which `rest` follows. A
    /// conflict (its seqs stored already) that another import of the file explains is no
    /// failure: when that import stored the whole run, it is present; when it stored part of
    /// the batch, the rest is committed again; when all of it, the store is ahead. Anything
    /// else, a different run above all, stays an error. Each retry starts further on, so this
    /// ends.
    fn commit(
        &self,
        store: &dyn Store,
        batch: &mut Batch,
        mut from: usize,
        rest: &[Event],
    ) -> Result<Landed, ImportError> {
        let stored = |source| ImportError::Store { run_id: self.run_id.to_owned(), source };
        loop {
            let end = from + batch.events.len();
            let refused = match store.commit(batch) {
                Ok(()) => return Ok(Landed::Stored),
                Err(e) if e.kind == StoreErrorKind::Conflict => e,
                Err(e) => return Err(stored(e)),
            };
            match self.recheck(store, from, &batch.events, rest)? {
                Some(Start::Present) => return Ok(Landed::Present),
                Some(Start::At(upto)) if upto >= end => return Ok(Landed::Ahead { upto }),
                Some(Start::At(upto)) if upto > from => {
                    batch.events.drain(..upto - from);
                    from = upto;
                }
                _ => return Err(stored(refused)),
            }
        }
    }

    /// Looks at the stored run again after a commit of the file's events from its `from`th
    /// (`batch`, then `rest`) was refused: [`existing`]'s answer, `None` when the run is gone or
    /// holds fewer events than this import found or stored (no other import explains that).
    /// The events before `from` are not compared again: this import compared or stored them.
    fn recheck(
        &self,
        store: &dyn Store,
        from: usize,
        batch: &[Event],
        rest: &[Event],
    ) -> Result<Option<Start>, ImportError> {
        let meta = match store.run(self.run_id) {
            Ok(meta) => meta,
            Err(e) if e.kind == StoreErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(ImportError::Store { run_id: self.run_id.to_owned(), source }),
        };
        let held = held_events(store, self.run_id)?;
        let Some(before) = held.get(..from) else { return Ok(None) };
        let mut file = before.to_vec();
        file.extend(Identity::of_file(batch, self.mismatched));
        file.extend(Identity::of_file(rest, self.mismatched));
        if meta.labels.contains_key(UNFINISHED_LABEL) {
            file.truncate(held.len());
            same_events(self.run_id, &held, &file)?;
            return Ok(Some(Start::At(held.len())));
        }
        same_events(self.run_id, &held, &file)?;
        compare_header(&meta, self.header)?;
        Ok(Some(Start::Present))
    }
}

/// One transaction of an import: its events (the next ones in order) and its blobs.
#[derive(Debug, Default)]
struct Chunk {
    events: usize,
    /// Indexes in `Trace::blobs`.
    blobs: Vec<usize>,
}

/// The events after the first `done` (stored already, with every blob they need), cut into
/// chunks of at most `chunk` events and about `budget` bytes, each with the blobs first needed
/// by its events. A manifest's names go with the manifest, before it, so each batch is
/// self-contained. Blobs stored while the file was read don't count against `budget`; a
/// manifest line counts as the request it is rebuilt into, so the requests of a long
/// conversation, each holding every earlier turn again, are rebuilt a few at a time.
fn assign_chunks(trace: &Trace<'_>, chunk: usize, budget: u64, done: usize) -> Vec<Chunk> {
    const STORED: usize = usize::MAX - 1;
    let index = &trace.index;
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut bytes = 0u64;
    let mut chunk_of = vec![usize::MAX; trace.blobs.len()];
    let mut stack = Vec::new();
    for (i, event) in trace.events.iter().enumerate() {
        let c = if i < done {
            STORED
        } else {
            if chunks.last().is_none_or(|c| c.events >= chunk || bytes >= budget) {
                chunks.push(Chunk::default());
                bytes = 0;
            }
            let last = chunks.len() - 1;
            chunks[last].events += 1;
            last
        };
        stack.extend([event.request_ref, event.output_ref].into_iter().flatten());
        while let Some(digest) = stack.pop() {
            let Some(&blob) = index.get(&digest) else { continue };
            if chunk_of[blob] != usize::MAX {
                continue;
            }
            chunk_of[blob] = c;
            let blob = &trace.blobs[blob];
            if !matches!(blob.held, Held::Stored { .. }) {
                bytes += blob.len();
            }
            stack.extend(blob.names.iter().flatten());
        }
    }
    if chunks.is_empty() {
        chunks.push(Chunk::default());
    }
    let last = chunks.len() - 1;
    for (blob, &c) in chunk_of.iter().enumerate() {
        // Every blob is referenced (read verified it); a stray one goes with the last chunk.
        if c != STORED {
            chunks[c.min(last)].blobs.push(blob);
        }
    }
    chunks
}

/// How to store each blob (by its place in `trace.blobs`): model requests and responses as
/// such (so the store may keep them as manifests, as at record), the rest raw.
fn hints(trace: &Trace<'_>) -> Vec<BlobHint> {
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
pub(super) fn stored_prefix(
    store: &dyn Store,
    run_id: &str,
    events: &[Event],
    mismatched: &Mismatched,
) -> Result<usize, ImportError> {
    let held = held_events(store, run_id)?;
    let file = Identity::of_file(&events[..held.len().min(events.len())], mismatched);
    same_events(run_id, &held, &file).map(|()| held.len())
}

/// Every event of a stored run, as exported, as compared ([`Identity`]).
fn held_events(store: &dyn Store, run_id: &str) -> Result<Vec<Identity>, ImportError> {
    let stored = |source| ImportError::Store { run_id: run_id.to_owned(), source };
    let mut pages = crate::export::RunEvents::new(store, run_id).map_err(stored)?;
    let mut held = Vec::new();
    while let Some(page) = pages.next_page().map_err(stored)? {
        held.extend(page.iter().map(Identity::stored));
    }
    Ok(held)
}

/// The run is stored already: its events must be the file's, hash for hash. Both are the run as
/// exported: a fork recorded here stores only its own events and inherits the rest from its
/// source, while its file holds them all.
fn compare(store: &dyn Store, run_id: &str, trace: &Trace<'_>) -> Result<(), ImportError> {
    let held = held_events(store, run_id)?;
    let file = Identity::of_file(&trace.events, &trace.mismatched);
    same_events(run_id, &held, &file)
}

/// The stored run's events `held` must be the file's `file`, hash for hash: a conflict naming
/// the first that differs otherwise.
fn same_events(run_id: &str, held: &[Identity], file: &[Identity]) -> Result<(), ImportError> {
    match first_difference(held, file) {
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
pub(super) fn check_sources(
    store: &dyn Store,
    own: &str,
    events: &[Event],
    mismatched: &Mismatched,
) -> Result<(), ImportError> {
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
        let held = stored_events(store, source, first, group.len())?;
        let file = Identity::of_file(group, mismatched);
        if let Some((offset, detail)) = first_difference(&held, &file) {
            let seq = first + offset - 1;
            return Err(ImportError::Inherited {
                fork: own.to_owned(),
                source_run: source.clone(),
                seq,
                detail,
                fork_in_file: true,
            });
        }
    }
    Ok(())
}

/// The other way round: forks of the run imported before it hold the events they inherit from
/// it, which must be the file's. Else the store would hold two histories of one run: the fork's
/// own copy, which its export and chain keep, and the run's, which `show` of the fork serves.
///
/// The forks looked at are those of `own`, and those whose source isn't stored (a fork of a
/// fork, imported alone, inherits from `own` through a run the store lacks); only the events
/// they hold that `own` recorded (their `run_id`) before their fork point are read.
pub(super) fn check_forks(
    store: &dyn Store,
    own: &str,
    events: &[Event],
    mismatched: &Mismatched,
) -> Result<(), ImportError> {
    let failed = |source| ImportError::Store { run_id: own.to_owned(), source };
    let runs = store.runs().map_err(failed)?;
    let stored: HashSet<&str> = runs.iter().map(|r| r.id.as_str()).collect();
    let forks = runs.iter().filter(|r| r.mode == RunMode::Fork && r.id != own).filter_map(|r| {
        let (source, at) = (r.source_run.as_deref()?, r.fork_at?);
        (source == own || !stored.contains(source)).then_some((r.id.as_str(), at))
    });
    for (fork, at) in forks {
        let mut next = 1;
        while next < at {
            let page = store.events(fork, next, PAGE.min((at - next) as usize)).map_err(failed)?;
            let Some(last) = page.last() else { break };
            next = last.seq + 1;
            for held in page.iter().filter(|e| e.run_id == own && e.seq < at) {
                let Some(filed) = events.get(held.seq as usize - 1).filter(|e| e.seq == held.seq) else {
                    return Err(ImportError::Inherited {
                        fork: fork.to_owned(),
                        source_run: own.to_owned(),
                        seq: held.seq,
                        detail: "the file ends before it".into(),
                        fork_in_file: false,
                    });
                };
                let file = Identity::of_file(std::slice::from_ref(filed), mismatched);
                if let Some((_, detail)) = first_difference(&[Identity::stored(held)], &file) {
                    return Err(ImportError::Inherited {
                        fork: fork.to_owned(),
                        source_run: own.to_owned(),
                        seq: held.seq,
                        detail,
                        fork_in_file: false,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Up to `limit` stored events of `run` from seq `from`, as compared, read page by page.
fn stored_events(
    store: &dyn Store,
    run: &str,
    from: u64,
    limit: usize,
) -> Result<Vec<Identity>, ImportError> {
    let stored = |source| ImportError::Store { run_id: run.to_owned(), source };
    let mut hashes = Vec::new();
    let mut next = from;
    while hashes.len() < limit {
        let page = store.events(run, next, PAGE.min(limit - hashes.len())).map_err(stored)?;
        let Some(last) = page.last() else { break };
        next = last.seq + 1;
        let full = page.len() == PAGE;
        hashes.extend(page.iter().map(Identity::stored));
        if !full {
            break;
        }
    }
    Ok(hashes)
}
