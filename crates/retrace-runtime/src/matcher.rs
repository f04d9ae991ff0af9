//! Matching steps against a recorded run: each agent's not-yet-consumed recorded steps, by key,
//! identical keys in recorded order (SPEC §7).
//!
//! This is the part of replay every mode shares: exact replay, forks and the scheduler all consume
//! recorded steps through a [`RecordedLog`].
//!
//! A fork loads the whole recorded run up front ([`RecordedLog::load`]). A replay streams it
//! ([`RecordedLog::stream`]): a reader thread reads pages ahead, with their outputs, and the log
//! takes in the next page only when a question can't be answered from what it holds. Pages
//! arrive in seq order, so the earliest loaded match is the earliest recorded one; an answer of
//! "none" (no step with that key, no delivery left) is only given once the whole run is loaded.
//! Consumed steps are dropped, so an in-order replay holds a page or so of the run at a time.
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use parking_lot::Mutex;
use retrace_core::envelope::Decision;
use retrace_core::{Digest, EventType};
use retrace_store::{Store, StoreError, StoreResult};
use serde_json::Value;

mod agent_log;
mod feed;

use agent_log::{AgentLog, Slot};
use feed::{Fed, Item, Page, Reader};

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
    /// A model call's pinned snapshot, as recorded.
    pub snapshot: Option<String>,
    /// The recorded output, read and verified ahead of the step (a streaming replay whose
    /// program gets outputs as stored).
    pub(crate) output: Option<Prefetched>,
}

/// A step's output as the log's reader read it ahead ([`feed`]), its digest verified.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Prefetched {
    /// What `serde_json::from_slice` gives of the bytes: a tool's or a read's output, which a
    /// Session step hands back decoded.
    Value(Value),
    /// The bytes as stored: a model call's output, which the proxy hands back as the document
    /// it is (decoded, most of it would be thrown away; a Session's `model` decodes it).
    Bytes(Vec<u8>),
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

/// Prefetched outputs a streaming log holds at most in steps not yet consumed; past it, the
/// outputs of further pages are dropped as they are taken in (the replay reads those itself),
/// and the reader stops prefetching until the held ones are down to [`RESUME_PREFETCH`].
const HELD_OUTPUTS: usize = 8192;

/// Held prefetched outputs at or below which a paused reader prefetches again.
const RESUME_PREFETCH: usize = HELD_OUTPUTS / 2;

/// The recorded steps of a run, per agent, with what has been consumed so far.
#[derive(Debug)]
pub struct RecordedLog {
    loaded: Mutex<Loaded>,
    last_seq: u64,
    /// How many unconsumable seqs have been loaded (read without the lock by the scheduler).
    unconsumable: AtomicUsize,
}

/// What has been loaded, and where the rest comes from.
#[derive(Debug, Default)]
struct Loaded {
    agents: HashMap<String, AgentLog>,
    decisions: Vec<(String, Decision)>,
    unconsumable: Vec<u64>,
    /// Intents whose completion has not been loaded yet: their agent and slot.
    open_intents: HashMap<u64, (Arc<str>, usize)>,
    /// Every seq up to this one has been taken in.
    loaded_to: u64,
    /// The reader of the rest (`None`: everything is loaded, or loading failed).
    feed: Option<Feed>,
    /// Why loading stopped early.
    failure: Option<StoreError>,
    held_outputs: usize,
    /// Whether the reader prefetches outputs (`None`: it never does). Cleared once outputs are
    /// dropped: agents consuming far out of recorded order (each agent's task running to its
    /// end, say) leave most of them unused, and the reader's work on them, on a thread that
    /// competes with the program's for the cores, would be wasted.
    prefetch: Option<Arc<AtomicBool>>,
}

/// The reader thread's pages.
struct Feed(Receiver<Fed>);

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Feed")
    }
}

