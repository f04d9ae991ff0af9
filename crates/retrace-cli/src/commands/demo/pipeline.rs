//! `retrace demo pipeline`: the 8-step pipeline recorded, forked at `critique`, and accounted
//! for step by step; and `retrace demo run pipeline`, the program a recorded run re-runs.
use std::path::Path;

use retrace_core::envelope::Usage;
use retrace_demo::client::{prices_from_config, ChatClient};
use retrace_demo::pipeline::{pipeline, Prompts, ToolCalls, STEPS};
use retrace_demo::pipeline_story::{pipeline_options, run_pipeline, PipelineReport, StepRow};
use retrace_demo::server::SimServer;
use retrace_runtime::{Mode, Outcome, Session};
use retrace_store::diff::Tokens;
use serde_json::json;

use crate::commands::store_from_env;
use crate::output::print_json;

/// Where the demos read `[prices]` from.
const CONFIG: &str = "retrace.toml";

/// Records the pipeline, forks it, and prints what the fork re-ran, reused and saved.
pub async fn demo(seed: u64, upstream: Option<String>, json: bool) -> anyhow::Result<()> {
    let store = store_from_env()?;
    let prices = prices_from_config(Path::new(CONFIG))?;
    let model = upstream.clone().unwrap_or_else(|| "the built-in model simulator (not a real model)".into());
    let report = run_pipeline(store, seed, upstream, prices, &super::masking()?).await?;
    if json {
        return print_json(&report_json(&report));
    }
    let names: Vec<&str> = STEPS.iter().map(|(step, _)| *step).collect();
    println!("Retrace demo: the 8-step pipeline ({}); model: {model}\n", names.join(" → "));
    let [search, verify, publish] = report.tools_recorded;
    println!(
        "Recorded {}: {} model calls, web.search ran {search}×, report.verify {verify}×, cms.publish {publish}× ({}).",
        report.source,
        report.model_calls[0],
        report.recorded.published["url"].as_str().unwrap_or("not published"),
    );
    let at = report.critique_seq.map(|s| format!(", seq {s}")).unwrap_or_default();
    println!(
        "Forked it as {} with {}: the critic gets its stricter rubric from critique on{at}.\n",
        report.fork, report.edit
    );
    println!("{}", step_table(&report.steps));
    let [search, verify, publish] = report.tools_forked;
    println!(
        "\nThe fork made {} model calls; web.search ran {search}×, report.verify {verify}×, cms.publish {publish}× \
         (it returned {}).",
        report.model_calls[1], report.forked.published
    );
    let d = &report.diff;
    println!("\nTotals (retrace diff {} {}):", d.a.id, d.b.id);
    println!("  source  {}", tokens_line(&d.a.live, "live model calls"));
    println!("  fork    {}", tokens_line(&d.b.live, "live model calls"));
    if let Some(saved) = &d.b.saved {
        println!("  saved   {}", tokens_line(saved, "model calls served from the recording"));
    }
    if let Some(inherited) = d.b.inherited.as_ref().filter(|t| t.steps > 0) {
        println!("  (and    {})", tokens_line(inherited, "inherited before the fork point)"));
    }
    let moved = if d.decisions.is_empty() { "none".to_owned() } else { format!("{}", d.decisions.len()) };
    println!(
        "  steps: {} same, {} changed, {} only in the source, {} new; decisions moved: {moved}",
        d.counts.same, d.counts.changed, d.counts.only_in_a, d.counts.only_in_b
    );
    println!("\nDig deeper:");
    println!("  retrace diff {} {}", report.source, report.fork);
    println!("  retrace show {}", report.fork);
    println!("  retrace replay {}        # the fork again, zero live calls", report.fork);
    println!("  retrace fork {} --edit {}", report.source, report.edit);
    Ok(())
}

