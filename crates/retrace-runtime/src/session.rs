//! The session: one run in record, replay or off mode. Record and replay run this same code; only
//! the edge differs (a live call and an append, or a lookup in the recorded log).
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use retrace_core::key::KeyConfig;
use retrace_core::lamport::LamportClock;
use retrace_core::mask::Masker;
use retrace_core::run::{Command, FinalDecision, RunMeta, RunMode, RunStatus};
use retrace_core::{Divergence, DivergenceCode};
use retrace_store::{LeaseHolder, RunWriter, Store, StoreConfig};

use crate::agent::Agent;
use crate::bus::Bus;
use crate::env_sources::{new_run_id, Clock, SystemClock};
use crate::error::{RuntimeError, RuntimeResult};
use crate::fork::ForkPlan;
use crate::fork_sched::ForkState;
use crate::matcher::RecordedLog;
use crate::scheduler::{Scheduler, SchedulerConfig};
use retrace_core::edit::Edit;

/// What a session does with each step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Run live and record.
    Record,
    /// Serve every output from the recorded log; run nothing live.
    Replay,
    /// Run live, record nothing.
    Off,
    /// Counterfactual replay: matched steps from the source, changed and new steps live (or
    /// cached, or dry-run), recorded as a fork run.
    Fork,
}

/// How to open a session.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Run name.
    pub name: Option<String>,
    /// Run labels.
    pub labels: BTreeMap<String, String>,
    /// The command being recorded, if known.
    pub command: Option<Command>,
    /// Which request fields keys ignore.
    pub keys: KeyConfig,
    /// The masking stage.
    pub masker: Masker,
    /// Wait for each event's acknowledgment before the step returns (default). When false, steps
    /// are pipelined and a store failure surfaces at the next step or at `finish`.
    pub wait_for_ack: bool,
    /// The wall clock read by `now()` in record.
    pub clock: Arc<dyn Clock>,
    /// Use this run id instead of a fresh one (record), or as the replay run's id (replay).
    pub run_id: Option<String>,
    /// Replay: every step waits for all earlier seqs (programs whose agents interact only through
    /// Retrace).
    pub strict: bool,
    /// Replay: how long waiting steps may go without progress before the run is a stall.
    pub stall_timeout: Duration,
    /// Record: shuffle deliveries and inject small delays, seeded (recorded with the run).
    pub chaos_seed: Option<u64>,
    /// Record under chaos: the largest delay injected before a message becomes deliverable.
    pub chaos_max_delay: Duration,
    /// Where `template()` finds `<name>/<version>.txt` (default: `RETRACE_PROMPTS` or `./prompts`).
    pub prompts_dir: std::path::PathBuf,
    /// Prices that give model calls their estimated cost when the live call reported none.
    pub prices: Arc<retrace_core::prices::PriceTable>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            name: None,
            labels: BTreeMap::new(),
            command: None,
            keys: KeyConfig::default(),
            masker: Masker::empty(),
            wait_for_ack: true,
            clock: Arc::new(SystemClock),
            run_id: None,
            strict: false,
            stall_timeout: Duration::from_secs(30),
            chaos_seed: None,
            chaos_max_delay: Duration::from_millis(20),
            prompts_dir: crate::template::default_prompts_dir(),
            prices: Arc::new(retrace_core::prices::PriceTable::builtin()),
        }
    }
}

/// Per-agent state kept by the session.
#[derive(Debug, Default)]
pub(crate) struct AgentState {
    pub(crate) clock: LamportClock,
    pub(crate) role: Option<String>,
    /// Deliveries taken since the agent's previous step.
    pub(crate) pending_inbound: Vec<u64>,
    /// The agent's latest delivery: the default causal parent of its steps.
    pub(crate) last_delivery: Option<u64>,
    /// The prompt template in force, stamped on model calls.
    pub(crate) prompt: Option<retrace_core::envelope::PromptRef>,
    /// The agent's template, `name@version`.
    pub(crate) template: Option<String>,
}

/// How the program ended, compared in replay.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The exit status, when the session knows it.
    pub exit_status: Option<i32>,
}

/// What `finish` reports.
#[derive(Clone, Debug, PartialEq)]
pub struct RunReport {
    /// The run that was recorded or the replay run.
    pub run_id: String,
    /// For a replay: the recorded run.
    pub source_run: Option<String>,
    /// Final status.
    pub status: RunStatus,
    /// Steps taken.
    pub steps: usize,
    /// Live calls made (0 in replay).
    pub live_calls: usize,
}

