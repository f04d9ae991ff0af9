//! The autonomy ladder through the Rust runtime, on real SQLite files: each rung at a
//! `side_effect` call in record (refused, held, released), and replay reproducing the recorded
//! `approval` events without the policy.
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use retrace_core::autonomy::{AutonomyPolicy, Below};
use retrace_core::envelope::ApprovalOutcome;
use retrace_core::ledger::{public_key_base64, signing_key, LedgerEntry, LedgerFile};
use retrace_core::EventType;
use retrace_runtime::autonomy::Governor;
use retrace_runtime::{Outcome, RuntimeError, Session, SessionOptions, ToolSpec};
use retrace_store::ledger::ApprovalDecision;
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Durability, Store};
use serde_json::{json, Value};

const SEED: &str = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc="; // 32 bytes of 7

fn open(dir: &Path) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(&dir.join("retrace.db"), &dir.join("blobs"), Durability::Os, 5_000).unwrap())
}

fn policy(below: Below, timeout_s: u64) -> AutonomyPolicy {
    AutonomyPolicy {
        side_effect_min_clean: 3,
        side_effect_min_traces: 2,
        below,
        approval_timeout_s: timeout_s,
        ..AutonomyPolicy::default()
    }
}

fn ledger(clean: u64, distinct: u64) -> LedgerFile {
    let entry = LedgerEntry {
        project: "billing".into(),
        agent: "ops".into(),
        clean_streak: clean,
        distinct_traces: distinct,
        ..LedgerEntry::default()
    };
    LedgerFile::sign(vec![entry], 1, &signing_key(SEED).unwrap())
}

fn options(governor: Governor) -> SessionOptions {
    SessionOptions { autonomy: Some(Arc::new(governor)), ..SessionOptions::default() }
}

/// One side effect by `ops`; counts how often the live function ran.
fn send(session: &Session, ran: &AtomicUsize) -> Result<Value, RuntimeError> {
    session.agent("ops").tool("email.send", &json!({"to": "ceo"}), ToolSpec::side_effect("1"), || {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(json!({"sent": true}))
    })
}

fn approvals(store: &Arc<dyn Store>, run: &str) -> Vec<ApprovalOutcome> {
    let events = store.events(run, 1, 100).unwrap();
    events
        .iter()
        .filter(|e| e.kind == EventType::Approval)
        .map(|e| e.approval.clone().unwrap().outcome)
        .collect()
}

/// Replays `run` with no policy at all; returns the replay's answers to the calls.
fn replay(store: &Arc<dyn Store>, run: &str, calls: usize) -> Vec<Result<Value, RuntimeError>> {
    let r = Session::replay(store.clone(), run, SessionOptions::default()).unwrap();
    let ran = AtomicUsize::new(0);
    let answers = (0..calls).map(|_| send(&r, &ran)).collect();
    let report = r.finish(Outcome::default()).unwrap();
    assert_eq!(report.status, retrace_core::run::RunStatus::Ok, "{report:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "replay runs no side effect");
    answers
}

#[test]
fn unproven_and_probation_agents_are_refused_and_replay_refuses_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for (name, governor) in [
        ("unproven", Governor::new(policy(Below::Refuse, 0), "billing", None)),
        ("probation", Governor::new(policy(Below::Refuse, 0), "billing", Some(ledger(2, 5)))),
    ] {
        let s = Session::record(store.clone(), options(governor)).unwrap();
        let ran = AtomicUsize::new(0);
        let err = send(&s, &ran).unwrap_err();
        let text = err.to_string();
        assert!(matches!(&err, RuntimeError::NotPermitted(r) if r.rung == name), "{text}");
        assert!(text.contains(&format!("rung {name}")), "{text}");
        assert!(text.contains("3 consecutive clean replays over 2 distinct traces"), "names the bar: {text}");
        assert!(text.contains("retrace approve"), "{text}");
        assert_eq!(ran.load(Ordering::SeqCst), 0, "a refused side effect never runs");
        let run = s.run_id();
        s.finish(Outcome::default()).unwrap();
        assert_eq!(approvals(&store, &run), [ApprovalOutcome::Refused]);
        let again = replay(&store, &run, 1);
        assert!(matches!(&again[0], Err(RuntimeError::NotPermitted(r)) if r.rung == name), "{again:?}");
    }
}

