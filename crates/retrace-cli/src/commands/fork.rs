//! `retrace fork RUN --edit ... [-- CMD]`: counterfactual replay of a run with one change.
use std::path::Path;
use std::sync::Arc;

use clap::Parser;
use retrace_core::canonical::canonicalize;
use retrace_core::edit::{Content, Edit};
use retrace_core::mask::Masker;
use retrace_core::run::{Command, RunMeta, RunMode, RunStatus};
use retrace_core::terminal::shell_words;
use retrace_runtime::env_sources::{new_run_id, Clock, SystemClock};
use retrace_runtime::fork::ForkPlan;
use retrace_store::diff::{diff_runs, DiffOptions, RunDiff};
use retrace_store::{BlobHint, LeaseHolder, Store};

use super::existing_store_from_env;
use crate::daemon::Embedded;
use crate::exit::{check_failed, interrupted, usage, usage_hint, Failure};
use crate::launcher::{self, Child};
use crate::output::count;
use crate::output::print_json_line;
use retrace_server::host::{RECORDER_DAEMON, RECORDER_LABEL};

mod many;
use many::fork_many;

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace fork 01jd3k --edit swap:14,17\n  \
         retrace fork 01jd3k --edit tool-output:9=@fixed.json -- ./target/release/agents\n  \
         retrace fork --runs all --edit model:reviewer=gpt-4o@gpt-4o-2024-08-06"
    };
}

