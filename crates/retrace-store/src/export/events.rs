//! A run's whole event sequence, read page by page: a fork's events include those it inherits.
//!
//! A fork recorded here stores only its own events, from its fork point on; the events before
//! it are its source's (recursively, for a fork of a fork). An imported fork stores all of them
//! itself. [`RunEvents`] hides the difference: it yields seq 1, 2, 3... of the run as exported.
use std::collections::HashSet;

use retrace_core::Event;

use crate::{LocatedEvent, Store, StoreError, StoreErrorKind, StoreResult};

/// Events read from the store per page.
pub const PAGE: usize = 4096;

/// One stretch of a run's events held by one stored run: seqs `from..=to` of `run`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The stored run that holds these events.
    pub run: String,
    /// First seq.
    pub from: u64,
    /// Last seq.
    pub to: u64,
}

/// Where a walk over a run's events stands: the stretches that hold them and the next seq.
/// It borrows no store, so a reader on a thread of its own can keep one.
#[derive(Clone, Debug)]
pub struct EventCursor {
    segments: Vec<Segment>,
    index: usize,
    next: u64,
}

impl EventCursor {
    /// Resolves where `run`'s events are stored; `NotFound` when the run, or a fork's source, is
    /// missing.
    pub fn new(store: &dyn Store, run: &str) -> StoreResult<EventCursor> {
        let segments = segments(store, run)?;
        let next = segments.first().map_or(1, |s| s.from);
        Ok(EventCursor { segments, index: 0, next })
    }

    /// The stretches, first to last.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// How many events the run has, inherited ones included (the last seq).
    pub fn count(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.to)
    }

    /// The next page of at most `limit` events read from `store`, or `None` after the last.
    pub fn next_page(&mut self, store: &dyn Store, limit: usize) -> StoreResult<Option<Vec<Event>>> {
        self.advance(limit, |run, from, want| store.events(run, from, want), |e| e.seq)
    }

    /// [`EventCursor::next_page`] with where each event's blobs are kept
    /// ([`crate::EventStore::events_located`]).
    pub fn next_located_page(
        &mut self,
        store: &dyn Store,
        limit: usize,
    ) -> StoreResult<Option<Vec<LocatedEvent>>> {
        self.advance(limit, |run, from, want| store.events_located(run, from, want), |e| e.event.seq)
    }

    /// The one event at the cursor, read alone, with its seq: the cursor moves past it even
    /// when it can't be read, so a reader that reports what it can't read goes on past it
    /// ([`crate::verify`] does, where a page failed). `None` after the last.
    pub fn next_single(&mut self, store: &dyn Store) -> Option<(u64, StoreResult<Event>)> {
        let run = self.current()?.run.clone();
        let seq = self.next;
        let read = store.event(&run, seq);
        self.next += 1;
        Some((seq, read))
    }

    /// The segment that holds `self.next`, moving past the ones finished; `None` after the last.
    fn current(&mut self) -> Option<&Segment> {
        while self.next > self.segments.get(self.index)?.to {
            self.index += 1;
            self.next = self.segments.get(self.index).map_or(0, |s| s.from);
        }
        self.segments.get(self.index)
    }

    /// The next page read by `read(run, from, limit)`, whose items have seqs `seq`.
    fn advance<T>(
        &mut self,
        limit: usize,
        mut read: impl FnMut(&str, u64, usize) -> StoreResult<Vec<T>>,
        seq: impl Fn(&T) -> u64,
    ) -> StoreResult<Option<Vec<T>>> {
        let Some(segment) = self.current().cloned() else { return Ok(None) };
        let next = self.next;
        let want = usize::try_from(segment.to - next + 1).unwrap_or(limit).min(limit);
        let page = read(&segment.run, next, want)?;
        let Some(last) = page.last() else {
            return Err(StoreError::corrupt(format!(
                "run {} holds no events from seq {next} though its last seq is {}",
                segment.run, segment.to
            )));
        };
        self.next = seq(last) + 1;
        Ok(Some(page))
    }
}

/// The events of a run in seq order, [`PAGE`] at a time, inherited ones included.
pub struct RunEvents<'a> {
    store: &'a dyn Store,
    cursor: EventCursor,
}

impl std::fmt::Debug for RunEvents<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunEvents").field("cursor", &self.cursor).finish()
    }
}

impl<'a> RunEvents<'a> {
    /// Resolves where `run`'s events are stored; `NotFound` when the run, or a fork's source, is
    /// missing.
    pub fn new(store: &'a dyn Store, run: &str) -> StoreResult<RunEvents<'a>> {
        Ok(RunEvents { store, cursor: EventCursor::new(store, run)? })
    }

    /// The stretches, first to last.
    pub fn segments(&self) -> &[Segment] {
        self.cursor.segments()
    }

    /// How many events the run has, inherited ones included (the last seq).
    pub fn count(&self) -> u64 {
        self.cursor.count()
    }

    /// The next page of at most [`PAGE`] events, or `None` after the last.
    pub fn next_page(&mut self) -> StoreResult<Option<Vec<Event>>> {
        self.cursor.next_page(self.store, PAGE)
    }

    /// The one next event, read alone ([`EventCursor::next_single`]).
    pub fn next_single(&mut self) -> Option<(u64, StoreResult<Event>)> {
        self.cursor.next_single(self.store)
    }

    /// [`RunEvents::next_page`] with where each event's blobs are kept.
    pub fn next_located_page(&mut self) -> StoreResult<Option<Vec<LocatedEvent>>> {
        self.cursor.next_located_page(self.store, PAGE)
    }
}

/// Whether `meta` is a fork that holds the events it inherits itself (imported from its trace,
/// which carries them) rather than by reference to its source: it then reads as a whole run
/// without its source.
pub fn holds_inherited(store: &dyn Store, meta: &retrace_core::run::RunMeta) -> StoreResult<bool> {
    if !matches!((meta.fork_at, &meta.source_run), (Some(at), Some(_)) if at > 1) {
        return Ok(false);
    }
    Ok(store.events(&meta.id, 1, 1)?.first().is_some_and(|e| e.seq == 1))
}

/// Which stored runs hold which seqs of `run`, first to last.
fn segments(store: &dyn Store, run: &str) -> StoreResult<Vec<Segment>> {
    let mut segments = Vec::new();
    let mut current = run.to_owned();
    let mut upto = u64::MAX;
    let mut seen = HashSet::new();
    loop {
        if !seen.insert(current.clone()) {
            return Err(StoreError::corrupt(format!(
                "run {run}: its chain of fork sources loops through {current}"
            )));
        }
        let meta = store.run(&current)?;
        let last = store.last_seq(&current)?.min(upto);
        let first = store.events(&current, 1, 1)?.first().map(|e| e.seq);
        let by_reference = match (meta.fork_at, &meta.source_run) {
            (Some(at), Some(source)) if at > 1 && first.is_none_or(|s| s > 1) => Some((at, source.clone())),
            _ => None,
        };
        let Some((at, source)) = by_reference else {
            if last >= 1 {
                segments.push(Segment { run: current, from: 1, to: last });
            }
            break;
        };
        if last >= at {
            segments.push(Segment { run: current.clone(), from: at, to: last });
        }
        upto = upto.min(at - 1);
        match store.run(&source) {
            Ok(_) => current = source,
            Err(e) if e.kind == StoreErrorKind::NotFound => {
                return Err(StoreError::not_found(format!(
                    "run {current} is a fork of run {source}, which is not in the store: \
                     its events before seq {at} are missing"
                )))
            }
            Err(e) => return Err(e),
        }
    }
    segments.reverse();
    Ok(segments)
}