#[test]
fn an_autonomous_agent_runs_its_side_effect_with_no_approval_event() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = Session::record(
        store.clone(),
        options(Governor::new(policy(Below::Refuse, 0), "billing", Some(ledger(3, 2)))),
    )
    .unwrap();
    let ran = AtomicUsize::new(0);
    assert_eq!(send(&s, &ran).unwrap(), json!({"sent": true}));
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    let run = s.run_id();
    s.finish(Outcome::default()).unwrap();
    assert!(approvals(&store, &run).is_empty());
    assert_eq!(replay(&store, &run, 1)[0].as_ref().unwrap(), &json!({"sent": true}));
}

/// The store's own ledger can't raise a rung, but a divergence it records after the signed
/// ledger was exported lowers one: an older signed ledger put back doesn't restore autonomy.
#[test]
fn a_divergence_after_the_signed_ledger_holds_an_autonomous_agent() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let governor = || Governor::new(policy(Below::Refuse, 0), "billing", Some(ledger(3, 2)));
    let outcome = |at_ms: u64| retrace_store::ledger::ReplayOutcome {
        project: "billing".into(),
        agent: "ops".into(),
        trace: retrace_core::Digest::of(b"trace"),
        clean: false,
        seq: Some(2),
        detail: Some("step_mismatch at seq 2".into()),
        at_ms,
    };
    // Signed at 1 ms: a divergence recorded here at 0 ms is older, and changes nothing.
    store.ledger_record(&outcome(0)).unwrap();
    let s = Session::record(store.clone(), options(governor())).unwrap();
    assert_eq!(send(&s, &AtomicUsize::new(0)).unwrap(), json!({"sent": true}));
    s.finish(Outcome::default()).unwrap();

    store.ledger_record(&outcome(5)).unwrap();
    let local = store.ledger_entries(Some("billing")).unwrap();
    let standing = governor().standing_with("ops", local.first());
    assert_eq!(standing.rung.as_str(), "probation");
    assert!(standing.why.contains("after the signed ledger was exported"), "{}", standing.why);
    let s = Session::record(store.clone(), options(governor())).unwrap();
    let ran = AtomicUsize::new(0);
    assert!(send(&s, &ran).is_err(), "refused: the agent diverged since the ledger was signed");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    s.finish(Outcome::default()).unwrap();
}

#[test]
fn a_held_call_blocks_until_approved_from_another_connection_and_replays_approved() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = Session::record(store.clone(), options(Governor::new(policy(Below::Hold, 20), "billing", None)))
        .unwrap();
    let run = s.run_id();
    let approver = {
        let dir = dir.path().to_path_buf();
        let run = run.clone();
        std::thread::spawn(move || {
            // Another connection to the same file, as `retrace approve` in another process.
            let other = open(&dir);
            let id = loop {
                let pending = other.ledger_entries(None).unwrap();
                assert!(pending.is_empty());
                let events = other.events(&run, 1, 10).unwrap();
                assert!(events.is_empty(), "nothing recorded while held");
                if let Some(id) = held_id(&dir) {
                    break id;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let yes =
                ApprovalDecision { approved: true, by: "ada".into(), reason: "checked".into(), at_ms: 1 };
            other.approval_decide(&id, &yes).unwrap();
        })
    };
    let ran = AtomicUsize::new(0);
    assert_eq!(send(&s, &ran).unwrap(), json!({"sent": true}));
    approver.join().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    s.finish(Outcome::default()).unwrap();
    assert_eq!(approvals(&store, &run), [ApprovalOutcome::Approved]);
    assert_eq!(replay(&store, &run, 1)[0].as_ref().unwrap(), &json!({"sent": true}));
}

/// The id of the one pending approval in the store under `dir`, read with plain SQL.
fn held_id(dir: &Path) -> Option<String> {
    let conn = rusqlite::Connection::open(dir.join("retrace.db")).ok()?;
    conn.query_row("SELECT id FROM approvals WHERE decision IS NULL", [], |r| r.get(0)).ok()
}

#[test]
fn a_hold_without_wait_raises_approval_required_then_the_approved_retry_runs_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = Session::record(store.clone(), options(Governor::new(policy(Below::Hold, 0), "billing", None)))
        .unwrap();
    let ran = AtomicUsize::new(0);
    let err = send(&s, &ran).unwrap_err();
    let RuntimeError::ApprovalRequired { id, .. } = &err else { panic!("{err}") };
    assert!(err.to_string().contains(&format!("retrace approve {id}")), "{err}");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let yes = ApprovalDecision { approved: true, by: "ada".into(), reason: "ok".into(), at_ms: 1 };
    open(dir.path()).approval_decide(id, &yes).unwrap();
    assert_eq!(send(&s, &ran).unwrap(), json!({"sent": true}));
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    let run = s.run_id();
    s.finish(Outcome::default()).unwrap();
    assert_eq!(approvals(&store, &run), [ApprovalOutcome::TimedOut, ApprovalOutcome::Approved]);
    let answers = replay(&store, &run, 2);
    assert!(
        matches!(&answers[0], Err(RuntimeError::ApprovalRequired { id: again, .. }) if again == id),
        "{answers:?}"
    );
    assert_eq!(answers[1].as_ref().unwrap(), &json!({"sent": true}));
}

