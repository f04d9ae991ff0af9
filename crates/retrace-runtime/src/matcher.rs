//! Matching steps against a recorded run: each agent's not-yet-consumed recorded steps, by key,
//! identical keys in recorded order (SPEC §7).
//!
//! This is the part of replay every mode shares: exact replay, forks and the scheduler all consume
//! recorded steps through a [`RecordedLog`].
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use retrace_core::envelope::Decision;
use retrace_core::{Digest, Event, EventType};
use retrace_store::export::RunEvents;
use retrace_store::{Store, StoreResult};

/// What replay needs of one recorded step.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedStep {
    /// Its seq in the recorded run.
    pub seq: u64,
    /// Its type.
    pub kind: EventType,
    /// Its name (tool, endpoint, recipient, variable).
    pub name: Option<String>,
    /// Its key.
    pub key: Digest,
    /// Its request blob.
    pub request_ref: Option<Digest>,
    /// Its output blob.
    pub output_ref: Option<Digest>,
    /// Its recorded error, raised again in replay.
    pub error: Option<String>,
    /// The decision it took.
    pub decision: Option<Decision>,
    /// For an intent: whether its completion (or a resolution) was recorded.
    pub completed: bool,
    /// The recorded causal parent.
    pub causal_parent: Option<u64>,
    /// The recorded Lamport clock.
    pub lamport: u64,
    /// Where the recorded output came from (a fork's dry-run side effects have no intent).
    pub source: retrace_core::Source,
    /// For an intent whose completion was never recorded: a person's answer (`retrace resolve`).
    pub resolution: Option<Resolution>,
    /// The recorded message envelope (sends).
    pub to: Option<String>,
}

impl RecordedStep {
    /// `tool_call sql.query`.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("{} {n}", self.kind),
            None => self.kind.to_string(),
        }
    }
}

/// A person's answer for a side effect whose intent was logged but whose completion was not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// It happened, with this output: replay returns it.
    Outcome(Digest),
    /// It did not happen: replay stops there (`log_ended`), a fork runs it as a new step.
    NotExecuted,
}

/// A recorded delivery: what an agent heard, in the order it heard it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedDelivery {
    /// The `deliver` event's seq.
    pub seq: u64,
    /// The `send` it delivered (None for a timed-out `recv`).
    pub send_seq: Option<u64>,
    /// The sender.
    pub from: Option<String>,
    /// The message kind.
    pub kind: Option<String>,
    /// The `recv` timed out: no message.
    pub timed_out: bool,
}

/// "No slot" in [`Slot::next`] links.
const NONE: u32 = u32::MAX;

/// One recorded step as the log keeps it: fixed-size fields inline, the name shared with every
/// other step of that name, and the rarely present fields boxed.
#[derive(Debug)]
struct Slot {
    seq: u64,
    lamport: u64,
    causal_parent: Option<u64>,
    key: Digest,
    request_ref: Option<Digest>,
    output_ref: Option<Digest>,
    name: Option<Arc<str>>,
    rare: Option<Box<Rare>>,
    /// The next slot with the same key, or [`NONE`].
    next: u32,
    kind: EventType,
    source: retrace_core::Source,
    completed: bool,
    consumed: bool,
}

/// The fields most steps lack.
#[derive(Debug, Default)]
struct Rare {
    error: Option<String>,
    decision: Option<Decision>,
    resolution: Option<Resolution>,
    to: Option<String>,
}

impl Slot {
    fn new(e: &Event, names: &mut HashMap<String, Arc<str>>) -> Slot {
        let name = e.name.as_deref().map(|n| match names.get(n) {
            Some(a) => a.clone(),
            None => {
                let a: Arc<str> = Arc::from(n);
                names.insert(n.to_owned(), a.clone());
                a
            }
        });
        let to = e.message.as_ref().and_then(|m| m.to.clone());
        let rare = (e.error.is_some() || e.decision.is_some() || to.is_some()).then(|| {
            Box::new(Rare { error: e.error.clone(), decision: e.decision.clone(), resolution: None, to })
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
            next: NONE,
            kind: e.kind,
            source: e.source,
            completed: true,
            consumed: false,
        }
    }

    fn set_resolution(&mut self, resolution: Option<Resolution>) {
        if let Some(r) = resolution {
            self.rare.get_or_insert_with(Box::default).resolution = Some(r);
        }
    }

    fn step(&self) -> RecordedStep {
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
        }
    }
}

