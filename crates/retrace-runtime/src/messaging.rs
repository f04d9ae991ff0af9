//! Messages between agents: `send` is a step (its event acknowledged before the message can be
//! delivered); the moment a receiver takes a message is a separate `deliver` event, so each
//! agent's delivery order is a recorded fact that replay reproduces.
use std::sync::atomic::Ordering;
use std::time::Duration;

use retrace_core::envelope::MessageRef;
use retrace_core::json::Json;
use retrace_core::{Divergence, DivergenceCode, Event, EventType, Source};
use serde::Serialize;
use serde_json::{json, Value};

use crate::agent::{to_json, Agent};
use crate::bus::Taken;
use crate::error::{RuntimeError, RuntimeResult};
use crate::scheduler::Delivery;
use crate::session::Mode;
use crate::step::{LiveOutput, Prepared, StepInput};

/// A message as its receiver gets it.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// The seq of the message's `send` event (the recorded one, in replay).
    pub seq: u64,
    /// The sending agent.
    pub sender: String,
    /// The message kind.
    pub kind: Option<String>,
    /// The body.
    pub body: Value,
    /// The send's causal parent.
    pub parent: Option<u64>,
}

impl Agent {
    /// Sends `body` to agent `to`; returns the seq of the `send` event. `parent` names the event
    /// that caused this message (default: the agent's latest delivery).
    ///
    /// A body holding NaN or an infinity is refused, naming the step, before anything is
    /// recorded or delivered (SPEC §2): serde_json would turn it into `null`, and the receiver
    /// would hear, and the log hold, something other than what was sent.
    pub async fn send<B: Serialize + ?Sized>(
        &self,
        to: &str,
        kind: &str,
        body: &B,
        parent: Option<u64>,
    ) -> RuntimeResult<u64> {
        self.named(to, "send", "the recipient's name")?;
        if let Some(problem) = retrace_core::run::agent_id_problem(to) {
            // No agent could ever receive it (QA39 D3).
            return Err(RuntimeError::Usage(format!(
                "agent {:?}: send: the recipient can't be an agent: {problem}",
                self.id
            )));
        }
        let body = to_json(body, &self.id, &format!("send {to}"))?;
        if let Some(remote) = self.remote() {
            self.session.inner.steps.fetch_add(1, Ordering::Relaxed);
            let sent = remote
                .post(&self.id, "send", json!({ "to": to, "kind": kind, "body": body, "parent": parent }))
                .await?;
            return sent.get("seq").and_then(Value::as_u64).ok_or_else(|| RuntimeError::Decode {
                agent: self.id.clone(),
                step: format!("send {to}"),
                message: format!("the daemon's answer has no seq: {sent}"),
            });
        }
        self.earlier_event(parent, to)?;
        let mut template = Event::new(self.session.run_id(), self.id.clone(), EventType::Send);
        template.name = Some(to.to_owned());
        template.role = self.state.lock().role.clone();
        template.causal_parent = parent;
        template.message = Some(MessageRef {
            from: Some(self.id.clone()),
            to: Some(to.to_owned()),
            // Masked like a step's name (QA39 D1: a kind holding an email was stored in clear).
            kind: Some(self.masked_name(kind)),
            timed_out: false,
        });
        let input = StepInput::new(template, json!({ "to": to, "kind": kind, "body": body }))
            .no_output()
            .acknowledged();
        let inner = &self.session.inner;
        if let Some(d) = self.session.divergence() {
            return Err(d.into());
        }
        inner.steps.fetch_add(1, Ordering::Relaxed);
        let label = input.template.label();
        let prepared = self.prepare(&input, &label)?;
        match inner.mode {
            Mode::Fork => self.fork_send(input, prepared, &label, to, kind, body).await,
            Mode::Replay => {
                let (input, prepared, body) = self.edited_message(input, prepared, &label, body)?;
                let body = self.as_logged(&prepared, body)?;
                let (_, step) = self.replay(input, prepared, &label, Some(body)).await?;
                Ok(step.seq)
            }
            Mode::Record => {
                let recorded =
                    self.record(input, prepared, &label, || async { Ok(LiveOutput::none()) }).await?;
                let bus = inner.bus.as_ref().expect("record sessions have a bus");
                bus.post(
                    to,
                    recorded.seq,
                    &self.id,
                    Some(kind.to_owned()),
                    recorded.lamport,
                    recorded.causal_parent,
                    body,
                );
                Ok(recorded.seq)
            }
            Mode::Off => {
                let seq = inner.steps.load(Ordering::Relaxed) as u64;
                let lamport = self.state.lock().clock.tick();
                let bus = inner.bus.as_ref().expect("off sessions have a bus");
                bus.post(to, seq, &self.id, Some(kind.to_owned()), lamport, parent, body);
                Ok(seq)
            }
        }
    }

