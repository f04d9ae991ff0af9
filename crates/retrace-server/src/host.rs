//! The runs the daemon hosts: one runtime [`Session`] per run, opened on the run's first proxied
//! call (or by the API), so the daemon is that run's one sequencer (record) or drives the
//! runtime's one replay scheduler for it (replay). The daemon owns no replay logic of its own.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use retrace_core::mask::MaskKey;
use retrace_core::run::{RunMeta, RunMode, RunStatus};
use retrace_core::vault::VaultKey;
use retrace_runtime::{Agent, Outcome, RunReport, RuntimeError, Session, SessionOptions};
use retrace_store::vault::Revealer;
use retrace_store::Store;

/// Label set on a run recorded through the daemon: its replay is concluded by the daemon too.
pub const RECORDER_LABEL: &str = "recorder";
/// The value of [`RECORDER_LABEL`] for runs the daemon recorded.
pub const RECORDER_DAEMON: &str = "retrace-daemon";

/// Why a run can't be hosted.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// No such run.
    #[error("no run {0} in this store")]
    UnknownRun(String),
    /// The run's session could not be opened (its lease is held elsewhere, it has finished...).
    #[error("run {run}: {source}")]
    Open {
        /// The run.
        run: String,
        /// Why.
        source: RuntimeError,
    },
    /// The run was finished already.
    #[error("run {0} has finished; start a new run")]
    Finished(String),
}

/// The sessions of the runs this daemon hosts.
pub struct RunHost {
    store: Arc<dyn Store>,
    stall_timeout: Duration,
    mask_key: Option<MaskKey>,
    vault_key: Option<VaultKey>,
    autonomy: Option<Arc<retrace_runtime::autonomy::Governor>>,
    /// The daemon's own rules: where a run's recorded literal rules (kept as digests) get their
    /// values back.
    mask_rules: retrace_core::mask::MaskRules,
    /// What its sessions price model tokens at.
    prices: Arc<retrace_core::prices::PriceTable>,
    runs: Mutex<HashMap<String, Slot>>,
    /// The request body limit of each hosted run that keeps its own (`RunMeta::max_body`).
    body_limits: Mutex<HashMap<String, usize>>,
    opening: Mutex<()>,
    /// Proxied calls of each run still being recorded: the run's end waits for them.
    calls: Mutex<HashMap<String, usize>>,
    call_ended: Condvar,
    /// The longest a run's end waits for its calls in flight.
    call_wait: Duration,
}

/// How long a run's end waits for its proxied calls in flight, beyond the upstream timeout
/// that ends each of them.
const CALL_END_MARGIN: Duration = Duration::from_secs(10);

/// A proxied call being recorded ([`RunHost::call_started`]); dropped when its step is stored
/// (or failed), which is what the run's end waits for.
#[derive(Debug)]
pub struct CallInFlight {
    host: Arc<RunHost>,
    run: String,
}

impl Drop for CallInFlight {
    fn drop(&mut self) {
        let mut calls = self.host.calls.lock();
        if let Some(n) = calls.get_mut(&self.run) {
            *n -= 1;
            if *n == 0 {
                calls.remove(&self.run);
            }
        }
        self.host.call_ended.notify_all();
    }
}

impl std::fmt::Debug for RunHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHost").field("runs", &self.runs.lock().len()).finish_non_exhaustive()
    }
}

enum Slot {
    Open(Session),
    Finished,
}

impl RunHost {
    /// A host over `store`; replays declare a stall after `stall_timeout` without progress.
    pub fn new(
        store: Arc<dyn Store>,
        stall_timeout: Duration,
        mask_key: Option<MaskKey>,
        vault_key: Option<VaultKey>,
    ) -> RunHost {
        RunHost {
            store,
            stall_timeout,
            mask_key,
            vault_key,
            autonomy: None,
            mask_rules: retrace_core::mask::MaskRules::default(),
            prices: Arc::new(retrace_core::prices::PriceTable::builtin()),
            runs: Mutex::new(HashMap::new()),
            body_limits: Mutex::new(HashMap::new()),
            opening: Mutex::new(()),
            calls: Mutex::new(HashMap::new()),
            call_ended: Condvar::new(),
            call_wait: Duration::from_secs(600) + CALL_END_MARGIN,
        }
    }

    /// Each proxied call ends within `timeout` (the upstream's), so a run's end waits that
    /// long, and a little more, for the calls it has in flight.
    pub fn with_upstream_timeout(mut self, timeout: Duration) -> RunHost {
        self.call_wait = timeout + CALL_END_MARGIN;
        self
    }

