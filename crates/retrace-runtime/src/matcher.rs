//! Matching steps against a recorded run: each agent's not-yet-consumed recorded steps, by key,
//! identical keys in recorded order (SPEC §7).
//!
//! This is the part of replay every mode shares: exact replay, forks and the scheduler all consume
//! recorded steps through a [`RecordedLog`].
use std::collections::{HashMap, HashSet, VecDeque};

use parking_lot::Mutex;
use retrace_core::envelope::Decision;
use retrace_core::{Digest, Event, EventType};
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
}

impl RecordedStep {
    fn from_event(e: &Event) -> RecordedStep {
        RecordedStep {
            seq: e.seq,
            kind: e.kind,
            name: e.name.clone(),
            key: e.key,
            request_ref: e.request_ref,
            output_ref: e.output_ref,
            error: e.error.clone(),
            decision: e.decision.clone(),
            completed: true,
        }
    }

    /// `tool_call sql.query`.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("{} {n}", self.kind),
            None => self.kind.to_string(),
        }
    }
}

#[derive(Debug, Default)]
struct AgentLog {
    steps: Vec<RecordedStep>,
    consumed: Vec<bool>,
    by_key: HashMap<Digest, VecDeque<usize>>,
    first_unconsumed: usize,
}

impl AgentLog {
    fn push(&mut self, step: RecordedStep) {
        let idx = self.steps.len();
        self.by_key.entry(step.key).or_default().push_back(idx);
        self.steps.push(step);
        self.consumed.push(false);
    }

    fn take(&mut self, key: &Digest) -> Option<RecordedStep> {
        let queue = self.by_key.get_mut(key)?;
        let idx = queue.pop_front()?;
        self.consumed[idx] = true;
        while self.first_unconsumed < self.consumed.len() && self.consumed[self.first_unconsumed] {
            self.first_unconsumed += 1;
        }
        Some(self.steps[idx].clone())
    }

    fn first_unconsumed(&self, pred: impl Fn(&RecordedStep) -> bool) -> Option<&RecordedStep> {
        (self.first_unconsumed..self.steps.len())
            .filter(|&i| !self.consumed[i])
            .map(|i| &self.steps[i])
            .find(|s| pred(s))
    }
}

/// The recorded steps of a run, per agent, with what has been consumed so far.
#[derive(Debug, Default)]
pub struct RecordedLog {
    agents: HashMap<String, Mutex<AgentLog>>,
    last_seq: u64,
    decisions: Vec<(String, Decision)>,
}

/// Events read from the store per page while loading.
const PAGE: usize = 8192;

impl RecordedLog {
    /// Loads `run`'s steps from the store, streaming page by page.
    pub fn load(store: &dyn Store, run: &str) -> StoreResult<RecordedLog> {
        let mut agents: HashMap<String, AgentLog> = HashMap::new();
        let mut completed_intents = HashSet::new();
        let mut intents: Vec<(String, usize)> = Vec::new();
        let mut decisions = Vec::new();
        let mut from = 1;
        let mut last_seq = 0;
        loop {
            let page = store.events(run, from, PAGE)?;
            let Some(last) = page.last() else { break };
            from = last.seq + 1;
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
                let log = agents.entry(e.agent_id.clone()).or_default();
                if e.kind == EventType::Intent {
                    intents.push((e.agent_id.clone(), log.steps.len()));
                }
                log.push(RecordedStep::from_event(e));
            }
            if page.len() < PAGE {
                break;
            }
        }
        for (agent, idx) in intents {
            let log = agents.get_mut(&agent).expect("intent's agent was loaded");
            let step = &mut log.steps[idx];
            step.completed = completed_intents.contains(&step.seq);
        }
        Ok(RecordedLog {
            agents: agents
                .into_iter()
                .map(|(k, v)| (k, Mutex::new(v)))
                .collect(),
            last_seq,
            decisions,
        })
    }

    /// Consumes `agent`'s earliest unconsumed step with `key`.
    pub fn take(&self, agent: &str, key: &Digest) -> Option<RecordedStep> {
        self.agents.get(agent)?.lock().take(key)
    }

    /// `agent`'s earliest unconsumed step of `kind` named `name` (what a divergence "expected").
    pub fn expected(
        &self,
        agent: &str,
        kind: EventType,
        name: Option<&str>,
    ) -> Option<RecordedStep> {
        let log = self.agents.get(agent)?.lock();
        log.first_unconsumed(|s| s.kind == kind && s.name.as_deref() == name)
            .cloned()
    }

    /// `agent`'s earliest unconsumed step of any kind.
    pub fn next_of(&self, agent: &str) -> Option<RecordedStep> {
        self.agents
            .get(agent)?
            .lock()
            .first_unconsumed(|_| true)
            .cloned()
    }

    /// The earliest unconsumed step of every agent that has one, in seq order.
    pub fn leftovers(&self) -> Vec<(String, RecordedStep)> {
        let mut out: Vec<_> = self
            .agents
            .iter()
            .filter_map(|(a, log)| {
                log.lock()
                    .first_unconsumed(|_| true)
                    .map(|s| (a.clone(), s.clone()))
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
}