    /// Refuses a `parent` that names no earlier event of the run (seq 0, or one not yet taken):
    /// the send would be stored with a causal parent that `verify` and `import` then reject,
    /// making the whole recording unusable (QA20 D2).
    fn earlier_event(&self, parent: Option<u64>, to: &str) -> RuntimeResult<()> {
        let Some(parent) = parent else { return Ok(()) };
        let last = self.session.inner.writer.as_ref().map(|w| w.head().0);
        if parent == 0 || last.is_some_and(|last| parent > last) {
            let last = last.map_or_else(String::new, |l| format!(" (its last is seq {l})"));
            return Err(RuntimeError::Usage(format!(
                "send {to} of agent {:?}: parent {parent} is not an earlier event of the run{last}: a \
                 message's parent is the seq of the event that caused it",
                self.id
            )));
        }
        Ok(())
    }

    /// What a replay hands the receiver of `body`: what the log holds, tokens where a masking rule
    /// fired (the original only where a rule says `replay = "original"`), as a tool's output is
    /// handed back, and as a receiver gets it when the sender runs in another process and `recv`
    /// reads the recording (QA14 D7: an in-process receiver got the originals).
    fn as_logged(&self, prepared: &Prepared, body: Value) -> RuntimeResult<Value> {
        if !retrace_core::mask::contains_token(&prepared.masked) {
            return Ok(body);
        }
        self.body_of(self.session.inner.for_program(prepared.masked.clone())?, "send")
    }

    /// The `body` of a send's request (`{to, kind, body}`) as stored, decoded for `step`.
    fn body_of(&self, request: Vec<u8>, step: &str) -> RuntimeResult<Value> {
        let value: Value = serde_json::from_slice(&request).map_err(|e| RuntimeError::Decode {
            agent: self.id.clone(),
            step: step.into(),
            message: e.to_string(),
        })?;
        Ok(value.get("body").cloned().unwrap_or(Value::Null))
    }

    /// In a replay of a fork, the send as the fork made it: where the recording holds no send
    /// of the program's body but holds one of a `message:` edit's body (the fork replaced it),
    /// that body, as SPEC §7's "replay of a fork applies its edits again" asks.
    fn edited_message(
        &self,
        input: StepInput,
        prepared: Prepared,
        label: &str,
        body: Value,
    ) -> RuntimeResult<(StepInput, Prepared, Value)> {
        let Some(plan) = &self.session.inner.plan else {
            return Ok((input, prepared, body));
        };
        let bodies = plan.messages.values().chain(&plan.inherited_messages);
        self.body_the_log_holds(input, prepared, label, body, bodies)
    }

