//! THE replay scheduler (SPEC §7), one implementation behind a transport-neutral interface:
//! in-process agents call it directly, and the daemon drives the same code for agents in other
//! processes.
//!
//! - A keyed step (model, tool, clock, random, env, send, decide) consumes its agent's earliest
//!   unconsumed recorded step with the same key and is answered at once.
//! - A `recv` returns the message of the agent's next recorded delivery, once that message's
//!   `send` has been replayed, however long that takes; a recorded timeout times out at once.
//! - In strict mode every step also waits until every earlier seq has been released, so the
//!   global order is the recorded one.
//! - A stall (no waiting step can proceed) is declared at once when no agent that could still
//!   act is left, else after the stall timeout without progress; every waiter is released with
//!   the divergence, never left hanging.
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use retrace_core::{Digest, Divergence, DivergenceCode};
use serde_json::Value;
use tokio::sync::Notify;

use crate::matcher::{RecordedDelivery, RecordedLog, RecordedStep};

/// How the scheduler orders replayed steps.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Every step waits for all earlier seqs (for programs whose agents interact only through
    /// Retrace).
    pub strict: bool,
    /// How long waiting steps may go without any progress before the run is a stall.
    pub stall_timeout: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { strict: false, stall_timeout: Duration::from_secs(30) }
    }
}

/// What a replayed `recv` gets.
#[derive(Clone, Debug, PartialEq)]
pub enum Delivery {
    /// A message.
    Message {
        /// The recorded delivery.
        delivery: RecordedDelivery,
        /// The body the replayed `send` carried (None when the sender was replayed elsewhere
        /// without its body).
        body: Option<Value>,
        /// The recorded send's causal parent.
        parent: Option<u64>,
    },
    /// The recorded `recv` timed out.
    TimedOut {
        /// The recorded delivery.
        delivery: RecordedDelivery,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Running,
    Waiting,
    Exited,
}

/// What a waiting step needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// The recorded send `seq` has been replayed.
    Sent(u64),
    /// Every seq before this one has been released (strict mode).
    Turn(u64),
    /// A fork's `recv`: the agent's next message in fork order can be decided. `timed`: the
    /// recv ends by its own timeout when nothing comes.
    Mail {
        /// The recv has a timeout.
        timed: bool,
    },
}

#[derive(Debug)]
pub(crate) struct Waiter {
    pub(crate) need: Need,
    pub(crate) what: String,
    pub(crate) notify: Arc<Notify>,
}

