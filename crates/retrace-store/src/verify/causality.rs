//! The causal invariants of a run's events, checked in seq order by `verify` and by `import`
//! alike (an import must not store a run that `verify` then rejects): each agent's Lamport
//! clock increases, a `causal_parent` names an earlier event (a deliver's names a send with a
//! smaller clock), and `inbound` names earlier delivers to the same agent.
//!
//! It keeps 16 bytes per event, so a run of millions of events is checked streaming.
use std::collections::{BTreeSet, HashMap};

use retrace_core::envelope::EventType;
use retrace_core::Event;

use super::ProblemKind;

/// What the checks remember of each event.
#[derive(Clone, Copy)]
struct Seen {
    lamport: u64,
    agent: u32,
    kind: EventType,
}

/// The causal state of a run's events so far.
#[derive(Default)]
pub(crate) struct Causality {
    /// Index `seq - 1`.
    seen: Vec<Seen>,
    agents: HashMap<String, u32>,
    /// Last Lamport value per agent index.
    clocks: Vec<Option<u64>>,
}

impl Causality {
    /// Events seen so far, holes included.
    pub(crate) fn len(&self) -> u64 {
        self.seen.len() as u64
    }

    /// The next event couldn't be read: a placeholder no check matches.
    pub(crate) fn hole(&mut self) {
        self.seen.push(Seen { lamport: 0, agent: u32::MAX, kind: EventType::Decision });
    }

    /// Checks `e`, the next event, and remembers it; each problem found, with its kind.
    /// References to a seq in `unreadable` are not judged (the event they name is a hole).
    pub(crate) fn check(&mut self, e: &Event, unreadable: &BTreeSet<u64>) -> Vec<(ProblemKind, String)> {
        let mut problems = Vec::new();
        // Looked up before inserting: the agent's name is cloned once, not once per event.
        let agent = match self.agents.get(e.agent_id.as_str()) {
            Some(&agent) => agent,
            None => {
                let next = self.agents.len() as u32;
                self.agents.insert(e.agent_id.clone(), next);
                self.clocks.push(None);
                next
            }
        };
        if let Some(last) = self.clocks[agent as usize] {
            if e.lamport <= last {
                let message = format!(
                    "lamport {} of agent {} does not increase (its previous event has {last})",
                    e.lamport, e.agent_id
                );
                problems.push((ProblemKind::Lamport, message));
            }
        }
        self.clocks[agent as usize] = Some(e.lamport);
        if let Some(parent) = e.causal_parent.filter(|p| !unreadable.contains(p)) {
            problems.extend(self.parent(e, parent));
        }
        for &seq in &e.inbound {
            let ok = unreadable.contains(&seq)
                || seq < e.seq
                    && self.at(seq).is_some_and(|s| s.kind == EventType::Deliver && s.agent == agent);
            if !ok {
                let message = format!("inbound {seq} is not an earlier deliver to {}", e.agent_id);
                problems.push((ProblemKind::Inbound, message));
            }
        }
        self.seen.push(Seen { lamport: e.lamport, agent, kind: e.kind });
        problems
    }

    fn parent(&self, e: &Event, parent: u64) -> Option<(ProblemKind, String)> {
        let Some(found) = self.at(parent).filter(|_| parent < e.seq) else {
            return Some((ProblemKind::Causal, format!("causal_parent {parent} is not an earlier event")));
        };
        if e.kind != EventType::Deliver {
            return None;
        }
        if found.kind != EventType::Send {
            let message = format!("deliver names causal_parent {parent}, a {}, not a send", found.kind);
            Some((ProblemKind::Causal, message))
        } else if e.lamport <= found.lamport {
            let message = format!(
                "deliver has lamport {} but its send (seq {parent}) has {}",
                e.lamport, found.lamport
            );
            Some((ProblemKind::Lamport, message))
        } else {
            None
        }
    }

    fn at(&self, seq: u64) -> Option<Seen> {
        self.seen.get(usize::try_from(seq).ok()?.checked_sub(1)?).copied()
    }
}
