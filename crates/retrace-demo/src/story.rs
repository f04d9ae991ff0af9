//! `retrace demo`: record the triage agent, replay it exactly, and tell the story.
use std::sync::Arc;

use anyhow::{bail, Context};
use retrace_core::run::Command;
use retrace_runtime::{Outcome, Session, SessionOptions};
use retrace_store::Store;

use crate::masking::DemoMasking;
use crate::simulator::Simulator;
use crate::single::{triage, LiveCounter, Transcript};

/// One recorded run of the demo and its replays.
#[derive(Debug, Clone)]
pub struct DemoRun {
    /// The recorded run.
    pub recorded: String,
    /// The replay runs.
    pub replays: Vec<String>,
    /// Steps in the recording.
    pub steps: usize,
    /// Live calls made while recording.
    pub live_calls_recorded: usize,
    /// Live calls made while replaying (must be 0).
    pub live_calls_replayed: usize,
    /// What the program saw while recording.
    pub transcript: Transcript,
}

/// The argv a demo run records: a hidden subcommand that runs exactly that program.
pub fn single_command(seed: u64) -> Command {
    Command {
        argv: ["retrace", "demo", "run", "single", "--seed", &seed.to_string()].map(String::from).to_vec(),
        cwd: ".".into(),
    }
}

/// Records the single-agent program `runs` times (the simulator seeded with `seed`, so answers
/// vary between runs), and replays each recording `replays` times with nothing live, checking
/// that every replay saw exactly what its recording saw. Every session masks with `masking`.
pub fn run_single(
    store: Arc<dyn Store>,
    runs: usize,
    seed: u64,
    replays: usize,
    masking: &DemoMasking,
) -> anyhow::Result<Vec<DemoRun>> {
    let mut out = Vec::new();
    for i in 0..runs {
        let run_seed = seed.wrapping_add(i as u64);
        let options = masking.apply(SessionOptions {
            name: Some(format!("demo: support triage #{}", i + 1)),
            command: Some(single_command(run_seed)),
            ..SessionOptions::default()
        });
        let record = Session::record(store.clone(), options).context("starting the recording")?;
        let live = LiveCounter::default();
        let transcript =
            triage(&record, &live, &Simulator::new(run_seed)).context("running the program live")?;
        let report = record.finish(Outcome { exit_status: Some(0) }).context("finishing the recording")?;

        let mut replay_ids = Vec::new();
        let replay_live = LiveCounter::default();
        for _ in 0..replays {
            let replay =
                Session::replay(store.clone(), &report.run_id, masking.apply(SessionOptions::default()))
                    .context("starting a replay")?;
            // A different seed: if anything were served live, the answers would differ.
            let again = triage(&replay, &replay_live, &Simulator::new(run_seed ^ 0x5eed))?;
            replay.finish(Outcome { exit_status: Some(0) })?;
            if again != transcript {
                bail!("replay {} saw something else than the recording:\n{again:#?}", replay.run_id());
            }
            replay_ids.push(replay.run_id());
        }
        out.push(DemoRun {
            recorded: report.run_id,
            replays: replay_ids,
            steps: report.steps,
            live_calls_recorded: live.get(),
            live_calls_replayed: replay_live.get(),
            transcript,
        });
    }
    Ok(out)
}
