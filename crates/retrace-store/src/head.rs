//! [`EventHead`]: an event's place in the causal graph, what `retrace knew` follows and shows,
//! so that walking long causal chains reads a narrow index, not whole envelopes
//! ([`crate::EventStore::heads_at`]).
use retrace_core::{Event, EventType};

/// An event's seq, agent, type, name and causal parent. Every field equals the event's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventHead {
    /// The event's seq.
    pub seq: u64,
    /// The agent that took the step.
    pub agent_id: String,
    /// What kind of step it is.
    pub kind: EventType,
    /// The step's name.
    pub name: Option<String>,
    /// The event this one acted on.
    pub causal_parent: Option<u64>,
}

impl EventHead {
    /// `send reviewer`, `model_call openai/chat.completions`... as [`Event::label`].
    pub fn label(&self) -> String {
        match &self.name {
            Some(name) => format!("{} {name}", self.kind),
            None => self.kind.to_string(),
        }
    }
}

impl From<&Event> for EventHead {
    fn from(e: &Event) -> EventHead {
        EventHead {
            seq: e.seq,
            agent_id: e.agent_id.clone(),
            kind: e.kind,
            name: e.name.clone(),
            causal_parent: e.causal_parent,
        }
    }
}
