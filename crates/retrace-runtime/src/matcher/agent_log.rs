//! One agent's recorded steps as the matcher keeps them: the slots loaded so far and not yet
//! consumed (consumed slots at the front are dropped), found by key in recorded order.
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use retrace_core::envelope::Decision;
use retrace_core::{Digest, Event, EventType};

use super::{Leftover, RecordedDelivery, RecordedStep, Resolution};

/// "No slot" in [`Slot::next`] links.
const NONE: u32 = u32::MAX;

/// One recorded step as the log keeps it: fixed-size fields inline, the name shared with every
/// other step of that name, and the rarely present fields boxed.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) seq: u64,
    lamport: u64,
    causal_parent: Option<u64>,
    pub(super) key: Digest,
    request_ref: Option<Digest>,
    pub(super) output_ref: Option<Digest>,
    pub(super) name: Option<Arc<str>>,
    rare: Option<Box<Rare>>,
    /// The output, read and verified ahead of the replay ([`super::feed`]).
    pub(super) output: Option<super::Prefetched>,
    /// The next slot with the same key, or [`NONE`].
    next: u32,
    pub(super) kind: EventType,
    pub(super) source: retrace_core::Source,
    /// For an intent: whether its completion (or a resolution) has been loaded.
    pub(super) completed: bool,
    consumed: bool,
}

/// The fields most steps lack.
#[derive(Debug, Default)]
struct Rare {
    error: Option<String>,
    decision: Option<Decision>,
    resolution: Option<Resolution>,
    to: Option<String>,
    /// A model call's pinned snapshot, which a fork's step served from it keeps.
    snapshot: Option<Arc<str>>,
}

impl Slot {
    pub(super) fn new(e: &Event, names: &mut HashMap<String, Arc<str>>) -> Slot {
        let name = e.name.as_deref().map(|n| intern(names, n));
        let to = e.message.as_ref().and_then(|m| m.to.clone());
        let snapshot = e.model.as_ref().and_then(|m| m.snapshot.as_deref()).map(|s| intern(names, s));
        let rare =
            (e.error.is_some() || e.decision.is_some() || to.is_some() || snapshot.is_some()).then(|| {
                Box::new(Rare {
                    error: e.error.clone(),
                    decision: e.decision.clone(),
                    resolution: None,
                    to,
                    snapshot,
                })
            });
        Slot {
            seq: e.seq,
            lamport: e.lamport,
            causal_parent: e.causal_parent,
            key: e.key,
            request_ref: e.request_ref,
            output_ref: e.output_ref,
            name,
            rare,
            output: None,
            next: NONE,
            kind: e.kind,
            source: e.source,
            // An intent is completed once its completion is loaded.
            completed: e.kind != EventType::Intent,
            consumed: false,
        }
    }

    /// Whether the step failed in record (its error is raised again, its output never read).
    pub(super) fn failed(&self) -> bool {
        self.rare.as_ref().is_some_and(|r| r.error.is_some())
    }

    pub(super) fn complete(&mut self, resolution: Option<Resolution>) {
        self.completed = true;
        if let Some(r) = resolution {
            self.rare.get_or_insert_with(Box::default).resolution = Some(r);
        }
    }

    pub(super) fn step(&self) -> RecordedStep {
        let rare = self.rare.as_deref();
        RecordedStep {
            seq: self.seq,
            kind: self.kind,
            name: self.name.as_deref().map(str::to_owned),
            key: self.key,
            request_ref: self.request_ref,
            output_ref: self.output_ref,
            error: rare.and_then(|r| r.error.clone()),
            decision: rare.and_then(|r| r.decision.clone()),
            completed: self.completed,
            causal_parent: self.causal_parent,
            lamport: self.lamport,
            source: self.source,
            resolution: rare.and_then(|r| r.resolution.clone()),
            to: rare.and_then(|r| r.to.clone()),
            snapshot: rare.and_then(|r| r.snapshot.as_deref()).map(str::to_owned),
            output: None,
        }
    }
}

/// The shared copy of `s` in `names`.
pub(super) fn intern(names: &mut HashMap<String, Arc<str>>, s: &str) -> Arc<str> {
    match names.get(s) {
        Some(a) => a.clone(),
        None => {
            let a: Arc<str> = Arc::from(s);
            names.insert(s.to_owned(), a.clone());
            a
        }
    }
}