/// Fork a run with one input changed; only what the change reaches runs.
#[derive(Debug, Parser)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Fork a run: re-run its program from the start with one input changed, serve every step the \
change doesn't reach from the source run at zero tokens, run changed and new steps (from the \
caches when possible; side effects only as dry runs), and report what moved.\n\n\
Edits (seqs are the source run's; --at defaults to the smallest seq an edit names, or 1):\n  \
swap:A,B                 deliveries A < B to one agent trade messages\n  \
message:SEQ=@FILE        replace a message body (SEQ: its send, or its delivery: the send counts)\n  \
tool-output:SEQ=@FILE    replace a tool call's recorded output\n  \
model-output:SEQ=@FILE   replace a model call's recorded output (for a proxied call, the JSON \
body the provider would return; a streamed one needs its recorded document)\n  \
prompt:AGENT=VERSION     template() hands the agent another version\n  \
model:AGENT=NAME[@SNAP]  rewrite the agent's model requests to another model: those the \
model can serve (its provider's, for a name that says it: gpt-..., claude-...; embedding \
requests for an embedding model, the others for any other)\n  \
param:AGENT.NAME=VALUE   set a sampling parameter of the agent's model requests (not its \
embedding requests): temperature, top_p, max_tokens, seed...; not model (use model:), \
messages, input, system or prompt (what is asked), nor stream\n\n\
Two edits of the same thing (one seq's output or message, one agent's prompt, model or \
parameter) are refused. An agent edit applies once its agent is past --at: one that changed \
none of the fork's steps is said, as a warning (and under \"warnings\" in the JSON), and so \
is an edit that masking changed: edits are stored masked like any input, so where an edit file \
(or a param: value) holds what a masking rule finds, the fork uses the token.\n\n\
A fork of a fork starts from that fork's world: its edits (and those it inherited) apply again, \
as they do in its replay, and the new edits go on top (one of the same target wins).\n\n\
The fork's id, its summary and (with --runs) one line per run go to standard error; the \
program's output is its own. With --runs, a run the edits don't fit (an agent that made no \
model call, say) is skipped with why, on its own line and under \"skipped\" in the JSON, and the \
others are forked. Exit codes: 0 every fork finished; 1 a fork's program failed or diverged or \
stopped; 2 bad usage (an edit that doesn't fit the run, or fits none of --runs; an unknown \
run).",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// The run to fork (id or unique prefix); omit with --runs.
    run: Option<String>,
    /// The first seq the fork re-decides (default: the smallest seq an edit names, a message
    /// edit's send for a delivery, or 1). One past the source's last seq inherits every event:
    /// the program re-runs with nothing changed, and whatever it does beyond them is new.
    #[arg(long, allow_negative_numbers = true, value_name = "SEQ")]
    at: Option<u64>,
    // The help is a string, not a doc comment: rustdoc would read `[@SNAP]` as a link.
    #[arg(
        long = "edit",
        value_name = "EDIT",
        help = "An edit (repeatable): swap:A,B, message:SEQ=@FILE, tool-output:SEQ=@FILE, \
                model-output:SEQ=@FILE, prompt:AGENT=VERSION, model:AGENT=NAME[@SNAP], \
                param:AGENT.NAME=VALUE (each explained under --help)"
    )]
    edits: Vec<String>,
    /// Fork many runs with the same edits (edits that name no seq): `all`, `name~TEXT` or
    /// `label:KEY=VALUE` (recorded runs only, not forks or replays), a comma-separated list of
    /// run ids (forks too), or a folder of exported traces (each imported into the store first,
    /// if it isn't there, and said so).
    #[arg(long, value_name = "PATH|QUERY", conflicts_with = "run")]
    runs: Option<String>,
    /// Shuffle deliveries of new messages (seeded).
    #[arg(long, allow_negative_numbers = true, value_name = "SEED")]
    chaos: Option<u64>,
    /// Declare a stall when waiting steps make no progress for this many seconds.
    #[arg(long, allow_negative_numbers = true, value_name = "S", default_value_t = 30.0, value_parser = super::stall_seconds)]
    stall_timeout: f64,
    /// OpenAI-compatible upstream for steps that run live.
    #[arg(long, value_name = "URL")]
    upstream_openai: Option<String>,
    /// Anthropic upstream for steps that run live.
    #[arg(long, value_name = "URL")]
    upstream_anthropic: Option<String>,
    /// Print the outcome as one line of JSON, the last of standard output (after the
    /// program's own): `{"fork", "status", "exit_status", "divergence", "diff", "warnings"}`; with
    /// --runs, the summary of every fork
    /// (`{"forks", "runs", "runs_with_moved_decisions", "forks_not_finished", "skipped"}`).
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
    // Edit files are masked like any input: with the fork's rules (the source's plus today's).
    let source = args.run.as_deref().map(|r| launcher::source_run(store.as_ref(), r));
    let mask = match &source {
        Some(Ok(source)) => super::mask_for_source(store.as_ref(), source)?,
        _ => super::mask_from_env()?,
    };
    let rules = match source {
        Some(Ok(source)) => retrace_runtime::masking::fork_rules(&source.masking_rules, &mask.rules).0,
        _ => mask.rules.clone(),
    };
    let masker = retrace_runtime::masking::masker_with(rules, &mask.rules, Some(&mask.key))?;
    let (edits, masked) = parse_edits(store.as_ref(), &args.edits, &masker)?;
    // Said before the fork runs, as record and replay warn before the program starts (QA14
    // S5); kept at the head of the outcome's warnings for --json, and not said again.
    for warning in &masked {
        eprintln!("warning: {warning}");
    }
    match (&args.run, &args.runs) {
        (Some(run), None) => {
            let mut outcome = fork_one(&store, run, &edits, &args)?;
            outcome.warnings.splice(0..0, masked.iter().cloned());
            report_one(&outcome, args.json, masked.len())
        }
        (None, Some(query)) => fork_many(&store, query, &edits, &args, &masked),
        _ => Err(usage_hint("name a run to fork, or --runs", "retrace fork RUN --edit EDIT")),
    }
}

