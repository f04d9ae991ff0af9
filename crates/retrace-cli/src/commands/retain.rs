//! `retrace retain`: set a run's retention tier (routine, incident, pinned).
use retrace_core::run::Retention;
use retrace_store::gc::{retain, RetainError};

use crate::commands::existing_store_from_env;
use crate::exit;
use crate::output::print_json;

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace retain 01j5c3 incident\n  \
         retrace retain 01j5c3 pinned --json\n  \
         retrace retain 01j5c3 routine"
    };
}

/// Set how long a run is kept.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Set a run's retention tier, which `retrace gc` honours:\n  \
routine   expires once older than [retention] routine_days in ./retrace.toml (default 30)\n  \
incident  kept: it explains an incident\n  \
pinned    kept forever\n\n\
A run's effective tier is the highest of its own and of every fork of it: a fork inherits its \
source's early events, so `gc` keeps a source while any fork of it remains. Replay runs have no \
tier of their own: they go with their source, so retain the source instead. A run still \
recording keeps the tier it is given when it ends. Importing a run's trace file with a stronger \
tier raises the stored run's.",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// The run: its id or a unique prefix of it (at least 4 characters).
    pub run: String,
    /// routine, incident or pinned.
    #[arg(value_parser = parse_tier)]
    pub tier: Retention,
    /// Print JSON: `{"run", "retention", "previous"}`.
    #[arg(long)]
    pub json: bool,
}

fn parse_tier(text: &str) -> Result<Retention, String> {
    text.parse()
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let store = existing_store_from_env()?;
    let meta = crate::commands::runs::find(&*store, &args.run)?;
    let retained = retain(&*store, meta, args.tier).map_err(|e| match &e {
        RetainError::Replay { source_run: source, .. } => {
            let source = source.as_deref().unwrap_or("its source");
            exit::usage_hint(
                e.to_string(),
                format!("retain the source: retrace retain {source} {}", args.tier),
            )
        }
        RetainError::Store(_) => anyhow::Error::from(e),
    })?;
    if args.json {
        return print_json(&serde_json::json!({
            "run": retained.run,
            "retention": retained.retention.as_str(),
            "previous": retained.previous.as_str(),
        }));
    }
    match retained.retention == retained.previous {
        true => println!("run {} is {} already: nothing changed", retained.run, retained.retention),
        false => println!("run {} is now {} (was {})", retained.run, retained.retention, retained.previous),
    }
    Ok(())
}
