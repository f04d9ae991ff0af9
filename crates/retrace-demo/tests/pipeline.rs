//! The 8-step pipeline demo end to end on a temporary SQLite store: record, fork at `critique`
//! with the critic's stricter prompt, check what ran live and what it cost, replay the fork.
use std::sync::Arc;

use retrace_core::envelope::Usage;
use retrace_core::prices::PriceTable;
use retrace_core::run::RunStatus;
use retrace_demo::client::{prices_from_config, ChatClient};
use retrace_demo::masking::DemoMasking;
use retrace_demo::pipeline::{pipeline, Prompts, ToolCalls};
use retrace_demo::pipeline_story::{run_pipeline, PipelineReport};
use retrace_runtime::{Outcome, Session, SessionOptions};
use retrace_store::{open_store, Store, StoreConfig};

fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(&StoreConfig::in_home(dir.path())).unwrap();
    (dir, store)
}

async fn demo(store: &Arc<dyn Store>) -> PipelineReport {
    run_pipeline(store.clone(), 11, None, PriceTable::builtin(), &DemoMasking::default()).await.unwrap()
}

fn tokens(u: &Option<Usage>) -> u64 {
    u.as_ref().map_or(0, |u| u.input_tokens + u.output_tokens)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fork_reruns_only_what_the_critique_reaches() {
    let (_dir, store) = store();
    let report = demo(&store).await;
    let shown: Vec<String> = report
        .steps
        .iter()
        .map(|r| format!("{} {} {}", r.step, r.source, if r.same { "same" } else { "changed" }))
        .collect();
    assert_eq!(
        shown,
        [
            "plan recorded same",
            "research recorded same",
            "analyse recorded same",
            "critique live changed",
            "revise live changed",
            "compose live changed",
            "verify live changed",
            "publish dry_run changed",
        ],
    );
    for row in &report.steps {
        assert!(row.origin_seq.is_some(), "{} is paired with a source step", row.step);
        if row.same {
            assert_eq!(row.output_hash, row.source_hash, "{}", row.step);
            assert_eq!(tokens(&row.usage), 0, "{} costs nothing in the fork", row.step);
        }
    }
    // Model calls: five while recording, three (critique, revise, compose) in the fork.
    assert_eq!(report.model_calls, [5, 3]);
    // research, verify and publish ran once each while recording; in the fork only verify ran,
    // and the side effect was a dry run.
    assert_eq!(report.tools_recorded, [1, 1, 1]);
    assert_eq!(report.tools_forked, [0, 1, 0]);
    assert_eq!(report.recorded.published["published"], true);
    assert_eq!(report.forked.published["dry_run"], true);
    assert_eq!(report.forked.job, report.recorded.job, "the job id is served from the recording");
    assert_eq!(report.diff.a.status, RunStatus::Ok);
    assert_eq!(report.diff.b.status, RunStatus::Ok);
    assert!(report.diff.decisions.is_empty(), "the publisher decides the same: {:?}", report.diff.decisions);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fork_costs_less_and_says_what_it_saved() {
    let (_dir, store) = store();
    let report = demo(&store).await;
    let (source, fork) = (&report.diff.a, &report.diff.b);
    let total = |t: &retrace_store::diff::Tokens| t.input_tokens + t.output_tokens;
    assert_eq!(source.live.steps, 5);
    assert_eq!(fork.live.steps, 3);
    assert!(total(&fork.live) < total(&source.live), "{:?} vs {:?}", fork.live, source.live);
    let saved = fork.saved.as_ref().expect("a fork reports its savings");
    assert_eq!(saved.steps, 2, "plan and analyse were served from the recording");
    assert!(total(saved) > 0);
    let recorded_tokens: u64 = report.steps.iter().filter(|r| r.same).map(|r| tokens(&r.source_usage)).sum();
    assert_eq!(total(saved), recorded_tokens);
    // Every model event is priced: runs and forks sum dollars too.
    for row in report.steps.iter().filter(|r| !matches!(r.step, "research" | "verify" | "publish")) {
        let usage = row.source_usage.as_ref().expect("model steps record their usage");
        assert!(usage.cost_usd.is_some_and(|c| c > 0.0), "{} is priced: {usage:?}", row.step);
    }
    let (source_usd, fork_usd) = (source.live.cost_usd.unwrap(), fork.live.cost_usd.unwrap());
    assert!(fork_usd > 0.0 && fork_usd < source_usd, "{fork_usd} vs {source_usd}");
    assert!(saved.cost_usd.unwrap() > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_the_fork_runs_nothing_live() {
    let (_dir, store) = store();
    let report = demo(&store).await;
    let prompts = Prompts::write().unwrap();
    // Nothing listens here: a live model call would fail.
    let offline = ChatClient::new("http://127.0.0.1:9/v1");
    let tools = ToolCalls::default();
    let options = SessionOptions { prompts_dir: prompts.dir().to_path_buf(), ..SessionOptions::default() };
    let replay = Session::replay(store.clone(), &report.fork, options).unwrap();
    let brief = pipeline(&replay, &offline, &tools).await.unwrap();
    let done = replay.finish(Outcome { exit_status: Some(0) }).unwrap();
    assert_eq!(done.status, RunStatus::Ok);
    assert_eq!(done.live_calls, 0);
    assert_eq!(offline.calls(), 0);
    assert_eq!(tools.counts(), [0, 0, 0]);
    assert_eq!(brief, report.forked, "the replay saw exactly what the fork saw");
}

#[test]
fn retrace_toml_prices_override_the_builtin_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("retrace.toml");
    let usage =
        Usage { input_tokens: 1_000_000, output_tokens: 1_000_000, cost_usd: None, ..Default::default() };
    let builtin = prices_from_config(&path).unwrap();
    assert_eq!(builtin.cost("retrace-sim-1-2026-11-01", &usage), Some(0.75));
    std::fs::write(&path, "[prices]\n\"retrace-sim-1*\" = { input = 1, output = 2 }\n").unwrap();
    let configured = prices_from_config(&path).unwrap();
    assert_eq!(configured.cost("retrace-sim-1-2026-11-01", &usage), Some(3.0));
    std::fs::write(&path, "[prices]\n\"retrace-sim-1*\" = 3\n").unwrap();
    let e = prices_from_config(&path).unwrap_err();
    assert!(format!("{e:#}").contains("line 2"), "{e:#}");
}