/// One agent's loaded steps and deliveries. Slots are numbered from the agent's first step
/// (absolute indices); `steps` holds those from `base` on, the consumed ones before the first
/// unconsumed slot having been dropped.
#[derive(Debug, Default)]
pub(super) struct AgentLog {
    steps: VecDeque<Slot>,
    /// The absolute index of `steps[0]`.
    base: usize,
    /// Per key: the first and last unconsumed slot with it (linked through [`Slot::next`]).
    /// Built only when a step is asked for out of recorded order: a replay that asks in order
    /// (the common case) matches every step against the first unconsumed one and never pays
    /// for the index, in memory or at load.
    by_key: Option<HashMap<Digest, (u32, u32)>>,
    /// The absolute index of the first unconsumed slot (`end()` when there is none).
    first_unconsumed: usize,
    pub(super) deliveries: VecDeque<RecordedDelivery>,
    /// The seq of the last step pushed (consumed or not): where an agent that asks for more
    /// steps than it recorded went past its recording.
    last_seq: Option<u64>,
    /// The first step taken out of recorded order: it, and the earlier step it went before.
    pub(super) reordered: Option<(Leftover, Leftover)>,
}

impl AgentLog {
    /// The absolute index the next pushed slot gets.
    pub(super) fn end(&self) -> usize {
        self.base + self.steps.len()
    }

    pub(super) fn slot(&self, idx: usize) -> Option<&Slot> {
        idx.checked_sub(self.base).and_then(|i| self.steps.get(i))
    }

    pub(super) fn slot_mut(&mut self, idx: usize) -> Option<&mut Slot> {
        idx.checked_sub(self.base).and_then(|i| self.steps.get_mut(i))
    }

    fn at(&self, idx: u32) -> &Slot {
        &self.steps[idx as usize - self.base]
    }

    fn at_mut(&mut self, idx: u32) -> &mut Slot {
        &mut self.steps[idx as usize - self.base]
    }

    /// The seq of the agent's last loaded step, consumed or not.
    pub(super) fn last_seq(&self) -> Option<u64> {
        self.last_seq
    }

    /// Appends `slot`; returns its absolute index.
    pub(super) fn push(&mut self, slot: Slot) -> usize {
        let idx = self.end();
        let small = u32::try_from(idx).ok().filter(|&i| i != NONE).expect("fewer than 2^32 steps per agent");
        let key = slot.key;
        self.last_seq = Some(slot.seq);
        self.steps.push_back(slot);
        if let Some(mut by_key) = self.by_key.take() {
            self.link(&mut by_key, key, small);
            self.by_key = Some(by_key);
        }
        idx
    }

    /// Appends slot `idx` (with `key`) to its key's queue in `by_key`.
    fn link(&mut self, by_key: &mut HashMap<Digest, (u32, u32)>, key: Digest, idx: u32) {
        match by_key.get_mut(&key) {
            Some((_, tail)) => {
                let tail = std::mem::replace(tail, idx);
                self.at_mut(tail).next = idx;
            }
            None => {
                by_key.insert(key, (idx, idx));
            }
        }
    }

    /// The index of unconsumed slots by key, built on first use.
    fn index(&mut self) -> &mut HashMap<Digest, (u32, u32)> {
        if self.by_key.is_none() {
            let mut by_key = HashMap::new();
            for idx in self.first_unconsumed..self.end() {
                let slot = self.at_mut(idx as u32);
                slot.next = NONE;
                if !slot.consumed {
                    let key = slot.key;
                    self.link(&mut by_key, key, idx as u32);
                }
            }
            self.by_key = Some(by_key);
        }
        self.by_key.as_mut().expect("just built")
    }

    /// The absolute index of the earliest loaded unconsumed slot with `key`. While the earliest
    /// unconsumed slot has it, no index is needed; with no unconsumed slot loaded, none is built
    /// (the next ones loaded may well be in order).
    pub(super) fn find(&mut self, key: &Digest) -> Option<usize> {
        if self.by_key.is_none() {
            let first = self.slot(self.first_unconsumed)?;
            if first.key == *key {
                return Some(self.first_unconsumed);
            }
        }
        let (head, _) = *self.index().get(key)?;
        Some(head as usize)
    }

    /// Consumes slot `idx` (found by [`AgentLog::find`] or a scan) and returns its step, with
    /// its prefetched output.
    pub(super) fn take(&mut self, idx: usize) -> RecordedStep {
        if idx > self.first_unconsumed && self.reordered.is_none() {
            // Matched by key, as SPEC §7 says, and not a divergence; but noted, for whoever
            // cares in which order an agent took its steps (`gate --strict-order`).
            let at = |i: usize| self.at(i as u32);
            let note = |s: &Slot| Leftover { seq: s.seq, label: s.step().label(), key: Some(s.key) };
            self.reordered = Some((note(at(idx)), note(at(self.first_unconsumed))));
        }
        let key = self.at(idx as u32).key;
        self.unlink(&key, idx as u32);
        let slot = self.at_mut(idx as u32);
        slot.consumed = true;
        let mut step = slot.step();
        step.output = slot.output.take();
        while self.first_unconsumed < self.end() && self.at(self.first_unconsumed as u32).consumed {
            self.first_unconsumed += 1;
        }
        // What lies before the first unconsumed slot is never looked at again.
        while self.base < self.first_unconsumed {
            self.steps.pop_front();
            self.base += 1;
        }
        step
    }

