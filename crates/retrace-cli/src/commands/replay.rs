//! `retrace replay RUN [-- CMD]`: exact replay of a run by running its program again.
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use retrace_core::run::{RunMeta, RunMode, RunStatus};
use retrace_core::terminal::shell_words;
use retrace_core::{Divergence, DivergenceCode};
use retrace_runtime::env_sources::{new_run_id, Clock, SystemClock};

use super::existing_store_from_env;
use crate::daemon::Embedded;
use crate::exit::{check_failed, interrupted, usage};
use crate::launcher::{self, Child};
use crate::output::print_json_line;
use retrace_server::host::{RECORDER_DAEMON, RECORDER_LABEL};
use retrace_store::{LeaseHolder, Store};

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace replay 01jd3k\n  \
         retrace replay 01jd3k -- ./target/release/my-agents --fixed-input"
    };
}

/// Replay a recorded run exactly, with zero live calls.
#[derive(Debug, Parser)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Replay a recorded run exactly: run its program again (by default the recorded command, from the \
same directory relative to the git top level) with zero live calls. Every step is answered from \
the log; a step the log doesn't hold, recorded steps left over, other final decisions or \
another exit status are a divergence (exit 1, report on standard error). A run still being \
recorded is refused until it has finished (exit 2). Stopped with Ctrl-C (SIGINT) or SIGTERM, the \
replay is stored `interrupted`, judged neither way, and retrace exits 130 or 143.",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// The run to replay (id or unique prefix).
    run: String,
    /// Declare a stall when waiting steps make no progress for this many seconds.
    #[arg(long, allow_negative_numbers = true, value_name = "S", default_value_t = 30.0, value_parser = super::stall_seconds)]
    stall_timeout: f64,
    /// Every step waits for all earlier seqs (programs whose agents interact only through Retrace).
    #[arg(long)]
    strict: bool,
    /// Print the outcome as one line of JSON, the last of standard output (after the
    /// program's own): `{"replay", "source", "status", "exit_status", "divergence", "hints"}`;
    /// `hints` says what input the program probably read without Retrace, as `gate` does.
    #[arg(long)]
    json: bool,
    /// The program to run instead of the recorded command.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.json {
        launcher::line_end::track();
    }
    let store = existing_store_from_env()?;
    let source = launcher::source_run(store.as_ref(), &args.run)?;
    // Refused before anything runs: the replay session would refuse every step.
    launcher::check_finished(store.as_ref(), &source, "replay")?;
    let (argv, cwd) = launcher::command_for(&source, &args.command)?;
    let program_dir = cwd.clone();
    let mask = super::mask_for_source(store.as_ref(), &source)?;
    let plan = Plan {
        store: store.clone(),
        source,
        argv,
        cwd,
        stall_timeout: args.stall_timeout,
        strict: args.strict,
        mask,
        store_env: launcher::store_env()?,
        remove_env: Vec::new(),
        output: None,
        time_limit: None,
    };
    let replayed = execute(plan, |id, plan| {
        eprintln!(
            "retrace: replaying {} as {id}: {} (in {})",
            plan.source.id,
            shell_words(&plan.logged_argv()),
            plan.cwd.display()
        )
    })?;
    let (id, status, outcome) = (&replayed.id, replayed.exit_status, &replayed.outcome);
    let parsed =
        outcome.divergence.as_ref().and_then(|d| serde_json::from_value::<Divergence>(d.clone()).ok());
    // What input the program probably read without Retrace, as `gate` says it.
    let hints = match (&parsed, replayed.interrupted) {
        (Some(d), None) => {
            let env: Vec<(String, String)> = std::env::vars().collect();
            super::gate::hints_for(store.as_ref(), &replayed.source.id, d, &env, &program_dir)
                .unwrap_or_default()
        }
        _ => Vec::new(),
    };
    if args.json {
        let hints: Vec<serde_json::Value> = hints
            .iter()
            .map(|h| serde_json::json!({"kind": h.kind(), "path": h.path, "message": h.message()}))
            .collect();
        print_json_line(&serde_json::json!({
            "replay": id, "source": replayed.source.id, "status": outcome.status, "exit_status": status,
            "divergence": outcome.divergence, "hints": hints,
        }))?;
    }
    let rendered = outcome.divergence.as_ref().map(|d| match &parsed {
        Some(parsed) => parsed.to_string(),
        None => d.to_string(),
    });
    match (replayed.interrupted, rendered) {
        (Some(signal), found) => {
            // The user stopped it: no verdict. A divergence found before then is shown, as found.
            if let Some(rendered) = found {
                eprint!("before it was stopped, the replay had found:\n{rendered}");
            }
            Err(interrupted(
                signal,
                format!(
                    "replay {id} of {} interrupted ({signal}): stopped before it could be judged, stored as \
                     interrupted",
                    replayed.source.id
                ),
            ))
        }
        (None, None) => {
            eprintln!("retrace: replay {id} ok: every step matched, exit status {status}");
            if let Some(said) = replayed.outcome.labels.get(retrace_runtime::session::REORDERED) {
                eprintln!(
                    "retrace: note: steps taken in another order than recorded (each matched by key): {said}"
                );
            }
            Ok(())
        }
        (None, Some(rendered)) => {
            eprint!("{rendered}");
            for hint in &hints {
                eprintln!("hint: {}", hint.message());
            }
            Err(check_failed(format!("replay {id} of {} diverged", replayed.source.id)))
        }
    }
}