/// Runs the pipeline under the session the environment names (what `retrace replay` and
/// `retrace fork` re-run).
pub async fn run_recorded(seed: u64, upstream: Option<String>) -> anyhow::Result<()> {
    let prompts = Prompts::write()?;
    let session = Session::from_env_with(pipeline_options(seed, prompts.dir()))?;
    let upstream = super::model_server(upstream);
    let server = match (&upstream, session.mode()) {
        (None, Mode::Record | Mode::Off | Mode::Fork) => Some(SimServer::start(seed).await?),
        _ => None,
    };
    let base = upstream.unwrap_or_else(|| server.as_ref().map(SimServer::base_url).unwrap_or_default());
    let client = ChatClient::new(&base).with_prices(prices_from_config(Path::new(CONFIG))?);
    let brief = pipeline(&session, &client, &ToolCalls::default()).await?;
    let report = session.finish(Outcome { exit_status: Some(0) })?;
    println!("job {}: {}", brief.job, brief.published);
    super::say_finished(&report);
    Ok(())
}

/// The fork's steps as a table.
fn step_table(rows: &[StepRow]) -> String {
    let mut out = format!(
        "  {:<9} {:<11} {:>4}  {:<9}  {:<27} {:>17}  {:>10}",
        "step", "agent", "seq", "source", "output vs source", "tokens src → fork", "fork cost"
    );
    for r in rows {
        let short = |d: &Option<retrace_core::Digest>| {
            d.map(|d| d.to_string().trim_start_matches("sha256:")[..8].to_owned())
                .unwrap_or_else(|| "-".into())
        };
        let output = if r.same {
            format!("same     {}", short(&r.output_hash))
        } else {
            format!("changed  {} → {}", short(&r.source_hash), short(&r.output_hash))
        };
        let tokens = match (&r.source_usage, &r.usage) {
            (None, None) => "-".to_owned(),
            (s, f) => format!("{} → {}", total(s), total(f)),
        };
        let cost = match (&r.usage, &r.source_usage) {
            (Some(u), _) => u.cost_usd.map_or("no price".to_owned(), dollars),
            (None, Some(_)) => "$0".to_owned(),
            (None, None) => "-".to_owned(),
        };
        let seq = r.seq.map_or("-".to_owned(), |s| s.to_string());
        out.push_str(&format!(
            "\n  {:<9} {:<11} {:>4}  {:<9}  {:<27} {:>17}  {:>10}",
            r.step, r.agent, seq, r.source, output, tokens, cost
        ));
    }
    out
}

fn total(usage: &Option<Usage>) -> u64 {
    usage.as_ref().map_or(0, |u| u.input_tokens + u.output_tokens)
}

fn tokens_line(t: &Tokens, what: &str) -> String {
    let cached = match t.cache_read_tokens {
        0 => String::new(),
        n => format!(", {n} of them from the prompt cache"),
    };
    format!(
        "{} {what}: {} tokens ({} in{cached}, {} out), {}",
        t.steps,
        t.input_tokens + t.output_tokens,
        t.input_tokens,
        t.output_tokens,
        t.cost_usd.map_or("no price".to_owned(), dollars)
    )
}

fn dollars(usd: f64) -> String {
    format!("${usd:.6}")
}

fn report_json(r: &PipelineReport) -> serde_json::Value {
    let d = &r.diff;
    let tools = |[research, verify, publish]: [usize; 3]| json!({"web.search": research, "report.verify": verify, "cms.publish": publish});
    json!({
        "source": r.source,
        "fork": r.fork,
        "edit": r.edit,
        "critique_seq": r.critique_seq,
        "steps": r.steps,
        "model_calls": {"source": r.model_calls[0], "fork": r.model_calls[1]},
        "tool_calls": {"source": tools(r.tools_recorded), "fork": tools(r.tools_forked)},
        "published": {"source": r.recorded.published, "fork": r.forked.published},
        "totals": {"source": d.a.live, "fork": d.b.live, "saved": d.b.saved, "inherited": d.b.inherited},
        "counts": d.counts,
        "decisions": d.decisions,
    })
}
