//! The ack log of `Durability::Event` (`sqlite/ack_log.rs`): acknowledged batches the WAL lost
//! come back from it. Power cuts are simulated by `tests/power_cut` (a snapshot of the database
//! taken earlier, paired with the ack log as it stood when later batches had been acknowledged).
use std::path::{Path, PathBuf};
use std::sync::Arc;

use retrace_core::run::RunStatus;
use retrace_core::Digest;
use retrace_store::conformance::{batch, sample_events, sample_run};
use retrace_store::sqlite::SqliteStore;
use retrace_store::verify::{verify_run, ProblemKind};
use retrace_store::{CacheEntry, Durability, EventStore, LeaseHolder, RunWriter, Store, StoreErrorKind};
use rusqlite::Connection;

#[path = "../power_cut/mod.rs"]
mod power_cut;
use power_cut::{copy_log, log_dir, open, record_step, record_then_lose, snapshot, the_log, Step, RUN};

/// Every step is stored as recorded: events, output blobs and cache entries; the run verifies.
fn assert_holds(store: &dyn Store, steps: &[Step]) {
    assert_eq!(store.last_seq(RUN).unwrap(), steps.len() as u64);
    let events = store.events(RUN, 1, steps.len() + 1).unwrap();
    for (stored, step) in events.iter().zip(steps) {
        assert_eq!(*stored, step.event, "seq {}", step.event.seq);
        assert_eq!(store.get_blob(&step.output.digest()).unwrap(), step.output.bytes().to_vec());
        let entry = store.cache_get(&step.key).unwrap().expect("the cache entry is stored");
        assert_eq!(entry.output_ref, step.output.digest());
    }
    assert_eq!(verify_run(store, RUN), Vec::new(), "the run verifies");
}

#[test]
fn acknowledged_batches_the_wal_lost_come_back_when_the_lease_is_taken() {
    let (live, lost) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let steps = record_then_lose(live.path(), lost.path(), 20, 5, 1000);

    let store = open(lost.path(), Durability::Event);
    assert_eq!(store.last_seq(RUN).unwrap(), 5, "the database alone lost seqs 6..=20");

    let writer = RunWriter::open(store.clone(), RUN, LeaseHolder::current()).unwrap();
    assert_holds(store.as_ref(), &steps);
    let next = record_step(&writer, 21, 1000);
    assert_eq!(next.event.seq, 21);
    assert_eq!(next.event.prev, Some(steps[19].event.hash), "the chain continues after the recovered events");
    writer.close().unwrap();
    assert_eq!(verify_run(store.as_ref(), RUN), Vec::new());
}

#[test]
fn a_dead_recorders_ack_log_is_recovered_before_its_run_is_marked_interrupted() {
    let (live, lost) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let steps = record_then_lose(live.path(), lost.path(), 20, 5, 1000);
    let conn = Connection::open(lost.path().join("retrace.db")).unwrap();
    conn.execute("UPDATE leases SET holder = 'elsewhere:1:1', expires_at = 0", []).unwrap();
    drop(conn);

    let store = open(lost.path(), Durability::Os);
    assert_eq!(store.recover_interrupted().unwrap(), vec![RUN.to_string()]);
    assert_eq!(store.run(RUN).unwrap().status, RunStatus::Interrupted);
    assert_holds(store.as_ref(), &steps);
    assert!(std::fs::read_dir(log_dir(lost.path())).unwrap().next().is_none(), "the log is gone");
    assert_eq!(store.lease_holder(RUN).unwrap(), None);
}

#[test]
fn a_torn_last_record_is_dropped_and_the_ones_before_it_recover() {
    let (live, lost) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let steps = record_then_lose(live.path(), lost.path(), 20, 5, 1000);
    // The last record ends with its checksum: the last byte that isn't zero lies in it.
    let log = the_log(lost.path());
    let mut bytes = std::fs::read(&log).unwrap();
    let end = bytes.iter().rposition(|b| *b != 0).unwrap();
    bytes[end] ^= 0xff;
    std::fs::write(&log, &bytes).unwrap();

    let store = open(lost.path(), Durability::Event);
    let writer = RunWriter::open(store.clone(), RUN, LeaseHolder::current()).unwrap();
    assert_holds(store.as_ref(), &steps[..19]);
    assert_eq!(record_step(&writer, 20, 1000).event.seq, 20);
    writer.close().unwrap();
}

