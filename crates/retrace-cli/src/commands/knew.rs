//! `retrace knew RUN SEQ`: what the agent of event SEQ knew when it acted.
use clap::Parser;
use retrace_store::causal;

use super::store_from_env;
use crate::output::print_json;

/// Show what an agent knew when it acted: the messages delivered to it before SEQ, in the order
/// it heard them, each with its causal chain back to its origin.
///
/// Example: retrace knew 01jd3k 14
#[derive(Debug, Parser)]
pub struct Args {
    /// The run (id or unique prefix).
    run: String,
    /// The step's seq.
    seq: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let store = store_from_env()?;
    let run = store.find_run(&args.run)?;
    let knew = causal::knew(store.as_ref(), &run.id, args.seq)?;
    if args.json {
        return print_json(&serde_json::to_value(&knew)?);
    }
    print!("{}", causal::render(&knew));
    Ok(())
}
