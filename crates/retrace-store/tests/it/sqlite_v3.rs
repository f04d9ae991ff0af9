//! What version 3 of the SQLite schema brought, on real files: the upgrade from version 2, the
//! append-only audit table, and garbage collection giving back blob files and packed segments.
use std::path::Path;

use retrace_core::run::{Retention, RunMode};
use retrace_core::vault::{seal_with_nonce, VaultKey};
use retrace_store::conformance::{aged_run, raw, record_with_outputs, sample_events, sample_run};
use retrace_store::gc::{collect, GcConfig};
use retrace_store::sqlite::schema::SCHEMA_VERSION;
use retrace_store::sqlite::SqliteStore;
use retrace_store::vault::{AuditAction, AuditEntry};
use retrace_store::{
    Batch, BlobHint, BlobPut, BlobStore, Durability, EventStore, GcRequest, GcStore, VaultStore,
};
use rusqlite::Connection;

fn open(dir: &Path) -> SqliteStore {
    SqliteStore::open(&dir.join("retrace.db"), &dir.join("blobs"), Durability::Os, 5_000).unwrap()
}

fn version(db: &Path) -> i64 {
    Connection::open(db).unwrap().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap()
}

#[test]
fn a_version_2_store_gains_the_vault_audit_and_blob_times_and_keeps_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("retrace.db");
    let events = sample_events("old", 1, 3, None);
    let blob = BlobPut::new(&b"an output from version 2"[..], BlobHint::Raw);
    {
        let store = open(dir.path());
        let mut finished = sample_run("old", 1);
        finished.status = retrace_core::run::RunStatus::Ok;
        store.create_run(&finished).unwrap();
        store
            .commit(&Batch {
                run_id: "old".into(),
                events: events.clone(),
                blobs: vec![blob.clone()],
                cache: vec![],
            })
            .unwrap();
    }
    // Version 2 is version 3 without the vault, the audit log and blobs.stored_at.
    Connection::open(&db)
        .unwrap()
        .execute_batch(
            "DROP TABLE vault; DROP TABLE audit; ALTER TABLE blobs DROP COLUMN stored_at; PRAGMA user_version = 2;",
        )
        .unwrap();
    assert_eq!(version(&db), 2);
    let store = open(dir.path());
    assert_eq!(version(&db), SCHEMA_VERSION);
    assert_eq!(store.events("old", 1, 10).unwrap(), events);
    assert_eq!(store.get_blob(&blob.digest()).unwrap(), blob.bytes().to_vec());
    let stored_at: Option<i64> = Connection::open(&db)
        .unwrap()
        .query_row("SELECT stored_at FROM blobs WHERE digest = ?1", [blob.digest().as_bytes()], |r| r.get(0))
        .unwrap();
    assert_eq!(stored_at, None, "rows from before version 3 carry no time: they count as old");
    let key = VaultKey::from_bytes([1; 32]);
    assert_eq!(
        store.vault_put(None, &[("rtk_t".into(), seal_with_nonce(&key, "rtk_t", [0; 24], b"x"))]).unwrap(),
        1
    );
    // Deleting the run sweeps its blob from before version 3 (no time: old) even with the
    // earliest cutoff, which still keeps a new blob nothing references yet.
    store
        .commit(&Batch {
            run_id: "old".into(),
            blobs: vec![raw(b"new and unreferenced")],
            ..Batch::default()
        })
        .unwrap();
    let report = store
        .collect_garbage(&GcRequest {
            runs: vec!["old".into()],
            named: vec![],
            blob_cutoff_ms: 1,
            dry_run: false,
        })
        .unwrap();
    assert_eq!((report.runs_deleted.len(), report.blobs_deleted), (1, 1), "{report:?}");
    assert!(store.has_blob(&raw(b"new and unreferenced").digest()).unwrap());
}

#[test]
fn the_audit_log_refuses_updates_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let entry = AuditEntry {
        at_ms: 1,
        who: "ada".into(),
        role: "admin".into(),
        action: AuditAction::Reveal,
        subject: "rtk_t".into(),
        reason: "r".into(),
        outcome: "ok".into(),
    };
    store.audit_append(&entry).unwrap();
    let conn = Connection::open(dir.path().join("retrace.db")).unwrap();
    for sql in ["UPDATE audit SET who = 'mallory'", "DELETE FROM audit"] {
        let err = conn.execute(sql, []).unwrap_err();
        assert!(err.to_string().contains("append-only"), "{err}");
    }
    assert_eq!(store.audit_list(None).unwrap()[0].entry, entry);
}