/// Reads every `@FILE` edit, stores its (canonical, masked) JSON as a blob and names the blob
/// instead; masks what other edits say in their own text. Also returns a warning for each edit
/// that masking changed: the program (or the provider) gets tokens there.
fn parse_edits(
    store: &dyn Store,
    texts: &[String],
    masker: &Masker,
) -> anyhow::Result<(Vec<Edit>, Vec<String>)> {
    let (mut edits, mut warnings) = (Vec::new(), Vec::new());
    for text in texts {
        let edit: Edit = text.parse().map_err(|e| usage(format!("{e}")))?;
        let edit = match edit.content() {
            Some(Content::File(path)) => {
                let bytes = std::fs::read(Path::new(path))
                    .map_err(|e| usage(format!("edit {text}: reading {path}: {e}")))?;
                let canonical = canonicalize(&bytes)
                    .map_err(|e| usage(format!("edit {text}: {path} is not JSON: {e}")))?;
                let masked = masker.mask_json(&canonical);
                if masked.tokens > 0 {
                    // Stored masked, like any input; but a message or output the fork hands
                    // the program is what it stored, so the program gets the tokens.
                    warnings.push(format!(
                        "edit {text}: {} of {path} matched a masking rule and {} stored as \
                         tokens: the program gets the tokens, not the values as written",
                        count(masked.tokens, "value"),
                        if masked.tokens == 1 { "is" } else { "are" }
                    ));
                }
                let digest = store.put_blob(&masked.bytes, BlobHint::Raw)?;
                edit.with_content(Content::Blob(digest))
            }
            // What an edit says in its own text is stored in the fork's metadata: masked too.
            _ => {
                let (stored, tokens) = retrace_runtime::masking::masked_edit(&edit, masker);
                if tokens > 0 {
                    warnings.push(retrace_runtime::masking::masked_edit_warning(&stored, tokens));
                }
                stored
            }
        };
        edits.push(edit);
    }
    Ok((edits, warnings))
}

/// `message` with each edit as the user typed it (`tool-output:3=@out.json`), where it names
/// the stored blob its file became (`tool-output:3=@sha256:…`): `typed` are the `--edit`
/// arguments, each of `stored` the edits they became, in the same order.
fn as_typed(message: String, typed: &[String], stored: &[&[Edit]]) -> String {
    let mut message = message;
    for edits in stored {
        for (text, edit) in typed.iter().zip(edits.iter()) {
            if matches!(edit.content(), Some(Content::Blob(_))) {
                message = message.replace(&edit.to_string(), text);
            }
        }
    }
    message
}

/// A `model-output` edit of a model call the proxy recorded must be what the proxy serves: a
/// recorded HTTP response (`retrace-http/1`). An edit that is a plain JSON body (what the
/// provider returns, as a user writes it) of a whole, non-streamed response is stored as a 200
/// response with that body; for a streamed response the edit must be a recorded document.
fn as_recorded_responses(store: &dyn Store, source: &str, edits: &[Edit]) -> anyhow::Result<Vec<Edit>> {
    use retrace_server::proxy::document::{Recorded, RecordedBody};
    let mut out = Vec::with_capacity(edits.len());
    for edit in edits {
        let (Edit::ModelOutput { seq, content: Content::Blob(blob) }, Some(recorded)) =
            (edit, step_output(store, source, edit)?)
        else {
            out.push(edit.clone());
            continue;
        };
        let Ok(doc) = Recorded::decode(&recorded) else {
            out.push(edit.clone()); // an in-process model call's output: any JSON
            continue;
        };
        let given = store.get_blob(blob)?;
        if Recorded::decode(&given).is_ok() {
            out.push(edit.clone());
            continue;
        }
        if matches!(doc.body, RecordedBody::Stream { .. }) {
            return Err(usage(format!(
                "edit model-output:{seq}: seq {seq} was a streamed response, so its edit must be a \
                 recorded response document (retrace-http/1 with chunks, as `retrace show {source} --seq {seq} \
                 --json` shows its output), not a plain body"
            )));
        }
        // The source response's headers (its request id, rate-limit headers: what a program may
        // log or read), but for those that describe the old body (QA28 S2: only content-type).
        let describes_body = |name: &str| {
            ["content-type", "content-length", "content-encoding", "transfer-encoding", "etag"]
                .iter()
                .any(|h| name.eq_ignore_ascii_case(h))
        };
        let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
        headers.extend(doc.headers.iter().filter(|(name, _)| !describes_body(name)).cloned());
        let wrapped = Recorded { status: 200, headers, body: RecordedBody::Whole(given.into()) };
        let digest = store.put_blob(&wrapped.encode(), BlobHint::Raw)?;
        out.push(Edit::ModelOutput { seq: *seq, content: Content::Blob(digest) });
    }
    Ok(out)
}

