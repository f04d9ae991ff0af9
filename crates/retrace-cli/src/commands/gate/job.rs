//! One trace through the gate: a temporary store, the trace imported into it, the program
//! replayed against it with its output captured, and the outcome with its hygiene hints.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use nix::sys::signal::Signal;
use retrace_core::export::ExportHeader;
use retrace_core::run::{RunMeta, RunMode, RunStatus};
use retrace_core::terminal::shell_words;
use retrace_core::{Digest, Divergence, DivergenceCode, EventType};
use retrace_runtime::masking;
use retrace_store::export::{export_run, RunEvents};
use retrace_store::import::{import_reader, ImportOptions};
use retrace_store::{open_store, Durability, Store, StoreConfig};

use super::discover::{check_header, Origin, Trace};
use super::hygiene::{self, Evidence, Hint};
use crate::commands::{replay, MaskSetup};
use crate::exit::{usage, usage_hint, Failure};
use crate::launcher;
use crate::output::count;

/// What every trace of one gate shares.
pub struct Settings {
    /// The program to run instead of each trace's recorded command.
    pub command: Vec<String>,
    /// Seconds without progress before a stall.
    pub stall_timeout: f64,
    /// The mask key (and rules) the replays check tokens under.
    pub mask: MaskSetup,
    /// The real store's `mask.key`, copied into each temporary store so that programs that
    /// open the store themselves (`Session::from_env()`) use the same key.
    pub key_file: Option<PathBuf>,
    /// Set when no mask key is configured, so that `mask` is a throwaway key: where the key was
    /// looked for (`RETRACE_MASK_KEY is unset and HOME has no mask.key`). A trace holding
    /// tokens is then refused saying so, never as a mismatch with the throwaway key.
    pub missing_key: Option<String>,
    /// The real store, for traces given as run ids.
    pub real: Option<Arc<dyn Store>>,
    /// The runs of the trace files found, by id ([`super::discover::runs_of`]).
    pub runs: std::collections::HashMap<String, Origin>,
    /// `PATH` for the programs, with this executable's folder first, so that a recorded
    /// `retrace …` command runs this build.
    pub path: String,
    /// This process's environment, for the hygiene report.
    pub env: Vec<(String, String)>,
    /// `--strict-order`: an agent's steps taken in another order than recorded diverge.
    pub strict_order: bool,
    /// `--timeout`: seconds a trace's program may run; `None`: ten times as long as it took
    /// when recorded, at least two minutes; `Some(0)`: no limit.
    pub timeout: Option<f64>,
}

/// How long a trace's program may run: `--timeout`, else ten times its recorded time, at least
/// two minutes (a replay answers from the log, so it is rarely slower than its recording).
fn time_limit(settings: &Settings, source: &RunMeta) -> Option<std::time::Duration> {
    let seconds = match settings.timeout {
        Some(s) if s <= 0.0 => return None,
        Some(s) => s,
        None => {
            let recorded = source.finished_at_ms.map_or(0, |end| end.saturating_sub(source.started_at_ms));
            (recorded as f64 / 1000.0 * 10.0).max(120.0)
        }
    };
    Some(std::time::Duration::from_secs_f64(seconds))
}

/// How a trace fared.
#[derive(Debug)]
pub enum Verdict {
    /// Every step, the final decisions and the exit status matched.
    Ok,
    /// The replay diverged.
    Diverged {
        /// The first divergence.
        divergence: Box<Divergence>,
        /// What was probably not captured, most likely first.
        hints: Vec<Hint>,
    },
    /// The trace could not be replayed: a bad file, a program that can't be started, a run
    /// holding tokens under another mask key (exit 2).
    Error {
        /// What went wrong.
        message: String,
        /// What to do about it.
        hint: Option<String>,
    },
    /// The user stopped the gate (SIGINT, SIGTERM) before this trace's replay ended, or before
    /// it started: neither a match nor a divergence (exit 128 + signal, the ledger untouched).
    Interrupted {
        /// The signal Retrace received.
        signal: Signal,
    },
}

