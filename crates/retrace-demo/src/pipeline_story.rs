//! `retrace demo pipeline`: record the 8-step pipeline once, fork it at `critique` with the
//! critic's stricter prompt, and account step by step for what the fork ran, reused and saved.
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use retrace_core::edit::Edit;
use retrace_core::envelope::Usage;
use retrace_core::prices::PriceTable;
use retrace_core::run::Command;
use retrace_core::{Digest, Event, EventType, Source};
use retrace_runtime::{Outcome, Session, SessionOptions};
use retrace_store::diff::{diff_runs, DiffOptions, RunDiff};
use retrace_store::export::RunEvents;
use retrace_store::{Store, StoreResult};
use serde::Serialize;

use crate::client::ChatClient;
use crate::masking::DemoMasking;
use crate::pipeline::{pipeline, Brief, Prompts, ToolCalls, STEPS};
use crate::server::SimServer;

/// The fork's edit: from `critique` on, the critic's template is the stricter `v2`.
pub const FORK_EDIT: &str = "prompt:critic=v2";

/// The argv a pipeline run records: the hidden subcommand that runs exactly that program.
pub fn pipeline_command(seed: u64) -> Command {
    Command {
        argv: ["retrace", "demo", "run", "pipeline", "--seed", &seed.to_string()].map(String::from).to_vec(),
        cwd: ".".into(),
    }
}

/// Session options of a pipeline run whose templates are under `prompts`.
pub fn pipeline_options(seed: u64, prompts: &Path) -> SessionOptions {
    SessionOptions {
        name: Some("demo: 8-step pipeline".into()),
        command: Some(pipeline_command(seed)),
        prompts_dir: prompts.to_path_buf(),
        ..SessionOptions::default()
    }
}

/// One pipeline step of a fork, against the source step it was matched or paired with.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepRow {
    /// The step (`plan`, ...).
    pub step: &'static str,
    /// The agent that took it.
    pub agent: &'static str,
    /// Its seq in the fork (`None` when the fork didn't take it).
    pub seq: Option<u64>,
    /// `live`, `recorded`, `cache_hit`, `dry_run`, or `inherited` (before the fork point).
    pub source: String,
    /// The source step's seq.
    pub origin_seq: Option<u64>,
    /// The fork's output hash.
    pub output_hash: Option<Digest>,
    /// The source step's output hash.
    pub source_hash: Option<Digest>,
    /// Whether the two hashes are equal.
    pub same: bool,
    /// What the step cost in the fork (live steps only).
    pub usage: Option<Usage>,
    /// What the source step cost.
    pub source_usage: Option<Usage>,
}

/// What the demo did.
#[derive(Clone, Debug)]
pub struct PipelineReport {
    /// The recorded run.
    pub source: String,
    /// The fork.
    pub fork: String,
    /// The fork's edit.
    pub edit: String,
    /// The seq of `critique`'s model call in the source, where the edit takes effect.
    pub critique_seq: Option<u64>,
    /// The fork's steps against the source's.
    pub steps: Vec<StepRow>,
    /// `retrace diff SOURCE FORK`.
    pub diff: RunDiff,
    /// Model calls over HTTP while recording and while forking.
    pub model_calls: [usize; 2],
    /// Live runs of research, verify and publish while recording.
    pub tools_recorded: [usize; 3],
    /// The same while forking (publish must be 0).
    pub tools_forked: [usize; 3],
    /// What the recording produced.
    pub recorded: Brief,
    /// What the fork produced.
    pub forked: Brief,
}

