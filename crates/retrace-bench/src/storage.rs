//! Storage: a 200-turn chat (a user and an assistant message per turn, each 200 B..4 KB), every
//! model request carrying the whole history. Bytes on disk (database + WAL after a checkpoint +
//! blob folder) against the unique message bytes + 600 B per event.
use std::path::Path;

use retrace_core::canonical::canonical_value;
use retrace_runtime::{ModelCall, ModelReply, Outcome, Session, SessionOptions};
use retrace_store::Durability;
use rusqlite::{Connection, OpenFlags};
use serde_json::{json, Value};

use crate::env::{disk_bytes, note, Config};
use crate::payload::{message, Rng};
use crate::report::{median, print, Line, Target};

/// Turns of the chat.
pub const TURNS: usize = 200;

/// The per-event allowance of the budget.
pub const PER_EVENT: u64 = 600;

/// What one chat stored.
struct Stored {
    /// Bytes on disk.
    total: u64,
    /// Unique message bytes + 600 B per event.
    budget: u64,
    /// What the requests and outputs would take stored flat.
    flat: u64,
    /// Where the bytes are: per table or index, and the blob folder.
    breakdown: String,
}

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    note(&format!("storage: {TURNS}-turn chat, {} repeats (seeds 0..)", cfg.repeats));
    let runs: Vec<Stored> = (0..cfg.repeats as u64).map(|seed| chat(cfg, seed)).collect();
    let ratio = |s: &Stored| s.total as f64 / s.budget as f64;
    let ratios: Vec<f64> = runs.iter().map(ratio).collect();
    let mid = ratios.iter().position(|r| *r == median(&ratios)).unwrap_or(0);
    let s = &runs[mid];
    note(&format!("storage breakdown of the median run: {}", s.breakdown));
    print(
        lines,
        Line::new(
            "storage total bytes (median run)",
            s.total as f64,
            "B",
            Some(s.budget as f64),
            Target::RatioAtMost(1.3),
        ),
    );
    print(
        lines,
        Line::new(
            "storage flat requests+outputs (for scale)",
            s.flat as f64,
            "B",
            Some(s.budget as f64),
            Target::Info,
        ),
    );
}

fn size(v: &Value) -> u64 {
    canonical_value(v).expect("canonical").len() as u64
}

fn chat(cfg: &Config, seed: u64) -> Stored {
    let store = cfg.store("storage", Durability::Batch);
    let session =
        Session::record(store.store.clone(), SessionOptions::default()).expect("starting a recording");
    let agent = session.agent("assistant");
    let mut rng = Rng::new(seed);
    let (mut history, mut unique, mut flat) = (Vec::new(), 0, 0);
    for turn in 0..TURNS {
        let (user_size, reply_size) = (rng.between(200, 4096) as usize, rng.between(200, 4096) as usize);
        let user = message(&mut rng, "user", user_size);
        let reply = message(&mut rng, "assistant", reply_size);
        unique += size(&user) + size(&reply);
        history.push(user);
        let body = json!({"model": "gpt-4o", "temperature": 0.2, "messages": history});
        let call = ModelCall { provider: "openai".into(), endpoint: "chat.completions".into(), body };
        let response = json!({
            "id": format!("chatcmpl-{seed}-{turn}"),
            "object": "chat.completion",
            "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
        });
        flat += size(&call.body) + size(&response);
        let live = ModelReply { body: response, snapshot: None, usage: None };
        agent.model(&call, move |_body| Ok::<_, String>(live)).expect("recording a model call");
        history.push(reply);
    }
    let report = session.finish(Outcome::default()).expect("finishing the chat");
    store.sqlite.checkpoint().expect("checkpointing");
    let db = store.sqlite.path().to_path_buf();
    let mut wal = db.clone().into_os_string();
    wal.push("-wal");
    let files = disk_bytes(store.sqlite.blobs_dir());
    let total = disk_bytes(&db) + disk_bytes(wal.as_ref()) + files;
    let breakdown = format!("{}, blob files {files} B", tables(&db));
    Stored { total, budget: unique + PER_EVENT * report.steps as u64, flat, breakdown }
}

/// Bytes per table and index of the database at `db` (SQLite's `dbstat`), largest first.
fn tables(db: &Path) -> String {
    let sizes = || -> rusqlite::Result<Vec<(String, i64)>> {
        let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        let mut stmt = conn.prepare("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect()
    };
    match sizes() {
        Ok(sizes) => {
            sizes.iter().map(|(name, bytes)| format!("{name} {bytes} B")).collect::<Vec<_>>().join(", ")
        }
        Err(e) => format!("(dbstat unavailable: {e})"),
    }
}