/// One trace's result.
#[derive(Debug)]
pub struct Outcome {
    /// The trace.
    pub trace: Trace,
    /// The recorded run's id, once read.
    pub run_id: Option<String>,
    /// Events in the trace.
    pub steps: u64,
    /// Wall time for the whole trace (import, replay, report), seconds.
    pub seconds: f64,
    /// Of which the replayed program ran, seconds.
    pub program_seconds: f64,
    /// The program run.
    pub command: Vec<String>,
    /// The recording the trace holds ([`recording_of`]): the ledger counts each once.
    pub digest: Option<Digest>,
    /// The agents that took steps in the trace.
    pub agents: Vec<String>,
    /// The last lines the program wrote (standard output and error), for a failed trace.
    pub output_tail: Vec<String>,
    /// Which agents took steps in another order than recorded, if any did (the replay run's
    /// `reordered` label: matched by key, no divergence unless `--strict-order`).
    pub reordered: Option<String>,
    /// How it fared.
    pub verdict: Verdict,
}

/// Replays `trace` in its own temporary store.
pub fn run(trace: &Trace, settings: &Settings) -> Outcome {
    let started = Instant::now();
    let mut out = Outcome {
        trace: trace.clone(),
        run_id: None,
        steps: 0,
        seconds: 0.0,
        program_seconds: 0.0,
        command: Vec::new(),
        digest: None,
        agents: Vec::new(),
        output_tail: Vec::new(),
        reordered: None,
        verdict: Verdict::Ok,
    };
    // Once the user has stopped the gate, no trace starts.
    out.verdict = match launcher::signals::received() {
        Some(signal) => Verdict::Interrupted { signal },
        None => replay_trace(trace, settings, &mut out).unwrap_or_else(|e| error_verdict(&e)),
    };
    out.seconds = started.elapsed().as_secs_f64();
    out
}

fn error_verdict(err: &anyhow::Error) -> Verdict {
    match (err.downcast_ref::<Failure>(), launcher::signals::received()) {
        // Refused because the user stopped the gate first (the program was not started).
        (Some(f), Some(signal)) if f.code > 128 => Verdict::Interrupted { signal },
        (Some(f), _) => Verdict::Error { message: f.message.clone(), hint: f.hint.clone() },
        (None, _) => Verdict::Error { message: format!("{err:#}"), hint: None },
    }
}

/// What makes two trace files one recording: the run's id and the hash its event chain ends at
/// (which covers every event), not the file's bytes, so a copy re-serialized by a tool or with
/// CRLF line ends is the same trace to the ledger's "distinct traces".
fn recording_of(header: &retrace_core::export::ExportHeader) -> Digest {
    recording(&header.run.id, header.run.head, header.events)
}

/// [`recording_of`] the run `id` whose chain ends at `head` after `events` events.
fn recording(id: &str, head: Option<Digest>, events: u64) -> Digest {
    let head = head.map_or_else(|| "none".to_owned(), |h| h.to_string());
    Digest::of(format!("retrace-recording\n{id}\n{head}\n{events}").as_bytes())
}

/// The recording a trace checks, for the ledger's "distinct traces" (QA26 D1: each replay of one
/// recording, exported, counted as another trace, and an agent earned autonomy from one): a
/// replay run's trace replays its source, and a fork that edits nothing takes its source's
/// steps, so both count as that source (as stored here, or by its id alone when the gate has
/// only the fork); any other trace counts as itself.
fn checked_recording(
    store: &dyn Store,
    header: &retrace_core::export::ExportHeader,
    source: &RunMeta,
) -> anyhow::Result<Digest> {
    let of = |meta: &RunMeta| -> anyhow::Result<Digest> {
        Ok(recording(&meta.id, meta.head, store.last_seq(&meta.id)?))
    };
    if source.id != header.run.id {
        return of(source);
    }
    match (&header.run.source_run, header.run.mode) {
        (Some(from), RunMode::Fork) if header.run.edits.is_empty() => match store.run(from) {
            Ok(meta) => of(&meta),
            Err(_) => Ok(recording(from, None, 0)),
        },
        _ => Ok(recording_of(header)),
    }
}