    /// Counts a proxied call of `run` as in flight until the guard drops: a call whose client
    /// stopped reading goes on to the upstream's end and is stored then, which the run's end
    /// ([`RunHost::finish`]) waits for, so the run never ends without it.
    pub fn call_started(self: &Arc<Self>, run: &str) -> CallInFlight {
        *self.calls.lock().entry(run.to_owned()).or_default() += 1;
        CallInFlight { host: self.clone(), run: run.to_owned() }
    }

    /// How many proxied calls of `run` are in flight.
    pub fn calls_in_flight(&self, run: &str) -> usize {
        self.calls.lock().get(run).copied().unwrap_or(0)
    }

    /// Waits until `run` has no proxied call in flight, the upstream timeout and a margin have
    /// passed, or `stopped()` holds (asked every 100 ms); returns how many are left.
    fn wait_for_calls(&self, run: &str, stopped: &dyn Fn() -> bool) -> usize {
        let deadline = std::time::Instant::now() + self.call_wait;
        let mut calls = self.calls.lock();
        while let Some(&n) = calls.get(run) {
            if stopped() || std::time::Instant::now() >= deadline {
                return n;
            }
            let slice = (std::time::Instant::now() + Duration::from_millis(100)).min(deadline);
            self.call_ended.wait_until(&mut calls, slice);
        }
        0
    }

    /// The masking rules of the daemon's `retrace.toml`: a run records a literal rule as its
    /// value's digest, and its sessions take the value from these.
    pub fn with_mask_rules(mut self, rules: retrace_core::mask::MaskRules) -> RunHost {
        self.mask_rules = rules;
        self
    }

    /// What its sessions price model tokens at (`[prices]` of the daemon's `retrace.toml`).
    pub fn with_prices(mut self, prices: Arc<retrace_core::prices::PriceTable>) -> RunHost {
        self.prices = prices;
        self
    }