/// The stored output of the source step a `model-output` edit names, if it has one.
fn step_output(store: &dyn Store, source: &str, edit: &Edit) -> anyhow::Result<Option<Vec<u8>>> {
    let Edit::ModelOutput { seq, .. } = edit else { return Ok(None) };
    let mut pages = retrace_store::export::RunEvents::new(store, source)?;
    while let Some(page) = pages.next_page()? {
        if let Some(e) = page.iter().find(|e| e.seq == *seq) {
            return Ok(match e.output_ref {
                Some(blob) => Some(store.get_blob(&blob)?),
                None => None,
            });
        }
        if page.last().is_some_and(|e| e.seq > *seq) {
            break;
        }
    }
    Ok(None)
}

/// Each `prompt:AGENT=VERSION` edit names a template file the program will find, where that
/// can be told: when the template the agent used in the source run has a folder in the
/// program's prompts folder (`RETRACE_PROMPTS`, else `prompts/`, from its working directory
/// `cwd`), `VERSION` must be in it. Checked before the program runs, which would stop at the
/// agent's first `template()` and leave the other agents waiting until the stall timeout. A
/// program may keep its templates elsewhere (`SessionOptions::prompts_dir`; the pipeline demo
/// writes its own): without the folder there is nothing to check.
fn check_prompt_edits(store: &dyn Store, source: &str, edits: &[Edit], cwd: &Path) -> anyhow::Result<()> {
    let prompts: Vec<(&str, &str)> = edits
        .iter()
        .filter_map(|e| match e {
            Edit::Prompt { agent, version } => Some((agent.as_str(), version.as_str())),
            _ => None,
        })
        .collect();
    if prompts.is_empty() {
        return Ok(());
    }
    let mut used: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut pages = retrace_store::export::RunEvents::new(store, source)?;
    while let Some(page) = pages.next_page()? {
        for e in page {
            if let Some(name) = e.prompt_template.as_ref().and_then(|p| p.id.split_once('@')).map(|(n, _)| n)
            {
                used.entry(e.agent_id.clone()).or_insert_with(|| name.to_owned());
            }
        }
    }
    let dir = std::env::var_os("RETRACE_PROMPTS").map_or_else(|| cwd.join("prompts"), |d| cwd.join(d));
    for (agent, version) in prompts {
        let edit = format!("prompt:{agent}={version}");
        let Some(name) = used.get(agent) else {
            return Err(usage(format!(
                "can't fork {source}: {edit}: agent {agent:?} used no prompt template in the source run"
            )));
        };
        let path = dir.join(name).join(format!("{version}.txt"));
        if dir.join(name).is_dir() && !path.is_file() {
            let mut have: Vec<String> = std::fs::read_dir(dir.join(name))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|f| f.file_name().to_str()?.strip_suffix(".txt").map(str::to_owned))
                .collect();
            have.sort();
            return Err(usage_hint(
                format!("can't fork {source}: {edit}: there is no {}", path.display()),
                format!("the versions of {name} there: {}", have.join(", ")),
            ));
        }
    }
    Ok(())
}

/// What one fork did.
struct Forked {
    fork: RunMeta,
    diff: RunDiff,
    /// Agent edits that changed nothing ([`retrace_runtime::fork::unapplied`]).
    warnings: Vec<String>,
}