impl Loaded {
    fn integrate(&mut self, page: Page) {
        for item in page.items {
            match item {
                Item::Step { agent, mut slot } => {
                    let intent = slot.kind == EventType::Intent;
                    let seq = slot.seq;
                    if slot.output.is_some() {
                        if self.held_outputs < HELD_OUTPUTS {
                            self.held_outputs += 1;
                        } else {
                            slot.output = None;
                            self.set_prefetch(false);
                        }
                    }
                    let idx = self.agent(&agent).push(slot);
                    if intent {
                        self.open_intents.insert(seq, (agent, idx));
                    }
                }
                Item::Delivery { agent, delivery } => self.agent(&agent).deliveries.push_back(delivery),
                Item::Completes { intent, resolution } => {
                    if let Some((agent, idx)) = self.open_intents.remove(&intent) {
                        let slot = self.agents.get_mut(&*agent).and_then(|log| log.slot_mut(idx));
                        if let Some(slot) = slot.filter(|s| s.seq == intent) {
                            slot.complete(resolution);
                        }
                    }
                }
                Item::Decision { agent, decision } => self.decisions.push((agent.to_string(), decision)),
                Item::Unconsumable(seq) => self.unconsumable.push(seq),
            }
        }
        self.loaded_to = self.loaded_to.max(page.last_seq);
    }

    /// Tells the reader to prefetch outputs, or not; a no-op when it never does.
    fn set_prefetch(&self, on: bool) {
        if let Some(flag) = &self.prefetch {
            if flag.load(Ordering::Relaxed) != on {
                flag.store(on, Ordering::Relaxed);
            }
        }
    }

    fn agent(&mut self, agent: &str) -> &mut AgentLog {
        if !self.agents.contains_key(agent) {
            self.agents.insert(agent.to_owned(), AgentLog::default());
        }
        self.agents.get_mut(agent).expect("just inserted")
    }

    /// Takes in the next page from the reader; false when there is none left (or loading
    /// failed: see `failure`).
    fn more(&mut self) -> bool {
        let Some(Feed(rx)) = &self.feed else { return false };
        match rx.recv() {
            Ok(Fed::Page(page)) => {
                self.integrate(page);
                true
            }
            Ok(Fed::End) => {
                self.feed = None;
                false
            }
            Ok(Fed::Failed(e)) => {
                self.failure = Some(e);
                self.feed = None;
                false
            }
            Err(_) => {
                self.failure = Some(StoreError::io("the thread reading the recorded run stopped"));
                self.feed = None;
                false
            }
        }
    }

    fn load_all(&mut self) {
        while self.more() {}
    }

    /// The first `Some` that `f` gives, taking in pages until it gives one or none are left.
    fn until<T>(&mut self, mut f: impl FnMut(&mut Loaded) -> Option<T>) -> Option<T> {
        loop {
            if let Some(found) = f(self) {
                return Some(found);
            }
            if !self.more() {
                return None;
            }
        }
    }

    /// The absolute index of `agent`'s earliest unconsumed step with `key`, its completion
    /// loaded if it is an intent.
    fn find(&mut self, agent: &str, key: &Digest) -> Option<usize> {
        let idx = self.until(|l| l.agents.get_mut(agent)?.find(key))?;
        self.settle(agent, idx);
        Some(idx)
    }

    /// The absolute index of `agent`'s earliest unconsumed step for which `pred` holds.
    fn first(&mut self, agent: &str, pred: impl Fn(&Slot) -> bool) -> Option<usize> {
        let idx = self.until(|l| l.agents.get(agent)?.first_unconsumed(&pred))?;
        self.settle(agent, idx);
        Some(idx)
    }

    /// Takes in pages until slot `idx` of `agent`, if an intent, knows whether it completed.
    fn settle(&mut self, agent: &str, idx: usize) {
        while self.slot(agent, idx).is_some_and(|s| !s.completed) && self.more() {}
    }

