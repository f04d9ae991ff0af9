//! Messages in a fork: a send is matched or paired like any step and makes its message
//! deliverable in its source place (or as a new message); a `recv` takes messages in the fork's
//! delivery order (SPEC §7 "Deliveries in a fork"). Deliveries before the fork point are
//! inherited; from it on each is the fork's own `deliver` event, with its `origin_seq`.
use std::time::Duration;

use retrace_core::{EventType, Source};
use serde_json::{json, Value};

use crate::agent::Agent;
use crate::error::RuntimeResult;
use crate::fork_sched::{ForkDelivery, ForkMatch, ForkMessage};
use crate::messaging::Message;
use crate::step::{LiveOutput, Prepared, StepInput};

impl Agent {
    /// A send in a fork; returns the send's seq in the fork's numbering.
    pub(crate) async fn fork_send(
        &self,
        input: StepInput,
        prepared: Prepared,
        label: &str,
        to: &str,
        kind: &str,
        body: Value,
    ) -> RuntimeResult<u64> {
        let inner = &self.session.inner;
        let scheduler = inner.scheduler.clone().expect("forks have a scheduler");
        let plan = inner.plan.clone().expect("forks have a plan");
        // The source fork sent some bodies in place of the program's (its `message:` edits):
        // the program's send is the one the source recorded with such a body.
        let (mut input, prepared, body) =
            self.body_the_log_holds(input, prepared, label, body, plan.inherited_messages.iter())?;
        let mut probe = input.template.clone();
        probe.key = prepared.key;
        let matched = scheduler.take_fork_step(&self.id, EventType::Send, Some(to), &prepared.key).await?;
        let (origin, source) = match matched {
            None => return Err(self.mismatch(EventType::Send, &probe, &prepared, label)),
            Some(ForkMatch::Matched(step)) if step.seq < plan.at => {
                self.state.lock().clock.observe(step.lamport.saturating_sub(1));
                let message = ForkMessage {
                    from: self.id.clone(),
                    kind: Some(kind.to_owned()),
                    body,
                    parent: step.causal_parent,
                    lamport: step.lamport,
                    send_seq: step.seq,
                };
                scheduler.fork_send(Some(step.seq), to, message);
                return Ok(step.seq);
            }
            Some(ForkMatch::Matched(step)) => (Some(step.seq), Source::Recorded),
            Some(ForkMatch::Changed(step)) => (Some(step.seq), Source::Live),
            Some(ForkMatch::New) => (None, Source::Live),
        };
        // A `message:` edit replaces the body its receiver gets; the fork's send event says so.
        let (body, prepared) = match origin.and_then(|s| plan.messages.get(&s)) {
            Some(blob) => {
                let edited: Value = serde_json::from_slice(&inner.for_program(inner.store.get_blob(blob)?)?)
                    .unwrap_or(Value::Null);
                input.request = json!({ "to": to, "kind": kind, "body": edited });
                input.source = Source::Live;
                let prepared = self.prepare(&input, label)?;
                (edited, prepared)
            }
            None => {
                input.source = source;
                (body, prepared)
            }
        };
        input.origin_seq = origin;
        let recorded = self.record(input, prepared, label, || async { Ok(LiveOutput::none()) }).await?;
        let message = ForkMessage {
            from: self.id.clone(),
            kind: Some(kind.to_owned()),
            body,
            parent: recorded.causal_parent,
            lamport: recorded.lamport,
            send_seq: recorded.seq,
        };
        scheduler.fork_send(origin, to, message);
        Ok(recorded.seq)
    }

    /// A `recv` in a fork.
    pub(crate) async fn fork_recv(&self, timeout: Option<Duration>) -> RuntimeResult<Option<Message>> {
        let inner = &self.session.inner;
        let scheduler = inner.scheduler.clone().expect("forks have a scheduler");
        let at = scheduler.fork_at().unwrap_or(1);
        let heard = scheduler.take_fork_delivery(&self.id, timeout).await?;
        let inherit = |seq: u64| {
            let mut state = self.state.lock();
            state.pending_inbound.push(seq);
            state.last_delivery = Some(seq);
        };
        match heard {
            ForkDelivery::Message { origin: Some(d), message } if d.seq < at => {
                inherit(d.seq);
                self.state.lock().clock.observe(message.lamport);
                Ok(Some(to_message(message)))
            }
            ForkDelivery::TimedOut { origin: Some(d) } if d.seq < at => {
                inherit(d.seq);
                Ok(None)
            }
            ForkDelivery::Message { origin, message } => {
                let lamport = message.lamport;
                let source = if origin.is_some() { Source::Recorded } else { Source::Live };
                self.append_delivery(Some((to_message(message), lamport)), origin.map(|d| d.seq), source)
                    .await
            }
            ForkDelivery::TimedOut { origin } => {
                let source = if origin.is_some() { Source::Recorded } else { Source::Live };
                self.append_delivery(None, origin.map(|d| d.seq), source).await
            }
        }
    }
}

fn to_message(m: ForkMessage) -> Message {
    Message { seq: m.send_seq, sender: m.from, kind: m.kind, body: m.body, parent: m.parent }
}
