//! What version 11 of the SQLite schema brought, on real files: each event row holds the row ids
//! of its request and output blobs, filled by every commit that carries them, NULL in rows a
//! version-10 store held; export reads by those ids and gives the same bytes whether the ids
//! are there, missing, swapped or pointing nowhere (an id is a hint, checked against the digest).
use std::path::Path;

use retrace_core::Digest;
use retrace_store::conformance::sample_run;
use retrace_store::export::export_run;
use retrace_store::sqlite::schema::SCHEMA_VERSION;
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Durability, EventStore};
use rusqlite::Connection;

fn open(dir: &Path) -> SqliteStore {
    SqliteStore::open(&dir.join("retrace.db"), &dir.join("blobs"), Durability::Os, 5_000).unwrap()
}

fn sql(db: &Path, statements: &str) {
    Connection::open(db).unwrap().execute_batch(statements).unwrap();
}

fn count(db: &Path, query: &str) -> i64 {
    Connection::open(db).unwrap().query_row(query, [], |r| r.get(0)).unwrap()
}

/// Commits `n` tool calls to `run` from seq `first`, each with a 1 KB request and output (every
/// third request the same, so later batches carry a blob already stored).
fn record(store: &SqliteStore, run: &str, first: u64, n: u64, prev: Option<Digest>) -> Option<Digest> {
    let mut prev = prev;
    for seq in first..first + n {
        let request = match seq % 3 {
            0 => "the same request ".repeat(60),
            _ => format!("request {seq} ").repeat(80),
        };
        let output = format!("output {seq} ").repeat(90);
        let batch = crate::steps::tool_call(run, seq, request, output, prev);
        prev = Some(batch.events[0].hash);
        store.commit(&batch).unwrap();
    }
    prev
}

fn export(store: &SqliteStore, run: &str) -> Vec<u8> {
    let mut out = Vec::new();
    export_run(store, run, &mut out, &mut |_| {}).unwrap();
    out
}

#[test]
fn every_commit_stores_its_blobs_row_ids() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("retrace.db");
    let store = open(dir.path());
    store.create_run(&sample_run("ids", 1)).unwrap();
    record(&store, "ids", 1, 30, None);
    assert_eq!(
        count(&db, "SELECT count(*) FROM events WHERE request_blob IS NULL OR output_blob IS NULL"),
        0
    );
    let wrong = "SELECT count(*) FROM events e JOIN blobs b ON b.id = e.request_blob \
                 JOIN blobs o ON o.id = e.output_blob \
                 WHERE b.digest IS NOT e.request_ref OR o.digest IS NOT e.output_ref";
    assert_eq!(count(&db, wrong), 0, "each id is its blob's row");
}

#[test]
fn a_version_10_store_is_upgraded_and_exports_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("retrace.db");
    let (before, last) = {
        let store = open(dir.path());
        store.create_run(&sample_run("old", 1)).unwrap();
        let last = record(&store, "old", 1, 40, None);
        (export(&store, "old"), last)
    };
    sql(
        &db,
        "ALTER TABLE events DROP COLUMN request_blob; ALTER TABLE events DROP COLUMN output_blob;
         PRAGMA user_version = 10;",
    );

    let store = open(dir.path());
    assert_eq!(count(&db, "PRAGMA user_version"), SCHEMA_VERSION);
    assert_eq!(count(&db, "SELECT count(*) FROM events WHERE request_blob IS NOT NULL"), 0, "old rows: NULL");
    assert_eq!(export(&store, "old"), before, "read by digest, as before");
    // New commits fill the ids; the export reads old rows by digest and new ones by id.
    record(&store, "old", 41, 5, last);
    assert_eq!(count(&db, "SELECT count(*) FROM events WHERE request_blob IS NOT NULL"), 5);
    let after = export(&store, "old");
    assert!(after.len() > before.len());
    drop(store);
    let store = open(dir.path());
    assert_eq!(export(&store, "old"), after, "reopening changes nothing");
}

#[test]
fn ids_that_point_at_other_blobs_or_nowhere_export_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("retrace.db");
    let store = open(dir.path());
    store.create_run(&sample_run("hints", 1)).unwrap();
    record(&store, "hints", 1, 50, None);
    let exact = export(&store, "hints");
    drop(store);
    for garble in [
        "UPDATE events SET request_blob = output_blob, output_blob = request_blob",
        "UPDATE events SET request_blob = request_blob + 7, output_blob = -1",
        "UPDATE events SET request_blob = 9223372036854775807, output_blob = NULL",
    ] {
        sql(&db, garble);
        let store = open(dir.path());
        assert_eq!(export(&store, "hints"), exact, "after {garble}");
    }
}
