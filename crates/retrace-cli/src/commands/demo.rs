//! `retrace demo`: the built-in demos, end to end, on the embedded store.
use std::sync::Arc;

use clap::{Parser, Subcommand};
use retrace_demo::client::ChatClient;
use retrace_demo::masking::DemoMasking;
use retrace_demo::server::SimServer;
use retrace_demo::simulator::Simulator;
use retrace_demo::single::{triage, LiveCounter};
use retrace_demo::story::run_single;
use retrace_demo::trio::trio;
use retrace_demo::trio_story::{run_trio, trio_options, TrioReport, TrioRun};
use retrace_runtime::{Mode, Outcome, Session};
use retrace_store::causal;

use super::store_from_env;
use crate::output::count;
use crate::output::print_json;

mod pipeline;

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace demo\n  \
         retrace demo --runs 20 --seed 42\n  \
         retrace demo single\n  \
         retrace demo pipeline"
    };
}

/// Run the built-in demo: record a multi-agent program under chaos, replay the bad run exactly.
#[derive(Debug, Parser)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Record a multi-agent program under chaos, find the run that went wrong, replay it exactly.\n\n\
The migration trio: a planner asks a schema agent to rename users.name to users.full_name, then \
writes a backfill that still reads users.name and tells the reviewer it is ready. The reviewer \
approves the backfill if \"backfill ready\" arrives before \"column renamed\": an ordering bug that \
shows only under some interleavings. Each agent calls a model over HTTP (by default the demo's \
built-in simulator, whose answers and latencies vary; use --upstream-openai to point the same \
demo at any OpenAI-compatible server).\n\n\
The demo records a few runs with the plain scheduler (a third of --runs, at least 2), then --runs \
runs with chaos scheduling (deliveries shuffled and delayed; seeds --seed, --seed + 1, ...), \
checks an invariant over each log and, while no run has broken it, keeps recording (up to 8 \
times --runs). It replays a bad run several times with the model server stopped (the same wrong \
approval every time, zero live calls), shows what the reviewer knew when it approved, and forks \
the bad run with the reviewer's two deliveries swapped. The runs stay in the store \
(RETRACE_HOME, default ./.retrace).\n\n\
Which seed goes wrong can differ from one invocation to the next: the agents run in real time, \
so timing as well as the seed decides which interleavings chaos reaches. Every run, once \
recorded, replays exactly.",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// How many runs to record under chaos (at least 1); more, up to 8 times as many, while none
    /// has gone wrong.
    #[arg(long, default_value_t = 12, value_parser = at_least_one)]
    runs: usize,
    /// First seed of the chaos scheduler and the model simulator. The agents run in real time,
    /// so which seed goes wrong can differ between invocations; a recorded run replays exactly.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// How many times to replay the bad run.
    #[arg(long, default_value_t = 3)]
    replays: usize,
    /// Call this OpenAI-compatible server (e.g. http://127.0.0.1:8000/v1) instead of the simulator.
    #[arg(long, value_name = "URL")]
    upstream_openai: Option<String>,
    /// Print the outcome as JSON (for `single` and `pipeline` too, before or after their name).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    program: Option<Program>,
}

#[derive(Debug, Subcommand)]
enum Program {
    /// The single-agent demo: every kind of step, recorded and replayed exactly.
    Single {
        /// How many runs to record (at least 1).
        #[arg(long, default_value_t = 3, value_parser = at_least_one)]
        runs: usize,
        /// Seed of the model simulator.
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// How many times to replay each run.
        #[arg(long, default_value_t = 2)]
        replays: usize,
    },
    /// The 8-step pipeline (plan → research → analyse → critique → revise → compose → verify →
    /// publish): record it once, fork it at critique with the critic's stricter prompt, and show
    /// that only the steps the change reaches ran live (publish as a dry run), the rest cost zero
    /// tokens with identical outputs, and what the fork saved in tokens and dollars. Prices come
    /// from `[prices]` in ./retrace.toml over built-in defaults.
    Pipeline {
        /// Seed of the model simulator.
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Call this OpenAI-compatible server instead of the simulator.
        #[arg(long, value_name = "URL")]
        upstream_openai: Option<String>,
    },
    /// Run one demo program under the session named by the environment (RETRACE_MODE,
    /// RETRACE_RUN, RETRACE_HOME): what `retrace replay RUN` re-runs.
    #[command(hide = true)]
    Run {
        /// Which program.
        #[arg(value_parser = ["single", "trio", "pipeline"])]
        name: String,
        /// Chaos and simulator seed.
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Record with the plain scheduler (no chaos).
        #[arg(long)]
        no_chaos: bool,
        /// Model server for the trio and the pipeline (default: the upstream of the `record` or
        /// `fork` running it, else OPENAI_BASE_URL unless it is a Retrace proxy, else a built-in
        /// simulator).
        #[arg(long, value_name = "URL")]
        upstream_openai: Option<String>,
    },
}