pub(crate) struct Inner {
    pub(crate) mode: Mode,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) writer: Option<RunWriter>,
    pub(crate) scheduler: Option<Arc<Scheduler>>,
    pub(crate) bus: Option<Bus>,
    /// The fork's edits (in a fork, and in a replay of a fork).
    pub(crate) plan: Option<Arc<ForkPlan>>,
    pub(crate) prompts_dir: std::path::PathBuf,
    pub(crate) prices: Arc<retrace_core::prices::PriceTable>,
    pub(crate) keys: KeyConfig,
    pub(crate) masker: Masker,
    pub(crate) wait_for_ack: bool,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) run: Mutex<RunMeta>,
    pub(crate) agents: Mutex<HashMap<String, Arc<Mutex<AgentState>>>>,
    pub(crate) decisions: Mutex<Vec<FinalDecision>>,
    pub(crate) holds_tokens: AtomicBool,
    pub(crate) steps: AtomicUsize,
    pub(crate) live_calls: AtomicUsize,
    finished: AtomicBool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("mode", &self.mode).field("run", &self.run.lock().id).finish()
    }
}

/// One run being recorded, replayed, or executed with recording off. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Session {
    pub(crate) inner: Arc<Inner>,
}

impl Session {
    /// Starts recording a new run.
    pub fn record(store: Arc<dyn Store>, options: SessionOptions) -> RuntimeResult<Session> {
        let id = options.run_id.clone().unwrap_or_else(new_run_id);
        let mut meta = RunMeta::new(id.clone(), RunMode::Record, options.clock.now_ms());
        meta.name = options.name.clone();
        meta.labels = options.labels.clone();
        meta.command = options.command.clone();
        meta.masking_rules = options.masker.rules().clone();
        meta.mask_key_fingerprint = options.masker.key_fingerprint();
        meta.chaos_seed = options.chaos_seed;
        store.create_run(&meta)?;
        let writer = RunWriter::open(store.clone(), &id, LeaseHolder::current())?;
        Ok(Session::build(Mode::Record, store, Some(writer), None, meta, options))
    }

    /// Replays `source` (a run id or unique prefix) exactly, as a new replay run.
    pub fn replay(store: Arc<dyn Store>, source: &str, options: SessionOptions) -> RuntimeResult<Session> {
        let mut source_meta = store.find_run(source)?;
        if source_meta.mode == RunMode::Replay {
            let of = source_meta.source_run.clone().ok_or_else(|| {
                RuntimeError::Usage(format!("replay run {} names no source run", source_meta.id))
            })?;
            source_meta = store.run(&of)?;
        }
        if source_meta.status == RunStatus::Running {
            if let Some(holder) = store.lease_holder(&source_meta.id)? {
                return Err(RuntimeError::Usage(format!(
                    "run {} is still being recorded by {}; replay it once it has finished",
                    source_meta.id, holder.0
                )));
            }
        }
        let log = RecordedLog::load(store.as_ref(), &source_meta.id)?;
        let id = options.run_id.clone().unwrap_or_else(new_run_id);
        let mut meta = match store.run(&id) {
            Ok(existing) if existing.mode == RunMode::Replay => existing,
            _ => {
                let mut m = RunMeta::new(id.clone(), RunMode::Replay, options.clock.now_ms());
                m.source_run = Some(source_meta.id.clone());
                m.command = options.command.clone().or_else(|| source_meta.command.clone());
                m.name = options.name.clone().or_else(|| source_meta.name.clone());
                store.create_run(&m)?;
                m
            }
        };
        meta.source_run = Some(source_meta.id.clone());
        meta.masking_rules = source_meta.masking_rules.clone();
        meta.mask_key_fingerprint = source_meta.mask_key_fingerprint.clone();
        let config = SchedulerConfig { strict: options.strict, stall_timeout: options.stall_timeout };
        let scheduler = Scheduler::new(log, config);
        store_divergence_when_found(&scheduler, &store, &meta.id);
        // A replay of a fork applies the fork's edits again, so its steps ask what the fork asked.
        let plan = match source_meta.mode {
            RunMode::Fork => Some(plan_of(store.as_ref(), &source_meta)?),
            _ => None,
        };
        let mut session = Session::build(Mode::Replay, store, None, Some(scheduler), meta, options);
        Arc::get_mut(&mut session.inner).expect("just built").plan = plan.map(Arc::new);
        session.inner.run.lock().labels.insert("source_status".into(), source_meta.status.to_string());
        Ok(session)
    }