fn replay_trace(trace: &Trace, settings: &Settings, out: &mut Outcome) -> anyhow::Result<Verdict> {
    let temp = super::temp::dir("")?;
    let bytes = trace_bytes(trace, settings)?;
    let header = header(&bytes)?;
    out.digest = Some(recording_of(&header));
    out.run_id = Some(header.run.id.clone());
    out.steps = header.events;
    if let Some(key) = &settings.key_file {
        let copy = temp.path().join(retrace_runtime::masking::MASK_KEY_FILE);
        std::fs::copy(key, &copy)?;
        std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    }
    // A throwaway store: nothing in it needs to survive a crash, so nothing waits for fsync.
    let config = StoreConfig { durability: Durability::Os, ..StoreConfig::in_home(temp.path()) };
    let store = open_store(&config)?;
    let options = ImportOptions { file_name: Some(trace.name.clone()), ..ImportOptions::default() };
    import_reader(&*store, &bytes[..], options).map_err(|e| crate::output::failure(2, &e))?;
    import_sources(&*store, trace, &header, settings)?;
    let source = launcher::source_run(&*store, &header.run.id)?;
    if source.status == RunStatus::Running {
        // A trace exported while its run was being recorded holds the recording in part: its
        // replay would end at `log_ended` whatever the program does, which says nothing about
        // the program. An input to fix, not a divergence.
        return Err(crate::exit::usage_hint(
            format!(
                "run {} was still being recorded when it was exported: the file holds the events \
                 stored up to then, not the whole recording",
                source.id
            ),
            format!(
                "once the recording has finished, export it again: retrace export {} -o {}",
                source.id, trace.name
            ),
        ));
    }
    if let Some(missing) = &settings.missing_key {
        crate::commands::refuse_tokens_without_key(&*store, &source, missing)?;
    }
    let original = source.masking_rules.replaying_originals();
    if source.holds_tokens && !original.is_empty() {
        // Its steps would fail one by one on originals no trace file carries.
        return Err(crate::exit::usage_hint(
            format!(
                "{}: its masking rule(s) {} hand the program the originals from the vault, which a \
                 trace file doesn't carry",
                trace.name,
                original.join(", ")
            ),
            "gate runs whose rules replay as \"token\"; replay this one in the store that recorded it \
             (`retrace replay RUN`, with RETRACE_VAULT_KEY)",
        ));
    }
    if source.id != header.run.id {
        // A replay run's trace replays its source: those are the steps it checks.
        out.steps = store.last_seq(&source.id)?;
    }
    out.digest = Some(checked_recording(&*store, &header, &source)?);
    let (argv, cwd) = launcher::command_for(&source, &settings.command)?;
    out.command = argv.clone();
    preflight(&argv, &cwd, &settings.path)?;
    let log = temp.path().join("program-output.log");
    let home = temp.path().to_string_lossy().into_owned();
    let program_dir = cwd.clone();
    let limit = time_limit(settings, &source);
    let plan = replay::Plan {
        store: store.clone(),
        source: source.clone(),
        argv,
        cwd,
        stall_timeout: settings.stall_timeout,
        strict: false,
        mask: settings.mask.clone(),
        store_env: vec![
            ("RETRACE_HOME".into(), home),
            ("RETRACE_DURABILITY".into(), "os".into()),
            ("PATH".into(), settings.path.clone()),
        ],
        remove_env: ["RETRACE_STORE", "RETRACE_BLOBS", "RETRACE_URL", "RETRACE_TOKEN"]
            .map(String::from)
            .to_vec(),
        output: Some(log.clone()),
        time_limit: limit,
    };
    // The program's last lines go into the JUnit file and --json, which CI keeps as artifacts:
    // masked like anything Retrace writes (QA12 S1).
    let result = replay::execute(plan, |_, _| {});
    out.output_tail = masked_tail(&log, 8, &source, settings);
    let replayed = result?;
    out.program_seconds = replayed.program_seconds;
    if let Some(signal) = replayed.interrupted {
        return Ok(Verdict::Interrupted { signal });
    }
    if replayed.timed_out {
        let recorded =
            source.finished_at_ms.map(|end| end.saturating_sub(source.started_at_ms) as f64 / 1000.0);
        return Ok(Verdict::Error {
            message: format!(
                "the program ran past the time limit of {:.0} s{} and was stopped: it hangs, or is far slower \
                 than recorded",
                limit.map_or(0.0, |l| l.as_secs_f64()),
                recorded.map_or(String::new(), |r| format!(" (recorded, it took {r:.1} s)")),
            ),
            hint: Some(
                "a wait outside Retrace's steps (a thread never joined, a blocking read, a sleep)? its last \
                 output is below; --timeout S sets the limit (0: none)"
                    .into(),
            ),
        });
    }
    let divergence = replayed.outcome.divergence.map(|d| {
        serde_json::from_value::<Divergence>(d.clone())
            .unwrap_or_else(|_| Divergence::new(DivergenceCode::StepMismatch, "*").detail(d.to_string()))
    });
    if let Some(d) = &divergence {
        let recorded_status = source.exit_status.unwrap_or(0);
        let never_started = matches!(d.code, DivergenceCode::StepsLeft | DivergenceCode::ExitStatus)
            && replayed.exit_status != 0
            && replayed.exit_status != recorded_status
            && out.steps > 0
            // What the program took, not the replay run's own events: it stores none (QA33 D1:
            // a program that crashed after its first steps was an error "before taking any").
            && replayed.steps_taken == 0;
        if never_started {
            // Not a change of trajectory but a program that could not run here (QA19 D4): as
            // every trace of a CI job missing the program's packages would fail this way, it is
            // an error to fix, not a regression of each trace (and not counted in the ledger).
            return Ok(Verdict::Error {
                message: format!(
                    "the program exited with status {} before taking any of the trace's {} (it recorded \
                     status {recorded_status}): it could not run as recorded",
                    replayed.exit_status,
                    count(out.steps, "step"),
                ),
                hint: Some(
                    "a missing package or module, a syntax error, another interpreter? its last output is \
                     below; install what the program needs where the gate runs, or fix it"
                        .into(),
                ),
            });
        }
    }
    out.reordered = replayed.outcome.labels.get(retrace_runtime::session::REORDERED).cloned();
    let strict_reorder = settings.strict_order && divergence.is_none() && out.reordered.is_some();
    let divergence = match (divergence, &out.reordered) {
        (None, Some(said)) if settings.strict_order => Some(out_of_order(said)),
        (d, _) => d,
    };
    let facts = read_run(&*store, &source.id, divergence.as_ref().and_then(|d| d.seq))?;
    out.agents = facts.agents.into_iter().collect();
    Ok(match divergence {
        None => Verdict::Ok,
        Some(d) => {
            // Nothing was left uncaptured: the program took the same steps in another order.
            let hints = match strict_reorder {
                true => Vec::new(),
                false => facts
                    .at
                    .map(|at| hints(&*store, &d, &at, &facts.outputs, &settings.env, &program_dir))
                    .unwrap_or_default(),
            };
            Verdict::Diverged { divergence: Box::new(d), hints }
        }
    })
}

