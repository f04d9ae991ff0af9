//! `retrace demo`: the built-in demo, end to end, on the embedded store.
use clap::{Parser, Subcommand};
use retrace_demo::simulator::Simulator;
use retrace_demo::single::{triage, LiveCounter};
use retrace_demo::story::run_single;
use retrace_runtime::{Outcome, Session};

use super::store_from_env;
use crate::output::print_json;

/// Record a small agent program, replay it exactly with nothing live, and show what was stored.
///
/// The program is a support-triage agent: it reads a random ticket id, the clock and an
/// environment variable, searches a knowledge base (a deterministic tool), asks a model (the
/// demo's built-in simulator, whose answers vary from run to run), decides, and updates the
/// ticket (a side effect, which replay never executes). Each recording is replayed with a
/// differently seeded simulator: the replay must see exactly what the recording saw, with zero
/// live calls. The runs stay in the store (RETRACE_HOME, default ./.retrace) for `retrace runs`,
/// `show`, `verify` and `export`.
///
/// Example: retrace demo --runs 3 --seed 7
#[derive(Debug, Parser)]
pub struct Args {
    /// How many runs to record.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seed of the model simulator (the whole demo is reproducible for a seed).
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// How many times to replay each recorded run.
    #[arg(long, default_value_t = 2)]
    replays: usize,
    /// Print the outcome as JSON.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    program: Option<Program>,
}

#[derive(Debug, Subcommand)]
enum Program {
    /// Run one demo program under the session named by the environment (RETRACE_MODE,
    /// RETRACE_RUN, RETRACE_HOME): what `retrace replay RUN` re-runs.
    #[command(hide = true)]
    Run {
        /// Which program.
        #[arg(value_parser = ["single"])]
        name: String,
        /// Simulator seed.
        #[arg(long, default_value_t = 7)]
        seed: u64,
    },
}

/// Runs the demo.
pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(Program::Run { seed, .. }) = args.program {
        let session = Session::from_env()?;
        let live = LiveCounter::default();
        triage(&session, &live, &Simulator::new(seed))?;
        let report = session.finish(Outcome {
            exit_status: Some(0),
        })?;
        eprintln!(
            "retrace: run {} {} ({} steps)",
            report.run_id, report.status, report.steps
        );
        return Ok(());
    }
    let store = store_from_env()?;
    let runs = run_single(store, args.runs, args.seed, args.replays)?;
    if args.json {
        let value = serde_json::json!({
            "runs": runs.iter().map(|r| serde_json::json!({
                "recorded": r.recorded,
                "replays": r.replays,
                "steps": r.steps,
                "live_calls_recorded": r.live_calls_recorded,
                "live_calls_replayed": r.live_calls_replayed,
                "transcript": r.transcript,
            })).collect::<Vec<_>>()
        });
        return print_json(&value);
    }
    println!(
        "Retrace demo: a support-triage agent, recorded {} times and replayed exactly.\n",
        runs.len()
    );
    for (i, r) in runs.iter().enumerate() {
        println!(
            "run {} recorded as {} ({} steps, {} live calls):",
            i + 1,
            r.recorded,
            r.steps,
            r.live_calls_recorded
        );
        for line in &r.transcript {
            println!("    {line}");
        }
        println!(
            "  replayed {} times with a differently seeded model: identical every time, {} live calls\n",
            r.replays.len(),
            r.live_calls_replayed
        );
    }
    let models: std::collections::BTreeSet<_> = runs
        .iter()
        .filter_map(|r| r.transcript.iter().find(|l| l.starts_with("model:")))
        .collect();
    println!(
        "The model answered {} different way(s) across {} recordings; each replay reproduced its own recording.",
        models.len(),
        runs.len()
    );
    if let Some(last) = runs.last() {
        println!("\nDig deeper:");
        println!("  retrace runs");
        println!("  retrace show {}", last.recorded);
        println!("  retrace show {} --seq 5", last.recorded);
        println!("  retrace verify {}", last.recorded);
        println!("  retrace export {} -o triage.jsonl", last.recorded);
    }
    Ok(())
}
