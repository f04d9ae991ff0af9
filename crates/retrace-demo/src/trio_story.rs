//! `retrace demo`: record the migration trio under chaos, find the runs that broke the
//! invariant, and replay one of them exactly with the model server stopped.
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use retrace_core::run::Command;
use retrace_runtime::{Outcome, Session, SessionOptions};
use retrace_store::Store;

use crate::client::ChatClient;
use crate::invariant::{check, Violation};
use crate::masking::DemoMasking;
use crate::server::SimServer;
use crate::trio::trio;

/// The chaos delay the demo uses: comparable to the model latencies, so it can flip the race.
pub const CHAOS_MAX_DELAY: Duration = Duration::from_millis(20);

/// One recorded run of the trio.
#[derive(Debug, Clone)]
pub struct TrioRun {
    /// The run id.
    pub id: String,
    /// The chaos seed it was recorded under (None: the plain scheduler).
    pub chaos_seed: Option<u64>,
    /// The reviewer's decision.
    pub decision: String,
    /// Whether it broke the invariant, and where.
    pub violation: Option<Violation>,
}

/// The replays of one bad run.
#[derive(Debug, Clone)]
pub struct TrioReplays {
    /// The recorded run that was replayed.
    pub run: String,
    /// The replay runs.
    pub replays: Vec<String>,
    /// The decision each replay reached.
    pub decisions: Vec<String>,
    /// Model calls made over HTTP while replaying (must be 0).
    pub live_calls: usize,
}

/// The counterfactual: the bad run forked with the reviewer's two deliveries swapped.
#[derive(Debug, Clone)]
pub struct TrioFork {
    /// The fork run.
    pub fork: String,
    /// The swap edit, as typed.
    pub edit: String,
    /// The reviewer's decision in the fork.
    pub decision: String,
    /// Model calls the fork made over HTTP (changed steps only, when not cached).
    pub live_calls: usize,
}

/// What the demo did.
#[derive(Debug, Clone)]
pub struct TrioReport {
    /// Every recorded run.
    pub runs: Vec<TrioRun>,
    /// The replays of the first bad run, if there was one.
    pub replayed: Option<TrioReplays>,
    /// The fork of the bad run with its deliveries swapped.
    pub forked: Option<TrioFork>,
    /// Model calls the recordings made.
    pub live_calls_recorded: usize,
}

/// The argv a trio run records: the hidden subcommand that runs exactly that program, its
/// simulator (and, with `chaos`, its scheduler) seeded with `seed`.
pub fn trio_command(seed: u64, chaos: bool) -> Command {
    let mut argv: Vec<String> =
        ["retrace", "demo", "run", "trio", "--seed", &seed.to_string()].map(String::from).to_vec();
    if !chaos {
        argv.push("--no-chaos".into());
    }
    Command { argv, cwd: ".".into() }
}

/// Session options of a trio recording under chaos seed `seed` (None: no chaos).
pub fn trio_options(seed: Option<u64>) -> SessionOptions {
    SessionOptions {
        name: Some(match seed {
            Some(seed) => format!("demo: migration trio (chaos seed {seed})"),
            None => "demo: migration trio (no chaos)".into(),
        }),
        command: Some(match seed {
            Some(seed) => trio_command(seed, true),
            None => Command {
                argv: ["retrace", "demo", "run", "trio", "--no-chaos"].map(String::from).to_vec(),
                cwd: ".".into(),
            },
        }),
        chaos_seed: seed,
        chaos_max_delay: CHAOS_MAX_DELAY,
        ..SessionOptions::default()
    }
}

/// How many plain (no chaos) runs the demo records first, for contrast.
pub fn plain_runs(runs: usize) -> usize {
    (runs / 3).max(2)
}