/// The divergence `--strict-order` makes of a replay run's `reordered` label: at the first
/// agent's step taken early, naming the step it went before.
fn out_of_order(said: &str) -> Divergence {
    let first = said.split("; ").next().unwrap_or(said);
    let agent = first
        .strip_prefix("agent ")
        .and_then(|rest| serde_json::Deserializer::from_str(rest).into_iter::<String>().next())
        .and_then(Result::ok)
        .unwrap_or_else(|| "*".to_owned());
    let seq = first.split_once(": seq ").and_then(|(_, rest)| rest.split(' ').next()?.parse().ok());
    // Its own code: the recording holds the steps, taken in another order (QA33 D3: said as a
    // step_mismatch, "something the recording does not hold").
    let mut d = Divergence::new(DivergenceCode::OutOfOrder, agent)
        .detail(format!("--strict-order: steps taken in another order than recorded: {said}"));
    if let Some(seq) = seq {
        d = d.at(seq);
    }
    d
}

/// The trace's bytes: the file, or the run exported from the real store.
pub(super) fn trace_bytes(trace: &Trace, settings: &Settings) -> anyhow::Result<Vec<u8>> {
    match &trace.origin {
        Origin::File(path) => {
            std::fs::read(path).map_err(|e| usage(format!("cannot read {}: {e}", path.display())))
        }
        Origin::Run(id) => {
            let store =
                settings.real.as_ref().ok_or_else(|| usage(format!("{id}: the store is not open")))?;
            // Exported now, a run still being recorded would be a trace cut short.
            launcher::check_finished(&**store, &store.run(id)?, "gate")?;
            let mut bytes = Vec::new();
            export_run(&**store, id, &mut bytes, &mut |_| {}).map_err(|e| crate::output::failure(2, &e))?;
            Ok(bytes)
        }
    }
}