/// A count of runs, at least 1: zero would ask for nothing to show (the trio would still record
/// its plain runs and up to 8 chaos runs), so it is refused as a usage error (exit 2).
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("want at least 1 run".into()),
        Ok(n) => Ok(n),
        Err(_) => Err("want a whole number of runs, at least 1".into()),
    }
}

/// Runs the demo.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    match args.program {
        Some(Program::Run { name, seed, upstream_openai, .. }) if name == "pipeline" => {
            rt.block_on(pipeline::run_recorded(seed, upstream_openai)).map_err(reported_by_launcher)
        }
        Some(Program::Run { name, seed, no_chaos, upstream_openai }) => rt
            .block_on(run_program(&name, seed, (!no_chaos).then_some(seed), upstream_openai))
            .map_err(reported_by_launcher),
        Some(Program::Single { runs, seed, replays }) => single(runs, seed, replays, args.json),
        Some(Program::Pipeline { seed, upstream_openai }) => {
            rt.block_on(pipeline::demo(seed, upstream_openai, args.json))
        }
        None => rt.block_on(trio_demo(args)),
    }
}

/// The program's last line on standard error, unless the `retrace record`, `replay`, `fork` or
/// `gate` that launched it (`RETRACE_URL`) says how the run ended: under it the run is the
/// daemon's, still `running` when the program's session lets go.
pub(crate) fn say_finished(report: &retrace_runtime::RunReport) {
    if std::env::var_os("RETRACE_URL").is_none() {
        eprintln!(
            "retrace: run {} {} ({})",
            report.run_id,
            report.status,
            crate::output::count(report.steps, "step")
        );
    }
}

/// A demo program's divergence, under the `retrace replay`, `fork` or `gate` that launched it
/// (`RETRACE_URL`): that command reports it in full, so the program only says it stopped there.
fn reported_by_launcher(e: anyhow::Error) -> anyhow::Error {
    let diverged = e.chain().find_map(|c| {
        c.downcast_ref::<retrace_core::Divergence>()
            .or_else(|| c.downcast_ref::<retrace_runtime::RuntimeError>().and_then(|r| r.divergence()))
    });
    match diverged {
        Some(d) if std::env::var_os("RETRACE_URL").is_some() => {
            let at = d.seq.map(|s| format!(" at seq {s}")).unwrap_or_default();
            crate::exit::check_failed(format!("the program stopped at the divergence{at} ({})", d.code))
        }
        _ => e,
    }
}

async fn run_program(
    name: &str,
    seed: u64,
    chaos: Option<u64>,
    upstream: Option<String>,
) -> anyhow::Result<()> {
    if name == "single" {
        let session = Session::from_env()?;
        triage(&session, &LiveCounter::default(), &Simulator::new(seed))?;
        let report = session.finish(Outcome { exit_status: Some(0) })?;
        say_finished(&report);
        return Ok(());
    }
    let session = Session::from_env_with(trio_options(chaos))?;
    let upstream = model_server(upstream);
    let server = match (&upstream, session.mode()) {
        (None, Mode::Record | Mode::Off | Mode::Fork) => Some(SimServer::start(seed).await?),
        _ => None,
    };
    let base = upstream.unwrap_or_else(|| server.as_ref().map(SimServer::base_url).unwrap_or_default());
    let decision = trio(&session, Arc::new(ChatClient::new(&base))).await?;
    let report = session.finish(Outcome { exit_status: Some(0) })?;
    println!("reviewer: {decision}");
    say_finished(&report);
    Ok(())
}