fn fork_one(store: &Arc<dyn Store>, run: &str, edits: &[Edit], args: &Args) -> anyhow::Result<Forked> {
    let source = launcher::source_run(store.as_ref(), run)?;
    // Its log is still growing: the fork would branch from whatever part of it is stored.
    launcher::check_finished(store.as_ref(), &source, "fork")?;
    let parsed = edits;
    let edits = &as_recorded_responses(store.as_ref(), &source.id, edits)?;
    let at = match args.at {
        Some(at) => at,
        None => retrace_runtime::fork::default_at(store.as_ref(), &source.id, edits)?,
    };
    retrace_runtime::fork::check_distinct(edits)
        .and_then(|()| ForkPlan::new(at, edits.to_vec()))
        .and_then(|p| p.validate(store.as_ref(), &source.id))
        .map_err(|e| {
            usage(as_typed(format!("can't fork {}: {e}", source.id), &args.edits, &[parsed, edits]))
        })?;
    launcher::check_vault_key(&source, "fork")?;
    let (argv, cwd) = launcher::command_for(&source, &args.command)?;
    launcher::check_cwd(&argv, &cwd)?;
    check_prompt_edits(store.as_ref(), &source.id, edits, &cwd)?;
    let id = new_run_id();
    let mut meta = RunMeta::new(id.clone(), RunMode::Fork, SystemClock.now_ms());
    meta.source_run = Some(source.id.clone());
    meta.fork_at = Some(at);
    meta.edits = edits.iter().map(ToString::to_string).collect();
    meta.name = source.name.as_ref().map(|n| format!("fork of {n}"));
    meta.chaos_seed = args.chaos;
    meta.max_body = source.max_body;
    let mask = super::mask_from_env()?;
    super::check_mask_key(&source, &mask.key)?;
    let (rules, added) = retrace_runtime::masking::fork_rules(&source.masking_rules, &mask.rules);
    if !added.is_empty() && !source.masking_rules.is_empty() {
        eprintln!("{}", retrace_runtime::masking::fork_rules_warning(&added));
    }
    meta.masking_rules = rules.sealed(Some(&mask.key));
    meta.mask_key_fingerprint = Some(mask.key.fingerprint());
    // Without credentials (`user:password@`, a key in the query): the proxy calls the URLs given.
    let stored_masker = retrace_runtime::masking::masker_with(rules, &mask.rules, Some(&mask.key))?;
    let stored = |url: &str| retrace_runtime::masking::stored_upstream(url, &stored_masker);
    // The command as stored and logged: masked like any input, as `record` stores its own.
    let logged = launcher::masked_argv(&argv, &stored_masker);
    meta.command = Some(Command { argv: logged.clone(), cwd: launcher::recorded_cwd()? });
    // The upstreams the fork calls: the flags, else the source's (stored as the source stored
    // them), so that a fork of this fork calls the same ones, not the public defaults (QA22 D1).
    for (provider, flag) in [("openai", &args.upstream_openai), ("anthropic", &args.upstream_anthropic)] {
        let url = flag.as_deref().map(stored).or_else(|| source.upstreams.get(provider).cloned());
        if let Some(url) = url {
            meta.upstreams.insert(provider.into(), url);
        }
    }
    store.create_run(&meta)?;
    // This process finishes the run: while it lives, no one takes the run (which holds no
    // lease until the program's first step) for one whose recorder died.
    store.keep_run(&id, &LeaseHolder::current())?;
    eprintln!(
        "retrace: forking {} at seq {at} as {id}: {} (in {})",
        source.id,
        shell_words(&logged),
        cwd.display()
    );
    // The fork's own daemon: its proxy and SDK steps belong to the fork run; changed and new
    // model calls go to the fork's upstreams (the flags, else the source's).
    let upstream = |flag: &Option<String>, provider: &str| {
        flag.clone().or_else(|| source.upstreams.get(provider).cloned())
    };
    let mut config = super::serve::with_prices(super::serve::config(
        upstream(&args.upstream_openai, "openai"),
        upstream(&args.upstream_anthropic, "anthropic"),
        args.stall_timeout,
    )?)?;
    config.default_run = Some(id.clone());
    // The request body limit the source was recorded with: what it refused is refused again.
    config.max_body = source.max_body.map_or(config.max_body, |n| usize::try_from(n).unwrap_or(usize::MAX));
    let daemon = Embedded::start(store.clone(), config)?;
    let mut env = launcher::store_env()?;
    env.extend(daemon.child_env());
    env.push(("RETRACE_MODE".into(), "fork".into()));
    env.push(("RETRACE_RUN".into(), id.clone()));
    env.push(("RETRACE_STALL_TIMEOUT".into(), args.stall_timeout.to_string()));
    if let Some(seed) = args.chaos {
        env.push(("RETRACE_CHAOS_SEED".into(), seed.to_string()));
    }
    let ended = match launcher::run(&Child { argv, cwd, env, ..Child::default() }) {
        Ok(ended) => ended,
        Err(e) => {
            daemon.stop();
            launcher::discard_unstarted(store.as_ref(), &id)?;
            return Err(e);
        }
    };
    let status = ended.status;
    let recorded_by_daemon = source.labels.get(RECORDER_LABEL).map(String::as_str) == Some(RECORDER_DAEMON);
    if daemon.hosts(&id) || (recorded_by_daemon && store.run(&id)?.status == RunStatus::Running) {
        if let Err(e) = daemon.finish(&id, status) {
            eprintln!("retrace: finishing fork {id}: {e:#}");
        }
    }
    daemon.stop();
    let mut fork = store.run(&id)?;
    fork.exit_status = Some(status);
    if fork.status == RunStatus::Running && store.lease_holder(&id)?.is_none() {
        fork.status = if status == 0 { RunStatus::Ok } else { RunStatus::Failed };
    }
    if ended.interrupted.is_some() && fork.status != RunStatus::Running {
        // The user stopped it: how it ended says nothing about the edits.
        fork.status = RunStatus::Interrupted;
    }
    fork.finished_at_ms.get_or_insert(SystemClock.now_ms());
    store.update_run(&fork)?;
    // The summary shows a few changed steps, cut short; the JSON is for scripts: every step, and
    // each whole diff, as `retrace diff --json` gives them.
    let options = match args.json {
        true => DiffOptions { limit: usize::MAX, max_diff_lines: usize::MAX },
        false => DiffOptions { limit: 10, max_diff_lines: 12 },
    };
    let diff = diff_runs(store.as_ref(), &source.id, &id, &options)?;
    let warnings = match edits.iter().any(|e| e.agent().is_some()) {
        true => retrace_runtime::fork::unapplied(edits, &store.events(&id, at, usize::MAX)?),
        false => Vec::new(),
    };
    Ok(Forked { fork, diff, warnings })
}