/// Imports the run a fork (or a replay) re-executes, and its own source, and so on: from the
/// trace files found beside it, or from the real store for a run id.
fn import_sources(
    store: &dyn Store,
    trace: &Trace,
    of: &ExportHeader,
    settings: &Settings,
) -> anyhow::Result<()> {
    let mut next = of.run.source_run.clone();
    // The runs followed so far, each with the trace it came from: how the missing one is reached.
    let mut path: Vec<String> = vec![format!("{} is a {} of run", trace.name, of.run.mode)];
    while let Some(id) = next.take() {
        if store.run(&id).is_ok() {
            break;
        }
        let origin = match (&trace.origin, settings.runs.get(&id)) {
            (_, Some(found)) => found.clone(),
            (Origin::Run(_), None) => Origin::Run(id.clone()),
            (Origin::File(_), None) => {
                return Err(usage_hint(
                    format!("{} {id}, whose trace is not among the traces gated", path.join(" ")),
                    format!("export it beside this one (`retrace export {id} -o FILE`) and gate both"),
                ))
            }
        };
        let name = match &origin {
            Origin::File(file) => file.display().to_string(),
            Origin::Run(_) => "this store".to_owned(),
        };
        let source = Trace { name: format!("the source run {id}"), origin };
        let bytes = trace_bytes(&source, settings)?;
        let options = ImportOptions { file_name: Some(source.name.clone()), ..ImportOptions::default() };
        import_reader(store, &bytes[..], options).map_err(|e| crate::output::failure(2, &e))?;
        let source_header = header(&bytes)?;
        path.push(format!("{id} ({name}), itself a {} of run", source_header.run.mode));
        next = source_header.run.source_run;
    }
    Ok(())
}

/// The trace's header; a file that is not a trace (empty, cut, another format...) is an input
/// error saying why ([`check_header`]).
fn header(bytes: &[u8]) -> anyhow::Result<ExportHeader> {
    let end = bytes.iter().position(|b| *b == b'\n').map_or(bytes.len(), |i| i + 1);
    let value = check_header(&bytes[..end])
        .map_err(|not| usage_hint(format!("not a trace file: {}", not.reason), not.hint))?;
    let format = value["format"].as_str().unwrap_or_default();
    retrace_core::export::check_format(format).map_err(|e| usage(e.to_string()))?;
    serde_json::from_value(value).map_err(|e| usage(format!("line 1 is not a trace header: {e}")))
}

/// Refuses a program that can't be started, before anything runs: a missing executable, a
/// missing working directory, or an interpreter's missing script (exit 2, with the command).
fn preflight(argv: &[String], cwd: &Path, path: &str) -> anyhow::Result<()> {
    let shown = || format!("`{}` (in {})", shell_words(argv), cwd.display());
    // A recorded command runs in its directory relative to the git top level: outside the
    // checkout it was recorded in, that's the likely cause (QA23 S7), as replay says.
    let fix = "run retrace gate from the checkout the traces were recorded in (a recorded directory is \
               kept relative to the git top level), or pass the command after `--`";
    launcher::check_cwd(argv, cwd)?;
    let Some(program) = argv.first() else {
        return Err(usage_hint("no command to run", "put the program after `--`"));
    };
    let found = match program.contains('/') {
        true => cwd.join(program).is_file(),
        false => std::env::split_paths(path).any(|dir| dir.join(program).is_file()),
    };
    if !found && !program.contains('/') {
        // Looked up on PATH: the checkout is not the cause (QA33 D4: `python` on a CI image that
        // has only `python3`).
        return Err(usage_hint(
            format!("program not found: {} (`{program}` is on no folder of PATH)", shown()),
            format!(
                "install {program} where the gate runs, put it on PATH, or pass another command after `--`"
            ),
        ));
    }
    if !found {
        return Err(usage_hint(format!("program not found: {}", shown()), fix));
    }
    let name = Path::new(program).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let interpreter = ["python", "node", "bash", "sh", "ruby", "perl", "deno", "bun"].iter().any(|i| {
        name == *i || name.strip_prefix(i).is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
    });
    let script = argv[1..].iter().find(|a| !a.starts_with('-'));
    let scripty =
        |a: &str| [".py", ".js", ".mjs", ".ts", ".sh", ".rb", ".pl"].iter().any(|ext| a.ends_with(ext));
    if let Some(script) = script.filter(|s| interpreter && scripty(s)) {
        if !cwd.join(script).is_file() {
            return Err(usage_hint(format!("script not found: {script} for {}", shown()), fix));
        }
    }
    Ok(())
}