/// The model server a demo program records its calls to, through the SDK: `--upstream-openai`,
/// else the upstream `retrace record`, `fork` or `gate --accept` named
/// (`RETRACE_UPSTREAM_OPENAI`), else the caller's `OPENAI_BASE_URL`, else `None` (the built-in
/// simulator). Never a Retrace proxy, which would record each call a second time, and never
/// the public API unless named on the demo's own command line: a fork of a demo run recorded
/// offline runs its changed steps against the simulator, not api.openai.com.
pub(crate) fn model_server(flag: Option<String>) -> Option<String> {
    let named = |var: &str| std::env::var(var).ok().filter(|u| !u.is_empty() && !u.contains("/proxy/"));
    flag.or_else(|| {
        named("RETRACE_UPSTREAM_OPENAI")
            .or_else(|| named("OPENAI_BASE_URL"))
            .filter(|u| u.trim_end_matches('/') != super::serve::PUBLIC_OPENAI)
    })
}

/// The masking of the demos' sessions: what `retrace record` would record with here (the
/// store's mask key, `./retrace.toml`'s rules or the defaults, `RETRACE_VAULT_KEY`).
pub(crate) fn masking() -> anyhow::Result<DemoMasking> {
    let mask = super::mask_from_env()?;
    super::record::refuse_original_without_vault(&mask.rules)?;
    let vault_key = retrace_runtime::masking::vault_key_from_env()?;
    Ok(DemoMasking { key: Some(mask.key), rules: mask.rules, vault_key })
}