#[test]
fn records_left_from_an_earlier_lap_of_the_log_are_skipped() {
    // 60 KB outputs: a record each of about 61 KB, so the 1 MB log starts a new lap every 17
    // steps or so (syncing the WAL first); the third lap began before seq 40.
    let (live, lost) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let steps = record_then_lose(live.path(), lost.path(), 45, 40, 60 << 10);
    let log = std::fs::read(the_log(lost.path())).unwrap();
    let first_at_zero = u64::from_le_bytes(log[8..16].try_into().unwrap());
    assert!((30..=40).contains(&first_at_zero), "the lap at offset 0 starts at seq {first_at_zero}");
    let store = open(lost.path(), Durability::Event);
    assert_eq!(store.last_seq(RUN).unwrap(), 40);
    let writer = RunWriter::open(store.clone(), RUN, LeaseHolder::current()).unwrap();
    assert_holds(store.as_ref(), &steps);
    writer.close().unwrap();
}

#[test]
fn a_log_that_starts_past_the_database_is_corrupt_and_kept() {
    // The snapshot is from the first lap; the log's current lap starts at the third: the disk
    // lost events the WAL had synced.
    let (live, lost) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    record_then_lose(live.path(), lost.path(), 45, 10, 60 << 10);
    let store = open(lost.path(), Durability::Event);
    let err = RunWriter::open(store.clone(), RUN, LeaseHolder::current()).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Corrupt, "{err}");
    let message = err.to_string();
    assert!(message.contains("acknowledged events are missing") && message.contains("acklog"), "{message}");
    assert_eq!(store.last_seq(RUN).unwrap(), 10, "nothing stored is touched");
    assert!(the_log(lost.path()).exists(), "the log is kept for a person to look at");
    // The snapshot's lease (this process's, still live) is put back as it was.
    assert_eq!(store.lease_holder(RUN).unwrap(), Some(LeaseHolder::current()));
}

#[test]
fn only_event_durability_writes_an_ack_log() {
    for durability in [Durability::Batch, Durability::Os] {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), durability);
        store.create_run(&sample_run(RUN, 1)).unwrap();
        let writer = RunWriter::open(store.clone(), RUN, LeaseHolder::current()).unwrap();
        record_step(&writer, 1, 100);
        assert!(!log_dir(dir.path()).exists(), "{durability:?}");
        writer.close().unwrap();
    }
}

#[test]
fn a_batch_that_fails_to_commit_leaves_no_record_to_recover() {
    // The record is written before the commit (its write to the disk overlaps the commit);
    // a commit that fails takes it back, so recovery doesn't find a batch no one stored.
    let (live, lost) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = open(live.path(), Durability::Event);
    store.create_run(&sample_run(RUN, 1)).unwrap();
    snapshot(live.path(), lost.path());
    store.acquire_lease(RUN, &LeaseHolder::current(), 60_000).unwrap();
    let events = sample_events(RUN, 1, 5, None);
    store.commit(&batch(RUN, events[..1].to_vec())).unwrap();
    // Seq 2 continues the run, so its record is written; its cache entry names an output
    // blob no one stored, so the commit fails.
    let mut failing = batch(RUN, events[1..2].to_vec());
    let entry = CacheEntry {
        output_ref: Digest::of(b"never stored"),
        usage: None,
        stored_at_ms: 1,
        class: None,
        ttl_s: None,
        snapshot: None,
    };
    failing.cache.push((Digest::of(b"a key"), entry));
    let failed = store.commit(&failing).unwrap_err();
    assert_eq!(failed.kind, StoreErrorKind::NotFound, "{failed}");
    copy_log(live.path(), lost.path());

    let store = open(lost.path(), Durability::Event);
    assert_eq!(store.last_seq(RUN).unwrap(), 0);
    store.acquire_lease(RUN, &LeaseHolder::current(), 60_000).unwrap();
    assert_eq!(store.events(RUN, 1, 10).unwrap(), events[..1].to_vec());
    store.commit(&batch(RUN, events[1..].to_vec())).unwrap();
    store.release_lease(RUN, &LeaseHolder::current()).unwrap();
    assert_eq!(verify_run(store.as_ref(), RUN), Vec::new());
}