    /// Executes fork run `fork_id` (created by [`Session::fork_new`] or `retrace fork`): the
    /// program re-runs from the start; steps matching the source get its recorded output, changed
    /// and new steps run (cached, live, or as a dry run), and the fork's own events are recorded
    /// from its fork point on.
    pub fn fork(store: Arc<dyn Store>, fork_id: &str, options: SessionOptions) -> RuntimeResult<Session> {
        let meta = store.find_run(fork_id)?;
        if meta.mode != RunMode::Fork {
            return Err(RuntimeError::Usage(format!("run {} is a {} run, not a fork", meta.id, meta.mode)));
        }
        let source = meta
            .source_run
            .clone()
            .ok_or_else(|| RuntimeError::Usage(format!("fork {} names no source run", meta.id)))?;
        let plan = plan_of(store.as_ref(), &meta)?;
        let log = RecordedLog::load(store.as_ref(), &source)?;
        let state = ForkState::new(plan.at, &log, &plan.swaps);
        let config = SchedulerConfig { strict: false, stall_timeout: options.stall_timeout };
        let scheduler = Scheduler::with_fork(log, config, Some(state));
        store_divergence_when_found(&scheduler, &store, &meta.id);
        let writer = RunWriter::open(store.clone(), &meta.id, LeaseHolder::current())?;
        let mut session = Session::build(Mode::Fork, store, Some(writer), Some(scheduler), meta, options);
        Arc::get_mut(&mut session.inner).expect("just built").plan = Some(Arc::new(plan));
        Ok(session)
    }

    /// Creates a fork of `source` at `at` (default: the smallest seq an edit names, or 1) with
    /// `edits`, and starts executing it. Edits that carry content must name stored blobs
    /// (`Content::Blob`); bad edits are usage errors that say why, and create nothing.
    pub fn fork_new(
        store: Arc<dyn Store>,
        source: &str,
        at: Option<u64>,
        edits: Vec<Edit>,
        options: SessionOptions,
    ) -> RuntimeResult<Session> {
        let source_meta = store.find_run(source)?;
        let at = at.unwrap_or_else(|| retrace_core::edit::default_fork_point(&edits));
        ForkPlan::new(at, edits.clone())
            .and_then(|p| p.validate(store.as_ref(), &source_meta.id))
            .map_err(|e| RuntimeError::Usage(e.to_string()))?;
        let id = options.run_id.clone().unwrap_or_else(new_run_id);
        let mut meta = RunMeta::new(id.clone(), RunMode::Fork, options.clock.now_ms());
        meta.source_run = Some(source_meta.id.clone());
        meta.fork_at = Some(at);
        meta.edits = edits.iter().map(ToString::to_string).collect();
        meta.name =
            options.name.clone().or_else(|| source_meta.name.as_ref().map(|n| format!("fork of {n}")));
        meta.command = options.command.clone().or_else(|| source_meta.command.clone());
        meta.chaos_seed = options.chaos_seed;
        meta.masking_rules = source_meta.masking_rules.clone();
        meta.mask_key_fingerprint = source_meta.mask_key_fingerprint.clone();
        store.create_run(&meta)?;
        Session::fork(store, &id, options)
    }

    /// A session that runs everything live and records nothing (`RETRACE_MODE=off`).
    pub fn off(store: Arc<dyn Store>, options: SessionOptions) -> Session {
        let meta = RunMeta::new(new_run_id(), RunMode::Record, options.clock.now_ms());
        Session::build(Mode::Off, store, None, None, meta, options)
    }

    /// Joins the run a launcher (`retrace record|replay -- CMD`) set up, from `RETRACE_MODE`
    /// (`record` default, `replay`, `off`), `RETRACE_RUN`, and `RETRACE_STORE` / `RETRACE_HOME`.
    ///
    /// In record, `RETRACE_RUN` names the run to record into (created when absent). In replay it
    /// names the replay run that the launcher created, which names its source; naming a recorded
    /// run directly starts a new replay of it.
    pub fn from_env() -> RuntimeResult<Session> {
        Session::from_env_with(SessionOptions::default())
    }

