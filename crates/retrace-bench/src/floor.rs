//! Same-run floors (perf-anchors D2, D3): what recording can't be cheaper than on this machine.
//!
//! - [`record_floor`]: canonicalise each step's request and output, sha256 both, and insert the
//!   rows the store writes for a step (two blob rows, one ~300 B event row) into a plain
//!   rusqlite WAL table, `synchronous=NORMAL`, 1000 steps per transaction.
//! - [`fsync_floor`]: append 300 B to a file and `sync_data` it, on the store's disk.
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use retrace_core::canonical::canonical_value;
use rusqlite::{params, Connection};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// Steps per transaction in the raw insert floor (as D2).
pub const ROWS_PER_TX: usize = 1000;

/// Bytes of the raw event row's payload (as D2).
const EVENT_ROW: usize = 300;

/// Opens a fresh raw database in `dir`: WAL, `synchronous=NORMAL`, the D2 events table and a
/// blobs table keyed by digest (as the store's).
pub fn raw_db(dir: &Path) -> Connection {
    raw_db_with(dir, "NORMAL", 4096)
}

/// [`raw_db`] with another `synchronous` level and page size.
pub fn raw_db_with(dir: &Path, synchronous: &str, page_size: u32) -> Connection {
    let conn = Connection::open(dir.join("raw.db")).expect("opening the raw floor database");
    conn.execute_batch(&format!(
        "PRAGMA page_size = {page_size}; PRAGMA journal_mode = WAL; PRAGMA synchronous = {synchronous};
         CREATE TABLE events (id INTEGER PRIMARY KEY, run_id TEXT, seq INTEGER, payload BLOB, UNIQUE (run_id, seq));
         CREATE TABLE blobs (id INTEGER PRIMARY KEY, digest BLOB NOT NULL UNIQUE, data BLOB);"
    ))
    .expect("creating the raw floor schema");
    conn
}

/// One step's rows (two blobs, one event) per transaction on `conn`, each commit's latency:
/// what SQLite + the disk cost per acknowledged step, with no Retrace code around it.
pub fn commit_latencies(conn: &mut Connection, data: &[(Value, Value)]) -> Vec<Duration> {
    let row = vec![7u8; EVENT_ROW];
    let rows: Vec<_> = data
        .iter()
        .map(|(r, o)| {
            let (r, o) = (canonical_value(r).expect("c"), canonical_value(o).expect("c"));
            (Sha256::digest(&r), r, Sha256::digest(&o), o)
        })
        .collect();
    let mut latencies = Vec::with_capacity(rows.len());
    for (seq, (rd, r, od, o)) in rows.iter().enumerate() {
        let began = Instant::now();
        let tx = conn.transaction().expect("raw transaction");
        {
            let mut blob =
                tx.prepare_cached("INSERT INTO blobs (digest, data) VALUES (?1, ?2)").expect("prepare");
            blob.execute(params![rd.as_slice(), r]).expect("raw blob insert");
            blob.execute(params![od.as_slice(), o]).expect("raw blob insert");
            tx.prepare_cached("INSERT INTO events (run_id, seq, payload) VALUES (?1, ?2, ?3)")
                .and_then(|mut s| s.execute(params!["run-floor", seq as i64, row]))
                .expect("raw event insert");
        }
        tx.commit().expect("raw commit");
        latencies.push(began.elapsed());
    }
    latencies
}

/// The floor of recording `data`: canonical JSON + sha256 + raw batched inserts. Returns the
/// wall time and the part of it spent in SQLite.
pub fn record_floor(conn: &mut Connection, data: &[(Value, Value)]) -> (Duration, Duration) {
    let began = Instant::now();
    let mut in_sqlite = Duration::ZERO;
    let mut row = vec![0u8; EVENT_ROW];
    for (chunk_no, chunk) in data.chunks(ROWS_PER_TX).enumerate() {
        let mut hashed = Vec::with_capacity(chunk.len());
        for (request, output) in chunk {
            let request = canonical_value(request).expect("canonical request");
            let output = canonical_value(output).expect("canonical output");
            let (r, o) = (Sha256::digest(&request), Sha256::digest(&output));
            hashed.push((request, r, output, o));
        }
        let sql = Instant::now();
        let tx = conn.transaction().expect("raw transaction");
        {
            let mut blob =
                tx.prepare_cached("INSERT INTO blobs (digest, data) VALUES (?1, ?2)").expect("prepare");
            let mut event = tx
                .prepare_cached("INSERT INTO events (run_id, seq, payload) VALUES (?1, ?2, ?3)")
                .expect("prepare");
            for (i, (request, r, output, o)) in hashed.iter().enumerate() {
                blob.execute(params![r.as_slice(), request]).expect("raw blob insert");
                blob.execute(params![o.as_slice(), output]).expect("raw blob insert");
                row[..32].copy_from_slice(r);
                row[32..64].copy_from_slice(o);
                let seq = (chunk_no * ROWS_PER_TX + i) as i64;
                event.execute(params!["run-floor", seq, row]).expect("raw event insert");
            }
        }
        tx.commit().expect("raw commit");
        in_sqlite += sql.elapsed();
    }
    (began.elapsed(), in_sqlite)
}

/// `count` appends of 300 B, each followed by `File::sync_data`, in a file in `dir`; each
/// one's latency (after 20 untimed warm-up appends).
pub fn fsync_floor(dir: &Path, count: usize) -> Vec<Duration> {
    let path = dir.join("fsync.log");
    let mut file = OpenOptions::new().create(true).append(true).open(&path).expect("opening the fsync file");
    let record = [b'x'; 300];
    let append = |file: &mut std::fs::File| {
        let began = Instant::now();
        file.write_all(&record).expect("append");
        file.sync_data().expect("fdatasync");
        began.elapsed()
    };
    for _ in 0..20 {
        append(&mut file);
    }
    let latencies = (0..count).map(|_| append(&mut file)).collect();
    let _ = std::fs::remove_file(path);
    latencies
}
