//! The scheduler in fork mode (SPEC §7 "Forks" and "Deliveries in a fork").
//!
//! Steps are matched by key as in replay. While an agent still has unconsumed source steps
//! before the fork point, a step with no match is a divergence; after that an unmatched step is
//! *changed* (paired with the agent's earliest unconsumed source step at or after the fork point
//! of the same type and name) or *new*.
//!
//! A message is identified by the pairing of its send: a fork send paired with source send S
//! takes S's place in its receiver's delivery order (after `swap` edits), even if its body
//! changed. A receiver waits for its next message in source order only while it can still
//! arrive: it is absent once its sender has exited, or, when the fork is quiescent (every agent
//! waits in `recv` or has exited), the awaited message with the smallest source seq is absent.
//! New messages are delivered in arrival order once no source message is due.
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use retrace_core::{Digest, Divergence, EventType};
use serde_json::Value;

use crate::matcher::{RecordedDelivery, RecordedLog, RecordedStep};
use crate::scheduler::{release, Need, Phase, Scheduler, State};

/// A message in a fork, as its receiver will get it.
#[derive(Clone, Debug, PartialEq)]
pub struct ForkMessage {
    /// The sender.
    pub from: String,
    /// The kind.
    pub kind: Option<String>,
    /// The body.
    pub body: Value,
    /// The send's causal parent.
    pub parent: Option<u64>,
    /// The sender's Lamport clock at the send.
    pub lamport: u64,
    /// The send's seq in the fork's numbering (inherited sends keep their source seq).
    pub send_seq: u64,
}

/// What a fork step got from the source run.
#[derive(Clone, Debug, PartialEq)]
pub enum ForkMatch {
    /// The same key as a source step: its recorded output, at zero cost.
    Matched(RecordedStep),
    /// A changed step, paired with the source step it takes the place of.
    Changed(RecordedStep),
    /// A step with no source counterpart.
    New,
}

/// What a fork `recv` got.
#[derive(Clone, Debug, PartialEq)]
pub enum ForkDelivery {
    /// A message; `origin` is the source delivery whose place it takes (None: a new message).
    Message {
        /// The source delivery.
        origin: Option<RecordedDelivery>,
        /// The message.
        message: ForkMessage,
    },
    /// No message: the source recv timed out here (`origin`), or a live timeout.
    TimedOut {
        /// The source delivery.
        origin: Option<RecordedDelivery>,
    },
}

/// Message order and availability in a fork.
#[derive(Debug)]
pub(crate) struct ForkState {
    pub(crate) at: u64,
    order: HashMap<String, VecDeque<RecordedDelivery>>,
    available: HashMap<u64, ForkMessage>,
    new_mail: HashMap<String, VecDeque<ForkMessage>>,
    senders: HashMap<u64, String>,
    absent: HashSet<u64>,
}

impl ForkState {
    /// Takes the source deliveries out of `log` and applies `swaps` (deliveries `a < b` to one
    /// agent trade messages).
    pub(crate) fn new(at: u64, log: &RecordedLog, swaps: &[(u64, u64)]) -> ForkState {
        let mut order = log.take_all_deliveries();
        for &(a, b) in swaps {
            for queue in order.values_mut() {
                let ia = queue.iter().position(|d| d.seq == a);
                let ib = queue.iter().position(|d| d.seq == b);
                if let (Some(ia), Some(ib)) = (ia, ib) {
                    let (da, db) = (queue[ia].clone(), queue[ib].clone());
                    for (i, from) in [(ia, db), (ib, da)] {
                        let d = &mut queue[i];
                        d.send_seq = from.send_seq;
                        d.from = from.from;
                        d.kind = from.kind;
                        d.timed_out = from.timed_out;
                    }
                }
            }
        }
        ForkState {
            at,
            order,
            available: HashMap::new(),
            new_mail: HashMap::new(),
            senders: log.senders(),
            absent: HashSet::new(),
        }
    }

    fn sender_exited(&self, send: u64, phases: &HashMap<String, Phase>) -> bool {
        self.senders.get(&send).is_some_and(|a| phases.get(a) == Some(&Phase::Exited))
    }

    /// Whether `agent`'s next `recv` can be decided now.
    pub(crate) fn decidable(&self, agent: &str, phases: &HashMap<String, Phase>) -> bool {
        match self.order.get(agent).and_then(VecDeque::front) {
            Some(d) if d.timed_out => true,
            Some(d) => {
                let s = d.send_seq.unwrap_or_default();
                self.available.contains_key(&s) || self.absent.contains(&s) || self.sender_exited(s, phases)
            }
            None => self.new_mail.get(agent).is_some_and(|q| !q.is_empty()),
        }
    }
}