    /// Removes slot `idx` from its key's queue (nothing to do without an index).
    fn unlink(&mut self, key: &Digest, idx: u32) {
        let Some(mut by_key) = self.by_key.take() else { return };
        if let Some(&(head, tail)) = by_key.get(key) {
            let next = self.at(idx).next;
            if head == idx {
                if tail == idx {
                    by_key.remove(key);
                } else {
                    by_key.insert(*key, (next, tail));
                }
            } else {
                let mut prev = head;
                while prev != NONE {
                    let after = self.at(prev).next;
                    if after == idx {
                        self.at_mut(prev).next = next;
                        if tail == idx {
                            by_key.insert(*key, (head, prev));
                        }
                        break;
                    }
                    prev = after;
                }
            }
        }
        self.by_key = Some(by_key);
    }

    /// The absolute index of the earliest loaded unconsumed slot for which `pred` holds.
    pub(super) fn first_unconsumed(&self, pred: impl Fn(&Slot) -> bool) -> Option<usize> {
        let from = self.first_unconsumed - self.base;
        self.steps.range(from..).position(|s| !s.consumed && pred(s)).map(|i| self.first_unconsumed + i)
    }

    /// The loaded slots not yet consumed.
    pub(super) fn unconsumed(&self) -> impl Iterator<Item = &Slot> {
        self.steps.range(self.first_unconsumed - self.base..).filter(|s| !s.consumed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent log of tool steps with these keys (seq = position + 1).
    fn log(keys: &[u8]) -> AgentLog {
        let mut names = HashMap::new();
        let mut log = AgentLog::default();
        for (i, k) in keys.iter().enumerate() {
            let mut e = Event::new("run", "a", EventType::ToolCall);
            e.seq = i as u64 + 1;
            e.key = Digest::of(&[*k]);
            log.push(Slot::new(&e, &mut names));
        }
        log
    }

    fn take(log: &mut AgentLog, k: u8) -> Option<u64> {
        let idx = log.find(&Digest::of(&[k]))?;
        Some(log.take(idx).seq)
    }

    #[test]
    fn in_order_replay_never_builds_the_key_index() {
        let mut l = log(&[1, 2, 1, 3]);
        assert_eq!([1, 2, 1, 3].map(|k| take(&mut l, k)), [Some(1), Some(2), Some(3), Some(4)]);
        assert!(l.by_key.is_none());
        assert_eq!(take(&mut l, 1), None);
        assert!(l.by_key.is_none(), "no unconsumed slot: nothing to index");
        assert!(l.steps.is_empty(), "consumed slots are dropped");
    }

    #[test]
    fn out_of_order_steps_match_by_key_in_recorded_order() {
        let mut l = log(&[1, 2, 1, 3, 2]);
        assert_eq!(take(&mut l, 3), Some(4));
        assert!(l.by_key.is_some());
        assert_eq!(take(&mut l, 2), Some(2));
        assert_eq!(take(&mut l, 1), Some(1));
        assert_eq!(take(&mut l, 1), Some(3));
        assert_eq!(take(&mut l, 1), None);
        assert_eq!(take(&mut l, 2), Some(5));
        assert_eq!(l.first_unconsumed, 5);
    }

    #[test]
    fn an_index_built_late_skips_what_was_consumed() {
        let mut l = log(&[1, 2, 3, 2, 1]);
        assert_eq!(take(&mut l, 1), Some(1));
        let middle = l.first_unconsumed(|s| s.seq == 3).map(|idx| l.take(idx).seq);
        assert_eq!(middle, Some(3));
        assert!(l.by_key.is_none());
        // Key 1's next unconsumed slot is seq 5, not the consumed seq 1.
        let found = l.find(&Digest::of(&[1])).and_then(|idx| l.slot(idx)).map(|s| s.seq);
        assert_eq!(found, Some(5));
        assert_eq!(take(&mut l, 2), Some(2));
        assert_eq!(take(&mut l, 2), Some(4));
        assert_eq!(take(&mut l, 1), Some(5));
        assert_eq!(l.first_unconsumed, 5);
    }

    #[test]
    fn slots_pushed_after_the_index_is_built_join_their_key_queue() {
        let mut l = log(&[1, 2]);
        assert_eq!(take(&mut l, 2), Some(2));
        let mut names = HashMap::new();
        for (seq, k) in [(3, 2u8), (4, 1)] {
            let mut e = Event::new("run", "a", EventType::ToolCall);
            e.seq = seq;
            e.key = Digest::of(&[k]);
            l.push(Slot::new(&e, &mut names));
        }
        assert_eq!(take(&mut l, 2), Some(3));
        assert_eq!(take(&mut l, 1), Some(1));
        assert_eq!(take(&mut l, 1), Some(4));
        assert!(l.steps.is_empty());
    }
}