/// Reports one fork; the first `said` of its warnings were said before it ran.
fn report_one(outcome: &Forked, json: bool, said: usize) -> anyhow::Result<()> {
    let Forked { fork, diff, warnings } = outcome;
    if let (RunStatus::Interrupted, Some(signal)) = (fork.status, launcher::signals::received()) {
        return Err(interrupted(
            signal,
            format!("fork {} interrupted ({signal}): stopped before it finished", fork.id),
        ));
    }
    if json {
        print_json_line(&serde_json::json!({
            "fork": fork.id, "status": fork.status, "exit_status": fork.exit_status,
            "divergence": fork.divergence, "diff": diff, "warnings": warnings,
        }))?;
    } else {
        eprint!("{}", summary(diff));
    }
    for warning in warnings.iter().skip(said) {
        eprintln!("warning: {warning}");
    }
    match (&fork.status, &fork.divergence) {
        (RunStatus::Diverged, Some(d)) => {
            let parsed = serde_json::from_value::<retrace_core::Divergence>(d.clone()).ok();
            eprint!("{}", parsed.as_ref().map_or(d.to_string(), ToString::to_string));
            Err(check_failed(stopped(fork, parsed.as_ref())))
        }
        (RunStatus::Failed, _) => Err(check_failed(format!(
            "fork {} failed: the program exited with status {} (its output is above)",
            fork.id,
            exit_text(fork),
        ))),
        _ => Ok(()),
    }
}

/// Why a fork stopped, from its divergence: before the fork point, the program must ask what
/// the source asked; from there on, a stall, a pending side effect or a misuse stops it too.
fn stopped(fork: &RunMeta, d: Option<&retrace_core::Divergence>) -> String {
    let at = fork.fork_at.unwrap_or(1);
    match d {
        Some(d) if d.seq.is_some_and(|seq| seq < at) => format!(
            "fork {} stopped: the program diverged before the fork point (--at {at}), where it must \
             take the source's steps",
            fork.id
        ),
        Some(d) => format!("fork {} stopped: {} (above)", fork.id, d.code),
        None => format!("fork {} stopped: the program diverged (above)", fork.id),
    }
}

