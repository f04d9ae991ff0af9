//! How fast this machine is, against the one `perf-anchors.md` measured, printed before any
//! bench: three small fixed workloads (sha256 of 1 KB, perf-anchors' batched SQLite insert and
//! its JSON round trip). The lines with an absolute target (events/s, MB/s) move with the
//! machine: one 2-core VM exported 166k events/s, a later one 83k to 119k in runs minutes apart.
//! These lines let two runs' machines be compared. They are not a correction factor: here the
//! bench's allocator (mimalloc) and a newer SQLite make the last two faster than the anchors
//! on any machine.
use std::hint::black_box;
use std::time::Instant;

use sha2::{Digest as _, Sha256};

use crate::env::{note, Config};
use crate::floor::raw_db;
use crate::report::{median, print, Line, Target};

/// sha256 of 1 KB on the machine of `perf-anchors.md`, in µs.
const ANCHOR_SHA256_1KB_US: f64 = 0.7;

/// perf-anchors.md's D2: a 300-byte row inserted into its `events` table, 1,000 rows per
/// transaction, WAL, `synchronous=NORMAL`, in µs per row.
const ANCHOR_BATCHED_INSERT_US: f64 = 3.81;

/// perf-anchors.md's D4: a 4.2 KB step-shaped JSON object parsed into a `serde_json::Value`
/// and serialized back, in µs.
const ANCHOR_JSON_ROUND_TRIP_US: f64 = 26.0;

/// Prints the machine's speed lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    sha256(lines);
    batched_insert(cfg, lines);
    json_round_trip(lines);
}

/// D4's round trip, 20 samples of 500: allocation and branches, as most of a step's CPU is.
fn json_round_trip(lines: &mut Vec<Line>) {
    let messages: Vec<serde_json::Value> = (0..12)
        .map(|i| {
            serde_json::json!({
                "role": if i % 2 == 0 { "user" } else { "assistant" },
                "content": format!("message {i}: {}", "the quick brown fox jumps over the lazy dog ".repeat(6)),
            })
        })
        .collect();
    let doc = serde_json::json!({
        "run_id": "01jd4q9m6w8k2r7t3v5x0y1z2a",
        "seq": 4211,
        "agent_id": "planner",
        "request_ref": format!("sha256:{}", "ab".repeat(32)),
        "lamport": 9_007_199_254_740_993u64,
        "messages": messages,
    })
    .to_string();
    let per_sample = 500;
    let samples: Vec<f64> = (0..20)
        .map(|_| {
            let began = Instant::now();
            for _ in 0..per_sample {
                let value: serde_json::Value = serde_json::from_str(black_box(&doc)).expect("JSON");
                black_box(value.to_string());
            }
            began.elapsed().as_secs_f64() * 1e6 / f64::from(per_sample)
        })
        .collect();
    print(
        lines,
        Line::new(
            &format!("machine: JSON {:.1} KB parse+serialize vs perf-anchors", doc.len() as f64 / 1e3),
            median(&samples),
            "us",
            Some(ANCHOR_JSON_ROUND_TRIP_US),
            Target::Info,
        ),
    );
}

/// D2's batched insert, 20 transactions of 1,000 rows into a fresh database: what a store's
/// B-tree work costs here (memory and cache, more than the arithmetic sha256 measures).
fn batched_insert(cfg: &Config, lines: &mut Vec<Line>) {
    let dir = cfg.temp_dir("machine");
    let mut conn = raw_db(dir.path());
    let payload = [0x5au8; 300];
    let samples: Vec<f64> = (0..20)
        .map(|tx_no| {
            let began = Instant::now();
            let tx = conn.transaction().expect("a transaction");
            {
                let mut insert = tx
                    .prepare_cached("INSERT INTO events (run_id, seq, payload) VALUES (?1, ?2, ?3)")
                    .expect("the insert");
                for seq in 0..1_000 {
                    insert
                        .execute(rusqlite::params!["machine", tx_no * 1_000 + seq, &payload[..]])
                        .expect("an insert");
                }
            }
            tx.commit().expect("a commit");
            began.elapsed().as_secs_f64() * 1e6 / 1_000.0
        })
        .collect();
    print(
        lines,
        Line::new(
            "machine: SQLite batched insert vs perf-anchors",
            median(&samples),
            "us/row",
            Some(ANCHOR_BATCHED_INSERT_US),
            Target::Info,
        ),
    );
}

/// sha256 of 1 KB, 40 samples of 2,000.
fn sha256(lines: &mut Vec<Line>) {
    let block = [0x5au8; 1024];
    let per_sample = 2_000;
    let mut samples: Vec<f64> = (0..40)
        .map(|_| {
            let began = Instant::now();
            for _ in 0..per_sample {
                black_box(Sha256::digest(black_box(&block)));
            }
            began.elapsed().as_secs_f64() * 1e6 / f64::from(per_sample)
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    note(&format!("machine: sha256 of 1 KB, 40 samples: p10 {:.2} us, p90 {:.2} us", at(0.1), at(0.9)));
    print(
        lines,
        Line::new(
            "machine: sha256 1 KB vs perf-anchors",
            median(&samples),
            "us",
            Some(ANCHOR_SHA256_1KB_US),
            Target::Info,
        ),
    );
}