#[derive(Debug, Default)]
struct AgentLog {
    steps: Vec<Slot>,
    /// Per key: the first and last unconsumed slot with it (linked through [`Slot::next`]).
    /// Built only when a step is asked for out of recorded order: a replay that asks in order
    /// (the common case) matches every step against the first unconsumed one and never pays
    /// for the index, in memory or at load.
    by_key: Option<HashMap<Digest, (u32, u32)>>,
    first_unconsumed: usize,
    deliveries: VecDeque<RecordedDelivery>,
}

impl AgentLog {
    fn push(&mut self, slot: Slot) {
        let idx = u32::try_from(self.steps.len()).expect("fewer than 2^32 steps per agent");
        let key = slot.key;
        self.steps.push(slot);
        if let Some(by_key) = &mut self.by_key {
            link(&mut self.steps, by_key, key, idx);
        }
    }

    /// The index of unconsumed slots by key, built on first use.
    fn index(&mut self) -> &mut HashMap<Digest, (u32, u32)> {
        if self.by_key.is_none() {
            let mut by_key = HashMap::new();
            for idx in self.first_unconsumed..self.steps.len() {
                self.steps[idx].next = NONE;
                if !self.steps[idx].consumed {
                    let key = self.steps[idx].key;
                    link(&mut self.steps, &mut by_key, key, idx as u32);
                }
            }
            self.by_key = Some(by_key);
        }
        self.by_key.as_mut().expect("just built")
    }

    /// True when the earliest unconsumed slot has `key`: it is then the one to take, and no
    /// index is needed.
    fn in_order(&self, key: &Digest) -> bool {
        self.by_key.is_none() && self.steps.get(self.first_unconsumed).is_some_and(|s| s.key == *key)
    }

    fn consume(&mut self, idx: usize) -> RecordedStep {
        self.steps[idx].consumed = true;
        while self.first_unconsumed < self.steps.len() && self.steps[self.first_unconsumed].consumed {
            self.first_unconsumed += 1;
        }
        self.steps[idx].step()
    }

    fn take(&mut self, key: &Digest) -> Option<RecordedStep> {
        if self.in_order(key) {
            return Some(self.consume(self.first_unconsumed));
        }
        let (head, tail) = *self.index().get(key)?;
        let next = self.steps[head as usize].next;
        let by_key = self.index();
        if head == tail {
            by_key.remove(key);
        } else {
            by_key.insert(*key, (next, tail));
        }
        Some(self.consume(head as usize))
    }

    fn take_where(&mut self, pred: impl Fn(&RecordedStep) -> bool) -> Option<RecordedStep> {
        let idx = (self.first_unconsumed..self.steps.len())
            .find(|&i| !self.steps[i].consumed && pred(&self.steps[i].step()))?;
        let key = self.steps[idx].key;
        self.unlink(&key, idx as u32);
        Some(self.consume(idx))
    }

    /// Removes slot `idx` from its key's queue (nothing to do without an index).
    fn unlink(&mut self, key: &Digest, idx: u32) {
        let Some(by_key) = &mut self.by_key else { return };
        let Some(&(head, tail)) = by_key.get(key) else { return };
        let next = self.steps[idx as usize].next;
        if head == idx {
            if tail == idx {
                by_key.remove(key);
            } else {
                by_key.insert(*key, (next, tail));
            }
            return;
        }
        let mut prev = head;
        while prev != NONE {
            let after = self.steps[prev as usize].next;
            if after == idx {
                self.steps[prev as usize].next = next;
                if tail == idx {
                    by_key.insert(*key, (head, prev));
                }
                return;
            }
            prev = after;
        }
    }

    fn peek(&mut self, key: &Digest) -> Option<&Slot> {
        if self.in_order(key) {
            return Some(&self.steps[self.first_unconsumed]);
        }
        let (head, _) = *self.index().get(key)?;
        Some(&self.steps[head as usize])
    }

    fn first_unconsumed(&self, pred: impl Fn(&Slot) -> bool) -> Option<&Slot> {
        self.steps[self.first_unconsumed..].iter().filter(|s| !s.consumed).find(|s| pred(s))
    }
}

/// Appends slot `idx` (with `key`) to its key's queue in `by_key`.
fn link(steps: &mut [Slot], by_key: &mut HashMap<Digest, (u32, u32)>, key: Digest, idx: u32) {
    match by_key.get_mut(&key) {
        Some((_, tail)) => {
            steps[*tail as usize].next = idx;
            *tail = idx;
        }
        None => {
            by_key.insert(key, (idx, idx));
        }
    }
}

/// The first step an agent left unconsumed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leftover {
    /// Its recorded seq.
    pub seq: u64,
    /// `tool_call sql.query`, `deliver from planner`...
    pub label: String,
    /// Its key (deliveries have none that matters).
    pub key: Option<Digest>,
}