/// The decisions that moved, one line each; one decision that moved to another target reads as
/// one line (QA29 S4: two, keyed by target, `a on a2: (none) -> first` and `a on b1: first ->
/// (none)`).
fn decision_lines(moved: &[retrace_store::diff::MovedDecision]) -> Vec<String> {
    let target = |t: &Option<String>| t.clone().unwrap_or_else(|| "-".into());
    let action = |m: &retrace_store::diff::MovedDecision| m.a.clone().or_else(|| m.b.clone());
    let mut paired = vec![false; moved.len()];
    let mut lines = Vec::new();
    for (i, m) in moved.iter().enumerate() {
        if paired[i] {
            continue;
        }
        // Taken on one target in the source and on another in the fork: the same action.
        let partner = (m.a.is_some() != m.b.is_some())
            .then(|| {
                (i + 1..moved.len()).find(|&j| {
                    let n = &moved[j];
                    !paired[j]
                        && n.agent == m.agent
                        && n.a.is_some() == m.b.is_some()
                        && n.b.is_some() == m.a.is_some()
                        && action(n) == action(m)
                })
            })
            .flatten();
        if let Some(j) = partner {
            paired[j] = true;
            let (from, to) = if m.a.is_some() { (m, &moved[j]) } else { (&moved[j], m) };
            let act = action(m).unwrap_or_default();
            lines.push(format!(
                "{}: {act} on {} -> {act} on {}",
                m.agent,
                target(&from.target),
                target(&to.target)
            ));
            continue;
        }
        lines.push(format!(
            "{} on {}: {} -> {}",
            m.agent,
            target(&m.target),
            m.a.as_deref().unwrap_or("(none)"),
            m.b.as_deref().unwrap_or("(none)")
        ));
    }
    lines
}

/// A fork's exit status as the reports print it.
fn exit_text(fork: &RunMeta) -> String {
    fork.exit_status.map_or("unknown".to_owned(), |s| s.to_string())
}

/// A short account of a fork against its source.
fn summary(d: &RunDiff) -> String {
    let mut out = format!(
        "retrace: fork {} of {}: {} same, {} changed, {} only in the source, {} new\n",
        d.b.id,
        d.a.id,
        count(d.counts.same, "step"),
        d.counts.changed,
        d.counts.only_in_a,
        d.counts.only_in_b
    );
    for line in decision_lines(&d.decisions) {
        out.push_str(&format!("  decision moved: {line}\n"));
    }
    out.push_str(&format!(
        "  tokens: source {} in / {} out; fork {} in / {} out live",
        d.a.live.input_tokens, d.a.live.output_tokens, d.b.live.input_tokens, d.b.live.output_tokens
    ));
    if d.b.live.steps_without_usage > 0 {
        // Not "0 live": the calls ran, their answers said no usage (QA35 D2).
        let n = d.b.live.steps_without_usage;
        out.push_str(&format!(" (and {} live whose answers reported no usage)", count(n, "model call")));
    }
    if let Some(saved) = &d.b.saved {
        out.push_str(&format!("; saved {} in / {} out", saved.input_tokens, saved.output_tokens));
    }
    out.push('\n');
    out.push_str(&format!("  details: retrace diff {} {}\n", d.a.id, d.b.id));
    out
}

#[cfg(test)]
mod tests {
    use retrace_store::diff::MovedDecision;

    use super::*;

    #[test]
    fn a_decision_that_moved_to_another_target_is_one_line() {
        let moved = |target: &str, a: Option<&str>, b: Option<&str>| MovedDecision {
            agent: "a".into(),
            target: Some(target.into()),
            a: a.map(Into::into),
            b: b.map(Into::into),
        };
        let lines = decision_lines(&[
            moved("a2", None, Some("first")),
            moved("b1", Some("first"), None),
            moved("x", Some("approve"), Some("reject")),
            moved("y", Some("ship"), None),
        ]);
        assert_eq!(
            lines,
            ["a: first on b1 -> first on a2", "a on x: approve -> reject", "a on y: ship -> (none)"]
        );
    }
}