    fn slot(&self, agent: &str, idx: usize) -> Option<&Slot> {
        self.agents.get(agent)?.slot(idx)
    }

    fn take(&mut self, agent: &str, idx: usize) -> Option<RecordedStep> {
        let step = self.agents.get_mut(agent)?.take(idx);
        if step.output.is_some() {
            self.held_outputs -= 1;
            if self.held_outputs == RESUME_PREFETCH {
                self.set_prefetch(true);
            }
        }
        Some(step)
    }

    fn next_delivery(&mut self, agent: &str) -> Option<&mut VecDeque<RecordedDelivery>> {
        self.until(|l| l.agents.get(agent).is_some_and(|log| !log.deliveries.is_empty()).then_some(()))?;
        self.agents.get_mut(agent).map(|log| &mut log.deliveries)
    }
}

impl RecordedLog {
    /// Loads `run`'s steps from the store, all of them, page by page.
    pub fn load(store: &dyn Store, run: &str) -> StoreResult<RecordedLog> {
        let mut reader = Reader::new(store, run)?;
        let last_seq = reader.last_seq();
        let mut loaded = Loaded::default();
        while let Some(page) = reader.next_page(store, retrace_store::export::PAGE)? {
            loaded.integrate(page);
        }
        Ok(RecordedLog::new(loaded, last_seq))
    }

    /// Streams `run`'s steps from the store: a reader thread reads ahead of the replay, and
    /// with `outputs` also reads, verifies and decodes each step's output (for a replay that
    /// hands the program its outputs as stored). Where the run's events are is resolved here, so
    /// a missing run fails at once; a store failure later ends the log early, and is reported
    /// by [`RecordedLog::failure`].
    pub fn stream(store: Arc<dyn Store>, run: &str, outputs: bool) -> StoreResult<RecordedLog> {
        let reader = Reader::new(store.as_ref(), run)?;
        let last_seq = reader.last_seq();
        let prefetch = outputs.then(|| Arc::new(AtomicBool::new(true)));
        let flag = prefetch.clone().unwrap_or_default();
        let feed = Feed(feed::spawn(store, reader, flag));
        Ok(RecordedLog::new(Loaded { feed: Some(feed), prefetch, ..Loaded::default() }, last_seq))
    }

    fn new(loaded: Loaded, last_seq: u64) -> RecordedLog {
        let unconsumable = AtomicUsize::new(loaded.unconsumable.len());
        RecordedLog { loaded: Mutex::new(loaded), last_seq, unconsumable }
    }

    /// Runs `f` on what is loaded, then publishes how many unconsumable seqs are known.
    fn with<T>(&self, f: impl FnOnce(&mut Loaded) -> T) -> T {
        let mut loaded = self.loaded.lock();
        let out = f(&mut loaded);
        self.unconsumable.store(loaded.unconsumable.len(), Ordering::Release);
        out
    }

    /// Why loading the recorded run stopped before its end, if it did: answers given since
    /// (no such step, nothing left) may be wrong, and the replay must fail with this instead.
    pub fn failure(&self) -> Option<StoreError> {
        self.loaded.lock().failure.clone()
    }

    /// A step could not read what the recording holds for it (a blob that fails its digest, a
    /// read error): the replay fails as when the run can't be read to its end (the first
    /// failure is kept).
    pub fn fail(&self, e: StoreError) {
        self.loaded.lock().failure.get_or_insert(e);
    }

    /// Consumes `agent`'s earliest unconsumed step with `key`.
    pub fn take(&self, agent: &str, key: &Digest) -> Option<RecordedStep> {
        self.with(|l| {
            let idx = l.find(agent, key)?;
            l.take(agent, idx)
        })
    }

    /// `agent`'s earliest unconsumed step with `key`, without consuming it.
    pub fn peek_step(&self, agent: &str, key: &Digest) -> Option<RecordedStep> {
        self.with(|l| {
            let idx = l.find(agent, key)?;
            l.slot(agent, idx).map(Slot::step)
        })
    }

