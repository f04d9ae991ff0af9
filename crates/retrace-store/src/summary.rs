//! [`EventSummary`]: what comparing runs reads of an event, so that `retrace diff` of two long
//! runs reads digests and counters, not whole envelopes ([`crate::EventStore::summaries`]).
use retrace_core::envelope::{Decision, MessageRef, ModelRef, Usage};
use retrace_core::label::{self, StepParts};
use retrace_core::{Digest, Event, EventType, Source};

/// An event's identity, what it asked and produced (as digests), where its output came from,
/// its usage and its decision. Every field equals the event's own.
#[derive(Clone, Debug, PartialEq)]
pub struct EventSummary {
    /// The event's seq.
    pub seq: u64,
    /// The agent that took the step.
    pub agent_id: String,
    /// What kind of step it is.
    pub kind: EventType,
    /// The step's name.
    pub name: Option<String>,
    /// The seq of the step this one answers (a delivery's send).
    pub causal_parent: Option<u64>,
    /// Digest of the canonical request.
    pub key: Digest,
    /// Blob of the masked request.
    pub request_ref: Option<Digest>,
    /// Blob of the recorded output.
    pub output_ref: Option<Digest>,
    /// Digest of the canonical output.
    pub output_hash: Option<Digest>,
    /// Where the output came from in this run.
    pub source: Source,
    /// In a fork: the source step this one was matched or paired with.
    pub origin_seq: Option<u64>,
    /// Tokens and cost.
    pub usage: Option<Usage>,
    /// A decision taken.
    pub decision: Option<Decision>,
    /// A model call's model.
    pub model: Option<ModelRef>,
    /// A send's or delivery's message.
    pub message: Option<MessageRef>,
    /// Why the step failed, if it did.
    pub error: Option<String>,
}

impl EventSummary {
    /// What a timeline calls the step ([`retrace_core::label::step`]): `model_call gpt-4o`,
    /// `deliver <- planner`, the same as `retrace show` says.
    pub fn label(&self) -> String {
        label::step(StepParts {
            kind: self.kind,
            name: self.name.as_deref(),
            model: self.model.as_ref(),
            message: self.message.as_ref(),
            decision: self.decision.as_ref(),
        })
    }
}

impl From<Event> for EventSummary {
    fn from(e: Event) -> EventSummary {
        EventSummary {
            seq: e.seq,
            agent_id: e.agent_id,
            kind: e.kind,
            name: e.name,
            causal_parent: e.causal_parent,
            key: e.key,
            request_ref: e.request_ref,
            output_ref: e.output_ref,
            output_hash: e.output_hash,
            source: e.source,
            origin_seq: e.origin_seq,
            usage: e.usage,
            decision: e.decision,
            model: e.model,
            message: e.message,
            error: e.error,
        }
    }
}
