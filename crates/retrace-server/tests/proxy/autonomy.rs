//! The autonomy ladder through the daemon's SDK steps route over HTTP: a side effect by an
//! agent below the bar is refused or held (`approval_required`), one at the bar runs, and a
//! replay of the run answers from the recorded `approval` events (the replaying daemon has no
//! policy at all).
use std::sync::Arc;

use retrace_core::autonomy::{AutonomyPolicy, Below};
use retrace_core::ledger::{signing_key, LedgerEntry, LedgerFile};
use retrace_demo::providers::Providers;
use retrace_runtime::autonomy::Governor;
use retrace_store::ledger::ApprovalDecision;
use serde_json::{json, Value};

use crate::support::{client, daemon, daemon_over, Daemon};

fn governor(below: Below, timeout_s: u64, ledger: Option<(u64, u64)>) -> Arc<Governor> {
    let policy = AutonomyPolicy {
        side_effect_min_clean: 3,
        side_effect_min_traces: 2,
        below,
        approval_timeout_s: timeout_s,
        ..AutonomyPolicy::default()
    };
    let ledger = ledger.map(|(clean, distinct)| {
        let entry = LedgerEntry {
            project: "billing".into(),
            agent: "ops".into(),
            clean_streak: clean,
            distinct_traces: distinct,
            ..LedgerEntry::default()
        };
        LedgerFile::sign(
            vec![entry],
            1,
            &signing_key("BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=").unwrap(),
        )
    });
    Arc::new(Governor::new(policy, "billing", ledger))
}

/// Posts the side effect `email.send` for `ops`; completes it with `{"sent": true}` when the
/// daemon says to run it. Returns the final answer.
async fn send(d: &Daemon, run: &str) -> Value {
    let url = format!("{}/api/runs/{run}/agents/ops/steps", d.base);
    let step = json!({"type": "tool_call", "name": "email.send", "request": {"to": "ceo"},
                      "tool": {"class": "side_effect", "version": "1"}});
    let first: Value = client().post(&url).json(&step).send().await.unwrap().json().await.unwrap();
    if first["status"] != "run" {
        return first;
    }
    let done = json!({"step": first["step"], "output": {"sent": true}});
    client().post(&url).json(&done).send().await.unwrap().json().await.unwrap()
}

/// Replays `run` on a daemon with no policy over the same store; returns the answers.
async fn replayed(store: Arc<dyn retrace_store::Store>, run: &str, calls: usize) -> Vec<Value> {
    let plain = daemon_over(store, "http://127.0.0.1:9".into(), "http://127.0.0.1:9".into(), |_| {}).await;
    let replay_run = plain.replay_of(run).await;
    let mut answers = Vec::new();
    for _ in 0..calls {
        answers.push(send(&plain, &replay_run).await);
    }
    assert_eq!(plain.finish(&replay_run).await["status"], "ok");
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_bar_is_refused_at_each_rung_and_replays_refused() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    for (rung, ledger) in [("unproven", None), ("probation", Some((2, 5)))] {
        let d = daemon(&providers, |c| c.autonomy = Some(governor(Below::Refuse, 0, ledger))).await;
        let run = d.new_run().await;
        let refused = send(&d, &run).await;
        assert_eq!(refused["status"], "refused", "{refused}");
        let text = refused["error"].as_str().unwrap();
        assert!(text.contains(&format!("rung {rung}")) && text.contains("retrace approve"), "{text}");
        assert!(text.contains("3 consecutive clean replays over 2 distinct traces"), "{text}");
        assert_eq!(d.finish(&run).await["status"], "ok");
        let again = replayed(d.store.clone(), &run, 1).await;
        assert_eq!(again[0]["status"], "refused", "{again:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_bar_the_side_effect_runs() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |c| c.autonomy = Some(governor(Below::Refuse, 0, Some((3, 2))))).await;
    let run = d.new_run().await;
    let done = send(&d, &run).await;
    assert_eq!(done, json!({"status": "done", "output": {"sent": true}}));
    assert_eq!(d.finish(&run).await["status"], "ok");
    assert_eq!(replayed(d.store.clone(), &run, 1).await[0], done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_is_approval_required_then_runs_once_approved_and_replays_both() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |c| c.autonomy = Some(governor(Below::Hold, 0, None))).await;
    let run = d.new_run().await;
    let held = send(&d, &run).await;
    assert_eq!(held["status"], "approval_required", "{held}");
    let id = held["approval"].as_str().unwrap().to_owned();
    let yes = ApprovalDecision { approved: true, by: "ada".into(), reason: "ok".into(), at_ms: 1 };
    d.store.approval_decide(&id, &yes).unwrap();
    let done = send(&d, &run).await;
    assert_eq!(done, json!({"status": "done", "output": {"sent": true}}));
    assert_eq!(d.finish(&run).await["status"], "ok");
    let answers = replayed(d.store.clone(), &run, 2).await;
    assert_eq!(
        (answers[0]["status"].as_str(), answers[0]["approval"].as_str()),
        (Some("approval_required"), Some(id.as_str()))
    );
    assert_eq!(answers[1], done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_that_waits_times_out() {
    let providers = Providers::start("127.0.0.1:0").await.unwrap();
    let d = daemon(&providers, |c| c.autonomy = Some(governor(Below::Hold, 1, None))).await;
    let run = d.new_run().await;
    let began = std::time::Instant::now();
    let held = send(&d, &run).await;
    assert!(began.elapsed().as_secs_f64() >= 1.0);
    assert_eq!(held["status"], "approval_required", "{held}");
    assert_eq!(d.finish(&run).await["status"], "ok");
    let events = d.store.events(&run, 1, 10).unwrap();
    let outcomes: Vec<_> = events.iter().filter_map(|e| e.approval.clone()).collect();
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].outcome, retrace_core::envelope::ApprovalOutcome::TimedOut);
}