/// The recorded steps of a run, per agent, with what has been consumed so far.
#[derive(Debug, Default)]
pub struct RecordedLog {
    agents: HashMap<String, Mutex<AgentLog>>,
    last_seq: u64,
    decisions: Vec<(String, Decision)>,
    unconsumable: Vec<u64>,
}

impl RecordedLog {
    /// Loads `run`'s steps from the store, streaming page by page.
    pub fn load(store: &dyn Store, run: &str) -> StoreResult<RecordedLog> {
        let mut agents: HashMap<String, AgentLog> = HashMap::new();
        let mut completed_intents = HashSet::new();
        let mut resolutions: HashMap<u64, Resolution> = HashMap::new();
        let mut intents: Vec<(String, usize)> = Vec::new();
        let mut decisions = Vec::new();
        let mut unconsumable = Vec::new();
        let mut last_seq = 0;
        let mut names = HashMap::new();
        let mut pages = RunEvents::new(store, run)?;
        while let Some(page) = pages.next_page()? {
            for e in &page {
                last_seq = e.seq;
                if matches!(e.kind, EventType::ToolCall | EventType::Resolution) {
                    if let Some(parent) = e.causal_parent {
                        completed_intents.insert(parent);
                    }
                }
                if let (EventType::Decision, Some(d)) = (e.kind, &e.decision) {
                    decisions.push((e.agent_id.clone(), d.clone()));
                }
                if let (EventType::Resolution, Some(intent)) = (e.kind, e.causal_parent) {
                    let resolution = match (e.output_ref, e.name.as_deref()) {
                        (_, Some("not_executed")) | (None, _) => Resolution::NotExecuted,
                        (Some(out), _) => Resolution::Outcome(out),
                    };
                    resolutions.insert(intent, resolution);
                }
                if e.kind == EventType::Resolution {
                    // A person's answer, not a program step: replay never asks for it.
                    unconsumable.push(e.seq);
                    continue;
                }
                let log = agents.entry(e.agent_id.clone()).or_default();
                if e.kind == EventType::Deliver {
                    let message = e.message.as_ref();
                    log.deliveries.push_back(RecordedDelivery {
                        seq: e.seq,
                        send_seq: e.causal_parent,
                        from: message.and_then(|m| m.from.clone()),
                        kind: message.and_then(|m| m.kind.clone()),
                        timed_out: message.is_some_and(|m| m.timed_out),
                    });
                    continue;
                }
                if e.kind == EventType::Intent {
                    intents.push((e.agent_id.clone(), log.steps.len()));
                }
                log.push(Slot::new(e, &mut names));
            }
        }
        for (agent, idx) in intents {
            let log = agents.get_mut(&agent).expect("intent's agent was loaded");
            let step = &mut log.steps[idx];
            step.completed = completed_intents.contains(&step.seq);
            step.set_resolution(resolutions.remove(&step.seq));
        }
        Ok(RecordedLog {
            agents: agents.into_iter().map(|(k, v)| (k, Mutex::new(v))).collect(),
            last_seq,
            decisions,
            unconsumable,
        })
    }

    /// Consumes `agent`'s earliest unconsumed step with `key`.
    pub fn take(&self, agent: &str, key: &Digest) -> Option<RecordedStep> {
        self.agents.get(agent)?.lock().take(key)
    }

    /// `agent`'s earliest unconsumed step with `key`, without consuming it.
    pub fn peek_step(&self, agent: &str, key: &Digest) -> Option<RecordedStep> {
        self.agents.get(agent)?.lock().peek(key).map(|s| s.step())
    }

    /// Where `agent`'s earliest unconsumed step with `key` got its output, without consuming it.
    pub fn peek_source(&self, agent: &str, key: &Digest) -> Option<retrace_core::Source> {
        self.agents.get(agent)?.lock().peek(key).map(|s| s.source)
    }

    /// The seq of `agent`'s earliest unconsumed step with `key`, without consuming it.
    pub fn peek(&self, agent: &str, key: &Digest) -> Option<u64> {
        self.agents.get(agent)?.lock().peek(key).map(|s| s.seq)
    }

    /// `agent`'s next recorded delivery, without consuming it.
    pub fn next_delivery(&self, agent: &str) -> Option<RecordedDelivery> {
        self.agents.get(agent)?.lock().deliveries.front().cloned()
    }

    /// Consumes `agent`'s next recorded delivery.
    pub fn take_delivery(&self, agent: &str) -> Option<RecordedDelivery> {
        self.agents.get(agent)?.lock().deliveries.pop_front()
    }