/// One replay to execute: the run, the program and where it runs, the store it reads.
pub struct Plan {
    /// The store holding `source`; the replay run is created in it.
    pub store: Arc<dyn Store>,
    /// The run to replay (a record or fork run, not a replay).
    pub source: RunMeta,
    /// The program.
    pub argv: Vec<String>,
    /// Where it runs.
    pub cwd: PathBuf,
    /// Seconds without progress before a stall is declared.
    pub stall_timeout: f64,
    /// Every step waits for all earlier seqs.
    pub strict: bool,
    /// The mask key the daemon checks tokens under.
    pub mask: super::MaskSetup,
    /// The variables that tell the program where `store` is ([`launcher::store_env`]).
    pub store_env: Vec<(String, String)>,
    /// Inherited variables the program must not see (another store's location).
    pub remove_env: Vec<String>,
    /// Where the program's output goes ([`Child::output`]); `None` passes it through.
    pub output: Option<PathBuf>,
    /// How long the program may run ([`Child::time_limit`]); `None`: as long as it takes.
    pub time_limit: Option<std::time::Duration>,
}

impl Plan {
    /// The masker of the replay: the source's recorded rules (literal ones from today's
    /// `retrace.toml`) under the plan's key.
    fn masker(&self) -> retrace_runtime::RuntimeResult<retrace_core::mask::Masker> {
        retrace_runtime::masking::masker_with(
            self.source.masking_rules.clone(),
            &self.mask.rules,
            Some(&self.mask.key),
        )
    }

    /// The command line as logged and stored in the replay run: masked like any input, as
    /// `record` stores its own (a `-- CMD` given here may hold the secrets the recorded one
    /// had as tokens).
    pub fn logged_argv(&self) -> Vec<String> {
        match self.masker() {
            Ok(masker) => launcher::masked_argv(&self.argv, &masker),
            // Refused before anything runs ([`execute`]); today's rules alone meanwhile.
            Err(_) => match retrace_runtime::masking::masker(self.mask.rules.clone(), Some(&self.mask.key)) {
                Ok(masker) => launcher::masked_argv(&self.argv, &masker),
                Err(_) => vec!["(a command line that can't be masked)".to_owned()],
            },
        }
    }
}