fn single(runs: usize, seed: u64, replays: usize, json: bool) -> anyhow::Result<()> {
    let store = store_from_env()?;
    let runs = run_single(store, runs, seed, replays, &masking()?)?;
    if json {
        let value = serde_json::json!({
            "runs": runs.iter().map(|r| serde_json::json!({
                "recorded": r.recorded, "replays": r.replays, "steps": r.steps,
                "live_calls_recorded": r.live_calls_recorded, "live_calls_replayed": r.live_calls_replayed,
                "transcript": r.transcript,
            })).collect::<Vec<_>>()
        });
        return print_json(&value);
    }
    println!("Retrace demo: a support-triage agent, recorded {} times and replayed exactly.\n", runs.len());
    for (i, r) in runs.iter().enumerate() {
        println!(
            "run {} recorded as {} ({}, {}):",
            i + 1,
            r.recorded,
            count(r.steps, "step"),
            count(r.live_calls_recorded, "live call")
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
    if let Some(last) = runs.last() {
        println!("Dig deeper:\n  retrace show {}\n  retrace verify {}", last.recorded, last.recorded);
    }
    Ok(())
}

async fn trio_demo(args: Args) -> anyhow::Result<()> {
    let store = store_from_env()?;
    let masking = masking()?;
    let report =
        run_trio(store.clone(), args.runs, args.seed, args.replays, args.upstream_openai.clone(), &masking)
            .await?;
    let knew = match &report.replayed {
        Some(r) => {
            let bad = report.runs.iter().find(|x| x.id == r.run).and_then(|x| x.violation.clone());
            match bad {
                Some(v) => Some(causal::knew(store.as_ref(), &r.run, v.approval_seq)?),
                None => None,
            }
        }
        None => None,
    };
    if args.json {
        return print_json(&trio_json(&report, knew.as_ref()));
    }
    let model = args.upstream_openai.as_deref().unwrap_or("the built-in model simulator (not a real model)");
    println!("Retrace demo: the migration trio (planner, schema agent, reviewer); model: {model}\n");
    let (plain, chaos): (Vec<_>, Vec<_>) = report.runs.iter().partition(|r| r.chaos_seed.is_none());
    let bad = |runs: &[&TrioRun]| runs.iter().filter(|r| r.violation.is_some()).count();
    println!(
        "Recorded {} with the plain scheduler: {} approved the stale backfill.",
        count(plain.len(), "run"),
        bad(&plain)
    );
    println!(
        "Recorded {} under chaos scheduling (deliveries shuffled and delayed, seeds {}..):",
        count(chaos.len(), "run"),
        args.seed
    );
    for r in &chaos {
        let seed = r.chaos_seed.unwrap_or_default();
        match &r.violation {
            Some(v) => println!(
                "  {}  seed {seed:<4} APPROVE  <- approved the backfill of users.name (seq {}) although the column was renamed (seq {})",
                r.id, v.approval_seq, v.rename_seq
            ),
            None => println!("  {}  seed {seed:<4} {}", r.id, r.decision),
        }
    }
    println!(
        "{} of {} chaos runs broke the invariant (a backfill approved against a renamed column).\n",
        bad(&chaos),
        chaos.len()
    );
    let Some(replayed) = &report.replayed else {
        println!("No run showed the bug this time; try more runs: retrace demo --runs 40");
        return Ok(());
    };
    let same = replayed.decisions.iter().all(|d| d == "approve");
    println!("Replayed {} {} times with the model server stopped:", replayed.run, replayed.replays.len());
    println!(
        "  decisions: {}{}, {} live calls",
        replayed.decisions.join(", "),
        if same { ": the same wrong approval every time" } else { "" },
        replayed.live_calls
    );
    if let Some(k) = &knew {
        println!("\nWhat the reviewer knew when it approved (retrace knew {} {}):", replayed.run, k.seq);
        for line in causal::render(k).lines() {
            println!("  {line}");
        }
    }
    if let Some(f) = &report.forked {
        println!(
            "\nCounterfactual: fork {} with {} (the reviewer hears the rename first):",
            replayed.run, f.edit
        );
        println!("  fork {}: the reviewer decided {} ({}: unchanged steps came from the recording, changed ones from the cache or live)", f.fork, f.decision, count(f.live_calls, "live model call"));
        let diff =
            retrace_store::diff::diff_runs(store.as_ref(), &replayed.run, &f.fork, &Default::default())?;
        println!(
            "  diff: {} same, {} changed, {} only in the source, {} new",
            count(diff.counts.same, "step"),
            diff.counts.changed,
            diff.counts.only_in_a,
            diff.counts.only_in_b
        );
        for m in &diff.decisions {
            println!(
                "  decision moved: {} on {}: {} -> {}",
                m.agent,
                m.target.as_deref().unwrap_or("-"),
                m.a.as_deref().unwrap_or("(none)"),
                m.b.as_deref().unwrap_or("(none)")
            );
        }
    }
    println!("\nDig deeper:");
    println!("  retrace show {}", replayed.run);
    if let Some(k) = &knew {
        println!("  retrace knew {} {}", replayed.run, k.seq);
    }
    if let Some(f) = &report.forked {
        println!("  retrace diff {} {}", replayed.run, f.fork);
    }
    println!("  retrace replay {}", replayed.run);
    println!("  retrace export {} -o bad-migration.jsonl", replayed.run);
    Ok(())
}

fn trio_json(report: &TrioReport, knew: Option<&causal::Knew>) -> serde_json::Value {
    serde_json::json!({
        "runs": report.runs.iter().map(|r| serde_json::json!({
            "id": r.id, "chaos_seed": r.chaos_seed, "decision": r.decision,
            "violation": r.violation.as_ref().map(|v| serde_json::json!({"approval_seq": v.approval_seq, "rename_seq": v.rename_seq})),
        })).collect::<Vec<_>>(),
        "live_calls_recorded": report.live_calls_recorded,
        "replayed": report.replayed.as_ref().map(|r| serde_json::json!({
            "run": r.run, "replays": r.replays, "decisions": r.decisions, "live_calls": r.live_calls,
        })),
        "knew": knew,
        "forked": report.forked.as_ref().map(|f| serde_json::json!({
            "fork": f.fork, "edit": f.edit, "decision": f.decision, "live_calls": f.live_calls,
        })),
    })
}