    /// [`Session::from_env`] with options for what the environment doesn't say (name, command,
    /// chaos...). `RETRACE_CHAOS_SEED` overrides `options.chaos_seed`.
    pub fn from_env_with(mut options: SessionOptions) -> RuntimeResult<Session> {
        if let Some(seed) = std::env::var("RETRACE_CHAOS_SEED").ok().and_then(|s| s.parse().ok()) {
            options.chaos_seed = Some(seed);
        }
        if let Some(secs) = std::env::var("RETRACE_STALL_TIMEOUT").ok().and_then(|s| s.parse::<f64>().ok()) {
            options.stall_timeout = Duration::from_secs_f64(secs.max(0.0));
        }
        if std::env::var("RETRACE_STRICT").is_ok_and(|v| v == "1" || v == "true") {
            options.strict = true;
        }
        let config = StoreConfig::from_env()?;
        let store = retrace_store::open_store(&config)?;
        let mode = std::env::var("RETRACE_MODE").unwrap_or_else(|_| "record".into());
        let run = std::env::var("RETRACE_RUN").ok().filter(|s| !s.is_empty());
        match mode.as_str() {
            "record" => match run {
                Some(id) => match store.run(&id) {
                    Ok(meta) if meta.status == RunStatus::Running && meta.mode == RunMode::Record => {
                        let writer = RunWriter::open(store.clone(), &id, LeaseHolder::current())?;
                        Ok(Session::build(Mode::Record, store, Some(writer), None, meta, options))
                    }
                    Ok(meta) => Err(RuntimeError::Usage(format!(
                        "RETRACE_RUN={id} is a {} run with status {}; record into a new run id",
                        meta.mode, meta.status
                    ))),
                    Err(_) => {
                        options.run_id = Some(id);
                        Session::record(store, options)
                    }
                },
                None => Session::record(store, options),
            },
            "replay" => {
                let id = run.ok_or_else(|| {
                    RuntimeError::Usage("RETRACE_MODE=replay needs RETRACE_RUN (the run to replay)".into())
                })?;
                let meta = store.find_run(&id)?;
                if meta.mode == RunMode::Replay {
                    let source = meta
                        .source_run
                        .clone()
                        .ok_or_else(|| RuntimeError::Usage(format!("replay run {id} names no source run")))?;
                    options.run_id = Some(meta.id.clone());
                    Session::replay(store, &source, options)
                } else {
                    Session::replay(store, &meta.id, options)
                }
            }
            "off" => Ok(Session::off(store, options)),
            "fork" => {
                let id = run.ok_or_else(|| {
                    RuntimeError::Usage(
                        "RETRACE_MODE=fork needs RETRACE_RUN (the fork run to execute)".into(),
                    )
                })?;
                Session::fork(store, &id, options)
            }
            other => {
                Err(RuntimeError::Usage(format!("RETRACE_MODE={other:?}: want record, replay, fork or off")))
            }
        }
    }