    /// Consumes `agent`'s earliest unconsumed step for which `pred` holds (a fork's pairing of a
    /// changed step with the source step it replaces).
    pub fn take_where(&self, agent: &str, pred: impl Fn(&RecordedStep) -> bool) -> Option<RecordedStep> {
        self.agents.get(agent)?.lock().take_where(pred)
    }

    /// Whether `agent` still has an unconsumed step or delivery with seq < `at`.
    pub fn has_unconsumed_before(&self, agent: &str, at: u64) -> bool {
        let Some(log) = self.agents.get(agent) else { return false };
        let log = log.lock();
        log.first_unconsumed(|_| true).is_some_and(|s| s.seq < at)
            || log.deliveries.front().is_some_and(|d| d.seq < at)
    }

    /// Moves every agent's recorded deliveries out (a fork orders deliveries itself).
    pub fn take_all_deliveries(&self) -> HashMap<String, VecDeque<RecordedDelivery>> {
        self.agents.iter().map(|(a, log)| (a.clone(), std::mem::take(&mut log.lock().deliveries))).collect()
    }

    /// The sender of every recorded send, by seq.
    pub fn senders(&self) -> HashMap<u64, String> {
        let mut out = HashMap::new();
        for (agent, log) in &self.agents {
            for s in log.lock().steps.iter().filter(|s| s.kind == EventType::Send) {
                out.insert(s.seq, agent.clone());
            }
        }
        out
    }

    /// `agent`'s earliest unconsumed step of `kind` named `name` (what a divergence "expected").
    pub fn expected(&self, agent: &str, kind: EventType, name: Option<&str>) -> Option<RecordedStep> {
        let log = self.agents.get(agent)?.lock();
        log.first_unconsumed(|s| s.kind == kind && s.name.as_deref() == name).map(Slot::step)
    }

    /// `agent`'s earliest unconsumed step of any kind.
    pub fn next_of(&self, agent: &str) -> Option<RecordedStep> {
        self.agents.get(agent)?.lock().first_unconsumed(|_| true).map(Slot::step)
    }

    /// The earliest unconsumed step or delivery of every agent that has one, in seq order.
    pub fn leftovers(&self) -> Vec<(String, Leftover)> {
        let mut out: Vec<_> = self
            .agents
            .iter()
            .filter_map(|(a, log)| {
                let log = log.lock();
                let step = log.first_unconsumed(|_| true).map(|s| Leftover {
                    seq: s.seq,
                    label: s.step().label(),
                    key: Some(s.key),
                });
                let delivery = log.deliveries.front().map(|d| Leftover {
                    seq: d.seq,
                    label: match &d.from {
                        Some(from) => format!("deliver from {from}"),
                        None => "deliver (a recv timeout)".into(),
                    },
                    key: None,
                });
                let first = match (step, delivery) {
                    (Some(s), Some(d)) => Some(if s.seq < d.seq { s } else { d }),
                    (s, d) => s.or(d),
                };
                first.map(|f| (a.clone(), f))
            })
            .collect();
        out.sort_by_key(|(_, s)| s.seq);
        out
    }

    /// The recorded run's last seq.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The recorded decisions, in seq order.
    pub fn decisions(&self) -> &[(String, Decision)] {
        &self.decisions
    }

    /// Number of agents with recorded steps.
    pub fn agent_count(&self) -> usize {
        self.agents.len()
    }

    /// The agents with recorded steps.
    pub fn agents(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }

    /// Recorded seqs no program step consumes (resolutions), released from the start.
    pub fn unconsumable_seqs(&self) -> &[u64] {
        &self.unconsumable
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
        log.take(&Digest::of(&[k])).map(|s| s.seq)
    }

    #[test]
    fn in_order_replay_never_builds_the_key_index() {
        let mut l = log(&[1, 2, 1, 3]);
        assert_eq!([1, 2, 1, 3].map(|k| take(&mut l, k)), [Some(1), Some(2), Some(3), Some(4)]);
        assert!(l.by_key.is_none());
        assert_eq!(take(&mut l, 1), None);
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
        let middle = l.take_where(|s| s.seq == 3).map(|s| s.seq);
        assert_eq!(middle, Some(3));
        assert!(l.by_key.is_none());
        // Key 1's next unconsumed slot is seq 5, not the consumed seq 1.
        assert_eq!(l.peek(&Digest::of(&[1])).map(|s| s.seq), Some(5));
        assert_eq!(take(&mut l, 2), Some(2));
        assert_eq!(take(&mut l, 2), Some(4));
        assert_eq!(take(&mut l, 1), Some(5));
        assert_eq!(l.first_unconsumed, 5);
    }
}
