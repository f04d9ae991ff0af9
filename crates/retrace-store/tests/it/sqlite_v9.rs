//! What version 9 of the SQLite schema brought, on real files: `events` rebuilt from the
//! version-8 table (keyed by `(run_pk, seq)` without a rowid) into a rowid table keyed by
//! `run_pk << 32 | seq`, every event kept; and a store that can't be numbered that way refused
//! with nothing changed.
use std::path::Path;

use retrace_store::conformance::{sample_events, sample_run};
use retrace_store::sqlite::schema::{MAX_SEQ, SCHEMA_VERSION};
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Batch, Durability, EventStore};
use rusqlite::Connection;

fn open(dir: &Path) -> retrace_store::StoreResult<SqliteStore> {
    SqliteStore::open(&dir.join("retrace.db"), &dir.join("blobs"), Durability::Os, 5_000)
}

fn version(db: &Path) -> i64 {
    Connection::open(db).unwrap().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap()
}

/// Turns a current store's `events` back into the version-8 table, rows and all.
fn make_version_8(db: &Path) {
    Connection::open(db)
        .unwrap()
        .execute_batch(
            "CREATE TABLE events_v8 (
                 run_pk INTEGER NOT NULL, seq INTEGER NOT NULL, type INTEGER NOT NULL,
                 agent_pk INTEGER NOT NULL, lamport INTEGER NOT NULL, causal_parent INTEGER,
                 name TEXT, key BLOB NOT NULL, request_ref BLOB, output_ref BLOB, output_hash BLOB,
                 flags INTEGER NOT NULL, prev BLOB, hash BLOB NOT NULL, extra TEXT,
                 PRIMARY KEY (run_pk, seq)) WITHOUT ROWID;
             INSERT INTO events_v8 SELECT run_pk, seq, type, agent_pk, lamport, causal_parent, name,
                 key, request_ref, output_ref, output_hash, flags, prev, hash, extra FROM events;
             DROP TABLE events;
             ALTER TABLE events_v8 RENAME TO events;
             PRAGMA user_version = 8;",
        )
        .unwrap();
}

fn has_id_column(db: &Path) -> bool {
    Connection::open(db)
        .unwrap()
        .query_row("SELECT count(*) FROM pragma_table_info('events') WHERE name = 'id'", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap()
        == 1
}

#[test]
fn a_version_8_store_gets_its_events_rebuilt_and_keeps_every_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("retrace.db");
    let (one, two) = (sample_events("one", 1, 300, None), sample_events("two", 1, 40, None));
    {
        let store = open(dir.path()).unwrap();
        for (run, events) in [("one", &one), ("two", &two)] {
            store.create_run(&sample_run(run, 1)).unwrap();
            store.commit(&Batch { run_id: run.into(), events: events.clone(), ..Batch::default() }).unwrap();
        }
    }
    make_version_8(&db);
    assert!(!has_id_column(&db));

    let store = open(dir.path()).unwrap();
    assert_eq!(version(&db), SCHEMA_VERSION);
    assert!(has_id_column(&db), "events is a rowid table keyed by id");
    assert_eq!(store.events("one", 1, 1_000).unwrap(), one);
    assert_eq!(store.events("two", 1, 1_000).unwrap(), two);
    assert_eq!(store.events("one", 299, 10).unwrap(), one[298..]);
    assert_eq!(store.event("two", 40).unwrap(), two[39]);
    assert_eq!(store.events_at("one", &[7, 3]).unwrap(), [one[6].clone(), one[2].clone()]);
    assert_eq!((store.last_seq("one").unwrap(), store.last_seq("two").unwrap()), (300, 40));
    assert!(store.event("two", 41).is_err());
    // And it goes on: the next batch appends after the rebuilt rows.
    let more = sample_events("two", 41, 5, Some(two[39].hash));
    store.commit(&Batch { run_id: "two".into(), events: more.clone(), ..Batch::default() }).unwrap();
    assert_eq!(store.events("two", 40, 10).unwrap(), [&two[39..], &more[..]].concat());
}

#[test]
fn a_version_8_store_with_a_seq_beyond_32_bits_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("retrace.db");
    {
        let store = open(dir.path()).unwrap();
        store.create_run(&sample_run("big", 1)).unwrap();
        let events = sample_events("big", 1, 2, None);
        store.commit(&Batch { run_id: "big".into(), events, ..Batch::default() }).unwrap();
    }
    make_version_8(&db);
    Connection::open(&db)
        .unwrap()
        .execute("UPDATE events SET seq = ?1 WHERE seq = 2", [MAX_SEQ as i64 + 1])
        .unwrap();

    let err = open(dir.path()).unwrap_err().to_string();
    assert!(err.contains("version 9") && err.contains(&MAX_SEQ.to_string()), "{err}");
    assert_eq!(version(&db), 8, "the upgrade rolled back");
    assert!(!has_id_column(&db));
}

#[test]
fn a_seq_beyond_32_bits_is_refused_when_committed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).unwrap();
    // A fork's own events start after its fork point: the one way to reach such a seq at once.
    let mut meta = sample_run("far", 1);
    meta.fork_at = Some(MAX_SEQ + 1);
    store.create_run(&meta).unwrap();
    let events = sample_events("far", MAX_SEQ + 1, 1, None);
    let err =
        store.commit(&Batch { run_id: "far".into(), events, ..Batch::default() }).unwrap_err().to_string();
    assert!(err.contains(&format!("holds seqs up to {MAX_SEQ}")), "{err}");
}