    /// Where `agent`'s earliest unconsumed step with `key` got its output, without consuming it.
    pub fn peek_source(&self, agent: &str, key: &Digest) -> Option<retrace_core::Source> {
        self.with(|l| {
            let idx = l.find(agent, key)?;
            l.slot(agent, idx).map(|s| s.source)
        })
    }

    /// The seq of `agent`'s earliest unconsumed step with `key`, without consuming it.
    pub fn peek(&self, agent: &str, key: &Digest) -> Option<u64> {
        self.with(|l| {
            let idx = l.find(agent, key)?;
            l.slot(agent, idx).map(|s| s.seq)
        })
    }

    /// `agent`'s next recorded delivery, without consuming it.
    pub fn next_delivery(&self, agent: &str) -> Option<RecordedDelivery> {
        self.with(|l| l.next_delivery(agent)?.front().cloned())
    }

    /// Consumes `agent`'s next recorded delivery.
    pub fn take_delivery(&self, agent: &str) -> Option<RecordedDelivery> {
        self.with(|l| l.next_delivery(agent)?.pop_front())
    }

    /// Consumes `agent`'s earliest unconsumed step for which `pred` holds (a fork's pairing of a
    /// changed step with the source step it replaces).
    pub fn take_where(&self, agent: &str, pred: impl Fn(&RecordedStep) -> bool) -> Option<RecordedStep> {
        self.with(|l| {
            let idx = l.first(agent, |s| pred(&s.step()))?;
            l.take(agent, idx)
        })
    }

    /// Whether `agent` still has an unconsumed step or delivery with seq < `at`.
    pub fn has_unconsumed_before(&self, agent: &str, at: u64) -> bool {
        self.with(|l| {
            l.until(|l| {
                let log = l.agents.get(agent);
                let step = log.and_then(|log| log.unconsumed().next()).is_some_and(|s| s.seq < at);
                let delivery = log.and_then(|log| log.deliveries.front()).is_some_and(|d| d.seq < at);
                // Once every seq before `at` is loaded, what is loaded answers.
                (step || delivery || l.loaded_to + 1 >= at).then_some(step || delivery)
            })
            .unwrap_or(false)
        })
    }

    /// Moves every agent's recorded deliveries out (a fork orders deliveries itself).
    pub fn take_all_deliveries(&self) -> HashMap<String, VecDeque<RecordedDelivery>> {
        self.with(|l| {
            l.load_all();
            l.agents.iter_mut().map(|(a, log)| (a.clone(), std::mem::take(&mut log.deliveries))).collect()
        })
    }

    /// The sender of every recorded send not yet consumed, by seq (all of them, before a fork
    /// consumes any).
    pub fn senders(&self) -> HashMap<u64, String> {
        self.with(|l| {
            l.load_all();
            let mut out = HashMap::new();
            for (agent, log) in &l.agents {
                for s in log.unconsumed().filter(|s| s.kind == EventType::Send) {
                    out.insert(s.seq, agent.clone());
                }
            }
            out
        })
    }

    /// `agent`'s earliest unconsumed step of `kind` named `name` (what a divergence "expected").
    pub fn expected(&self, agent: &str, kind: EventType, name: Option<&str>) -> Option<RecordedStep> {
        self.with(|l| {
            let idx = l.first(agent, |s| s.kind == kind && s.name.as_deref() == name)?;
            l.slot(agent, idx).map(Slot::step)
        })
    }

    /// `agent`'s earliest unconsumed step of any kind.
    pub fn next_of(&self, agent: &str) -> Option<RecordedStep> {
        self.with(|l| {
            let idx = l.first(agent, |_| true)?;
            l.slot(agent, idx).map(Slot::step)
        })
    }