    /// The autonomy policy the side effects of recorded runs answer to (SPEC §7: only in
    /// record; the runtime reads no policy in replay or fork).
    pub fn with_autonomy(mut self, governor: Option<Arc<retrace_runtime::autonomy::Governor>>) -> RunHost {
        self.autonomy = governor;
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The session of `run_id`, opening it on first use.
    pub fn session(&self, run_id: &str) -> Result<Session, HostError> {
        self.session_for(run_id, None)
    }

    /// [`RunHost::session`], opened (if it isn't yet) on behalf of `revealer`: the caller a
    /// replay's originals are handed to, as the audit log names them.
    pub fn session_for(&self, run_id: &str, revealer: Option<Revealer>) -> Result<Session, HostError> {
        if let Some(slot) = self.runs.lock().get(run_id) {
            return match slot {
                Slot::Open(s) => Ok(s.clone()),
                Slot::Finished => Err(HostError::Finished(run_id.to_owned())),
            };
        }
        // One opening at a time: of two sessions opened at once for one record run, the
        // second would be refused its lease (each writer holds as its own holder), and the
        // call that raced it would fail instead of sharing the first.
        let _opening = self.opening.lock();
        match self.runs.lock().get(run_id) {
            Some(Slot::Open(s)) => return Ok(s.clone()),
            Some(Slot::Finished) => return Err(HostError::Finished(run_id.to_owned())),
            None => {}
        }
        let meta = self.store.run(run_id).map_err(|_| HostError::UnknownRun(run_id.to_owned()))?;
        let session = self.open(&meta, revealer)?;
        if let Some(limit) = meta.max_body {
            self.body_limits.lock().insert(run_id.to_owned(), usize::try_from(limit).unwrap_or(usize::MAX));
        }
        self.runs.lock().insert(run_id.to_owned(), Slot::Open(session.clone()));
        Ok(session)
    }

    /// The request body limit `run_id` keeps, once its session is open: the limit it was
    /// recorded with, when that was not the default; `None`: the daemon's own.
    pub fn body_limit(&self, run_id: &str) -> Option<usize> {
        self.body_limits.lock().get(run_id).copied()
    }

    fn open(&self, meta: &RunMeta, revealer: Option<Revealer>) -> Result<Session, HostError> {
        // `record --chaos SEED` shuffles deliveries on the daemon's bus too.
        let options = SessionOptions {
            stall_timeout: self.stall_timeout,
            chaos_seed: meta.chaos_seed,
            mask_key: self.mask_key.clone(),
            mask_rules: self.mask_rules.clone(),
            vault_key: self.vault_key.clone(),
            autonomy: self.autonomy.clone(),
            revealer,
            prices: self.prices.clone(),
            ..SessionOptions::default()
        };
        let recording = meta.mode == RunMode::Record && meta.status == RunStatus::Running;
        if recording && self.store.lease_holder(&meta.id).ok().flatten().is_none() {
            // Labelled before the session takes the run, whose copy of the run it finishes with.
            let mut meta = meta.clone();
            meta.labels.insert(RECORDER_LABEL.into(), RECORDER_DAEMON.into());
            let _ = self.store.update_run(&meta);
        }
        Session::join(self.store.clone(), &meta.id, options)
            .map_err(|source| HostError::Open { run: meta.id.clone(), source })
    }

    /// An agent of `run_id`.
    pub fn agent(&self, run_id: &str, agent: &str) -> Result<Agent, HostError> {
        Ok(self.session(run_id)?.agent(agent))
    }

    /// Whether this host has opened a session for `run_id`.
    pub fn hosts(&self, run_id: &str) -> bool {
        self.runs.lock().contains_key(run_id)
    }

    /// How many recorded steps the replay `run_id` has served so far; `None` when no session of
    /// it is open here.
    pub fn steps_served(&self, run_id: &str) -> Option<usize> {
        match self.runs.lock().get(run_id) {
            Some(Slot::Open(session)) => Some(session.replay_trace().len()),
            _ => None,
        }
    }

    /// Ends `run_id`'s session (opening it first if no call ever came, so a replay whose
    /// program made no call still checks what was left unconsumed), once the proxied calls it
    /// has in flight are stored: a program that stops reading a stream and exits leaves the
    /// call running to the upstream's end, and the run must hold it. Blocks: call it off the
    /// async runtime's workers.
    pub fn finish(
        &self,
        run_id: &str,
        outcome: Outcome,
    ) -> Result<Result<RunReport, RuntimeError>, HostError> {
        self.finish_unless(run_id, outcome, &|| false)
    }

    /// [`RunHost::finish`], waiting for the calls in flight only until `stopped()` holds (the
    /// user pressed Ctrl-C): the run is then stored `interrupted`, without them.
    pub fn finish_unless(
        &self,
        run_id: &str,
        outcome: Outcome,
        stopped: &dyn Fn() -> bool,
    ) -> Result<Result<RunReport, RuntimeError>, HostError> {
        let left = self.wait_for_calls(run_id, stopped);
        let session = self.session(run_id)?;
        self.runs.lock().insert(run_id.to_owned(), Slot::Finished);
        let report = session.finish(outcome);
        if left > 0 {
            // The run lacks those calls: it must not pass for a whole recording.
            if let Ok(mut meta) = self.store.run(run_id) {
                let why = if stopped() {
                    meta.status = RunStatus::Interrupted;
                    let (was, its, it_is) =
                        if left == 1 { ("was", "its", "it is") } else { ("were", "their", "they are") };
                    format!(
                        "stopped while {} {was} waiting for {its} upstream; {it_is} not recorded",
                        retrace_core::terminal::count(left, "proxied call"),
                    )
                } else {
                    meta.status = RunStatus::Failed;
                    let (was, its) = if left == 1 { ("was", "its") } else { ("were", "their") };
                    format!(
                        "{} {was} still waiting for {its} upstream {} s after the run ended, \
                         and not recorded",
                        retrace_core::terminal::count(left, "proxied call"),
                        self.call_wait.as_secs()
                    )
                };
                meta.labels.insert("failure".into(), why);
                let _ = self.store.update_run(&meta);
            }
        }
        Ok(report)
    }

    /// How long [`RunHost::finish`] waits for a run's calls in flight at most.
    pub fn call_wait(&self) -> Duration {
        self.call_wait
    }

    /// Whether `run_id` is hosted here and not finished.
    pub fn is_open(&self, run_id: &str) -> bool {
        matches!(self.runs.lock().get(run_id), Some(Slot::Open(_)))
    }

    /// Ends `run_id` as `interrupted`, saying `why`, if it is still running here: the process
    /// that would have finished it is gone ([`crate::processes::Processes::keep`]). What it
    /// recorded stays, as for a recorder that died.
    pub fn interrupt(&self, run_id: &str, why: &str) {
        if !self.is_open(run_id) || !self.store.run(run_id).is_ok_and(|m| m.status == RunStatus::Running) {
            return;
        }
        let _ = self.finish(run_id, Outcome::default());
        if let Ok(mut meta) = self.store.run(run_id) {
            meta.status = RunStatus::Interrupted;
            meta.labels.insert("failure".into(), why.to_owned());
            let _ = self.store.update_run(&meta);
        }
    }

    /// Marks `run_id` failed: recording failed closed (the store could not take an event).
    pub fn mark_failed(&self, run_id: &str, why: &str) {
        if let Ok(mut meta) = self.store.run(run_id) {
            if meta.status == RunStatus::Running {
                meta.status = RunStatus::Failed;
                meta.labels.insert("failure".into(), why.chars().take(500).collect());
                let _ = self.store.update_run(&meta);
            }
        }
    }
}
