//! `retrace gate PATH... [-- CMD]`: replay every trace under PATH, each in its own temporary
//! store, and fail on any divergence (issue 8, items 1–3).
//!
//! **In process, not a child `retrace replay`.** Each trace is replayed by
//! [`replay::execute`](crate::commands::replay::execute), the same function `retrace replay`
//! runs, called on a worker thread with the trace's temporary store passed in as a value. A
//! spawned `retrace replay` would work too, but (1) the gate needs the outcome as data (the
//! divergence with both keys, and the temporary store to read both requests from for the
//! hygiene report), which a child would have to print and the gate re-parse and re-open;
//! (2) every trace would pay for an exec, a store open, a mask-key resolution and a runtime
//! start on top of the program's own run, which matters against the 50 ms overhead budget;
//! (3) parallel jobs need different stores, and passing each its store and the child's
//! environment explicitly (never through this process's environment) is what makes them
//! independent. Each job still has its own embedded daemon on its own port, its own temporary
//! store and its own child process, whose output is captured (shown for a failed trace).
//!
//! The ledger's hook ([`crate::ledger::record_outcome`]) is called once per replayed trace with
//! the real store, never the temporary one.
mod accept;
mod discover;
mod hygiene;
mod job;
mod report;
mod temp;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Instant;

use retrace_core::terminal::shell_words;
use retrace_runtime::masking;
use retrace_store::{Store, StoreConfig};

pub(crate) use self::job::hints_for;
use self::job::{Outcome, Settings, Verdict};
use crate::commands::MaskSetup;
use crate::exit::{usage_hint, Failure};
use crate::ledger::{self, AgentOutcome};
use crate::output::{is_stdout, to_stderr, Progress};

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace gate tests/traces\n  \
         retrace gate tests/traces --junit target/gate.xml --jobs 4\n  \
         retrace gate tests/traces/checkout.jsonl -- python app.py --new-prompt\n  \
         retrace gate 01j5c3 01j5d8                      # runs of this store\n  \
         retrace gate tests/traces --accept --upstream-openai http://127.0.0.1:8100/v1\n  \
         retrace gate tests/traces --json | jq '.traces[] | select(.status != \"ok\")'"
    };
}