/// Records a few runs with the plain scheduler, then `runs` trio runs under chaos seeds
/// `seed..`, and keeps going (up to 8× as many) until one breaks the invariant, then replays the first bad run `replays` times with the model
/// server stopped. `upstream` replaces the built-in simulator with any OpenAI-compatible server;
/// every session masks with `masking`.
pub async fn run_trio(
    store: Arc<dyn Store>,
    runs: usize,
    seed: u64,
    replays: usize,
    upstream: Option<String>,
    masking: &DemoMasking,
) -> anyhow::Result<TrioReport> {
    let server = match &upstream {
        Some(_) => None,
        None => Some(SimServer::start(seed).await.context("starting the model simulator")?),
    };
    let base = upstream.clone().unwrap_or_else(|| server.as_ref().expect("started").base_url());
    let client = Arc::new(ChatClient::new(&base));
    let mut recorded: Vec<TrioRun> = Vec::new();
    let plain = plain_runs(runs);
    for i in 0..plain + runs.max(1) * 8 {
        if i >= plain + runs && recorded.iter().any(|r| r.violation.is_some()) {
            break;
        }
        let chaos_seed = (i >= plain).then(|| seed.wrapping_add((i - plain) as u64));
        let session = Session::record(store.clone(), masking.apply(trio_options(chaos_seed)))
            .context("starting a recording")?;
        let decision = trio(&session, client.clone()).await.context("running the trio live")?;
        let report = session.finish(Outcome { exit_status: Some(0) })?;
        let violation = check(store.as_ref(), &report.run_id)?;
        recorded.push(TrioRun { id: report.run_id, chaos_seed, decision, violation });
    }
    let live_calls_recorded = client.calls();
    if let Some(server) = server {
        server.stop().await;
    }
    let bad = recorded.iter().find(|r| r.violation.is_some() && r.chaos_seed.is_some()).cloned();
    let replayed = match bad {
        None => None,
        Some(bad) => {
            // The server is gone: any live call would fail. Replay must not make one.
            let offline = Arc::new(ChatClient::new(&base));
            let mut ids = Vec::new();
            let mut decisions = Vec::new();
            for _ in 0..replays {
                let session =
                    Session::replay(store.clone(), &bad.id, masking.apply(SessionOptions::default()))?;
                let decision = trio(&session, offline.clone()).await.context("replaying the bad run")?;
                session.finish(Outcome { exit_status: Some(0) }).context("replay diverged")?;
                ids.push(session.run_id());
                decisions.push(decision);
            }
            Some(TrioReplays { run: bad.id, replays: ids, decisions, live_calls: offline.calls() })
        }
    };
    let forked = match &replayed {
        Some(r) => Some(fork_swapped(store.clone(), &r.run, seed, upstream.as_deref(), masking).await?),
        None => None,
    };
    Ok(TrioReport { runs: recorded, replayed, forked, live_calls_recorded })
}

/// Forks `run` with the reviewer's first two deliveries swapped; the changed steps call the
/// model live (a fresh simulator, unless an upstream is given).
async fn fork_swapped(
    store: Arc<dyn Store>,
    run: &str,
    seed: u64,
    upstream: Option<&str>,
    masking: &DemoMasking,
) -> anyhow::Result<TrioFork> {
    let heard: Vec<u64> = store
        .deliveries_to(run, "reviewer", u64::MAX)?
        .iter()
        .filter(|d| d.message.as_ref().is_some_and(|m| !m.timed_out))
        .map(|d| d.seq)
        .collect();
    let [a, b, ..] = heard[..] else {
        anyhow::bail!("the reviewer of run {run} heard fewer than two messages")
    };
    let edit = retrace_core::edit::Edit::Swap { a, b };
    // A fork delivers in source order (no chaos), its live calls answered by a simulator of
    // its own seed: what its recorded command says, so a fork of the fork answers the same.
    let fork_seed = seed ^ 0xf0_4c;
    let server = match upstream {
        Some(_) => None,
        None => Some(SimServer::start(fork_seed).await?),
    };
    let base = upstream.map(str::to_owned).unwrap_or_else(|| server.as_ref().expect("started").base_url());
    let client = Arc::new(ChatClient::new(&base));
    let options = masking.apply(SessionOptions {
        name: Some("demo: the bad run, deliveries swapped".into()),
        command: Some(trio_command(fork_seed, false)),
        ..Default::default()
    });
    let session =
        Session::fork_new(store, run, None, vec![edit.clone()], options).context("forking the bad run")?;
    let decision = trio(&session, client.clone()).await.context("running the fork")?;
    session.finish(Outcome { exit_status: Some(0) }).context("finishing the fork")?;
    if let Some(server) = server {
        server.stop().await;
    }
    Ok(TrioFork { fork: session.run_id(), edit: edit.to_string(), decision, live_calls: client.calls() })
}