/// The last `n` lines of the program's output `path`, masked with the run's rules and this
/// checkout's. The last 64 KB are masked as one text before they are cut into lines, so a secret
/// that spans lines (a PEM private key) is found whole (QA27 D3: each line masked alone let a
/// key's body through).
pub(super) fn masked_tail(path: &Path, n: usize, source: &RunMeta, settings: &Settings) -> Vec<String> {
    const WINDOW: u64 = 64 << 10;
    let mut text = Vec::new();
    if let Ok(mut file) = std::fs::File::open(path) {
        use std::io::{Read, Seek, SeekFrom};
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = file.seek(SeekFrom::Start(len.saturating_sub(WINDOW)));
        let _ = file.take(WINDOW).read_to_end(&mut text);
    }
    let text = String::from_utf8_lossy(&text);
    let masker =
        masking::masker_with(source.masking_rules.clone(), &settings.mask.rules, Some(&settings.mask.key))
            .or_else(|_| masking::masker(settings.mask.rules.clone(), Some(&settings.mask.key)));
    let masked = match &masker {
        Ok(masker) => masker.mask_text(&text).0,
        // No masker can be built: nothing of the program's output is shown rather than its raw text.
        Err(_) => {
            return vec!["(the program's output is not shown: no masking rules could be built)".to_owned()]
        }
    };
    let lines: Vec<&str> = masked.lines().collect();
    lines[lines.len().saturating_sub(n)..].iter().map(|l| l.to_string()).collect()
}

/// What the gate reads of the recorded run: its agents, the event a divergence is at, and the
/// outputs its steps produced (for the hygiene report; only when there is a divergence).
struct RunFacts {
    agents: BTreeSet<String>,
    at: Option<retrace_core::Event>,
    outputs: Vec<Digest>,
}

/// Outputs read for the hygiene report, at most.
const MAX_OUTPUTS: usize = 2_000;

fn read_run(store: &dyn Store, run: &str, diverged_at: Option<u64>) -> anyhow::Result<RunFacts> {
    let mut facts = RunFacts { agents: BTreeSet::new(), at: None, outputs: Vec::new() };
    let mut pages = RunEvents::new(store, run)?;
    while let Some(page) = pages.next_page()? {
        for event in page {
            if !facts.agents.contains(&event.agent_id) {
                facts.agents.insert(event.agent_id.clone());
            }
            let Some(at) = diverged_at else { continue };
            if let Some(output) = event.output_ref.filter(|_| facts.outputs.len() < MAX_OUTPUTS) {
                facts.outputs.push(output);
            }
            if event.seq == at {
                facts.at = Some(event);
            }
        }
    }
    Ok(facts)
}

/// The hygiene hints for replay `d` of run `source`, whose program ran in `cwd` with `env`:
/// what input it probably read without Retrace. None when the divergence is at no recorded
/// step, or its requests can't be read.
pub(crate) fn hints_for(
    store: &dyn Store,
    source: &str,
    d: &Divergence,
    env: &[(String, String)],
    cwd: &Path,
) -> anyhow::Result<Vec<Hint>> {
    let facts = read_run(store, source, d.seq)?;
    Ok(facts.at.map(|at| hints(store, d, &at, &facts.outputs, env, cwd)).unwrap_or_default())
}

/// The hygiene hints for a step that didn't match: both requests compared whole.
fn hints(
    store: &dyn Store,
    d: &Divergence,
    at: &retrace_core::Event,
    outputs: &[Digest],
    env: &[(String, String)],
    cwd: &Path,
) -> Vec<Hint> {
    let json = |digest: Option<Digest>| -> Option<serde_json::Value> {
        serde_json::from_slice(&store.get_blob(&digest?).ok()?).ok()
    };
    let (Some(expected), Some(got)) = (json(at.request_ref), json(d.got_request)) else {
        return Vec::new();
    };
    let texts: Vec<String> = store
        .get_blobs(outputs)
        .unwrap_or_default()
        .into_iter()
        .filter(|b| b.len() <= 1 << 20)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect();
    // A template's text now: `prompts/NAME/VERSION.txt` under the program's folder, as the
    // runtime reads it (RETRACE_PROMPTS elsewhere).
    let template = at.prompt_template.as_ref().map(|p| {
        let now = p.id.split_once('@').and_then(|(name, version)| {
            let dir = retrace_runtime::template::default_prompts_dir();
            let file = if dir.is_absolute() { dir } else { cwd.join(dir) };
            std::fs::read(file.join(name).join(format!("{version}.txt"))).ok().map(|t| Digest::of(&t))
        });
        (p.id.as_str(), p.digest, now)
    });
    hygiene::diagnose(&Evidence {
        model_call: at.kind == EventType::ModelCall,
        expected: &expected,
        got: &got,
        snapshot_pinned: at.model.as_ref().map(|m| m.snapshot.is_some()),
        env,
        recorded_outputs: &texts,
        template,
    })
}