/// Replay recorded traces as tests: exit 1 if any diverges.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Replay every trace under PATH against the current code, each in its own temporary store, \
and fail if any diverges. PATH is a trace file written by `retrace export`, a folder, or a run id \
of this store. Every *.jsonl file under a folder (recursively, hidden folders skipped) is gated \
as a trace: one that can't be read as one (empty, cut short, another format, a Git LFS pointer \
not fetched) is an ERROR, never skipped, so keep other JSON Lines files out of the folders you \
gate. Files of other extensions are ignored.\n\n\
Each trace runs CMD (default: the trace's recorded command, from the same directory relative to \
the git top level, so traces replay from any clone) with zero live calls: the model upstreams \
point nowhere, every step is answered from the trace, and OPENAI_API_KEY / ANTHROPIC_API_KEY get \
placeholders when unset or empty, so official clients start in a CI without secrets. The folder of this \
retrace comes first on the program's PATH, so a recorded `retrace ...` command runs this build. \
The program's output is captured and its last lines shown when its trace fails. Traces that \
hold masked tokens need the mask key they were recorded under (RETRACE_MASK_KEY). A fork's or a \
replay's trace replays its source's log: gate it with its source's trace beside it (export both).\n\n\
Output: one line per trace (`ok` or `DIVERGED ... at seq N: agent A, expected KEY, got KEY, first \
differing path P`, with `hint:` lines saying what input was probably not captured: a clock read, \
a random id, an env var, unordered map iteration, a tool not wrapped, a prompt template whose text \
changed, a model alias), then a \
summary. --junit writes one test case per trace; --json prints everything for scripts, as one \
JSON document on standard output (the lines for people going to standard error).\n\n\
--accept re-records each diverging trace against live services (the trace's recorded upstreams, \
or --upstream-openai / --upstream-anthropic), writes it beside the old one as \
NAME.accepted.jsonl (never over an existing file) and prints what changed, as `retrace diff` \
does (with --json, in the document's `accepted` list: each trace's new file, run and diff, or \
why it was not accepted). Review it, then move it over the old trace. The gate still exits 1: \
the old traces still diverge. A re-recording that exits with another status than the trace's is \
not written (a missing API key, a program that failed), unless it exits 0: a program fixed to \
succeed. --accept refuses to run in CI (CI set to anything but empty, false, 0 or no) unless --force.\n\n\
Exit codes: 0 every trace replayed exactly; 1 a trace diverged (a step, the final decisions or \
the exit status); 2 a trace could not be replayed (not a trace, a program that can't be started, \
tokens under another mask key or none) or bad usage; 130 or 143 the gate was stopped (SIGINT, SIGTERM): \
the traces it was replaying are reported STOPPED, and the replay ledger is left as it was.",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// Trace files, folders of them, or run ids.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<String>,
    /// Write a JUnit XML report to FILE (`-`: standard output, the summary then going to
    /// standard error).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Replay N traces at once (default: the number of CPUs).
    #[arg(long, allow_negative_numbers = true, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub jobs: Option<u32>,
    /// Re-record each diverging trace against live services, as NAME.accepted.jsonl.
    #[arg(long)]
    pub accept: bool,
    /// Let --accept run in CI (CI=true, or any value but empty, false, 0 or no).
    #[arg(long, requires = "accept")]
    pub force: bool,
    /// Declare a stall when waiting steps make no progress for this many seconds.
    #[arg(long, allow_negative_numbers = true, value_name = "S", default_value_t = 30.0, value_parser = super::stall_seconds)]
    pub stall_timeout: f64,
    /// Stop a trace's program that runs longer than this many seconds, and report the trace as an
    /// error (default: ten times its recorded time, at least 120; 0: no limit). A wait outside
    /// Retrace's steps (a thread never joined) is no stall, and would hang the gate.
    #[arg(long, allow_negative_numbers = true, value_name = "S", value_parser = super::seconds)]
    pub timeout: Option<f64>,
    /// With --accept: the OpenAI-compatible upstream to record against.
    #[arg(long, value_name = "URL", requires = "accept")]
    pub upstream_openai: Option<String>,
    /// With --accept: the Anthropic-compatible upstream to record against.
    #[arg(long, value_name = "URL", requires = "accept")]
    pub upstream_anthropic: Option<String>,
    /// Fail a trace (exit 1) whose agent took its steps in another order than recorded: a
    /// replay matches an agent's steps by key (SPEC §7), so two side effects swapped are, without
    /// this, only a `note:` under the trace's line.
    #[arg(long)]
    pub strict_order: bool,
    /// Print the outcome (and --accept's) as one JSON document on standard output (the per-trace
    /// lines go to standard error).
    #[arg(long)]
    pub json: bool,
    /// The program to run instead of each trace's recorded command.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    // Folders a gate killed before it could remove them left behind (a mask key among them).
    temp::sweep_stale(&std::env::temp_dir());
    if let Some(ci) = std::env::var("CI").ok().filter(|v| in_ci(v)).filter(|_| args.accept && !args.force) {
        return Err(usage_hint(
            format!("refusing to run --accept under CI={ci}: it re-records traces against live services"),
            "accept on a workstation and commit the reviewed NAME.accepted.jsonl files; --force overrides",
        ));
    }
    if args.json && args.junit.as_deref().is_some_and(is_stdout) {
        return Err(usage_hint(
            "--json and --junit - would both write standard output",
            "write the JUnit report to a file (--junit target/gate.xml), or drop --json",
        ));
    }
    if let Some(path) = args.junit.as_deref().filter(|p| !is_stdout(p)) {
        // Before the traces replay, not after: a long gate shouldn't end on a typo.
        check_writable(path)?;
    }
    let began = Instant::now();
    // From here on a Ctrl-C stops the gate (exit 130), which then judges nothing.
    crate::launcher::signals::watch()?;
    let real_config = StoreConfig::from_env()?;
    let real: OnceLock<Arc<dyn Store>> = OnceLock::new();
    let traces = discover::find(&args.paths, || {
        if let Some(store) = real.get() {
            return Ok(store.clone());
        }
        // Only a store that exists: a mistyped RETRACE_HOME is said, not made (QA37 D1).
        let store = super::existing_store_from_env()?;
        Ok(real.get_or_init(|| store).clone())
    })?;
    let (mask, key_file, throwaway) = mask_setup(&real_config)?;
    let settings = Settings {
        command: args.command.clone(),
        stall_timeout: args.stall_timeout,
        strict_order: args.strict_order,
        timeout: args.timeout,
        mask,
        key_file,
        missing_key: throwaway.as_ref().map(|_| missing_key(&real_config)),
        real: real.get().cloned(),
        runs: discover::runs_of(&traces),
        path: program_path()?,
        env: std::env::vars().collect(),
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let jobs = args.jobs.map_or(cpus, |n| n as usize).clamp(1, traces.len().max(1));
    // With --json or `--junit -`, standard output carries the report alone: the lines of each
    // trace, the summary and what --accept did go to standard error.
    let junit_out = args.junit.as_deref().is_some_and(is_stdout);
    let people = match args.json || junit_out {
        true => Lines::ToStderr,
        false => Lines::ToStdout,
    };
    let outcomes = run_all(&traces, &settings, jobs, people)?;
    let seconds = began.elapsed().as_secs_f64();
    people.print(&report::summary(&outcomes, seconds, jobs))?;
    if junit_out {
        print_out(&report::junit(&outcomes, seconds))?;
    } else if let Some(path) = &args.junit {
        std::fs::write(path, report::junit(&outcomes, seconds)).map_err(|e| {
            usage_hint(format!("cannot write {}: {e}", path.display()), "check the --junit path")
        })?;
    }
    // Stopped by the user: its verdicts are incomplete, and a replay cut short says nothing
    // about an agent, so the ledger is left as it was.
    let stopped = crate::launcher::signals::received();
    let project = ledger::project(&std::env::current_dir()?);
    // The ledger is bookkeeping beside the verdicts: a store it can't write (read-only, locked,
    // full) is said once on standard error and doesn't turn a passing gate into a failing one.
    let mut unrecorded = 0;
    let mut first_error = None;
    // Clean replays first, divergences last: one gate's verdicts are one moment, and an agent
    // that diverged in it ends it with its streak broken, whatever the traces' names (QA26 D3:
    // a diverging trace sorted first was followed by clean ones that built the streak again).
    let (clean, diverged): (Vec<&Outcome>, Vec<&Outcome>) =
        outcomes.iter().partition(|o| !matches!(o.verdict, Verdict::Diverged { .. }));
    for outcome in clean.into_iter().chain(diverged).filter(|_| stopped.is_none()) {
        let judged = matches!(outcome.verdict, Verdict::Ok | Verdict::Diverged { .. });
        if let (Some(digest), true) = (&outcome.digest, judged) {
            if let Err(e) = ledger::record_outcome(&real_config, &project, digest, &agent_outcomes(outcome)) {
                unrecorded += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        to_stderr(&format!(
            "warning: the replay ledger was not updated for {unrecorded} trace(s): {e:#}\n  \
             hint: the verdicts stand; `retrace ledger` shows the ledger as it was before this gate\n"
        ));
    }
    // Before the JSON is printed, which holds what it did.
    let accepted = match (args.accept, stopped) {
        (true, None) => {
            let upstreams = accept::Upstreams {
                openai: args.upstream_openai.clone(),
                anthropic: args.upstream_anthropic.clone(),
            };
            Some(accept_all(&outcomes, &settings, &upstreams, people)?)
        }
        _ => None,
    };
    if args.json {
        // Through `print_out`: a closed standard output doesn't decide the exit code.
        let document = report::json(&outcomes, seconds, jobs, accepted.as_deref());
        let mut text = serde_json::to_string_pretty(&document)?;
        text.push('\n');
        crate::output::json_printed();
        print_out(&text)?;
    }
    if let Some(signal) = stopped {
        let tally = report::Tally::of(&outcomes);
        return Err(crate::exit::interrupted(
            signal,
            format!(
                "gate interrupted ({signal}): {} of {} traces not judged; the replay ledger was left as it was",
                tally.interrupted,
                outcomes.len()
            ),
        ));
    }
    let tally = report::Tally::of(&outcomes);
    let failure = |code: u8, message: String| Failure { code, message, hint: None, kind: None }.into();
    match (tally.errors, tally.diverged) {
        (0, 0) => Ok(()),
        (0, n) => Err(failure(1, format!("{n} of {} traces diverged", outcomes.len()))),
        (n, _) => Err(failure(2, format!("{n} of {} traces could not be replayed", outcomes.len()))),
    }
}

/// Where the lines for people go: standard output, unless it carries the `--json` document or
/// the `--junit -` report.
#[derive(Clone, Copy)]
enum Lines {
    ToStdout,
    ToStderr,
}

impl Lines {
    fn print(self, text: &str) -> anyhow::Result<()> {
        match self {
            Lines::ToStdout => print_out(text),
            Lines::ToStderr => {
                to_stderr(text);
                Ok(())
            }
        }
    }
}

/// Replays every trace on `jobs` threads; prints each trace's lines in trace order as soon as
/// they and every earlier trace are done.
fn run_all(
    traces: &[discover::Trace],
    settings: &Settings,
    jobs: usize,
    lines: Lines,
) -> anyhow::Result<Vec<Outcome>> {
    let next = AtomicUsize::new(0);
    let (done, results) = mpsc::channel::<(usize, Outcome)>();
    let mut slots: Vec<Option<Outcome>> = traces.iter().map(|_| None).collect();
    let mut progress = Progress::new("gate: traces replayed", traces.len() as u64);
    std::thread::scope(|scope| -> anyhow::Result<()> {
        for _ in 0..jobs {
            let (next, done) = (&next, done.clone());
            scope.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(trace) = traces.get(i) else { break };
                if done.send((i, job::run(trace, settings))).is_err() {
                    break;
                }
            });
        }
        drop(done);
        let mut printed = 0;
        for (i, outcome) in results {
            slots[i] = Some(outcome);
            progress.add(1);
            while let Some(Some(outcome)) = slots.get(printed) {
                progress.finish();
                lines.print(&report::trace_lines(outcome))?;
                printed += 1;
            }
        }
        Ok(())
    })?;
    progress.finish();
    Ok(slots.into_iter().map(|o| o.expect("every trace ran")).collect())
}

/// Prints to standard output. A reader that went away (`retrace gate traces | head`) only stops
/// the printing: the gate goes on, and its exit code is its verdict, never the broken pipe's 0,
/// so a CI script can't pass a diverged gate by cutting its report short.
fn print_out(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Re-records every diverging trace and prints where it went and what changed, or why not.
fn accept_all(
    outcomes: &[Outcome],
    settings: &Settings,
    upstreams: &accept::Upstreams,
    lines: Lines,
) -> anyhow::Result<Vec<accept::Report>> {
    let mut reports = Vec::new();
    for outcome in outcomes.iter().filter(|o| matches!(o.verdict, Verdict::Diverged { .. })) {
        let announce = || {
            to_stderr(&format!(
                "retrace: re-recording {} against live services: {}\n",
                outcome.trace.name,
                shell_words(&outcome.command)
            ))
        };
        let report = accept::accept(outcome, settings, upstreams, announce);
        lines.print(&report.text())?;
        reports.push(report);
    }
    Ok(reports)
}

/// Whether a `CI` variable's value says the gate runs in CI: CI services set it to `true`, `1`
/// or their own name (`woodpecker`); only an empty value, `false`, `0` or `no` says otherwise.
fn in_ci(value: &str) -> bool {
    !matches!(value.trim().to_ascii_lowercase().as_str(), "" | "false" | "0" | "no")
}

/// Checks that the `--junit` report can be written: opens it for writing, creating it (and
/// the folders it goes in: `target/` doesn't exist yet in a fresh clone) if need be and then
/// removing it again, so that a gate that fails before its report leaves no empty file behind.
/// An existing file is left as it is until the report replaces it.
fn check_writable(path: &Path) -> anyhow::Result<()> {
    let cannot = |e: std::io::Error| {
        usage_hint(format!("cannot write {}: {e}", path.display()), "check the --junit path")
    };
    crate::output::make_folder_of(path).map_err(cannot)?;
    match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(_) => std::fs::remove_file(path).map_err(cannot),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::OpenOptions::new().write(true).open(path).map(drop).map_err(cannot)
        }
        Err(e) => Err(cannot(e)),
    }
}

/// How each agent of a replayed trace fared, for the ledger.
fn agent_outcomes(outcome: &Outcome) -> Vec<AgentOutcome> {
    let diverged = match &outcome.verdict {
        Verdict::Diverged { divergence, .. } => Some(divergence),
        _ => None,
    };
    outcome
        .agents
        .iter()
        .map(|agent| AgentOutcome {
            agent: agent.clone(),
            clean: diverged.is_none(),
            divergence: diverged.filter(|d| &d.agent == agent).map(|d| match d.seq {
                Some(seq) => format!("{} at seq {seq}", d.code),
                None => d.code.to_string(),
            }),
            seq: diverged.filter(|d| &d.agent == agent).and_then(|d| d.seq),
        })
        .collect()
}

/// The mask key the replays use: `RETRACE_MASK_KEY`, else the real store's `mask.key` when it
/// exists (never generated there by a gate), else a throwaway key (only traces without tokens
/// replay under it). Also the key file to copy into each temporary store, and the folder that
/// holds a throwaway one (kept until the gate ends).
fn mask_setup(real: &StoreConfig) -> anyhow::Result<(MaskSetup, Option<PathBuf>, Option<tempfile::TempDir>)> {
    let rules = masking::rules_from_cwd()?;
    if std::env::var("RETRACE_MASK_KEY").is_ok_and(|v| !v.trim().is_empty()) {
        return Ok((MaskSetup { key: masking::resolve_key(real)?.key, rules }, None, None));
    }
    if let Some(file) = masking::home_of(real).map(|h| h.join(masking::MASK_KEY_FILE)).filter(|f| f.is_file())
    {
        return Ok((MaskSetup { key: masking::resolve_key(real)?.key, rules }, Some(file), None));
    }
    let dir = temp::dir("key-")?;
    let key = masking::resolve_key(&StoreConfig::in_home(dir.path()))?.key;
    let file = dir.path().join(masking::MASK_KEY_FILE);
    Ok((MaskSetup { key, rules }, Some(file), Some(dir)))
}

/// Where the mask key was looked for, when there is none: `RETRACE_MASK_KEY is unset and HOME
/// has no mask.key`.
fn missing_key(real: &StoreConfig) -> String {
    match masking::home_of(real) {
        Some(home) => {
            format!("RETRACE_MASK_KEY is unset and {} has no {}", home.display(), masking::MASK_KEY_FILE)
        }
        None => "RETRACE_MASK_KEY is unset (and the store is in memory)".into(),
    }
}

/// `PATH` for the programs: this executable's folder first.
fn program_path() -> anyhow::Result<String> {
    let exe = std::env::current_exe()?;
    let mut dirs: Vec<PathBuf> = exe.parent().map(|d| vec![d.to_path_buf()]).unwrap_or_default();
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    Ok(std::env::join_paths(dirs)?.to_string_lossy().into_owned())
}