/// A replayed send, as its receiver will get it.
#[derive(Clone, Debug)]
struct Sent {
    body: Option<Value>,
    parent: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct State {
    released: Vec<bool>,
    next_release: u64,
    /// How many of the log's unconsumable seqs have been marked released.
    absorbed: usize,
    sent: HashMap<u64, Sent>,
    pub(crate) phases: HashMap<String, Phase>,
    pub(crate) waiters: HashMap<String, Waiter>,
    pub(crate) last_progress: Instant,
    /// Answers held back on purpose ([`Scheduler::hold`]): while any is, the run is not stalled.
    holds: usize,
    pub(crate) divergence: Option<Divergence>,
    trace: Vec<u64>,
    /// Fork mode: message order and availability.
    pub(crate) fork: Option<crate::fork_sched::ForkState>,
}

impl State {
    pub(crate) fn ready(&self, agent: &str, need: Need) -> bool {
        match need {
            Need::Sent(seq) => self.sent.contains_key(&seq),
            Need::Turn(seq) => self.next_release >= seq,
            Need::Mail { .. } => self.fork.as_ref().is_some_and(|f| f.decidable(agent, &self.phases)),
        }
    }
}

/// Called once, with the first divergence, as soon as it is found.
pub type DivergenceHook = Box<dyn Fn(&Divergence) + Send + Sync>;

/// The replay scheduler of one replayed run.
pub struct Scheduler {
    pub(crate) log: RecordedLog,
    config: SchedulerConfig,
    pub(crate) state: Mutex<State>,
    hook: Mutex<Option<DivergenceHook>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Scheduler {
    /// A scheduler over `log`; starts the stall watchdog.
    pub fn new(log: RecordedLog, config: SchedulerConfig) -> Arc<Scheduler> {
        Scheduler::with_fork(log, config, None)
    }

    /// A scheduler over `log`, in fork mode when `fork` is set.
    pub(crate) fn with_fork(
        log: RecordedLog,
        config: SchedulerConfig,
        fork: Option<crate::fork_sched::ForkState>,
    ) -> Arc<Scheduler> {
        let last = log.last_seq() as usize;
        let mut released = vec![false; last + 2];
        released[0] = true;
        let mut state = State {
            released,
            next_release: 1,
            absorbed: 0,
            sent: HashMap::new(),
            phases: HashMap::new(),
            waiters: HashMap::new(),
            last_progress: Instant::now(),
            holds: 0,
            divergence: None,
            trace: Vec::new(),
            fork,
        };
        absorb(&log, &mut state);
        advance(&mut state);
        let scheduler = Arc::new(Scheduler { log, config, state: Mutex::new(state), hook: Mutex::new(None) });
        spawn_watchdog(Arc::downgrade(&scheduler));
        scheduler
    }

    /// Sets the function told about the first divergence (the session stores it at once, so a
    /// program that dies of it still leaves a diverged run behind).
    pub fn on_divergence(&self, hook: DivergenceHook) {
        *self.hook.lock() = Some(hook);
    }

    /// The recorded log.
    pub fn log(&self) -> &RecordedLog {
        &self.log
    }

    /// Whether every step waits for all earlier seqs.
    pub fn is_strict(&self) -> bool {
        self.config.strict
    }

    /// An agent started taking steps.
    pub fn agent_started(&self, agent: &str) {
        let mut st = self.state.lock();
        st.phases.entry(agent.to_owned()).or_insert(Phase::Running);
    }

    /// An agent will take no more steps (its task or process ended).
    pub fn agent_exited(&self, agent: &str) {
        let stalled = {
            let mut st = self.state.lock();
            st.phases.insert(agent.to_owned(), Phase::Exited);
            st.last_progress = Instant::now();
            // A fork's receiver already waiting for this agent's message now knows it is absent
            // (SPEC §7): it goes on instead of waiting out the stall timeout (QA29 D2).
            self.wake_ready(&mut st);
            self.check_stall(&mut st)
        };
        if let Some(d) = stalled {
            self.announce(&d);
        }
    }

    /// The divergence that ended the replay, if any.
    pub fn divergence(&self) -> Option<Divergence> {
        self.state.lock().divergence.clone()
    }

    /// Records `d` as the run's divergence (the first one wins), releases every waiter with it,
    /// and returns the run's divergence.
    pub fn diverge(&self, d: Divergence) -> Divergence {
        let (first, new) = {
            let mut st = self.state.lock();
            let new = st.divergence.is_none();
            (set_divergence(&mut st, d), new)
        };
        if new {
            self.announce(&first);
        }
        first
    }

    pub(crate) fn announce(&self, d: &Divergence) {
        if let Some(hook) = self.hook.lock().as_ref() {
            hook(d);
        }
    }

    /// Recorded seqs in the order replay released them.
    pub fn trace(&self) -> Vec<u64> {
        self.state.lock().trace.clone()
    }

    /// Consumes `agent`'s earliest unconsumed recorded step with `key` (in strict mode, once
    /// every earlier seq is released). `Ok(None)`: the log holds no such step; the caller builds
    /// the mismatch report and calls [`Scheduler::diverge`].
    pub async fn take_step(
        &self,
        agent: &str,
        key: &Digest,
        what: &str,
    ) -> Result<Option<RecordedStep>, Divergence> {
        self.fail_if_diverged()?;
        if self.config.strict {
            loop {
                let Some(seq) = self.log.peek(agent, key) else { return Ok(None) };
                self.absorb_unconsumable();
                self.wait(agent, Need::Turn(seq), what).await?;
                let mut st = self.state.lock();
                if self.log.peek(agent, key) == Some(seq) {
                    let step = self.log.take(agent, key).expect("peeked under the lock");
                    release(&mut st, step.seq);
                    // The next seq's waiter, if any, may go now.
                    self.wake_ready(&mut st);
                    return Ok(Some(step));
                }
            }
        }
        let step = self.log.take(agent, key);
        if let Some(step) = &step {
            let mut st = self.state.lock();
            release(&mut st, step.seq);
            if self.log.unconsumable_count() > st.absorbed {
                absorb(&self.log, &mut st);
                advance(&mut st);
                self.wake_ready(&mut st);
            }
        }
        Ok(step)
    }

    /// A replayed `send`: consumes the recorded send like [`Scheduler::take_step`] and makes its
    /// message deliverable, carrying `body`.
    pub async fn take_send(
        &self,
        agent: &str,
        key: &Digest,
        what: &str,
        body: Option<Value>,
    ) -> Result<Option<RecordedStep>, Divergence> {
        let step = self.take_step(agent, key, what).await?;
        if let Some(step) = &step {
            let mut st = self.state.lock();
            st.sent.insert(step.seq, Sent { body, parent: step.causal_parent });
            self.wake_ready(&mut st);
        }
        Ok(step)
    }

    /// A replayed `recv`: the agent's next recorded delivery, once its send has been replayed.
    /// `Ok(None)`: the log holds no further delivery for `agent`.
    pub async fn take_delivery(&self, agent: &str) -> Result<Option<Delivery>, Divergence> {
        self.fail_if_diverged()?;
        let Some(next) = self.log.next_delivery(agent) else { return Ok(None) };
        self.absorb_unconsumable();
        let what = match (&next.from, next.send_seq) {
            (Some(from), Some(send)) => {
                format!("deliver from {from} (seq {}, its send is seq {send})", next.seq)
            }
            _ => format!("deliver (seq {}, a recorded timeout)", next.seq),
        };
        if self.config.strict {
            self.wait(agent, Need::Turn(next.seq), &what).await?;
        }
        if let (false, Some(send)) = (next.timed_out, next.send_seq) {
            self.wait(agent, Need::Sent(send), &what).await?;
        }
        let mut st = self.state.lock();
        let delivery = self.log.take_delivery(agent).expect("only this agent consumes its deliveries");
        release(&mut st, delivery.seq);
        self.wake_ready(&mut st);
        Ok(Some(if delivery.timed_out {
            Delivery::TimedOut { delivery }
        } else {
            let sent = delivery.send_seq.and_then(|s| st.sent.get(&s).cloned());
            let (body, parent) = sent.map(|s| (s.body, s.parent)).unwrap_or((None, None));
            Delivery::Message { delivery, body, parent }
        }))
    }

    /// Marks released the unconsumable seqs (resolutions) the log has loaded since last asked:
    /// a step about to wait for its turn has loaded every seq before its own, so the turn
    /// passes over them.
    fn absorb_unconsumable(&self) {
        if self.log.unconsumable_count() == self.state.lock().absorbed {
            return;
        }
        let mut st = self.state.lock();
        absorb(&self.log, &mut st);
        advance(&mut st);
        self.wake_ready(&mut st);
    }

    #[allow(clippy::result_large_err)]
    pub(crate) fn fail_if_diverged(&self) -> Result<(), Divergence> {
        match &self.state.lock().divergence {
            Some(d) => Err(d.clone()),
            None => Ok(()),
        }
    }

    pub(crate) async fn wait(&self, agent: &str, need: Need, what: &str) -> Result<(), Divergence> {
        let notify = Arc::new(Notify::new());
        loop {
            let stalled = {
                let mut st = self.state.lock();
                if let Some(d) = &st.divergence {
                    let d = d.clone();
                    st.waiters.remove(agent);
                    return Err(d);
                }
                if st.ready(agent, need) {
                    st.waiters.remove(agent);
                    st.phases.insert(agent.to_owned(), Phase::Running);
                    return Ok(());
                }
                st.waiters
                    .insert(agent.to_owned(), Waiter { need, what: what.to_owned(), notify: notify.clone() });
                st.phases.insert(agent.to_owned(), Phase::Waiting);
                self.check_stall(&mut st)
            };
            if let Some(d) = stalled {
                self.announce(&d);
            }
            notify.notified().await;
        }
    }

    /// Wakes every waiter whose need is now met (and marks it running, so it can't be counted
    /// as stalled before it runs).
    pub(crate) fn wake_ready(&self, st: &mut State) {
        let ready: Vec<String> =
            st.waiters.iter().filter(|(a, w)| st.ready(a, w.need)).map(|(a, _)| a.clone()).collect();
        for agent in ready {
            if let Some(w) = st.waiters.get(&agent) {
                w.notify.notify_one();
            }
            st.phases.insert(agent, Phase::Running);
        }
    }

    /// Says that an answered step is being held back on purpose until the guard drops (the proxy
    /// holds the answer of a call whose client left in record as long as the client waited
    /// then, so it leaves again): the run makes progress meanwhile, and other agents waiting on
    /// what comes after it are not a stall, however long the hold.
    pub fn hold(self: &Arc<Self>) -> Hold {
        let mut st = self.state.lock();
        st.holds += 1;
        Hold(self.clone())
    }

    /// Declares a stall when steps wait and no agent that could still act is left: every known
    /// agent waits or has exited, and agents the recording knows have all started.
    /// Returns the stall divergence when this check declared one.
    pub(crate) fn check_stall(&self, st: &mut State) -> Option<Divergence> {
        if st.waiters.is_empty() || st.divergence.is_some() {
            return None;
        }
        let someone_runs = st.phases.values().any(|p| *p == Phase::Running);
        if someone_runs || self.log.any_agent_not(|a| st.phases.contains_key(a)) {
            return None;
        }
        if crate::fork_sched::settle_quiescent(st) {
            self.wake_ready(st);
            return None;
        }
        let d = stall(st, "every agent is waiting or has exited");
        Some(set_divergence(st, d))
    }
}

/// An answer the replay holds back on purpose, as long as this lives ([`Scheduler::hold`]).
#[derive(Debug)]
#[must_use = "the hold ends when this is dropped"]
pub struct Hold(Arc<Scheduler>);

impl Drop for Hold {
    fn drop(&mut self) {
        let mut st = self.0.state.lock();
        st.holds -= 1;
        st.last_progress = Instant::now();
    }
}

/// Marks `seq` released and moves the strict-mode turn forward.
pub(crate) fn release(st: &mut State, seq: u64) {
    let idx = seq as usize;
    if idx < st.released.len() {
        st.released[idx] = true;
    }
    st.trace.push(seq);
    st.last_progress = Instant::now();
    advance(st);
}

/// Marks released the log's unconsumable seqs not marked yet.
fn absorb(log: &RecordedLog, st: &mut State) {
    for seq in log.unconsumable_seqs(st.absorbed) {
        st.absorbed += 1;
        if let Some(released) = st.released.get_mut(seq as usize) {
            *released = true;
        }
    }
}

fn advance(st: &mut State) {
    while (st.next_release as usize) < st.released.len() && st.released[st.next_release as usize] {
        st.next_release += 1;
    }
}

fn set_divergence(st: &mut State, d: Divergence) -> Divergence {
    let first = st.divergence.get_or_insert(d).clone();
    for w in st.waiters.values() {
        w.notify.notify_one();
    }
    first
}

fn stall(st: &State, why: &str) -> Divergence {
    let awaited = |w: &Waiter| match w.need {
        Need::Sent(s) | Need::Turn(s) => Some(s),
        Need::Mail { .. } => None,
    };
    let mut waiting: Vec<(&String, &Waiter)> = st.waiters.iter().collect();
    waiting.sort_by_key(|(a, w)| (awaited(w).unwrap_or(u64::MAX), (*a).clone()));
    let (agent, first) = waiting[0];
    let mut d = Divergence::new(DivergenceCode::Stall, agent.clone()).step(first.what.clone()).detail(why);
    if let Some(seq) = awaited(first) {
        d = d.at(seq);
    }
    for (agent, w) in &waiting {
        d = d.detail(format!("agent {agent:?} waits for {}", w.what));
    }
    d
}

fn spawn_watchdog(scheduler: Weak<Scheduler>) {
    let _ = std::thread::Builder::new().name("retrace-stall-watchdog".into()).spawn(move || loop {
        std::thread::sleep(Duration::from_millis(50));
        let Some(s) = scheduler.upgrade() else { return };
        let mut st = s.state.lock();
        if st.divergence.is_some() {
            return;
        }
        if st.holds == 0 && !st.waiters.is_empty() && st.last_progress.elapsed() >= s.config.stall_timeout {
            let why = format!("no step made progress for {:?} (--stall-timeout)", s.config.stall_timeout);
            let mut d = stall(&st, &why);
            // A recorded agent this replay never heard from is the likeliest cause: its process
            // did not start, or ended before its first step (QA29 S3: the report didn't say).
            for agent in s.log.agents_not(|a| st.phases.contains_key(a)) {
                d = d.detail(format!(
                    "agent {agent:?} never started in this replay (recorded, it took steps): did its process start?"
                ));
            }
            let d = set_divergence(&mut st, d);
            drop(st);
            s.announce(&d);
            return;
        }
    });
}
