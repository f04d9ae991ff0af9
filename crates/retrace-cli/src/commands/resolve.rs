//! `retrace resolve RUN SEQ`: record a person's answer for a side effect that may or may not
//! have happened (its intent was logged, its completion was not).
use clap::Parser;
use retrace_core::canonical::canonicalize;
use retrace_core::json::Json;
use retrace_core::key::KeyConfig;
use retrace_core::{Event, EventType, Source};
use retrace_store::{BlobHint, BlobPut, LeaseHolder, RunWriter};

use super::existing_store_from_env;
use crate::exit::{usage, usage_hint};

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace resolve 01jd3k 14 --outcome @sent.json"
    };
}

/// Record what happened to a side effect that may or may not have happened.
#[derive(Debug, Parser)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Record what happened to a side effect whose intent was logged but whose completion was not (the \
process died in between). Replay and fork stop at such a step until it is resolved.\n\n\
With --outcome @FILE, replay returns that output where the program made the call. With \
--not-executed, replay stops there with `log_ended`, and a fork treats the call as a new step \
(a dry run). The answer is appended to the run as a `resolution` event.",
        "\n\n",
        examples!()
    ),
    // One answer or the other: clap then names both when neither is given.
    group(clap::ArgGroup::new("answer").required(true).args(["outcome", "not_executed"]))
)]
pub struct Args {
    /// The run (id or unique prefix).
    run: String,
    /// The seq of the side effect's `intent` event.
    seq: u64,
    /// The side effect happened; this JSON file is what it returned.
    #[arg(long, value_name = "@FILE")]
    outcome: Option<String>,
    /// The side effect did not happen.
    #[arg(long)]
    not_executed: bool,
    /// Print what was stored as JSON: `{"run", "intent", "resolution", "executed", "agent",
    /// "tool", "idempotency_key"}` (`resolution`: the seq of the new `resolution` event).
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let store = existing_store_from_env()?;
    let run = crate::commands::runs::find(&*store, &args.run)?;
    let intent = store.event(&run.id, args.seq)?;
    if intent.kind != EventType::Intent {
        return Err(usage_hint(
            format!(
                "seq {} of run {} is a {} ({}), not a side effect's intent",
                args.seq,
                run.id,
                intent.kind,
                intent.label()
            ),
            "`retrace show RUN` lists the intents",
        ));
    }
    let last = store.last_seq(&run.id)?;
    let later = store.events(&run.id, args.seq + 1, (last.saturating_sub(args.seq)) as usize)?;
    if let Some(done) = later.iter().find(|e| {
        e.causal_parent == Some(args.seq) && matches!(e.kind, EventType::ToolCall | EventType::Resolution)
    }) {
        return Err(usage(format!(
            "the intent at seq {} already has its answer: seq {} ({})",
            args.seq,
            done.seq,
            done.label()
        )));
    }
    let tool = intent.tool.as_ref().map(|t| t.name.as_str()).unwrap_or("?");
    let occurrence = 1 + store
        .events(&run.id, 1, args.seq as usize)?
        .iter()
        .filter(|e| {
            e.kind == EventType::Intent
                && e.agent_id == intent.agent_id
                && e.tool.as_ref().map(|t| t.name.as_str()) == Some(tool)
                && e.seq < args.seq
        })
        .count();
    let idempotency = idempotency_key(&run.id, &intent.agent_id, tool, occurrence);
    let mut event = Event::new(run.id.clone(), intent.agent_id.clone(), EventType::Resolution);
    event.causal_parent = Some(args.seq);
    event.tool = intent.tool.clone();
    event.role = intent.role.clone();
    event.source = Source::Recorded;
    let mut blobs = Vec::new();
    if let Some(file) = &args.outcome {
        let path = file.strip_prefix('@').ok_or_else(|| usage("--outcome takes @FILE"))?;
        let bytes = std::fs::read(path).map_err(|e| usage(format!("reading {path}: {e}")))?;
        let canonical = canonicalize(&bytes).map_err(|e| usage(format!("{path} is not JSON: {e}")))?;
        let blob = BlobPut::new(canonical, BlobHint::Raw);
        event.output_ref = Some(blob.digest());
        event.output_hash = Some(blob.digest());
        event.name = Some("executed".into());
        blobs.push(blob);
    } else {
        event.name = Some("not_executed".into());
    }
    let request = Json::from_value(&serde_json::json!({ "intent": args.seq }));
    event.key = KeyConfig::default().key(EventType::Resolution, event.name.as_deref(), None, &request)?;
    event.lamport = intent.lamport + 1;
    let writer = RunWriter::open(store.clone(), &run.id, LeaseHolder::unique())?;
    let acked = writer.append_sync(event, blobs)?;
    writer.close()?;
    let mut meta = store.run(&run.id)?;
    meta.head = Some(acked.hash);
    store.update_run(&meta)?;
    eprintln!(
        "retrace: resolved {} seq {} ({tool} by {}; idempotency key {idempotency}) as {} at seq {}",
        run.id,
        args.seq,
        intent.agent_id,
        if args.not_executed { "not executed" } else { "executed" },
        acked.seq
    );
    if args.json {
        // Every command that changes the store says what it stored (QA37 S2).
        crate::output::print_json(&serde_json::json!({
            "run": run.id, "intent": args.seq, "resolution": acked.seq, "executed": !args.not_executed,
            "agent": intent.agent_id, "tool": tool, "idempotency_key": idempotency,
        }))?;
    }
    Ok(())
}

/// The idempotency key a side-effect function that accepts one was handed when it ran:
/// `RUN/AGENT/TOOL#N`, where `N` counts the agent's side effects of that tool from 1 (its
/// `intent` events). The Python SDK hands it out (`Agent._tool_flow`); this is the one place
/// the Rust side writes it, so `resolve` names the key the side effect received.
fn idempotency_key(run: &str, agent: &str, tool: &str, occurrence: usize) -> String {
    format!("{run}/{agent}/{tool}#{occurrence}")
}
