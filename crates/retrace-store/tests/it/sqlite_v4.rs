//! What version 4 of the SQLite schema brought, on real files: the upgrade from version 3 (the
//! ledger and the approvals, data kept), and the ledger surviving a reopen.
use std::path::Path;

use retrace_core::Digest;
use retrace_store::conformance::{sample_events, sample_run};
use retrace_store::ledger::ReplayOutcome;
use retrace_store::sqlite::schema::SCHEMA_VERSION;
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Batch, Durability, EventStore, LedgerStore};
use rusqlite::Connection;

fn open(dir: &Path) -> SqliteStore {
    SqliteStore::open(&dir.join("retrace.db"), &dir.join("blobs"), Durability::Os, 5_000).unwrap()
}

fn version(db: &Path) -> i64 {
    Connection::open(db).unwrap().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap()
}

#[test]
fn a_version_3_store_gains_the_ledger_and_approvals_and_keeps_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("retrace.db");
    let events = sample_events("old", 1, 3, None);
    {
        let store = open(dir.path());
        store.create_run(&sample_run("old", 1)).unwrap();
        store.commit(&Batch { run_id: "old".into(), events: events.clone(), ..Batch::default() }).unwrap();
    }
    Connection::open(&db)
        .unwrap()
        .execute_batch(
            "DROP TABLE ledger; DROP TABLE ledger_traces; DROP TABLE approvals; PRAGMA user_version = 3;",
        )
        .unwrap();
    assert_eq!(version(&db), 3);
    let outcome = ReplayOutcome {
        project: "p".into(),
        agent: "a".into(),
        trace: Digest::of(b"trace"),
        clean: true,
        seq: None,
        detail: None,
        at_ms: 1,
    };
    {
        let store = open(dir.path());
        assert_eq!(version(&db), SCHEMA_VERSION);
        assert_eq!(store.events("old", 1, 10).unwrap(), events);
        store.ledger_record(&outcome).unwrap();
    }
    let store = open(dir.path());
    let again = store.ledger_record(&outcome).unwrap();
    assert_eq!((again.replays, again.traces_replayed, again.clean_streak), (2, 1, 2), "kept across a reopen");
}