/// What a replay ended with.
#[derive(Debug)]
pub struct Replayed {
    /// The replay run's id.
    pub id: String,
    /// The run replayed.
    pub source: RunMeta,
    /// The replay run as stored at the end: its status and divergence (None when it matched).
    pub outcome: RunMeta,
    /// The program's exit status.
    pub exit_status: i32,
    /// How long the program ran, from start to exit, seconds.
    pub program_seconds: f64,
    /// The signal the user stopped the replay with, if they did ([`launcher::Ended`]): the
    /// replay is stored `interrupted` and judged neither a match nor a divergence.
    pub interrupted: Option<nix::sys::signal::Signal>,
    /// How many recorded steps the program took (a replay run stores no events of its own).
    pub steps_taken: usize,
    /// The program ran past [`Plan::time_limit`] and was stopped.
    pub timed_out: bool,
}

/// Replays `plan.source` by running `plan.argv` with zero live calls: creates the replay run,
/// starts an embedded daemon whose upstreams point nowhere, runs the program with placeholder
/// API keys when none are set, and stores the outcome (SPEC §7). `started` is called with the
/// new run's id just before the program starts. `replay` and `gate` both run through here.
///
/// A run holding tokens made under another mask key, a fork whose source is not in the store,
/// or a program that can't be started (a missing program or working directory), is an error
/// (exit 2), and leaves no replay run; a divergence is not an error but the returned outcome,
/// and so is a replay the user stopped (SIGINT, SIGTERM): stored `interrupted`, unjudged.
pub fn execute(plan: Plan, started: impl FnOnce(&str, &Plan)) -> anyhow::Result<Replayed> {
    let store = plan.store.clone();
    let source = plan.source.clone();
    // From here on a Ctrl-C is the user stopping the replay, not the end of this process.
    launcher::signals::watch()?;
    // Refused before anything runs: tokens made under another key would never match.
    super::check_mask_key(&source, &plan.mask.key)?;
    launcher::check_vault_key(&source, "replay")?;
    // A literal rule recorded as its digest needs its value from today's retrace.toml.
    let masker = plan.masker().map_err(|e| usage(format!("can't replay {}: {e}", source.id)))?;
    // A fork imported without its source: every step would fail on the missing run.
    launcher::check_sources(store.as_ref(), &source)?;
    // A directory that isn't there (another checkout): said as such, and before a run exists.
    launcher::check_cwd(&plan.argv, &plan.cwd)?;
    let id = new_run_id();
    let mut meta = RunMeta::new(id.clone(), RunMode::Replay, SystemClock.now_ms());
    meta.source_run = Some(source.id.clone());
    meta.name = source.name.clone();
    meta.max_body = source.max_body;
    meta.command = Some(retrace_core::run::Command {
        argv: launcher::masked_argv(&plan.argv, &masker),
        cwd: launcher::recorded_cwd()?,
    });
    store.create_run(&meta)?;
    // This process finishes the run: while it lives, no one takes the run (a replay holds no
    // lease) for one whose launcher died, however long the program runs.
    store.keep_run(&id, &LeaseHolder::current())?;
    started(&id, &plan);
    // Replay makes no live call: the daemon's upstreams point nowhere.
    let nowhere = Some("http://127.0.0.1:9/replay-makes-no-live-calls".to_owned());
    let mut config =
        super::serve::config_masked(nowhere.clone(), nowhere, plan.stall_timeout, plan.mask.clone())?;
    config.default_run = Some(id.clone());
    // The request body limit the run was recorded with: what it refused is refused again.
    config.max_body = source.max_body.map_or(config.max_body, |n| usize::try_from(n).unwrap_or(usize::MAX));
    let daemon = Embedded::start(store.clone(), config)?;
    let mut env = plan.store_env.clone();
    env.extend(daemon.child_env());
    env.push(("RETRACE_MODE".into(), "replay".into()));
    env.push(("RETRACE_RUN".into(), id.clone()));
    env.push(("RETRACE_STALL_TIMEOUT".into(), plan.stall_timeout.to_string()));
    if plan.strict {
        env.push(("RETRACE_STRICT".into(), "1".into()));
    }
    // Unset or empty: a CI expands a secret it doesn't have (a fork's pull request) to "".
    for key in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"] {
        if std::env::var_os(key).is_none_or(|v| v.is_empty()) {
            env.push((key.into(), "retrace-replay-placeholder".into()));
        }
    }
    let child = Child {
        argv: plan.argv,
        cwd: plan.cwd,
        env,
        remove_env: plan.remove_env,
        output: plan.output,
        time_limit: plan.time_limit,
    };
    let program = std::time::Instant::now();
    let ended = match launcher::run(&child) {
        Ok(ended) => ended,
        Err(e) => {
            daemon.stop();
            launcher::discard_unstarted(store.as_ref(), &id)?;
            return Err(e);
        }
    };
    let (status, program_seconds) = (ended.status, program.elapsed().as_secs_f64());
    let steps_taken = daemon.steps_served(&id);
    if let Some(signal) = ended.interrupted {
        // Not finished: what the program left unconsumed, and its status, are the stop's doing.
        daemon.stop();
        let outcome = stopped(store.as_ref(), &id, status)?;
        return Ok(Replayed {
            id,
            source,
            outcome,
            exit_status: status,
            program_seconds,
            interrupted: Some(signal),
            steps_taken,
            timed_out: ended.timed_out,
        });
    }
    let recorded_by_daemon = source.labels.get(RECORDER_LABEL).map(String::as_str) == Some(RECORDER_DAEMON);
    let unfinished = store.run(&id)?.status == RunStatus::Running;
    if daemon.hosts(&id) || (recorded_by_daemon && unfinished) {
        // The daemon answered the program's calls (or should have): it checks what was left
        // unconsumed, the exit status, and stores the outcome.
        if let Err(e) = daemon.finish(&id, status) {
            eprintln!("retrace: finishing replay {id}: {e:#}");
        }
    }
    daemon.stop();
    let outcome = conclude(store.as_ref(), &id, &source, status)?;
    if outcome.status == RunStatus::Failed && outcome.divergence.is_none() {
        // The session could not serve the recording (a blob that fails its digest, a read
        // error): nothing was judged, so this is neither a match nor a divergence. A stored run
        // that verify finds damaged is a failed check (exit 1, as `verify` and `export` say of
        // it); anything else, an I/O error, is the store's (2).
        let problems = retrace_store::verify::verify_run(store.as_ref(), &source.id);
        let (code, found) = match problems.first() {
            Some(first) => (1, format!(": the stored run is damaged ({first})")),
            None => (2, String::new()),
        };
        return Err(crate::exit::Failure {
            code,
            message: format!(
                "replay {id} of {} failed: its recording could not be read to its end{found}",
                source.id
            ),
            hint: Some(format!("`retrace verify {}` says what is wrong with the stored run", source.id)),
            kind: (code == 1).then_some("corrupt"),
        }
        .into());
    }
    Ok(Replayed {
        id,
        source,
        outcome,
        exit_status: status,
        program_seconds,
        interrupted: None,
        steps_taken,
        timed_out: ended.timed_out,
    })
}