    /// The send the log holds where it holds no send of the program's body but holds one of
    /// `bodies` (edited bodies) in its place: that body and its prepared step; else the send
    /// as it was.
    pub(crate) fn body_the_log_holds<'a>(
        &self,
        mut input: StepInput,
        prepared: Prepared,
        label: &str,
        body: Value,
        bodies: impl Iterator<Item = &'a retrace_core::Digest>,
    ) -> RuntimeResult<(StepInput, Prepared, Value)> {
        let inner = &self.session.inner;
        let Some(scheduler) = &inner.scheduler else {
            return Ok((input, prepared, body));
        };
        let mut bodies = bodies.peekable();
        if bodies.peek().is_none() || scheduler.log().peek(&self.id, &prepared.key).is_some() {
            return Ok((input, prepared, body));
        }
        for blob in bodies {
            let Ok(edited) =
                serde_json::from_slice::<Value>(&inner.for_program(inner.store.get_blob(blob)?)?)
            else {
                continue;
            };
            let request = json!({ "to": input.request["to"], "kind": input.request["kind"], "body": edited });
            let original = std::mem::replace(&mut input.request, request);
            let prepared_edit = self.prepare(&input, label)?;
            if scheduler.log().peek(&self.id, &prepared_edit.key).is_some() {
                return Ok((input, prepared_edit, edited));
            }
            input.request = original;
        }
        Ok((input, prepared, body))
    }

    /// Takes the next message sent to this agent, waiting up to `timeout` (forever when None).
    /// `Ok(None)` is a timeout, which is recorded, and which replay reproduces at once.
    pub async fn recv(&self, timeout: Option<Duration>) -> RuntimeResult<Option<Message>> {
        let inner = &self.session.inner;
        if let Some(d) = self.session.divergence() {
            return Err(d.into());
        }
        inner.steps.fetch_add(1, Ordering::Relaxed);
        if let Some(remote) = self.remote() {
            let timeout_s = timeout.map(|t| t.as_secs_f64());
            let answer = remote.post(&self.id, "recv", json!({ "timeout_s": timeout_s })).await?;
            return remote_message(&self.id, answer);
        }
        match inner.mode {
            Mode::Replay => self.replay_recv().await,
            Mode::Fork => self.fork_recv(timeout).await,
            Mode::Record | Mode::Off => {
                let bus = inner.bus.as_ref().expect("live sessions have a bus");
                let taken = bus.take(&self.id, timeout).await;
                if inner.mode == Mode::Off {
                    return Ok(match taken {
                        Taken::Message(p) => Some(Message {
                            seq: p.send_seq,
                            sender: p.from,
                            kind: p.kind,
                            body: p.body,
                            parent: p.parent,
                        }),
                        Taken::TimedOut => None,
                    });
                }
                self.record_delivery(taken).await
            }
        }
    }

    async fn record_delivery(&self, taken: Taken) -> RuntimeResult<Option<Message>> {
        let heard = match taken {
            Taken::Message(p) => Some((
                Message { seq: p.send_seq, sender: p.from, kind: p.kind, body: p.body, parent: p.parent },
                p.lamport,
            )),
            Taken::TimedOut => None,
        };
        self.append_delivery(heard, None, Source::Live).await
    }

    /// Appends the `deliver` event of a message heard (with its sender's Lamport clock), or of
    /// a timeout; `origin` is the source delivery it takes the place of, in a fork.
    pub(crate) async fn append_delivery(
        &self,
        heard: Option<(Message, u64)>,
        origin: Option<u64>,
        source: Source,
    ) -> RuntimeResult<Option<Message>> {
        let inner = &self.session.inner;
        let mut event = Event::new(self.session.run_id(), self.id.clone(), EventType::Deliver);
        event.role = self.state.lock().role.clone();
        event.origin_seq = origin;
        event.source = source;
        let (request, message) = match heard {
            Some((m, sender_lamport)) => {
                event.name = Some(m.sender.clone());
                event.causal_parent = Some(m.seq);
                event.message = Some(MessageRef {
                    from: Some(m.sender.clone()),
                    to: Some(self.id.clone()),
                    kind: m.kind.as_deref().map(|k| self.masked_name(k)),
                    timed_out: false,
                });
                (Json::from_value(&json!({ "from": m.sender, "kind": m.kind })), Some((m, sender_lamport)))
            }
            None => {
                event.message =
                    Some(MessageRef { from: None, to: Some(self.id.clone()), kind: None, timed_out: true });
                (Json::from_value(&json!({ "timed_out": true })), None)
            }
        };
        event.key =
            inner.keys.key(EventType::Deliver, event.name.as_deref(), None, &request).map_err(|e| {
                RuntimeError::NotCanonical { agent: self.id.clone(), step: event.label(), source: e }
            })?;
        let (ticket, _) = self.append_stamped(event, Vec::new(), None, message.as_ref().map(|(_, l)| *l))?;
        let message = message.map(|(m, _)| m);
        let seq = ticket.seq;
        if inner.wait_for_ack {
            ticket.acked().await?;
        }
        let mut state = self.state.lock();
        state.pending_inbound.push(seq);
        state.last_delivery = Some(seq);
        Ok(message)
    }

    async fn replay_recv(&self) -> RuntimeResult<Option<Message>> {
        let inner = &self.session.inner;
        let scheduler = inner.scheduler.as_ref().expect("replay sessions have a scheduler");
        match scheduler.take_delivery(&self.id).await? {
            None => {
                let log = scheduler.log();
                if let Some(e) = log.failure() {
                    return Err(e.into());
                }
                if log.next_of(&self.id).is_none() && self.session.source_ended_early() {
                    let d = crate::log_end::log_ended(self.id.clone(), log.last_seq())
                        .step("recv")
                        .detail("the agent waited for a message after its last recorded step");
                    return Err(self.diverge(d));
                }
                let mut d = Divergence::new(DivergenceCode::UnexpectedStep, self.id.clone()).step("recv");
                d = match log.next_of(&self.id) {
                    Some(next) => d.at(next.seq).detail(format!(
                        "the recording holds no further delivery for this agent; its next recorded step is seq {} ({})",
                        next.seq,
                        next.label()
                    )),
                    None => match log.last_of(&self.id) {
                        Some(last) => d.at(last).detail(format!(
                            "the recording holds no further delivery for this agent; its last recorded step is seq {last}"
                        )),
                        None => d.detail("the recording holds no further delivery for this agent"),
                    },
                };
                Err(self.diverge(d))
            }
            Some(Delivery::TimedOut { delivery }) => {
                let mut state = self.state.lock();
                state.pending_inbound.push(delivery.seq);
                state.last_delivery = Some(delivery.seq);
                Ok(None)
            }
            Some(Delivery::Message { delivery, body, parent }) => {
                {
                    let mut state = self.state.lock();
                    state.pending_inbound.push(delivery.seq);
                    state.last_delivery = Some(delivery.seq);
                }
                let send_seq = delivery.send_seq.unwrap_or_default();
                let body = match body {
                    Some(b) => b,
                    None => self.recorded_body(send_seq)?,
                };
                Ok(Some(Message {
                    seq: send_seq,
                    sender: delivery.from.unwrap_or_default(),
                    kind: delivery.kind,
                    body,
                    parent,
                }))
            }
        }
    }

    /// The body of a recorded send, from its request blob.
    fn recorded_body(&self, send_seq: u64) -> RuntimeResult<Value> {
        let inner = &self.session.inner;
        let source = self.session.source_run().unwrap_or_default();
        let event = inner.store.event(&source, send_seq)?;
        let Some(request) = event.request_ref else { return Ok(Value::Null) };
        self.body_of(inner.for_program(inner.store.get_blob(&request)?)?, "recv")
    }

    /// Blocking [`Agent::send`], for agents on plain threads.
    pub fn send_blocking<B: Serialize + ?Sized>(
        &self,
        to: &str,
        kind: &str,
        body: &B,
        parent: Option<u64>,
    ) -> RuntimeResult<u64> {
        self.block_on(self.send(to, kind, body, parent))
    }

    /// Blocking [`Agent::recv`], for agents on plain threads. Record-mode timeouts need a tokio
    /// runtime; this one enters a private one when none is running. Called on a current-thread
    /// runtime (whose one thread it blocks, timer included), it waits on a thread of its own, so
    /// its timeout fires; a message only a task of that runtime would send can't come meanwhile.
    pub fn recv_blocking(&self, timeout: Option<Duration>) -> RuntimeResult<Option<Message>> {
        use tokio::runtime::RuntimeFlavor;
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == RuntimeFlavor::CurrentThread => {
                std::thread::scope(|scope| scope.spawn(|| self.recv_blocking(timeout)).join())
                    .unwrap_or_else(|_| Err(RuntimeError::Usage("recv_blocking's thread panicked".into())))
            }
            // A recv waits for another agent in any mode.
            Ok(_) => crate::block::block_on(true, self.recv(timeout)),
            Err(_) => {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .map_err(|e| RuntimeError::Usage(e.to_string()))?;
                rt.block_on(self.recv(timeout))
            }
        }
    }
}

/// A `recv` answer of the daemon: `{"message": {seq, sender, kind, body, parent} | null}`.
fn remote_message(agent: &str, answer: Value) -> RuntimeResult<Option<Message>> {
    let bad = |why: &str| RuntimeError::Decode {
        agent: agent.to_owned(),
        step: "recv".into(),
        message: format!("{why}: {answer}"),
    };
    let m = match answer.get("message") {
        None => return Err(bad("the daemon's answer has no message")),
        Some(Value::Null) => return Ok(None),
        Some(m) => m,
    };
    Ok(Some(Message {
        seq: m.get("seq").and_then(Value::as_u64).ok_or_else(|| bad("a message without a seq"))?,
        sender: m.get("sender").and_then(Value::as_str).unwrap_or_default().to_owned(),
        kind: m.get("kind").and_then(Value::as_str).map(str::to_owned),
        body: m.get("body").cloned().unwrap_or(Value::Null),
        parent: m.get("parent").and_then(Value::as_u64),
    }))
}
