//! `retrace record -- CMD`: run a program with recording on; prints the run id.
use std::collections::BTreeMap;

use clap::Parser;
use retrace_core::run::{Command, RunMeta, RunMode, RunStatus};
use retrace_runtime::env_sources::{new_run_id, Clock, SystemClock};

use super::store_from_env;
use crate::daemon::Embedded;
use crate::exit::usage;
use crate::launcher::{self, Child};

/// Run a program with recording on. An embedded daemon records every model call the program
/// makes through its proxy (OPENAI_BASE_URL and ANTHROPIC_BASE_URL point at it, so the official
/// clients need no change) and every step it takes through the Rust runtime's
/// `Session::from_env()`. Prints the run id and exits with the program's status; SIGINT and
/// SIGTERM are forwarded to the program. Replay it with `retrace replay RUN`.
///
/// Examples:
///   retrace record -- python app.py
///   retrace record --upstream-openai http://127.0.0.1:8000/v1 -- python app.py
///   retrace record --name nightly --label team=data -- cargo run --example agents
#[derive(Debug, Parser)]
pub struct Args {
    /// A name for the run.
    #[arg(long)]
    name: Option<String>,
    /// A label `key=value` (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// Shuffle message deliveries (seeded) to flush out order-dependent bugs.
    #[arg(long, value_name = "SEED")]
    chaos: Option<u64>,
    /// OpenAI-compatible upstream, with /v1 (default: $OPENAI_BASE_URL, else api.openai.com).
    #[arg(long, value_name = "URL")]
    upstream_openai: Option<String>,
    /// Anthropic-compatible upstream (default: $ANTHROPIC_BASE_URL, else api.anthropic.com).
    #[arg(long, value_name = "URL")]
    upstream_anthropic: Option<String>,
    /// Seconds an upstream may take to answer, and between two chunks of a stream.
    #[arg(long, value_name = "S", default_value_t = 600.0)]
    upstream_timeout: f64,
    /// Largest model request body the proxy accepts, in bytes (after decoding).
    #[arg(long, value_name = "BYTES", default_value_t = 32 << 20)]
    max_body: usize,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let store = store_from_env()?;
    let mut labels = BTreeMap::new();
    for label in &args.labels {
        let (k, v) =
            label.split_once('=').ok_or_else(|| usage(format!("--label {label:?}: want KEY=VALUE")))?;
        labels.insert(k.to_owned(), v.to_owned());
    }
    let id = new_run_id();
    let mut meta = RunMeta::new(id.clone(), RunMode::Record, SystemClock.now_ms());
    meta.name = args.name;
    meta.labels = labels;
    meta.chaos_seed = args.chaos;
    let mut config = super::serve::config(args.upstream_openai, args.upstream_anthropic, 30.0)?;
    // The command line is persisted and logged like any input: masked (a key passed as a flag).
    let masker = retrace_runtime::masking::masker(config.mask_rules.clone(), config.mask_key.as_ref())?;
    let argv: Vec<String> = args.command.iter().map(|a| masker.mask_text(a).0.into_owned()).collect();
    meta.command = Some(Command { argv: argv.clone(), cwd: launcher::recorded_cwd()? });
    config.default_run = Some(id.clone());
    config.upstream_timeout = std::time::Duration::from_secs_f64(args.upstream_timeout.max(0.001));
    config.max_body = args.max_body;
    meta.upstreams.insert("openai".into(), config.upstream_openai.clone());
    meta.upstreams.insert("anthropic".into(), config.upstream_anthropic.clone());
    meta.masking_rules = config.mask_rules.clone();
    meta.mask_key_fingerprint = config.mask_key.as_ref().map(|k| k.fingerprint());
    refuse_original_without_vault(&meta.masking_rules)?;
    store.create_run(&meta)?;
    eprintln!("retrace: recording run {id}: {}", argv.join(" "));
    let daemon = Embedded::start(store.clone(), config)?;
    let mut env = launcher::store_env()?;
    env.extend(daemon.child_env());
    env.push(("RETRACE_MODE".into(), "record".into()));
    env.push(("RETRACE_RUN".into(), id.clone()));
    if let Some(seed) = args.chaos {
        env.push(("RETRACE_CHAOS_SEED".into(), seed.to_string()));
    }
    let child = Child { argv: args.command, cwd: std::env::current_dir()?, env };
    let status = match launcher::run(&child) {
        Ok(status) => status,
        Err(e) => {
            daemon.stop();
            let mut failed = store.run(&id)?;
            failed.status = RunStatus::Failed;
            store.update_run(&failed)?;
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
    daemon.stop();
    let mut meta = store.run(&id)?;
    meta.exit_status = Some(status);
    if meta.status == RunStatus::Running && store.lease_holder(&id)?.is_none() {
        meta.status = if status == 0 { RunStatus::Ok } else { RunStatus::Failed };
    } else if meta.status == RunStatus::Ok && status != 0 {
        meta.status = RunStatus::Failed;
    }
    meta.finished_at_ms.get_or_insert(SystemClock.now_ms());
    store.update_run(&meta)?;
    let events = store.last_seq(&id)?;
    eprintln!("retrace: run {id} {} ({events} events), exit status {status}", meta.status);
    println!("{id}");
    std::process::exit(status);
}

/// SPEC §7: a rule whose replay hands back the original needs the vault to hold originals.
fn refuse_original_without_vault(rules: &retrace_core::mask::MaskRules) -> anyhow::Result<()> {
    let original: Vec<&str> = rules
        .rules
        .iter()
        .filter(|r| r.replay == retrace_core::mask::ReplayAs::Original)
        .map(|r| r.name.as_str())
        .collect();
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