#[test]
fn gc_gives_back_blob_files_and_packed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let big = raw(&vec![b'f'; retrace_store::INLINE_BLOB_MAX + 1]);
    let packed: Vec<BlobPut> = (0..40u8).map(|i| raw(&vec![i; 1000])).collect();
    let mut outputs: Vec<&BlobPut> = packed.iter().collect();
    outputs.push(&big);
    record_with_outputs(&store, &aged_run("old", RunMode::Record, 90, Retention::Routine, None), &outputs);
    let kept = raw(&[b'k'; 500]);
    record_with_outputs(&store, &aged_run("new", RunMode::Record, 1, Retention::Routine, None), &[&kept]);
    let file = store.blob_file(&big.digest());
    assert!(file.exists());
    let segments = |db: &Path| -> i64 {
        Connection::open(db).unwrap().query_row("SELECT count(*) FROM segments", [], |r| r.get(0)).unwrap()
    };
    let before = segments(store.path());
    std::thread::sleep(std::time::Duration::from_millis(3));
    let mut config = GcConfig::new(now(), 30);
    config.blob_grace_ms = 0;
    let report = collect(&store, &config).unwrap();
    assert_eq!((report.runs_deleted.len(), report.blobs_deleted), (1, 41), "{report:?}");
    assert!(report.bytes_freed >= big.bytes().len() as u64 + 30 * 1000, "{report:?}");
    assert!(!file.exists(), "the blob file is removed");
    assert!(!dir.path().join("blobs/.trash").read_dir().unwrap().any(|_| true), "the trash is emptied");
    assert!(segments(store.path()) < before - 5, "segments only the deleted run used are gone");
    assert_eq!(store.get_blob(&kept.digest()).unwrap(), kept.bytes().to_vec());
    let again = raw(&vec![7; 1000]);
    record_with_outputs(
        &store,
        &aged_run("later", RunMode::Record, 0, Retention::Routine, None),
        &[&again, &big],
    );
    assert_eq!(
        store.get_blob(&again.digest()).unwrap(),
        again.bytes().to_vec(),
        "packing resumes after a sweep"
    );
    assert_eq!(
        store.get_blob(&big.digest()).unwrap(),
        big.bytes().to_vec(),
        "a swept blob can be stored again"
    );
}

#[test]
fn a_trashed_file_whose_row_survived_a_crash_is_put_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let big = raw(&vec![b'c'; retrace_store::INLINE_BLOB_MAX + 1]);
    record_with_outputs(&store, &aged_run("r", RunMode::Record, 1, Retention::Pinned, None), &[&big]);
    let file = store.blob_file(&big.digest());
    let trash = dir.path().join("blobs/.trash");
    std::fs::create_dir_all(&trash).unwrap();
    std::fs::rename(&file, trash.join(big.digest().hex())).unwrap();
    std::fs::write(trash.join("leftover"), b"junk").unwrap();
    store
        .collect_garbage(&GcRequest { runs: vec![], named: vec![], blob_cutoff_ms: 0, dry_run: false })
        .unwrap();
    assert_eq!(store.get_blob(&big.digest()).unwrap(), big.bytes().to_vec());
    assert!(!trash.join("leftover").exists());
}

/// The same, put back when the store is next opened, with no collection run: a `delete` or
/// `gc` killed between trashing and committing leaves no run missing its blob files (QA7 D2).
/// While another connection holds the write lock (a collection under way), opening neither
/// waits nor restores.
#[test]
fn a_trashed_file_whose_row_survived_a_crash_is_put_back_when_the_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    let big = raw(&vec![b'd'; retrace_store::INLINE_BLOB_MAX + 1]);
    let file = {
        let store = open(dir.path());
        record_with_outputs(&store, &aged_run("r", RunMode::Record, 1, Retention::Pinned, None), &[&big]);
        store.blob_file(&big.digest())
    };
    let trash = dir.path().join("blobs/.trash");
    std::fs::create_dir_all(&trash).unwrap();
    std::fs::rename(&file, trash.join(big.digest().hex())).unwrap();

    let holder = rusqlite::Connection::open(dir.path().join("retrace.db")).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    // As `open_store` opens a store: then looks for what stopped processes left.
    let opened = |dir: &Path| {
        let store = open(dir);
        store.recover_interrupted().unwrap();
        store
    };
    let started = std::time::Instant::now();
    drop(opened(dir.path()));
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "opening didn't wait for the lock");
    assert!(!file.exists(), "left for the collection under way");
    holder.execute_batch("ROLLBACK").unwrap();

    let store = opened(dir.path());
    assert!(file.exists(), "put back at open");
    assert_eq!(store.get_blob(&big.digest()).unwrap(), big.bytes().to_vec());
    assert!(!trash.read_dir().unwrap().any(|_| true), "the trash is empty");
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}
