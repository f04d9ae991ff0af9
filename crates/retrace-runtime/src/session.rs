//! The session: one run in record, replay or off mode. Record and replay run this same code; only
//! the edge differs (a live call and an append, or a lookup in the recorded log).
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use retrace_core::key::KeyConfig;
use retrace_core::lamport::LamportClock;
use retrace_core::mask::{MaskKey, MaskRules, Masker};
use retrace_core::run::{Command, FinalDecision, RunMeta, RunMode, RunStatus};
use retrace_core::{Divergence, DivergenceCode};
use retrace_store::{LeaseHolder, RunWriter, Store, StoreConfig};

mod finish;
pub use finish::{PENDING_INTENTS, REORDERED};
mod open;

use crate::agent::Agent;
use crate::bus::Bus;
use crate::env_sources::{new_run_id, Clock, SystemClock};
use crate::error::{RuntimeError, RuntimeResult};
use crate::fork::ForkPlan;
use crate::fork_sched::ForkState;
use crate::masking;
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
    /// Record: the masking rules of a new run (recorded with it). Replay masks with the
    /// source's recorded rules, a fork with those plus these ([`crate::masking`]).
    pub mask_rules: MaskRules,
    /// The mask key tokens are made with; a run holding tokens made under another key is refused.
    pub mask_key: Option<MaskKey>,
    /// The vault key (`RETRACE_VAULT_KEY`): record seals masked originals into the vault under
    /// it; replay needs it where a rule hands back originals.
    pub vault_key: Option<retrace_core::vault::VaultKey>,
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
    /// Record: the autonomy policy side effects answer to (`None`: not governed).
    /// [`Session::from_env`] loads it from `./retrace.toml` when unset.
    pub autonomy: Option<Arc<crate::autonomy::Governor>>,
    /// Replay and fork: who is handed originals where a rule replays them, as the audit log
    /// names them (`None`: the OS user, acting as `admin` on a local store). The daemon sets
    /// the caller's token and role.
    pub revealer: Option<retrace_store::vault::Revealer>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            name: None,
            labels: BTreeMap::new(),
            command: None,
            keys: KeyConfig::default(),
            mask_rules: MaskRules::default(),
            mask_key: None,
            vault_key: None,
            wait_for_ack: true,
            clock: Arc::new(SystemClock),
            run_id: None,
            strict: false,
            stall_timeout: Duration::from_secs(30),
            chaos_seed: None,
            chaos_max_delay: Duration::from_millis(20),
            prompts_dir: crate::template::default_prompts_dir(),
            prices: Arc::new(retrace_core::prices::PriceTable::builtin()),
            autonomy: None,
            revealer: None,
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
    /// How many model calls of each key the agent has made in this run (recorded or forked):
    /// the n-th identical call has its own cache entry ([`crate::step`]'s `model_cache_key`).
    pub(crate) model_calls: std::collections::HashMap<retrace_core::Digest, u32>,
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
    /// The run's status when `finish` returned: `ok`, `failed` or `diverged` for a run this
    /// session ends.
    ///
    /// `running` for a session that joined a launcher's run (`retrace record|replay|fork --
    /// CMD`, where [`Session::from_env`] connects to the launcher's daemon): the program's
    /// `finish` does not end that run. The launcher ends it after the program exits, with its
    /// exit status, and only then judges what is left: recorded steps no process consumed,
    /// the final decisions and the exit status (another process of the same command may
    /// still take the steps this one left). So there an `Ok` from `finish` means no divergence
    /// was found so far, not that the replay matched: the launcher's exit code (1 on a
    /// divergence) is the verdict.
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
    /// Record and fork: where the originals masking replaced go (set when a vault key is).
    pub(crate) originals: Option<crate::vaulting::Originals>,
    /// Replay and fork: hands the program originals where a rule says `replay = "original"`.
    pub(crate) reveal: Option<crate::vaulting::Reveal>,
    pub(crate) wait_for_ack: bool,
    /// Record: the autonomy policy (SPEC §7: never read in replay or fork).
    pub(crate) autonomy: Option<Arc<crate::autonomy::Governor>>,
    /// Approvals already spent by this session's calls.
    pub(crate) spent: crate::approval::Spent,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) run: Mutex<RunMeta>,
    pub(crate) agents: Mutex<HashMap<String, Arc<Mutex<AgentState>>>>,
    pub(crate) decisions: Mutex<Vec<FinalDecision>>,
    pub(crate) holds_tokens: AtomicBool,
    pub(crate) steps: AtomicUsize,
    pub(crate) live_calls: AtomicUsize,
    /// Side effects whose intent is stored and whose completion isn't yet, by the intent's seq
    /// (its step's label): left at the end, the run says so (`pending_intents`).
    pub(crate) open_intents: Mutex<std::collections::BTreeMap<u64, String>>,
    finished: AtomicBool,
    /// With `RETRACE_URL`: the daemon's run every step goes to ([`crate::remote_session`]).
    /// Such a session holds no store, writer or scheduler of its own: the daemon is the run's
    /// one sequencer.
    pub(crate) remote: Option<Arc<crate::remote_session::RemoteRun>>,
}