    /// The seq of `agent`'s last recorded step, consumed or not (the whole log loaded), if it
    /// recorded any.
    pub fn last_of(&self, agent: &str) -> Option<u64> {
        self.with(|l| {
            l.load_all();
            l.agents.get(agent)?.last_seq()
        })
    }

    /// The earliest unconsumed step or delivery of every agent that has one, in seq order.
    pub fn leftovers(&self) -> Vec<(String, Leftover)> {
        self.with(|l| {
            l.load_all();
            let mut out: Vec<_> = l
                .agents
                .iter()
                .filter_map(|(a, log)| {
                    let step = log.unconsumed().next().map(|s| Leftover {
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
        })
    }

    /// Per agent that took a step out of its recorded order (matched by key, SPEC §7: no
    /// divergence), the first such step and the earlier recorded step it went before, in the
    /// order of those steps' seqs.
    pub fn reordered(&self) -> Vec<(String, Leftover, Leftover)> {
        self.with(|l| {
            let mut out: Vec<_> = l
                .agents
                .iter()
                .filter_map(|(a, log)| log.reordered.clone().map(|(took, before)| (a.clone(), took, before)))
                .collect();
            out.sort_by_key(|(_, took, _)| took.seq);
            out
        })
    }

    /// The recorded run's last seq.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The recorded decisions, in seq order.
    pub fn decisions(&self) -> Vec<(String, Decision)> {
        self.with(|l| {
            l.load_all();
            l.decisions.clone()
        })
    }

    /// Number of agents with recorded steps.
    pub fn agent_count(&self) -> usize {
        self.with(|l| {
            l.load_all();
            l.agents.len()
        })
    }

    /// The agents with recorded steps.
    pub fn agents(&self) -> Vec<String> {
        self.with(|l| {
            l.load_all();
            l.agents.keys().cloned().collect()
        })
    }

    /// Whether some agent with recorded steps is not `started`: answered from the agents loaded
    /// so far when one of them isn't, else once the whole run is loaded.
    pub fn any_agent_not(&self, started: impl Fn(&str) -> bool) -> bool {
        self.with(|l| {
            if l.agents.keys().any(|a| !started(a)) {
                return true;
            }
            l.load_all();
            l.agents.keys().any(|a| !started(a))
        })
    }

    /// The agents of the log loaded so far for which `started` is false, in name order.
    pub fn agents_not(&self, started: impl Fn(&str) -> bool) -> Vec<String> {
        self.with(|l| {
            let mut agents: Vec<String> = l.agents.keys().filter(|a| !started(a)).cloned().collect();
            agents.sort();
            agents
        })
    }

    /// How many recorded seqs no program step consumes (resolutions) have been loaded so far.
    pub fn unconsumable_count(&self) -> usize {
        self.unconsumable.load(Ordering::Acquire)
    }

    /// The recorded seqs no program step consumes (resolutions) loaded so far, from the
    /// `from`th on: released from the start, they are known once loaded, which is before any
    /// later seq is.
    pub fn unconsumable_seqs(&self, from: usize) -> Vec<u64> {
        self.with(|l| l.unconsumable.get(from..).unwrap_or_default().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use retrace_core::Event;
    use serde_json::json;

    use super::*;

    /// A page of `n` tool steps of `agent` from seq `from`, each with its output prefetched.
    fn page(agent: &str, from: u64, n: usize) -> Page {
        let mut names = HashMap::new();
        let agent: Arc<str> = Arc::from(agent);
        let items = (from..from + n as u64)
            .map(|seq| {
                let mut e = Event::new("run", &*agent, EventType::ToolCall);
                e.seq = seq;
                e.key = Digest::of(&seq.to_le_bytes());
                e.output_ref = Some(Digest::of(b"out"));
                let mut slot = Slot::new(&e, &mut names);
                slot.output = Some(Prefetched::Value(json!(seq)));
                Item::Step { agent: Arc::clone(&agent), slot }
            })
            .collect();
        Page { items, last_seq: from + n as u64 - 1 }
    }

    #[test]
    fn prefetch_pauses_while_outputs_are_dropped_and_resumes_at_half() {
        let flag = Arc::new(AtomicBool::new(true));
        let mut loaded = Loaded { prefetch: Some(Arc::clone(&flag)), ..Loaded::default() };
        // Agent `a` is never asked for while its outputs pile up to the cap: still prefetching.
        loaded.integrate(page("a", 1, HELD_OUTPUTS));
        assert_eq!(loaded.held_outputs, HELD_OUTPUTS);
        assert!(flag.load(Ordering::Relaxed), "at the cap, nothing dropped yet");
        // One more page: its outputs are dropped, and the reader is told to stop reading them.
        let next = HELD_OUTPUTS as u64 + 1;
        loaded.integrate(page("b", next, 10));
        assert_eq!(loaded.held_outputs, HELD_OUTPUTS);
        assert!(!flag.load(Ordering::Relaxed), "outputs dropped: prefetch paused");
        let dropped = loaded.take("b", 0).expect("b's first step");
        assert_eq!((dropped.seq, dropped.output), (next, None), "the replay reads this one itself");
        // Consuming `a` keeps the pause until the held outputs are down to half the cap.
        for idx in 0..HELD_OUTPUTS - RESUME_PREFETCH {
            assert!(!flag.load(Ordering::Relaxed), "still paused with {} held", loaded.held_outputs);
            let step = loaded.take("a", idx).expect("a's step");
            assert_eq!(
                step.output,
                Some(Prefetched::Value(json!(idx as u64 + 1))),
                "a held output is handed over"
            );
        }
        assert_eq!(loaded.held_outputs, RESUME_PREFETCH);
        assert!(flag.load(Ordering::Relaxed), "resumed at half the cap");
        // Later pages keep their outputs again.
        loaded.integrate(page("c", next + 10, 1));
        assert_eq!(loaded.take("c", 0).expect("c's step").output, Some(Prefetched::Value(json!(next + 10))));
    }

    #[test]
    fn a_model_calls_output_is_read_ahead_as_stored_and_a_tools_decoded() {
        use crate::{ModelCall, ModelReply, Outcome, Session, SessionOptions, ToolSpec};
        let dir = tempfile::tempdir().unwrap();
        let sqlite = retrace_store::sqlite::SqliteStore::open(
            &dir.path().join("retrace.db"),
            &dir.path().join("blobs"),
            retrace_store::Durability::Batch,
            5_000,
        )
        .unwrap();
        let store: Arc<dyn Store> = Arc::new(sqlite);
        let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
        let a = s.agent("a");
        let rows = json!({"rows": [1, 2.5, "x"]});
        a.tool("t", &json!({"q": 1}), ToolSpec::deterministic("1"), || Ok::<_, String>(rows.clone()))
            .unwrap();
        let call =
            ModelCall { provider: "openai".into(), endpoint: "chat.completions".into(), body: json!({}) };
        let reply = json!({"choices": [{"message": {"content": "hi"}}]});
        a.model(&call, |_| Ok::<_, String>(ModelReply { body: reply.clone(), snapshot: None, usage: None }))
            .unwrap();
        s.finish(Outcome::default()).unwrap();

        let log = RecordedLog::stream(store.clone(), &s.run_id(), true).unwrap();
        let tool = log.take_where("a", |st| st.kind == EventType::ToolCall).expect("the tool step");
        assert_eq!(tool.output, Some(Prefetched::Value(rows)));
        // The proxy hands a model call's output back byte for byte: read once, never decoded.
        let model = log.take_where("a", |st| st.kind == EventType::ModelCall).expect("the model step");
        let stored = store.get_blob(&model.output_ref.unwrap()).unwrap();
        assert_eq!(model.output, Some(Prefetched::Bytes(stored)));
    }
}
