//! `retrace ledger`: the replay ledger (per project and agent, how its traces replayed under
//! `retrace gate`), shown, or exported as a file signed under `RETRACE_LEDGER_KEY`.
use std::io::Write;
use std::path::PathBuf;

use retrace_core::ledger::{signing_key, LedgerEntry, LedgerFile};

use crate::commands::readable_store_from_env;
use crate::exit::usage_hint;
use crate::output::{is_stdout, print_json, table, utc_time};

/// The environment variable holding the ledger's signing key.
pub const LEDGER_KEY_ENV: &str = "RETRACE_LEDGER_KEY";

macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace gate tests/traces            # adds every replay to the ledger\n  \
         retrace ledger show\n  \
         RETRACE_LEDGER_KEY=$(cat ledger.key) retrace ledger export -o ci/ledger.json\n  \
         head -c 32 /dev/urandom | base64    # a new key, for CI's secrets"
    };
}

/// The replay ledger: how each agent's traces replayed, and the signed file policies load.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Every `retrace gate` adds each replayed trace to the ledger in the real store, per \
(project, agent): replays, traces replayed (each recording counted once: by its run id and the \
hash its event chain ends at, so copies of one file, however re-serialized, are one trace), the \
clean streak (consecutive clean replays), distinct traces in that streak, and the last divergence. \
A trace that diverges is a clean replay for none of its agents: the replay stops at the \
divergence, so no agent's steps after it were checked (the agent that diverged has it as its last \
divergence, the others \"the trace diverged at another agent\"). \
The project is `[project] name` in ./retrace.toml, else the git top-level folder's name, else \
the working folder's name (outside git: set [project] name, so traces gated from two folders count \
for one project).\n\n\
`retrace ledger export` writes it as a file signed with Ed25519 under RETRACE_LEDGER_KEY (a \
base64 32-byte seed, held by CI and not by the agents). A policy names that file and the public \
key the export prints ([autonomy] ledger, ledger_pubkey in retrace.toml); a file signed by any \
other key counts as no ledger, so agents can't grant themselves autonomy.",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

/// The ledger's subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Write the ledger as a JSON file signed under RETRACE_LEDGER_KEY.
    Export(ExportArgs),
    /// Print the ledger.
    Show(ShowArgs),
}

/// Export the signed ledger.
#[derive(Debug, clap::Args)]
#[command(after_help = examples!())]
pub struct ExportArgs {
    /// Where to write the file (`retrace-ledger/1` JSON); `-` is standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// Only this project's entries (default: every project).
    #[arg(long, value_name = "NAME")]
    pub project: Option<String>,
}

/// Show the ledger.
#[derive(Debug, clap::Args)]
#[command(after_help = examples!())]
pub struct ShowArgs {
    /// Print a JSON array of `{project, agent, replays, traces_replayed, clean_streak,
    /// distinct_traces, last_divergence?}`.
    #[arg(long)]
    pub json: bool,
}

/// Runs `retrace ledger`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Export(a) => export(a),
        Command::Show(a) => show(a),
    }
}

fn export(args: ExportArgs) -> anyhow::Result<()> {
    let seed = std::env::var(LEDGER_KEY_ENV).ok().filter(|s| !s.trim().is_empty()).ok_or_else(|| {
        usage_hint(
            format!("{LEDGER_KEY_ENV} is not set: the ledger is signed with it"),
            "set it to a base64 32-byte Ed25519 seed held by CI (head -c 32 /dev/urandom | base64)",
        )
    })?;
    let key = signing_key(&seed).map_err(|e| usage_hint(e.to_string(), format!("check {LEDGER_KEY_ENV}")))?;
    let store = readable_store_from_env()?;
    let entries = store.ledger_entries(args.project.as_deref())?;
    if let (Some(project), true) = (&args.project, entries.is_empty()) {
        // Deployed, an empty ledger makes every agent unproven: a typo'd project is refused (QA15 S3).
        let known: std::collections::BTreeSet<String> =
            store.ledger_entries(None)?.into_iter().map(|e| e.project).collect();
        let known: Vec<String> = known.into_iter().collect();
        return Err(usage_hint(
            format!("the ledger holds no entries of project {project:?}: nothing to export"),
            match known.is_empty() {
                true => "`retrace gate` fills the ledger; export it after a gate".to_owned(),
                false => format!("its projects: {}", known.join(", ")),
            },
        ));
    }
    let file = LedgerFile::sign(entries, now_ms(), &key);
    let mut text = serde_json::to_vec_pretty(&file)?;
    text.push(b'\n');
    if is_stdout(&args.output) {
        let mut out = std::io::stdout().lock();
        out.write_all(&text).and_then(|()| out.flush())?;
        eprintln!("wrote the ledger ({} entries), signed by {}", file.entries.len(), file.public_key);
        return Ok(());
    }
    // Its folder is made, as `gate --junit` makes its report's (QA26 D7).
    crate::output::make_folder_of(&args.output).map_err(|e| {
        usage_hint(format!("cannot make the folder of {}: {e}", args.output.display()), "check the -o path")
    })?;
    std::fs::write(&args.output, text).map_err(|e| {
        usage_hint(format!("cannot write {}: {e}", args.output.display()), "check the -o path")
    })?;
    eprintln!(
        "wrote {} ({} entries), signed by {}\nin retrace.toml where the agents run:\n  [autonomy]\n  ledger = \"{}\"\n  ledger_pubkey = \"{}\"",
        args.output.display(),
        file.entries.len(),
        file.public_key,
        args.output.display(),
        file.public_key
    );
    Ok(())
}

fn show(args: ShowArgs) -> anyhow::Result<()> {
    // No store yet (a CI step before the first gate): an empty ledger, as `runs` lists none.
    let entries = match crate::commands::missing_store_from_env()? {
        Some(_) => Vec::new(),
        None => readable_store_from_env()?.ledger_entries(None)?,
    };
    if args.json {
        return print_json(&serde_json::to_value(&entries)?);
    }
    if entries.is_empty() {
        eprintln!("the ledger is empty: `retrace gate PATH...` adds the traces it replays");
        return Ok(());
    }
    print!(
        "{}",
        table(
            &["PROJECT", "AGENT", "REPLAYS", "TRACES", "STREAK", "DISTINCT", "LAST DIVERGENCE"],
            &rows(&entries)
        )
    );
    Ok(())
}

fn rows(entries: &[LedgerEntry]) -> Vec<Vec<String>> {
    entries
        .iter()
        .map(|e| {
            vec![
                e.project.clone(),
                e.agent.clone(),
                e.replays.to_string(),
                e.traces_replayed.to_string(),
                e.clean_streak.to_string(),
                e.distinct_traces.to_string(),
                e.last_divergence
                    .as_ref()
                    .map_or("-".into(), |d| format!("{} {}", utc_time(d.at_ms), d.detail)),
            ]
        })
        .collect()
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}
