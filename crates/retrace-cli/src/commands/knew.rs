//! `retrace knew RUN SEQ`: what the agent of event SEQ knew when it acted.
use clap::Parser;
use retrace_core::run::RunMode;
use retrace_store::causal;

use super::readable_store_from_env;
use crate::exit::usage_hint;
use crate::output::print_json;

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace knew 01jd3k 14\n  \
         retrace knew 01jd3k 14 --json | jq '.heard[].deliver_seq'"
    };
}

/// Show what an agent knew when it acted: the messages it had heard, with their causes.
#[derive(Debug, Parser)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Show what an agent knew when it acted: the messages delivered to it before SEQ, in the order it \
heard them, each with its causal chain back to its origin.\n\n\
SEQ is any event of the run: the agent is the one that took it. A message counts from the moment \
the agent received it (its `deliver` event), not from when it was sent, so a message sent before \
SEQ but delivered after it is not listed: that is the difference between what had happened and \
what the agent knew. Each chain follows causal parents (the send, the step that sent it, what \
that step had heard, ...) back to a step with no parent, 256 links at most. The answer comes from \
the store's indexes, without reading the whole run. `--json` gives the same as one object.",
        "\n\n",
        examples!()
    )
)]
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
    let store = readable_store_from_env()?;
    let run = crate::commands::runs::find(&*store, &args.run)?;
    if let (RunMode::Replay, Some(source)) = (run.mode, &run.source_run) {
        // A replay stores no events: what its agents heard is its source's log.
        return Err(usage_hint(
            format!("run {} is a replay of {source}, and a replay keeps no events of its own", run.id),
            format!("ask about the recording: retrace knew {source} {}", args.seq),
        ));
    }
    let knew = causal::knew(store.as_ref(), &run.id, args.seq)?;
    if args.json {
        return print_json(&serde_json::to_value(&knew)?);
    }
    print!("{}", causal::render(&knew));
    Ok(())
}
