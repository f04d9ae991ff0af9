//! `retrace record -- CMD`: run a program with recording on; says the run id on standard error.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use retrace_core::run::{Command, RunMeta, RunMode, RunStatus};
use retrace_core::terminal::shell_words;
use retrace_runtime::env_sources::{new_run_id, Clock, SystemClock};

use super::store_from_env;
use crate::daemon::Embedded;
use crate::exit::usage;
use crate::launcher::{self, Child};
use crate::output::count;
use retrace_store::{LeaseHolder, Store};

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace record -- python app.py\n  \
         retrace record --upstream-openai http://127.0.0.1:8000/v1 -- python app.py\n  \
         retrace simulate &   # a stand-in model API on 127.0.0.1:8100, for the Rust example below\n  \
         retrace record --name nightly --label team=data --upstream-openai http://127.0.0.1:8100/v1 \\\n      \
         -- cargo run -p retrace-cli --example remote_agents"
    };
}

/// Run a program with recording on.
#[derive(Debug, Parser)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Run a program with recording on. An embedded daemon records every model call the program makes \
through its proxy (OPENAI_BASE_URL and ANTHROPIC_BASE_URL point at it, so the official clients \
need no change) and every step it takes through the Python SDK or the Rust runtime's \
`Session::from_env()`, which are clients of that daemon (RETRACE_URL): one run, one sequencer. \
The program's standard input, output and error pass through untouched; Retrace's own lines, \
the run id among them, go to standard error (--json adds the run as one line of JSON, the last \
of standard output). Exits with the program's status; SIGINT and SIGTERM are forwarded to the \
program. Replay it with `retrace replay RUN`.",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// A name for the run.
    #[arg(long)]
    name: Option<String>,
    /// A label `key=value` (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// Shuffle message deliveries (seeded) to flush out order-dependent bugs.
    #[arg(long, allow_negative_numbers = true, value_name = "SEED")]
    chaos: Option<u64>,
    /// OpenAI-compatible upstream, with /v1 (default: $OPENAI_BASE_URL, else api.openai.com).
    #[arg(long, value_name = "URL")]
    upstream_openai: Option<String>,
    /// Anthropic-compatible upstream (default: $ANTHROPIC_BASE_URL, else api.anthropic.com).
    #[arg(long, value_name = "URL")]
    upstream_anthropic: Option<String>,
    /// Seconds an upstream may take to answer, and between two chunks of a stream (more than 0).
    #[arg(long, allow_negative_numbers = true, value_name = "S", default_value_t = 600.0, value_parser = super::positive_seconds)]
    upstream_timeout: f64,
    /// Largest model request body the proxy accepts, in bytes (after decoding); a larger one
    /// gets 413 and is not recorded. The run keeps a limit other than the default: its replays
    /// and forks refuse the same requests.
    #[arg(long, allow_negative_numbers = true, value_name = "BYTES", default_value_t = 32 << 20)]
    max_body: usize,
    /// At the end, print the run as one line of JSON, the last of standard output:
    /// `run`, `status`, `events`, `exit_status`.
    #[arg(long)]
    json: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut labels = BTreeMap::new();
    for label in &args.labels {
        let (k, v) =
            label.split_once('=').ok_or_else(|| usage(format!("--label {label:?}: want KEY=VALUE")))?;
        labels.insert(k.to_owned(), v.to_owned());
    }
    if let Some(problem) = retrace_core::run::naming_problem(
        args.name.as_deref(),
        labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    ) {
        return Err(usage(problem));
    }
    let store = store_from_env()?;
    let args_json = args.json;
    if args_json {
        launcher::line_end::track();
    }
    let plan = Plan {
        store: store.clone(),
        name: args.name,
        labels,
        chaos: args.chaos,
        argv: args.command,
        cwd: std::env::current_dir()?,
        upstream_openai: args.upstream_openai,
        upstream_anthropic: args.upstream_anthropic,
        upstream_timeout: args.upstream_timeout,
        max_body: args.max_body,
        mask: super::mask_from_env()?,
        store_env: launcher::store_env()?,
        remove_env: Vec::new(),
        output: None,
    };
    let recorded = execute(plan, |id, plan| {
        eprintln!("retrace: recording run {id}: {}", shell_words(&plan.logged_argv()))
    })?;
    let (id, status) = (&recorded.id, recorded.exit_status);
    let Some(meta) = &recorded.meta else {
        eprintln!(
            "retrace: run {id} ended (exit status {status}) and was deleted at once by another process \
             (`retrace gc` or `retrace delete`)"
        );
        if args_json {
            let json =
                serde_json::json!({ "run": id, "status": null, "deleted": true, "exit_status": status });
            crate::output::print_json_line(&json)?;
        }
        std::process::exit(status);
    };
    let events = store.last_seq(id)?;
    // Standard output is the program's alone (SPEC §3): the id goes to standard error.
    eprintln!("retrace: run {id} {} ({}), exit status {status}", meta.status, count(events, "event"));
    let failure = meta.labels.get("failure");
    if let Some(why) = failure {
        // Why the run is `failed` or `interrupted` whatever the program's status (calls it left
        // that never ended, a step that couldn't be stored): the recording lacks them.
        eprintln!("retrace: warning: run {id} is {}: {why}", meta.status);
    }
    if let Some(pending) = meta.labels.get(retrace_runtime::session::PENDING_INTENTS) {
        let first = pending.split(' ').nth(1).unwrap_or("SEQ").to_owned();
        eprintln!(
            "retrace: warning: the program ended while a side effect ran: {pending} logged its intent but \
             not its completion. A replay stops there until you say what happened: retrace resolve {id} \
             {first} --outcome @FILE | --not-executed"
        );
    }
    if let Some((n, first)) = &recorded.refused {
        // Answered with the proxy's own error and never recorded (QA28 S4: the run read as a
        // program that took no step, and the note below blamed base_url).
        eprintln!(
            "retrace: note: the recording proxy refused {} of the program, for {}: {} not in the run \
             (the first: {first})",
            count(*n, "request"),
            if *n == 1 { "its body" } else { "their bodies" },
            if *n == 1 { "it is" } else { "they are" },
        );
    }
    if events == 0
        && failure.is_none()
        && status == 0
        && meta.status != RunStatus::Failed
        && recorded.refused.is_none()
    {
        // A program whose client sets its own base_url goes around the proxy: recorded as
        // nothing, its replay would make the live calls again and call that a match. One that
        // failed, or whose steps the store refused, has its own error above, and base_url is
        // the wrong lead there (QA23 D4, QA24 D5).
        eprintln!(
            "retrace: note: the program took no step through Retrace. If it calls a model, check that its \
             client doesn't set base_url itself (OPENAI_BASE_URL and ANTHROPIC_BASE_URL point at the \
             recording proxy), and that its other steps go through the SDK"
        );
    }
    if args_json {
        // One line, the last of standard output, whatever the program printed before it.
        let json =
            serde_json::json!({ "run": id, "status": meta.status, "events": events, "exit_status": status });
        crate::output::print_json_line(&json)?;
    }
    std::process::exit(status);
}