    fn build(
        mode: Mode,
        store: Arc<dyn Store>,
        writer: Option<RunWriter>,
        scheduler: Option<Arc<Scheduler>>,
        run: RunMeta,
        options: SessionOptions,
    ) -> Session {
        let bus = matches!(mode, Mode::Record | Mode::Off)
            .then(|| Bus::new(options.chaos_seed, options.chaos_max_delay));
        Session {
            inner: Arc::new(Inner {
                mode,
                store,
                writer,
                scheduler,
                bus,
                plan: None,
                prompts_dir: options.prompts_dir,
                prices: options.prices,
                keys: options.keys,
                masker: options.masker,
                wait_for_ack: options.wait_for_ack,
                clock: options.clock,
                run: Mutex::new(run),
                agents: Mutex::new(HashMap::new()),
                decisions: Mutex::new(Vec::new()),
                holds_tokens: AtomicBool::new(false),
                steps: AtomicUsize::new(0),
                live_calls: AtomicUsize::new(0),
                finished: AtomicBool::new(false),
            }),
        }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// The id of this session's run (the replay run, in replay).
    pub fn run_id(&self) -> String {
        self.inner.run.lock().id.clone()
    }

    /// In replay: the recorded run.
    pub fn source_run(&self) -> Option<String> {
        self.inner.run.lock().source_run.clone()
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// A handle for agent `id`; steps taken through it are that agent's. The agent counts as
    /// running until [`Agent::exit`] (replay uses this to detect stalls at once).
    pub fn agent(&self, id: &str) -> Agent {
        let state = self.inner.agents.lock().entry(id.to_owned()).or_default().clone();
        if let Some(s) = &self.inner.scheduler {
            s.agent_started(id);
        }
        Agent::new(self.clone(), id.to_owned(), state)
    }

    /// Runs agent `id` as a tokio task: `body` gets the agent's handle, and the agent exits when
    /// the task ends (successfully or not).
    pub fn spawn<F, Fut, T>(&self, id: &str, body: F) -> tokio::task::JoinHandle<RuntimeResult<T>>
    where
        F: FnOnce(Agent) -> Fut,
        Fut: std::future::Future<Output = RuntimeResult<T>> + Send + 'static,
        T: Send + 'static,
    {
        let agent = self.agent(id);
        let exit = agent.clone();
        let fut = body(agent);
        tokio::spawn(async move {
            let result = fut.await;
            exit.exit();
            result
        })
    }

    /// In replay: recorded seqs in the order replay released them.
    pub fn replay_trace(&self) -> Vec<u64> {
        self.inner.scheduler.as_ref().map(|s| s.trace()).unwrap_or_default()
    }

    /// Live calls made so far (always 0 in replay).
    pub fn live_calls(&self) -> usize {
        self.inner.live_calls.load(Ordering::Relaxed)
    }

    /// The divergence found so far, if any.
    pub fn divergence(&self) -> Option<Divergence> {
        self.inner.scheduler.as_ref().and_then(|s| s.divergence())
    }

    /// Waits until every recorded event is acknowledged (record); a no-op otherwise.
    pub fn flush(&self) -> RuntimeResult<()> {
        if let Some(w) = &self.inner.writer {
            w.flush()?;
        }
        Ok(())
    }

    /// Ends the run. Record: flushes, stores status, final decisions and exit status. Replay:
    /// checks that every recorded step was consumed, that the final decisions and the exit status
    /// match, stores the outcome, and returns the first divergence as an error.
    pub fn finish(&self, outcome: Outcome) -> RuntimeResult<RunReport> {
        if self.inner.finished.swap(true, Ordering::SeqCst) {
            return Err(RuntimeError::Usage("the session was already finished".into()));
        }
        match self.inner.mode {
            Mode::Record | Mode::Fork => self.finish_record(outcome),
            Mode::Replay => self.finish_replay(outcome),
            Mode::Off => Ok(self.report(RunStatus::Ok)),
        }
    }

    fn report(&self, status: RunStatus) -> RunReport {
        let run = self.inner.run.lock();
        RunReport {
            run_id: run.id.clone(),
            source_run: run.source_run.clone(),
            status,
            steps: self.inner.steps.load(Ordering::Relaxed),
            live_calls: self.live_calls(),
        }
    }

    fn finish_record(&self, outcome: Outcome) -> RuntimeResult<RunReport> {
        let writer = self.inner.writer.as_ref().expect("record sessions have a writer");
        let flushed = writer.flush();
        let divergence = self.divergence();
        let status = match (&flushed, outcome.exit_status) {
            _ if divergence.is_some() => RunStatus::Diverged,
            (Err(_), _) => RunStatus::Failed,
            (Ok(()), Some(code)) if code != 0 => RunStatus::Failed,
            _ => RunStatus::Ok,
        };
        let (_, head) = writer.head();
        let meta = {
            let mut run = self.inner.run.lock();
            run.status = status;
            run.divergence = divergence.as_ref().map(Divergence::to_json);
            run.exit_status = outcome.exit_status;
            run.decisions = self.inner.decisions.lock().clone();
            run.holds_tokens |= self.inner.holds_tokens.load(Ordering::Relaxed);
            run.finished_at_ms = Some(self.inner.clock.now_ms());
            run.head = head;
            run.clone()
        };
        self.inner.store.update_run(&meta)?;
        writer.release()?;
        flushed?;
        match divergence {
            Some(d) => Err(d.into()),
            None => Ok(self.report(status)),
        }
    }

    fn finish_replay(&self, outcome: Outcome) -> RuntimeResult<RunReport> {
        let scheduler = self.inner.scheduler.as_ref().expect("replay sessions have a scheduler");
        if scheduler.divergence().is_none() {
            if let Some(d) = self.ending_divergence(scheduler.log(), &outcome) {
                scheduler.diverge(d);
            }
        }
        let divergence = scheduler.divergence();
        let status = if divergence.is_some() { RunStatus::Diverged } else { RunStatus::Ok };
        let meta = {
            let mut run = self.inner.run.lock();
            run.status = status;
            run.exit_status = outcome.exit_status;
            run.decisions = self.inner.decisions.lock().clone();
            run.divergence = divergence.as_ref().map(Divergence::to_json);
            run.finished_at_ms = Some(self.inner.clock.now_ms());
            run.clone()
        };
        self.inner.store.update_run(&meta)?;
        match divergence {
            Some(d) => Err(d.into()),
            None => Ok(self.report(status)),
        }
    }

    fn ending_divergence(&self, log: &RecordedLog, outcome: &Outcome) -> Option<Divergence> {
        let leftovers = log.leftovers();
        if let Some((agent, first)) = leftovers.first() {
            let mut d = Divergence::new(DivergenceCode::StepsLeft, agent.clone())
                .at(first.seq)
                .step(first.label.clone())
                .keys(first.key, None);
            for (agent, step) in &leftovers {
                d = d.detail(format!(
                    "agent {agent:?}: first unconsumed step is seq {} ({})",
                    step.seq, step.label
                ));
            }
            return Some(d);
        }
        let run = self.inner.run.lock();
        let source = self.inner.store.run(run.source_run.as_deref().unwrap_or_default()).ok()?;
        drop(run);
        let now = self.inner.decisions.lock().clone();
        // Agents run concurrently, so decisions of different agents interleave however they
        // raced: only each agent's own order is part of the outcome.
        let per_agent = |ds: &[FinalDecision]| {
            let mut ds = ds.to_vec();
            ds.sort_by(|a, b| a.agent.cmp(&b.agent));
            ds
        };
        if per_agent(&now) != per_agent(&source.decisions) && !source.decisions.is_empty() {
            let render = |ds: &[FinalDecision]| {
                ds.iter()
                    .map(|d| {
                        format!(
                            "{}:{}{}",
                            d.agent,
                            d.action,
                            d.target.as_ref().map(|t| format!("@{t}")).unwrap_or_default()
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Some(
                Divergence::new(DivergenceCode::Decisions, "*")
                    .detail(format!("recorded: [{}]", render(&source.decisions)))
                    .detail(format!("replayed: [{}]", render(&now))),
            );
        }
        if let (Some(recorded), Some(now)) = (source.exit_status, outcome.exit_status) {
            if recorded != now {
                return Some(
                    Divergence::new(DivergenceCode::ExitStatus, "*")
                        .detail(format!("recorded exit status {recorded}, replay exited {now}")),
                );
            }
        }
        None
    }
}

/// Stores a replay's or fork's divergence the moment it is found, so a program that dies of it
/// still leaves its report behind.
fn store_divergence_when_found(scheduler: &Arc<Scheduler>, store: &Arc<dyn Store>, run_id: &str) {
    let store = store.clone();
    let run_id = run_id.to_owned();
    scheduler.on_divergence(Box::new(move |d| {
        if let Ok(mut run) = store.run(&run_id) {
            run.status = RunStatus::Diverged;
            run.divergence = Some(d.to_json());
            let _ = store.update_run(&run);
        }
    }));
}

/// The validated plan of a fork run, from its stored edits.
fn plan_of(store: &dyn Store, fork: &RunMeta) -> RuntimeResult<ForkPlan> {
    let source = fork.source_run.as_deref().unwrap_or_default();
    let edits = fork
        .edits
        .iter()
        .map(|e| e.parse::<Edit>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RuntimeError::Usage(format!("fork {}: {e}", fork.id)))?;
    ForkPlan::new(fork.fork_at.unwrap_or(1), edits)
        .and_then(|p| p.validate(store, source))
        .map_err(|e| RuntimeError::Usage(format!("fork {}: {e}", fork.id)))
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.mode != Mode::Record || self.finished.load(Ordering::SeqCst) {
            return;
        }
        // Never finished (panic or early return): keep what was acknowledged and mark the run.
        if let Some(writer) = &self.writer {
            let _ = writer.flush();
            let mut run = self.run.lock().clone();
            run.status = RunStatus::Interrupted;
            run.head = writer.head().1;
            let _ = self.store.update_run(&run);
            let _ = writer.release();
        }
    }
}