impl Inner {
    /// A replay step's recorded output, as the program gets it ([`Inner::for_program`]). A
    /// store that can't serve it fails the replay ([`crate::matcher::RecordedLog::fail`]): the
    /// session ends `failed`, judging nothing, rather than as a divergence made of whatever
    /// the program did about the error.
    pub(crate) fn recorded_output(&self, digest: &retrace_core::Digest) -> RuntimeResult<Vec<u8>> {
        match self.store.get_blob(digest) {
            Ok(bytes) => self.for_program(bytes),
            Err(e) => {
                if let Some(scheduler) = &self.scheduler {
                    scheduler.log().fail(e.clone());
                    // Nothing can be judged past this: agents waiting on one another are released
                    // now, not after --stall-timeout (QA36 D1), and the run ends failed.
                    let d = retrace_core::Divergence::new(retrace_core::DivergenceCode::Stall, "*").detail(
                        format!("the replay failed: the store could not serve a recorded output: {e}"),
                    );
                    scheduler.diverge(d);
                }
                Err(e.into())
            }
        }
    }

    /// Recorded bytes as the program gets them: with originals where a rule says
    /// `replay = "original"` (replay and fork), else as stored.
    pub(crate) fn for_program(&self, bytes: Vec<u8>) -> RuntimeResult<Vec<u8>> {
        match &self.reveal {
            Some(reveal) => reveal.apply(self.store.as_ref(), bytes),
            None => Ok(bytes),
        }
    }
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

    /// In replay: whether the recorded run ends early, its recorder having died before it
    /// finished (SPEC §7): past its last event the replay stops with `log_ended`.
    pub(crate) fn source_ended_early(&self) -> bool {
        let run = self.inner.run.lock();
        run.labels.get(crate::log_end::SOURCE_STATUS_LABEL).map(String::as_str)
            == Some(RunStatus::Interrupted.as_str())
    }

    /// The store; `None` for a session of a daemon's run ([`Session::connect`]), whose store
    /// is the daemon's.
    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        match &self.inner.remote {
            Some(_) => None,
            None => Some(&self.inner.store),
        }
    }

    /// A handle for agent `id`; steps taken through it are that agent's. The agent counts as
    /// running until [`Agent::exit`] (replay uses this to detect stalls at once).
    pub fn agent(&self, id: &str) -> Agent {
        let state = self.inner.agents.lock().entry(id.to_owned()).or_default().clone();
        match (&self.inner.remote, &self.inner.scheduler) {
            (Some(remote), _) => remote.agent_started(id),
            (None, Some(s)) => s.agent_started(id),
            (None, None) => {}
        }
        Agent::new(self.clone(), id.to_owned(), state)
    }

    /// Sets agent `id`'s role, recorded on each of its events from now on, without starting
    /// the agent: how the daemon learns the role an SDK agent was declared with (its model calls
    /// through the proxy are then recorded with it too).
    pub fn set_role(&self, id: &str, role: &str) {
        let state = self.inner.agents.lock().entry(id.to_owned()).or_default().clone();
        state.lock().role = Some(role.to_owned());
    }

    /// Runs agent `id` as a tokio task: `body` gets the agent's handle, and the agent exits when
    /// the task ends: with a result, by a panic, or cancelled (the task aborted, or its runtime
    /// shut down).
    pub fn spawn<F, Fut, T>(&self, id: &str, body: F) -> tokio::task::JoinHandle<RuntimeResult<T>>
    where
        F: FnOnce(Agent) -> Fut,
        Fut: std::future::Future<Output = RuntimeResult<T>> + Send + 'static,
        T: Send + 'static,
    {
        let agent = self.agent(id);
        // Tokio catches a panic in the task, and a cancelled task's future is dropped without
        // finishing: the exit is made when the guard is dropped, so it happens either way, and
        // a replay's waiters on this agent are released at once instead of at the stall
        // timeout (SPEC §7).
        let exit = ExitOnDrop(agent.clone());
        let fut = body(agent);
        tokio::spawn(async move {
            let _exit = exit;
            fut.await
        })
    }

    /// In replay or a fork: holds the run's stall watchdog off while the guard lives, for an
    /// answer held back on purpose ([`crate::scheduler::Scheduler::hold`]). `None` when no
    /// scheduler runs (record).
    pub fn hold(&self) -> Option<crate::scheduler::Hold> {
        self.inner.scheduler.as_ref().map(Scheduler::hold)
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
        match &self.inner.remote {
            Some(remote) => remote.divergence(),
            None => self.inner.scheduler.as_ref().and_then(|s| s.divergence()),
        }
    }

    /// Waits until every recorded event is acknowledged (record); a no-op otherwise.
    pub fn flush(&self) -> RuntimeResult<()> {
        if let Some(w) = &self.inner.writer {
            w.flush()?;
        }
        Ok(())
    }
}

/// Declares its agent exited when dropped ([`Session::spawn`]).
struct ExitOnDrop(Agent);

impl Drop for ExitOnDrop {
    fn drop(&mut self) {
        self.0.exit();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.finished.load(Ordering::SeqCst) {
            return;
        }
        // Never finished (panic or early return): keep what was acknowledged and mark the run
        // `interrupted`, a recording or fork (which replays to where it ends) and a replay
        // (unjudged) alike; a daemon's run this session created, through the daemon.
        if let Some(remote) = &self.remote {
            remote.abandon();
            return;
        }
        let mut run = self.run.lock().clone();
        match &self.writer {
            Some(writer) => {
                let _ = writer.flush();
                run.status = RunStatus::Interrupted;
                run.head = writer.acknowledged().1;
                let _ = self.store.update_run(&finish::with_stored_tier(self.store.as_ref(), run));
                let _ = writer.release();
            }
            None if self.mode == Mode::Replay => {
                if let Ok(mut stored) = self.store.run(&run.id) {
                    if stored.status == RunStatus::Running {
                        stored.status = RunStatus::Interrupted;
                        let _ = self.store.update_run(&stored);
                    }
                }
            }
            None => {}
        }
    }
}