/// Stores the replay run the user stopped as `interrupted`, with the program's exit status. A
/// divergence its session stored before then stays in the record, for `retrace show`.
fn stopped(store: &dyn retrace_store::Store, id: &str, status: i32) -> anyhow::Result<RunMeta> {
    let mut meta = store.run(id)?;
    meta.exit_status = Some(status);
    meta.status = RunStatus::Interrupted;
    meta.finished_at_ms.get_or_insert(SystemClock.now_ms());
    store.update_run(&meta)?;
    Ok(meta)
}

/// The divergence of a replay that no session finished, if any: the recording ends early
/// (`log_ended`, an interrupted source, as a session's `finish` reports it), or steps are left
/// that the program never took. A recording with no step, replayed by a program that takes
/// none, is no divergence.
fn unfinished(
    store: &dyn retrace_store::Store,
    source: &RunMeta,
    status: i32,
) -> anyhow::Result<Option<Divergence>> {
    // A fork with no event of its own still holds the source's events before its fork point.
    let recorded = match (store.last_seq(&source.id)?, source.fork_at) {
        (0, Some(at)) => at.saturating_sub(1),
        (last, _) => last,
    };
    let ended_early = retrace_runtime::log_end::ends_early(source);
    if recorded == 0 && !ended_early {
        return Ok(None);
    }
    // SPEC §7 names the first step left of each agent: as no session said which it had taken,
    // they are the agents' first recorded steps.
    let firsts = first_steps(store, &source.id)?;
    let mut d = match (ended_early, firsts.first()) {
        (true, _) => retrace_runtime::log_end::log_ended("*", recorded).detail(format!(
            "the program exited with {} before its Retrace session finished",
            launcher::status_words(status)
        )),
        (false, Some(first)) => Divergence::new(DivergenceCode::StepsLeft, first.agent_id.clone())
            .at(first.seq)
            .step(first.label())
            .keys(Some(first.key), None),
        (false, None) => Divergence::new(DivergenceCode::StepsLeft, "*"),
    };
    if !ended_early {
        d = d.detail(format!(
            "the program exited with {} before its Retrace session finished, with steps \
             of the recording's {recorded} events left (did it stop early, or end without `finish`?)",
            launcher::status_words(status)
        ));
    }
    for e in &firsts {
        d = d.detail(format!(
            "agent {:?}: first unconsumed step is seq {} ({})",
            e.agent_id,
            e.seq,
            e.label()
        ));
    }
    Ok(Some(d))
}