/// One recording to execute.
pub struct Plan {
    /// The store the run goes to.
    pub store: Arc<dyn Store>,
    /// The run's name.
    pub name: Option<String>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Chaos seed for deliveries.
    pub chaos: Option<u64>,
    /// The program.
    pub argv: Vec<String>,
    /// Where it runs.
    pub cwd: PathBuf,
    /// OpenAI-compatible upstream (None: [`crate::daemon::upstream`]'s default).
    pub upstream_openai: Option<String>,
    /// Anthropic-compatible upstream.
    pub upstream_anthropic: Option<String>,
    /// Seconds an upstream may take.
    pub upstream_timeout: f64,
    /// Largest model request body.
    pub max_body: usize,
    /// The mask key and the rules of new recordings.
    pub mask: super::MaskSetup,
    /// The variables that tell the program where `store` is.
    pub store_env: Vec<(String, String)>,
    /// Inherited variables the program must not see.
    pub remove_env: Vec<String>,
    /// Where the program's output goes; `None` passes it through.
    pub output: Option<PathBuf>,
}

impl Plan {
    /// The command line as logged and persisted: masked like any input.
    pub fn logged_argv(&self) -> Vec<String> {
        match retrace_runtime::masking::masker(self.mask.rules.clone(), Some(&self.mask.key)) {
            Ok(masker) => launcher::masked_argv(&self.argv, &masker),
            Err(_) => self.argv.clone(),
        }
    }
}