/// At quiescence (no agent running), declares absent the awaited source message with the
/// smallest seq. Returns true when quiescence was handled here (something became deliverable,
/// or some `recv` will end by its own timeout), so it is not a stall.
pub(crate) fn settle_quiescent(st: &mut State) -> bool {
    let Some(fork) = st.fork.as_mut() else { return false };
    let mut awaited: Vec<u64> = Vec::new();
    let mut timed = false;
    for (agent, w) in &st.waiters {
        match w.need {
            Need::Mail { timed: t } => match fork.order.get(agent).and_then(VecDeque::front) {
                Some(d) if !d.timed_out => awaited.extend(d.send_seq),
                _ => timed |= t,
            },
            _ => return false,
        }
    }
    match awaited.into_iter().min() {
        Some(s) => {
            fork.absent.insert(s);
            true
        }
        None => timed,
    }
}

impl Scheduler {
    /// The fork point, in fork mode.
    pub fn fork_at(&self) -> Option<u64> {
        self.state.lock().fork.as_ref().map(|f| f.at)
    }

    /// Whether `agent` has consumed every source step and delivery before `at` (edits of its
    /// prompt, model and parameters apply from then on).
    pub fn past(&self, agent: &str, at: u64) -> bool {
        !self.log.has_unconsumed_before(agent, at)
    }

    /// Matches a fork step: by key, else (once the agent is past the fork point) as changed or
    /// new. `Ok(None)`: the agent still owes source steps before the fork point and this one
    /// matches none of them; the caller reports the divergence.
    pub async fn take_fork_step(
        &self,
        agent: &str,
        kind: EventType,
        name: Option<&str>,
        key: &Digest,
    ) -> Result<Option<ForkMatch>, Divergence> {
        self.fail_if_diverged()?;
        let at = self.fork_at().unwrap_or(1);
        let mut st = self.state.lock();
        if let Some(step) = self.log.take(agent, key) {
            release(&mut st, step.seq);
            return Ok(Some(ForkMatch::Matched(step)));
        }
        if self.log.has_unconsumed_before(agent, at) {
            return Ok(None);
        }
        let paired =
            self.log.take_where(agent, |s| s.kind == kind && s.name.as_deref() == name && s.seq >= at);
        Ok(Some(match paired {
            Some(step) => {
                release(&mut st, step.seq);
                ForkMatch::Changed(step)
            }
            None => ForkMatch::New,
        }))
    }

    /// A fork send happened: paired with source send `source` (its message keeps that place in
    /// its receiver's order), or new.
    pub fn fork_send(&self, source: Option<u64>, to: &str, message: ForkMessage) {
        let mut st = self.state.lock();
        if let Some(fork) = st.fork.as_mut() {
            match source {
                Some(s) => {
                    fork.available.insert(s, message);
                }
                None => fork.new_mail.entry(to.to_owned()).or_default().push_back(message),
            }
        }
        self.wake_ready(&mut st);
    }

    /// A fork `recv`.
    pub async fn take_fork_delivery(
        &self,
        agent: &str,
        timeout: Option<Duration>,
    ) -> Result<ForkDelivery, Divergence> {
        loop {
            // What the agent waits for, for a stall report (QA29 D3: only "its next message").
            let mut what = format!("{agent}'s next message");
            let timed_wait = {
                let mut guard = self.state.lock();
                let st = &mut *guard;
                if let Some(d) = &st.divergence {
                    return Err(d.clone());
                }
                let phases = &st.phases;
                let fork = st.fork.as_mut().expect("fork mode");
                let front = fork.order.get(agent).and_then(VecDeque::front).cloned();
                match front {
                    Some(d) if d.timed_out => {
                        fork.order.get_mut(agent).expect("front").pop_front();
                        let mail = fork.new_mail.get_mut(agent).and_then(VecDeque::pop_front);
                        release(st, d.seq);
                        return Ok(match mail {
                            Some(message) => ForkDelivery::Message { origin: None, message },
                            None => ForkDelivery::TimedOut { origin: Some(d) },
                        });
                    }
                    Some(d) => {
                        let s = d.send_seq.unwrap_or_default();
                        if let Some(message) = fork.available.remove(&s) {
                            fork.order.get_mut(agent).expect("front").pop_front();
                            release(st, d.seq);
                            return Ok(ForkDelivery::Message { origin: Some(d), message });
                        }
                        if fork.absent.contains(&s) || fork.sender_exited(s, phases) {
                            fork.order.get_mut(agent).expect("front").pop_front();
                            release(st, d.seq);
                            continue;
                        }
                        let from = d.from.as_deref().unwrap_or("?");
                        what = format!(
                            "the message from {from} sent at source seq {s} (delivered at seq {})",
                            d.seq
                        );
                        false
                    }
                    None => {
                        if let Some(message) = fork.new_mail.get_mut(agent).and_then(VecDeque::pop_front) {
                            return Ok(ForkDelivery::Message { origin: None, message });
                        }
                        timeout.is_some()
                    }
                }
            };
            let wait = self.wait(agent, Need::Mail { timed: timed_wait }, &what);
            match (timed_wait, timeout) {
                (true, Some(t)) => {
                    if tokio::time::timeout(t, wait).await.is_err() {
                        let mut st = self.state.lock();
                        st.waiters.remove(agent);
                        st.phases.insert(agent.to_owned(), Phase::Running);
                        return Ok(ForkDelivery::TimedOut { origin: None });
                    }
                }
                _ => wait.await?,
            }
        }
    }
}