#[test]
fn a_hold_nobody_answers_times_out_and_a_refusal_by_a_person_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = Session::record(store.clone(), options(Governor::new(policy(Below::Hold, 1), "billing", None)))
        .unwrap();
    let ran = AtomicUsize::new(0);
    let began = std::time::Instant::now();
    let err = send(&s, &ran).unwrap_err();
    assert!(began.elapsed() >= Duration::from_secs(1), "blocked for approval_timeout_s");
    let RuntimeError::ApprovalRequired { id, .. } = err else { panic!("{err}") };
    let no = ApprovalDecision { approved: false, by: "ada".into(), reason: "not today".into(), at_ms: 1 };
    open(dir.path()).approval_decide(&id, &no).unwrap();
    let refused = send(&s, &ran).unwrap_err();
    assert!(
        refused.to_string().contains("refused by ada") && refused.to_string().contains("not today"),
        "{refused}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let run = s.run_id();
    s.finish(Outcome::default()).unwrap();
    assert_eq!(approvals(&store, &run), [ApprovalOutcome::TimedOut, ApprovalOutcome::Refused]);
    let answers = replay(&store, &run, 2);
    assert!(matches!(&answers[0], Err(RuntimeError::ApprovalRequired { .. })), "{answers:?}");
    assert!(matches!(&answers[1], Err(RuntimeError::NotPermitted(r)) if r.by == "ada"), "{answers:?}");
}

#[test]
fn a_forged_or_unsigned_ledger_counts_as_none() {
    let dir = tempfile::tempdir().unwrap();
    let trusted = public_key_base64(&signing_key(SEED).unwrap());
    let toml = format!(
        "[project]\nname = \"billing\"\n[autonomy]\nledger = \"ledger.json\"\nledger_pubkey = \"{trusted}\"\n\
         side_effect_min_clean = 3\nside_effect_min_traces = 2\n"
    );
    std::fs::write(dir.path().join("retrace.toml"), toml).unwrap();
    let write = |file: &LedgerFile| {
        std::fs::write(dir.path().join("ledger.json"), serde_json::to_vec(file).unwrap()).unwrap()
    };

    write(&ledger(9, 9));
    let good = Governor::load(dir.path()).unwrap().unwrap();
    assert!(good.warning.is_none());
    assert!(good.standing("ops").side_effects_allowed);

    // The agent signs its own ledger: another key.
    let own = signing_key("CAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAg=").unwrap();
    write(&LedgerFile::sign(ledger(9, 9).entries, 1, &own));
    let forged = Governor::load(dir.path()).unwrap().unwrap();
    assert!(forged.warning.as_deref().unwrap().contains("another key"), "{:?}", forged.warning);
    assert_eq!(forged.standing("ops").rung, retrace_core::autonomy::Rung::Unproven);

    // The trusted file, edited after signing.
    let mut edited = ledger(0, 0);
    edited.entries[0].clean_streak = 99;
    edited.entries[0].distinct_traces = 99;
    write(&edited);
    let tampered = Governor::load(dir.path()).unwrap().unwrap();
    assert!(tampered.warning.as_deref().unwrap().contains("does not verify"), "{:?}", tampered.warning);
    assert!(!tampered.standing("ops").side_effects_allowed);

    // Unsigned: no signature at all.
    let mut unsigned = serde_json::to_value(ledger(9, 9)).unwrap();
    unsigned["signature"] = json!("");
    std::fs::write(dir.path().join("ledger.json"), unsigned.to_string()).unwrap();
    let none = Governor::load(dir.path()).unwrap().unwrap();
    assert!(none.warning.is_some());
    assert!(!none.standing("ops").side_effects_allowed);

    // Older than the policy's ledger_max_age_days: an old signed file put back counts as none
    // (QA26 D5); a fresh one counts.
    let toml = format!(
        "[project]\nname = \"billing\"\n[autonomy]\nledger = \"ledger.json\"\nledger_pubkey = \"{trusted}\"\n\
         side_effect_min_clean = 3\nside_effect_min_traces = 2\nledger_max_age_days = 7\n"
    );
    std::fs::write(dir.path().join("retrace.toml"), toml).unwrap();
    write(&ledger(9, 9));
    let old = Governor::load(dir.path()).unwrap().unwrap();
    assert!(old.warning.as_deref().unwrap().contains("ledger_max_age_days = 7"), "{:?}", old.warning);
    assert!(!old.standing("ops").side_effects_allowed);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    write(&LedgerFile::sign(ledger(9, 9).entries, now, &signing_key(SEED).unwrap()));
    let fresh = Governor::load(dir.path()).unwrap().unwrap();
    assert!(fresh.warning.is_none(), "{:?}", fresh.warning);
    assert!(fresh.standing("ops").side_effects_allowed);
}