/// What a recording ended with.
#[derive(Debug)]
pub struct Recorded {
    /// The run's id.
    pub id: String,
    /// The run as stored at the end; `None` when another process deleted it (`gc`, `delete`)
    /// as soon as it ended, before this one read it back.
    pub meta: Option<RunMeta>,
    /// The program's exit status.
    pub exit_status: i32,
    /// The requests the proxy refused for their body (not in the recording): how many, and the
    /// first one's reason.
    pub refused: Option<(u64, String)>,
}

/// Records `plan.argv` as a new run: an embedded daemon records its proxied model calls and
/// serves its SDK steps, the Rust runtime's (`Session::from_env()` under `RETRACE_URL`) too. `started` is
/// called with the run id just before the program starts. `record` and `gate --accept` both
/// run through here.
pub fn execute(plan: Plan, started: impl FnOnce(&str, &Plan)) -> anyhow::Result<Recorded> {
    let store = plan.store.clone();
    let id = new_run_id();
    let mut meta = RunMeta::new(id.clone(), RunMode::Record, SystemClock.now_ms());
    meta.chaos_seed = plan.chaos;
    let mut config = super::serve::with_autonomy(super::serve::config_masked(
        plan.upstream_openai.clone(),
        plan.upstream_anthropic.clone(),
        30.0,
        plan.mask.clone(),
    )?)?;
    // The command line is persisted and logged like any input: masked (a key passed as a flag).
    let masker = retrace_runtime::masking::masker(config.mask_rules.clone(), config.mask_key.as_ref())?;
    let argv = launcher::masked_argv(&plan.argv, &masker);
    meta.command = Some(Command { argv, cwd: launcher::recorded_cwd_of(&plan.cwd) });
    // So are the run's name and labels.
    let mask = |text: &str| masker.mask_text(text).0.into_owned();
    meta.name = plan.name.as_deref().map(mask);
    meta.labels = plan.labels.iter().map(|(k, v)| (mask(k), mask(v))).collect();
    config.default_run = Some(id.clone());
    config.upstream_timeout = std::time::Duration::from_secs_f64(plan.upstream_timeout);
    // A limit other than the default is the run's: its replays and forks refuse what it refused.
    if plan.max_body != config.max_body {
        meta.max_body = Some(plan.max_body as u64);
    }
    config.max_body = plan.max_body;
    // Without credentials (`user:password@`, a key in the query): the proxy calls the URLs given.
    let stored = |url: &str| retrace_runtime::masking::stored_upstream(url, &masker);
    meta.upstreams.insert("openai".into(), stored(&config.upstream_openai));
    meta.upstreams.insert("anthropic".into(), stored(&config.upstream_anthropic));
    // A literal rule's value is the secret itself: the run records its digest.
    meta.masking_rules = config.mask_rules.sealed(config.mask_key.as_ref());
    meta.mask_key_fingerprint = config.mask_key.as_ref().map(|k| k.fingerprint());
    refuse_original_without_vault(&meta.masking_rules)?;
    store.create_run(&meta)?;
    // This process finishes the run: while it lives, no one takes the run (which holds no
    // lease until the program's first step) for one whose recorder died.
    store.keep_run(&id, &LeaseHolder::current())?;
    started(&id, &plan);
    let daemon = Embedded::start(store.clone(), config)?;
    let mut env = plan.store_env;
    env.extend(daemon.child_env());
    env.push(("RETRACE_MODE".into(), "record".into()));
    env.push(("RETRACE_RUN".into(), id.clone()));
    if let Some(seed) = plan.chaos {
        env.push(("RETRACE_CHAOS_SEED".into(), seed.to_string()));
    }
    let child = Child {
        argv: plan.argv,
        cwd: plan.cwd,
        env,
        remove_env: plan.remove_env,
        output: plan.output,
        time_limit: None,
    };
    let (status, stopped_by) = match launcher::run(&child) {
        // Stopped by the user or not, the program's status is the recording's (SPEC §3).
        Ok(ended) => (ended.status, ended.interrupted),
        Err(e) => {
            daemon.stop();
            launcher::discard_unstarted(store.as_ref(), &id)?;
            return Err(e);
        }
    };
    if daemon.hosts(&id) {
        // The daemon recorded the program's calls: it is the run's sequencer, and finishes it.
        match daemon.finish(&id, status) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => eprintln!("retrace: finishing run {id}: {e}"),
            Err(e) => eprintln!("retrace: finishing run {id}: {e:#}"),
        }
    }
    let refused = daemon.refused();
    daemon.stop();
    let mut meta = match store.run(&id) {
        Ok(meta) => meta,
        // Finished, then collected by another process at once: the program's status is still
        // the recording's (SPEC §3), and nothing is left to store.
        Err(e) if e.kind == retrace_store::StoreErrorKind::NotFound => {
            return Ok(Recorded { id, meta: None, exit_status: status, refused });
        }
        Err(e) => return Err(e.into()),
    };
    meta.exit_status = Some(status);
    if meta.status == RunStatus::Running && store.lease_holder(&id)?.is_none() {
        meta.status = if status == 0 { RunStatus::Ok } else { RunStatus::Failed };
    } else if meta.status == RunStatus::Ok && status != 0 {
        meta.status = RunStatus::Failed;
    }
    // Interrupted while calls the program had left waited for their upstream (below).
    let wait_interrupted = meta.status == RunStatus::Interrupted;
    // Stopped by the user (Ctrl-C, SIGTERM) and ended by it: the recording ends where the
    // program was stopped, which is what `interrupted` says (its replay serves the steps, then
    // stops at the end of the log); `failed` made its replay run the program on past that point
    // (QA23 S6). A program that caught the signal and exited 0 finished its run.
    if let (Some(signal), RunStatus::Failed) = (stopped_by, meta.status) {
        meta.status = RunStatus::Interrupted;
        meta.labels
            .entry("failure".into())
            .or_insert_with(|| format!("stopped by {signal} before the program ended"));
    }
    meta.finished_at_ms.get_or_insert(SystemClock.now_ms());
    store.update_run(&meta)?;
    if let (true, Some(signal)) = (wait_interrupted, launcher::signals::received()) {
        // Stopped while calls the program had left waited for their upstream: the user stopped
        // Retrace's wait, not the program (which had its own status), so the command ends as
        // one a signal stopped (README: exit 130 or 143).
        let why = meta.labels.get("failure").cloned().unwrap_or_default();
        return Err(crate::exit::interrupted(signal, format!("run {id} stored interrupted: {why}")));
    }
    Ok(Recorded { id, meta: Some(meta), exit_status: status, refused })
}

/// SPEC §7: a rule whose replay hands back the original needs the vault to hold originals.
pub(crate) fn refuse_original_without_vault(rules: &retrace_core::mask::MaskRules) -> anyhow::Result<()> {
    let original = rules.replaying_originals();
    let vault_key = std::env::var("RETRACE_VAULT_KEY").is_ok_and(|v| !v.trim().is_empty());
    if original.is_empty() || vault_key {
        return Ok(());
    }
    Err(usage(format!(
        "masking rule(s) {} say replay = \"original\", which needs the originals in the vault: set \
         RETRACE_VAULT_KEY (32 bytes, base64), or make those rules replay as \"token\"",
        original.join(", ")
    )))
}