#[test]
fn a_live_log_is_never_touched_by_another_store_of_the_same_process() {
    // The lease can't tell two stores of one process apart (its holder is the process); the
    // log's lock can.
    let dir = tempfile::tempdir().unwrap();
    let first = open(dir.path(), Durability::Event);
    first.create_run(&sample_run(RUN, 1)).unwrap();
    let writer = RunWriter::open(first.clone(), RUN, LeaseHolder::current()).unwrap();
    let mut steps = vec![record_step(&writer, 1, 1000)];
    let log = the_log(dir.path());

    let second = Arc::new(
        SqliteStore::open(&dir.path().join("retrace.db"), &dir.path().join("blobs"), Durability::Event, 100)
            .unwrap(),
    );
    second.recover_interrupted().unwrap();
    assert!(log.exists(), "recovering interrupted runs left the live log alone");
    let err = RunWriter::open(second.clone(), RUN, LeaseHolder::current()).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Busy, "{err}");
    assert!(err.to_string().contains("locked"), "{err}");
    assert_eq!(
        first.lease_holder(RUN).unwrap(),
        Some(LeaseHolder::current()),
        "the failed open kept the lease as it was"
    );
    let lease: i64 = Connection::open(dir.path().join("retrace.db"))
        .unwrap()
        .query_row("SELECT count(*) FROM leases", [], |r| r.get(0))
        .unwrap();
    assert_eq!(lease, 1);
    assert_eq!(the_log(dir.path()), log, "the live log is still the one the first writer appends to");

    steps.push(record_step(&writer, 2, 1000));
    writer.close().unwrap();
    assert_holds(second.as_ref(), &steps);
}

#[test]
fn a_log_that_cant_be_recovered_doesnt_keep_the_store_from_opening() {
    let (live, lost) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    record_then_lose(live.path(), lost.path(), 45, 10, 60 << 10);
    let conn = Connection::open(lost.path().join("retrace.db")).unwrap();
    conn.execute("UPDATE leases SET holder = 'elsewhere:1:1', expires_at = 0", []).unwrap();
    drop(conn);
    let store = open(lost.path(), Durability::Os);
    assert_eq!(store.recover_interrupted().unwrap(), Vec::<String>::new());
    assert_eq!(
        store.run(RUN).unwrap().status,
        RunStatus::Running,
        "not called interrupted: events are missing"
    );
    assert!(the_log(lost.path()).exists(), "the log is kept");
    let problems = verify_run(store.as_ref(), RUN);
    assert!(
        problems.iter().any(|p| p.kind == ProblemKind::Unrecovered && p.message.contains("acklog")),
        "verify names the log: {problems:#?}"
    );
    let err = RunWriter::open(store.clone(), RUN, LeaseHolder::current()).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Corrupt, "taking the lease says why: {err}");
}

/// Live `-wal` file → where [`snapshot_at_wal_sync`] copies its database.
static SYNC_SNAPSHOTS: std::sync::Mutex<Vec<(PathBuf, PathBuf)>> = std::sync::Mutex::new(Vec::new());

/// The hook of [`retrace_store::sqlite::on_wal_synced`]: after each WAL sync of a registered
/// store, its database as a disk would hold it if power failed right then.
fn snapshot_at_wal_sync(wal: &Path) {
    let target = SYNC_SNAPSHOTS.lock().unwrap().iter().find(|(w, _)| w == wal).map(|(_, t)| t.clone());
    if let Some(target) = target {
        let db = wal.with_file_name("retrace.db");
        let _ = std::fs::remove_file(&target);
        let conn = Connection::open(db).unwrap();
        conn.execute("VACUUM INTO ?1", [target.to_str().unwrap()]).unwrap();
    }
}

#[test]
fn what_the_last_wal_sync_left_plus_the_log_holds_every_acknowledged_event() {
    // The strictest power cut: the database as it stood at the store's last WAL sync of its
    // own (SQLite's checkpoints, which sync too, are ignored), with the log as it stands. A
    // lap that started over without syncing the WAL first fails this (a gap).
    retrace_store::sqlite::on_wal_synced(snapshot_at_wal_sync);
    let (live, lost) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::create_dir_all(lost.path()).unwrap();
    SYNC_SNAPSHOTS.lock().unwrap().push((live.path().join("retrace.db-wal"), lost.path().join("retrace.db")));
    let store = open(live.path(), Durability::Event);
    store.create_run(&sample_run(RUN, 1)).unwrap();
    let writer = RunWriter::open(store.clone(), RUN, LeaseHolder::current()).unwrap();
    let steps: Vec<Step> = (1..=45).map(|i| record_step(&writer, i, 60 << 10)).collect();
    copy_log(live.path(), lost.path());
    SYNC_SNAPSHOTS.lock().unwrap().clear();
    drop(writer);

    let store = open(lost.path(), Durability::Event);
    let synced = store.last_seq(RUN).unwrap();
    assert!((1..45).contains(&synced), "the last WAL sync held seqs up to {synced}");
    let writer = RunWriter::open(store.clone(), RUN, LeaseHolder::current()).unwrap();
    assert_holds(store.as_ref(), &steps);
    writer.close().unwrap();
}