/// The first recorded event of each agent of `run`, in seq order (the first pages only: a
/// report, not an audit).
fn first_steps(store: &dyn retrace_store::Store, run: &str) -> anyhow::Result<Vec<retrace_core::Event>> {
    let mut firsts: Vec<retrace_core::Event> = Vec::new();
    let mut pages = retrace_store::export::RunEvents::new(store, run)?;
    for _ in 0..8 {
        let Some(page) = pages.next_page()? else { break };
        for e in page {
            if !firsts.iter().any(|f| f.agent_id == e.agent_id) {
                firsts.push(e);
            }
        }
    }
    Ok(firsts)
}

/// Stores the replay run's final outcome once the program has exited.
fn conclude(
    store: &dyn retrace_store::Store,
    id: &str,
    source: &RunMeta,
    status: i32,
) -> anyhow::Result<RunMeta> {
    let mut meta = store.run(id)?;
    meta.exit_status = Some(status);
    // `failed`: the session could not read the recording; the program's exit status then says
    // nothing about the replay.
    if meta.divergence.is_none() && meta.status != RunStatus::Failed {
        // Still `running`: no session of the program finished the replay (none took a step
        // through Retrace, or one stopped before `finish`).
        let unfinished = match meta.status == RunStatus::Running {
            true => unfinished(store, source, status)?,
            false => None,
        };
        let d = unfinished.or_else(|| match source.exit_status {
            Some(recorded) if recorded != status => Some(
                Divergence::new(DivergenceCode::ExitStatus, "*")
                    .detail(format!("recorded exit status {recorded}, replay exited {status}")),
            ),
            _ => None,
        });
        if let Some(d) = d {
            meta.divergence = Some(d.to_json());
            meta.status = RunStatus::Diverged;
        }
    }
    if meta.status == RunStatus::Running {
        meta.status = RunStatus::Ok;
    }
    meta.finished_at_ms.get_or_insert(SystemClock.now_ms());
    store.update_run(&meta)?;
    Ok(meta)
}