#[test]
fn a_fork_reproduces_the_recorded_hold_and_approval_wherever_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let s = Session::record(store.clone(), options(Governor::new(policy(Below::Hold, 0), "billing", None)))
        .unwrap();
    let ran = AtomicUsize::new(0);
    let RuntimeError::ApprovalRequired { id, .. } = send(&s, &ran).unwrap_err() else { panic!("held") };
    let yes = ApprovalDecision { approved: true, by: "ada".into(), reason: "ok".into(), at_ms: 1 };
    open(dir.path()).approval_decide(&id, &yes).unwrap();
    send(&s, &ran).unwrap();
    let run = s.run_id();
    s.finish(Outcome::default()).unwrap();
    let last = store.last_seq(&run).unwrap();
    // 1, after the first approval (QA26 D2: the agent's next event repeated its lamport, and
    // verify refused the fork), and the end.
    for at in [1, 2, 3, last] {
        // No policy in the fork: what it hands back comes from the source's log.
        let f = Session::fork_new(store.clone(), &run, Some(at), vec![], SessionOptions::default()).unwrap();
        let first = send(&f, &ran).unwrap_err();
        assert!(
            matches!(&first, RuntimeError::ApprovalRequired { id: again, .. } if *again == id),
            "at {at}: {first}"
        );
        assert_eq!(send(&f, &ran).unwrap(), json!({"sent": true}), "at {at}");
        let fork = f.run_id();
        let report = f.finish(Outcome::default()).unwrap();
        assert_eq!(report.status, retrace_core::run::RunStatus::Ok, "at {at}: {report:?}");
        assert_eq!(retrace_store::verify::verify_run(&*store, &fork), vec![], "at {at}");
        if at == 1 {
            assert_eq!(approvals(&store, &fork), [ApprovalOutcome::TimedOut, ApprovalOutcome::Approved]);
        }
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1, "only the recording ran the side effect");
}

/// A policy that sets no bar governs nothing, whatever `below` says: said as a warning (QA26 S1:
/// a user who wrote only `below = "hold"` expected holds).
#[test]
fn a_policy_with_no_bar_says_every_side_effect_runs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("retrace.toml"), "[autonomy]\nbelow = \"hold\"\n").unwrap();
    let governor = Governor::load(dir.path()).unwrap().unwrap();
    assert!(governor.warning.as_deref().unwrap().contains("sets no bar"), "{:?}", governor.warning);
    assert!(governor.standing("ops").side_effects_allowed, "the rule itself is unchanged");
    std::fs::write(dir.path().join("retrace.toml"), "[autonomy]\nside_effect_min_clean = 1\n").unwrap();
    assert_eq!(Governor::load(dir.path()).unwrap().unwrap().warning, None);
}