/// Records the pipeline once, then forks it with [`FORK_EDIT`] and compares the two. The model
/// is the built-in simulator seeded with `seed`, or the OpenAI-compatible `upstream`; the
/// sessions mask with `masking`.
pub async fn run_pipeline(
    store: Arc<dyn Store>,
    seed: u64,
    upstream: Option<String>,
    prices: PriceTable,
    masking: &DemoMasking,
) -> anyhow::Result<PipelineReport> {
    let prompts = Prompts::write().context("writing the pipeline's prompt templates")?;
    let server = match &upstream {
        Some(_) => None,
        None => Some(SimServer::start(seed).await.context("starting the model simulator")?),
    };
    let base = upstream.unwrap_or_else(|| server.as_ref().map(SimServer::base_url).unwrap_or_default());
    let client = ChatClient::new(&base).with_prices(prices);

    let tools_recorded = ToolCalls::default();
    let session = Session::record(store.clone(), masking.apply(pipeline_options(seed, prompts.dir())))?;
    let recorded = pipeline(&session, &client, &tools_recorded).await.context("recording the pipeline")?;
    let source = session.finish(Outcome { exit_status: Some(0) })?.run_id;
    let recorded_calls = client.calls();

    let edit: Edit = FORK_EDIT.parse()?;
    let options = masking.apply(SessionOptions {
        name: Some("demo: 8-step pipeline, stricter critic".into()),
        ..pipeline_options(seed, prompts.dir())
    });
    let session = Session::fork_new(store.clone(), &source, None, vec![edit.clone()], options)
        .context("forking the pipeline")?;
    let tools_forked = ToolCalls::default();
    let forked = pipeline(&session, &client, &tools_forked).await.context("running the fork")?;
    let fork = session.finish(Outcome { exit_status: Some(0) })?.run_id;
    if let Some(server) = server {
        server.stop().await;
    }

    let diff = diff_runs(store.as_ref(), &source, &fork, &DiffOptions::default())?;
    let steps = step_rows(store.as_ref(), &fork)?;
    let critique_seq = pipeline_events(store.as_ref(), &source)?
        .iter()
        .find(|e| e.agent_id == "critic" && e.kind == EventType::ModelCall)
        .map(|e| e.seq);
    Ok(PipelineReport {
        source,
        fork,
        edit: edit.to_string(),
        critique_seq,
        steps,
        diff,
        model_calls: [recorded_calls, client.calls() - recorded_calls],
        tools_recorded: tools_recorded.counts(),
        tools_forked: tools_forked.counts(),
        recorded,
        forked,
    })
}

/// Each pipeline step of fork `fork` against its source step: where its output came from,
/// whether it equals the source's, and what each cost.
pub fn step_rows(store: &dyn Store, fork: &str) -> StoreResult<Vec<StepRow>> {
    let meta = store.run(fork)?;
    let source_run = meta.source_run.clone().unwrap_or_default();
    let events = pipeline_events(store, fork)?;
    let mut rows = Vec::new();
    for (step, agent) in STEPS {
        let Some(e) = events.iter().rev().find(|e| e.agent_id == agent) else {
            rows.push(StepRow {
                step,
                agent,
                seq: None,
                source: "absent".into(),
                origin_seq: None,
                output_hash: None,
                source_hash: None,
                same: false,
                usage: None,
                source_usage: None,
            });
            continue;
        };
        let inherited = e.run_id != meta.id;
        let origin = match (inherited, e.origin_seq) {
            (true, _) => Some(e.clone()),
            (false, Some(seq)) => Some(store.event(&source_run, seq)?),
            (false, None) => None,
        };
        let source = if inherited { "inherited".to_owned() } else { source_name(e.source) };
        rows.push(StepRow {
            step,
            agent,
            seq: Some(e.seq),
            source,
            origin_seq: origin.as_ref().map(|o| o.seq),
            output_hash: e.output_hash,
            source_hash: origin.as_ref().and_then(|o| o.output_hash),
            same: origin.as_ref().is_some_and(|o| o.output_hash == e.output_hash),
            usage: if inherited || e.source != Source::Live { None } else { e.usage.clone() },
            source_usage: origin.and_then(|o| o.usage),
        });
    }
    Ok(rows)
}

/// The model and tool calls of `run` (inherited ones included), in seq order.
fn pipeline_events(store: &dyn Store, run: &str) -> StoreResult<Vec<Event>> {
    let mut events = Vec::new();
    let mut pages = RunEvents::new(store, run)?;
    while let Some(page) = pages.next_page()? {
        events.extend(
            page.into_iter().filter(|e| matches!(e.kind, EventType::ModelCall | EventType::ToolCall)),
        );
    }
    Ok(events)
}

fn source_name(source: Source) -> String {
    match source {
        Source::Live => "live",
        Source::Recorded => "recorded",
        Source::CacheHit => "cache_hit",
        Source::DryRun => "dry_run",
    }
    .to_owned()
}
