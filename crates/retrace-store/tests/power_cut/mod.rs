//! A power cut under `Durability::Event`, simulated: a snapshot of the database taken while
//! recording (`VACUUM INTO` copies what was committed, synced or not) paired with the run's ack
//! log as it stood once later batches were acknowledged, which is what a disk that kept the
//! synced log but not the unsynced WAL would hold. Shared by the store's ack-log tests and the
//! CLI's (`#[path]`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use retrace_core::envelope::ToolClass;
use retrace_core::{Digest, Event, EventType};
use retrace_store::conformance::{sample_run, text};
use retrace_store::sqlite::SqliteStore;
use retrace_store::{BlobHint, BlobPut, CacheEntry, Durability, EventStore, LeaseHolder, RunWriter};
use rusqlite::Connection;

pub const RUN: &str = "acked";

pub fn open(dir: &Path, durability: Durability) -> Arc<SqliteStore> {
    Arc::new(SqliteStore::open(&dir.join("retrace.db"), &dir.join("blobs"), durability, 5_000).unwrap())
}

/// The ack-log folder of the store in `dir`.
pub fn log_dir(dir: &Path) -> PathBuf {
    dir.join("retrace.db-acklog")
}

/// The one ack log in `dir`.
pub fn the_log(dir: &Path) -> PathBuf {
    let logs: Vec<PathBuf> = std::fs::read_dir(log_dir(dir)).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(logs.len(), 1, "one ack log: {logs:?}");
    logs.into_iter().next().unwrap()
}

/// What the recorder stored for one step: its event (sealed), blobs and cache entry.
pub struct Step {
    pub event: Event,
    pub output: BlobPut,
    pub key: Digest,
}

/// Appends step `i` (a tool call with a request, an output of `output_len` bytes and a cache
/// entry) and waits for its acknowledgment.
pub fn record_step(writer: &RunWriter, i: u64, output_len: usize) -> Step {
    let mut seed = i + 1;
    let request = BlobPut::new(text(&mut seed, 300).into_bytes(), BlobHint::Raw);
    let output = BlobPut::new(text(&mut seed, output_len).into_bytes(), BlobHint::Raw);
    let mut event = Event::new(RUN, format!("agent{}", i % 3), EventType::ToolCall);
    event.name = Some(format!("tool{}", i % 5));
    event.lamport = i;
    event.key = Digest::of(format!("step {i}").as_bytes());
    event.request_ref = Some(request.digest());
    event.output_ref = Some(output.digest());
    let entry = CacheEntry {
        output_ref: output.digest(),
        usage: None,
        stored_at_ms: 1_000 + i,
        class: Some(ToolClass::Deterministic),
        ttl_s: None,
        snapshot: None,
    };
    let key = event.key;
    let ticket = writer.append_cached(event, vec![request, output.clone()], Some((key, entry))).unwrap();
    Step { event: ticket.wait().unwrap(), output, key }
}

/// A consistent copy of the database at `from` (committed transactions, synced or not) as the
/// database of a store in `to`.
pub fn snapshot(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    let conn = Connection::open(from.join("retrace.db")).unwrap();
    let target = to.join("retrace.db");
    conn.execute("VACUUM INTO ?1", [target.to_str().unwrap()]).unwrap();
}

/// Copies the ack log of the store in `from` into the store in `to`.
pub fn copy_log(from: &Path, to: &Path) -> PathBuf {
    let log = the_log(from);
    std::fs::create_dir_all(log_dir(to)).unwrap();
    let copy = log_dir(to).join(log.file_name().unwrap());
    std::fs::copy(&log, &copy).unwrap();
    copy
}

/// Records `n` steps in a fresh store in `live` under `event` durability, snapshots the
/// database into `lost` after `snapshot_at` of them, and copies the ack log (as it stands with
/// all `n` acknowledged) there too. Returns the steps; the live writer is closed.
pub fn record_then_lose(live: &Path, lost: &Path, n: u64, snapshot_at: u64, output_len: usize) -> Vec<Step> {
    let store = open(live, Durability::Event);
    store.create_run(&sample_run(RUN, 1)).unwrap();
    let writer = RunWriter::open(store.clone(), RUN, LeaseHolder::current()).unwrap();
    let mut steps = Vec::new();
    for i in 1..=n {
        steps.push(record_step(&writer, i, output_len));
        if i == snapshot_at {
            snapshot(live, lost);
        }
    }
    copy_log(live, lost);
    writer.close().unwrap();
    assert!(
        std::fs::read_dir(log_dir(live)).unwrap().next().is_none(),
        "releasing the lease deletes the ack log"
    );
    steps
}
