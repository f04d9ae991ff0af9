//! Runs: create, get, update, find by prefix, list.
use retrace_core::run::{Command, RunStatus};

use super::{err_kind, sample_run, MakeStore};
use crate::StoreErrorKind;

/// Runs are stored, read back equal, updated whole.
pub fn runs_create_get_update(make: MakeStore<'_>) {
    let store = make();
    let mut meta = sample_run("01hrun0000000000000000000a", 1_700_000_000_000);
    meta.name = Some("migration trio".into());
    meta.labels.insert("team".into(), "db".into());
    meta.command = Some(Command { argv: vec!["python".into(), "trio.py".into()], cwd: "demo".into() });
    meta.divergence = Some(serde_json::json!({"code": "log_ended", "seq": 12, "ratio": 0.25}));
    store.create_run(&meta).unwrap();
    assert_eq!(store.run(&meta.id).unwrap(), meta);
    meta.status = RunStatus::Ok;
    meta.exit_status = Some(3);
    meta.finished_at_ms = Some(1_700_000_000_999);
    store.update_run(&meta).unwrap();
    assert_eq!(store.run(&meta.id).unwrap(), meta);
    assert_eq!(err_kind(store.run("nope")), StoreErrorKind::NotFound);
    let missing = sample_run("missing", 0);
    assert_eq!(err_kind(store.update_run(&missing)), StoreErrorKind::NotFound);
}

/// A unique prefix of 4+ characters finds a run; an ambiguous one is `Invalid`.
pub fn runs_find_by_prefix(make: MakeStore<'_>) {
    let store = make();
    for id in ["01habc0000", "01habd0000", "01hxyz0000"] {
        store.create_run(&sample_run(id, 1)).unwrap();
    }
    assert_eq!(store.find_run("01hxyz0000").unwrap().id, "01hxyz0000");
    assert_eq!(store.find_run("01hx").unwrap().id, "01hxyz0000");
    // Run ids are ULIDs, which are case-insensitive: one pasted in capitals is found.
    assert_eq!(store.find_run("01HXYZ0000").unwrap().id, "01hxyz0000");
    assert_eq!(store.find_run("01HX").unwrap().id, "01hxyz0000");
    assert_eq!(store.find_run("01habc").unwrap().id, "01habc0000");
    let ambiguous = store.find_run("01ha").unwrap_err();
    assert_eq!(ambiguous.kind, StoreErrorKind::Invalid);
    assert!(
        ambiguous.message.contains("01habc0000") && ambiguous.message.contains("01habd0000"),
        "{ambiguous}"
    );
    assert!(ambiguous.message.contains("give at least 6 characters"), "{ambiguous}");
    assert_eq!(err_kind(store.find_run("01h")), StoreErrorKind::Invalid);
    assert_eq!(err_kind(store.find_run("01hq")), StoreErrorKind::NotFound);
    assert_eq!(err_kind(store.find_run("01h%")), StoreErrorKind::NotFound);
}

/// `runs()` lists oldest first (by start time, then creation order).
pub fn runs_list_oldest_first(make: MakeStore<'_>) {
    let store = make();
    assert!(store.runs().unwrap().is_empty());
    for (id, started) in [("c", 30), ("a", 10), ("b", 20), ("d", 20)] {
        store.create_run(&sample_run(id, started)).unwrap();
    }
    let ids: Vec<String> = store.runs().unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(ids, ["a", "b", "d", "c"]);
}

/// Creating a run twice is a `Conflict` naming it, and leaves the first untouched.
pub fn duplicate_run_conflicts(make: MakeStore<'_>) {
    let store = make();
    let first = sample_run("dup-run", 1);
    store.create_run(&first).unwrap();
    let mut second = sample_run("dup-run", 2);
    second.name = Some("other".into());
    let err = store.create_run(&second).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Conflict);
    assert!(err.message.contains("dup-run"), "{err}");
    assert_eq!(store.run("dup-run").unwrap(), first);
}
