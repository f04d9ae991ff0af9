//! The replay ledger and the approvals: a trace counted once per content hash, streaks reset by
//! a divergence, approvals decided once.
use retrace_core::Digest;

use super::MakeStore;
use crate::ledger::{ApprovalDecision, ApprovalRecord, ReplayOutcome};
use crate::StoreErrorKind;

fn outcome(agent: &str, trace: &str, clean: bool) -> ReplayOutcome {
    ReplayOutcome {
        project: "billing".into(),
        agent: agent.into(),
        trace: Digest::of(trace.as_bytes()),
        clean,
        seq: (!clean).then_some(7),
        detail: (!clean).then(|| "step_mismatch at seq 7".into()),
        at_ms: 1_700_000_000_000,
    }
}

/// Replays add up per (project, agent): a trace hash counts once in `traces_replayed` and once
/// per streak in `distinct_traces`; a divergence resets the streak and is remembered.
pub fn ledger_counts_traces_once_per_hash(make: MakeStore<'_>) {
    let store = make();
    assert!(store.ledger_entries(None).unwrap().is_empty());
    let e = store.ledger_record(&outcome("planner", "t1", true)).unwrap();
    assert_eq!((e.replays, e.traces_replayed, e.clean_streak, e.distinct_traces), (1, 1, 1, 1));
    let e = store.ledger_record(&outcome("planner", "t1", true)).unwrap();
    assert_eq!((e.replays, e.traces_replayed, e.clean_streak, e.distinct_traces), (2, 1, 2, 1), "same hash");
    let e = store.ledger_record(&outcome("planner", "t2", true)).unwrap();
    assert_eq!((e.traces_replayed, e.clean_streak, e.distinct_traces), (2, 3, 2));
    let e = store.ledger_record(&outcome("planner", "t3", false)).unwrap();
    assert_eq!((e.replays, e.traces_replayed, e.clean_streak, e.distinct_traces), (4, 3, 0, 0));
    let last = e.last_divergence.clone().expect("remembered");
    assert_eq!((last.seq, last.trace.as_str()), (Some(7), Digest::of(b"t3").to_string().as_str()));
    // After a divergence an old trace counts again in the new streak, not in traces_replayed.
    let e = store.ledger_record(&outcome("planner", "t1", true)).unwrap();
    assert_eq!((e.traces_replayed, e.clean_streak, e.distinct_traces), (3, 1, 1));
    assert!(e.last_divergence.is_some());
    store.ledger_record(&outcome("coder", "t1", true)).unwrap();
    let mut other = outcome("coder", "t1", true);
    other.project = "other".into();
    store.ledger_record(&other).unwrap();
    let agents: Vec<String> =
        store.ledger_entries(Some("billing")).unwrap().into_iter().map(|e| e.agent).collect();
    assert_eq!(agents, ["coder", "planner"]);
    assert_eq!(store.ledger_entries(None).unwrap().len(), 3);
}

/// A held call is stored pending, found by its step, decided exactly once.
pub fn approvals_are_decided_once(make: MakeStore<'_>) {
    let store = make();
    let key = Digest::of(b"step");
    let held = ApprovalRecord {
        id: "ap1".into(),
        run: "r1".into(),
        agent: "planner".into(),
        tool: "email.send".into(),
        key,
        rung: "unproven".into(),
        why: "no replay record".into(),
        requested_at_ms: 5,
        decision: None,
    };
    assert_eq!(store.approvals_undecided().unwrap(), vec![]);
    store.approval_request(&held).unwrap();
    assert_eq!(store.approval_request(&held).unwrap_err().kind, StoreErrorKind::Conflict);
    assert_eq!(store.approvals_undecided().unwrap(), vec![held.clone()]);
    assert_eq!(store.approval("ap1").unwrap().as_ref(), Some(&held));
    assert_eq!(store.approval("nope").unwrap(), None);
    assert_eq!(store.approval_for("r1", "planner", &key).unwrap().map(|a| a.id), Some("ap1".into()));
    assert_eq!(store.approval_for("r1", "coder", &key).unwrap(), None);
    let yes = ApprovalDecision { approved: true, by: "ada".into(), reason: "checked".into(), at_ms: 9 };
    let decided = store.approval_decide("ap1", &yes).unwrap();
    assert_eq!(decided.decision.as_ref(), Some(&yes));
    let again = store.approval_decide("ap1", &ApprovalDecision { approved: false, ..yes.clone() });
    assert_eq!(again.unwrap_err().kind, StoreErrorKind::Conflict);
    assert_eq!(store.approval_decide("nope", &yes).unwrap_err().kind, StoreErrorKind::NotFound);
    assert_eq!(store.approval("ap1").unwrap().unwrap().decision, Some(yes));
    assert_eq!(store.approvals_undecided().unwrap(), vec![], "decided is no longer listed");
    let later = ApprovalRecord { id: "ap2".into(), requested_at_ms: 6, ..held.clone() };
    store.approval_request(&later).unwrap();
    assert_eq!(store.approval_for("r1", "planner", &key).unwrap().map(|a| a.id), Some("ap2".into()));
    // Oldest request first, whatever the order they were stored in.
    let earlier = ApprovalRecord { id: "ap0".into(), run: "r2".into(), requested_at_ms: 1, ..held };
    store.approval_request(&earlier).unwrap();
    let ids: Vec<String> = store.approvals_undecided().unwrap().into_iter().map(|a| a.id).collect();
    assert_eq!(ids, ["ap0", "ap2"]);
}
