//! The message bus in record (issue 3): 16 agents (tokio tasks) in a ring, each sending a
//! ~200-byte body to the next and receiving one from the previous, round after round, on a
//! SQLite store with batch durability. Messages/s (each message is two events: its `send` and
//! its `deliver`), held to 30,000 msg/s, and µs per event beside the core's per-event floor;
//! with the default `wait_for_ack` and pipelined (sends are acknowledged either way). A counting
//! wrapper around the store also tells how many events each commit carried, and captures the
//! acked ring's writes once more, to commit them again from one thread: the store's own share
//! of the ring, which scheduling noise doesn't touch. It also times the store's commits inside
//! each ring: what the ring spends beyond them is hand-offs, wake-ups and the agents' own work.
//!
//! `RETRACE_BENCH_BUS_BATCH=N` commits the captured events again in batches of exactly `N`
//! (each with the blobs its events name first), instead of as the ring happened to batch them:
//! for instruction counts (`valgrind --tool=callgrind --toggle-collect='*commit_again*'`) that
//! two builds can be compared on to well under 1%.
//!
//! The floor (as [`crate::floor::record_floor`], for the bus's rows): per message, canonical
//! JSON and sha256 of the send's request and of the delivery's, then one blob row and two
//! ~300 B event rows inserted into a raw WAL table, `synchronous=NORMAL`, 1000 event rows per
//! transaction.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use retrace_core::canonical::canonical_value;
use retrace_runtime::{Outcome, RuntimeError, Session, SessionOptions};
use retrace_store::{Batch, Durability, Store};
use rusqlite::{params, Connection};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use tokio::runtime::Runtime;

use crate::counting::{capturing, counting, Captured, Counting};
use crate::drive::agent_name;
use crate::env::{note, BenchStore, Config};
use crate::floor::raw_db;
use crate::payload::{words, Rng};
use crate::report::{median, print, Line, Target};
use crate::scheduler::runtime;

/// Agents in the ring.
pub const AGENTS: usize = 16;

/// Bytes of a message body (canonical JSON).
pub const BODY: usize = 200;

/// The throughput target.
pub const TARGET_MSG_S: f64 = 30_000.0;

/// Event rows per transaction in the floor.
const ROWS_PER_TX: usize = 1000;

/// Bytes of the floor's event row.
const EVENT_ROW: usize = 300;

/// The message kind.
const KIND: &str = "note";

/// Every agent's bodies, built outside the clock.
type Bodies = Vec<Arc<Vec<Value>>>;

/// Body `n` of agent `a`: `{"from", "n", "text"}`, [`BODY`] canonical bytes, unique.
fn body(a: usize, n: usize, rng: &mut Rng) -> Value {
    let bare = json!({"from": a, "n": n, "text": ""});
    let short = BODY.saturating_sub(canonical_value(&bare).expect("canonical").len());
    json!({"from": a, "n": n, "text": words(rng, short)})
}

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let rounds: usize = cfg.pick(250, 3_125);
    let messages = rounds * AGENTS;
    note(&format!(
        "bus: {AGENTS} agents in a ring, {rounds} rounds = {messages} messages of {BODY} B, {} repeats",
        cfg.repeats
    ));
    let mut rng = Rng::new(7);
    let bodies: Bodies =
        (0..AGENTS).map(|a| Arc::new((0..rounds).map(|n| body(a, n, &mut rng)).collect())).collect();
    let rt = runtime();
    // Warm-up (untimed): page cache, allocator, tokio workers.
    let warm = cfg.store("bus-warm", Durability::Batch);
    ring(&rt, &warm, &truncated(&bodies, rounds.min(100)), true);
    drop(warm);

    let (mut floors, mut rates, mut batches) = (vec![], [vec![], vec![]], [vec![], vec![]]);
    let mut in_store = [vec![], vec![]];
    for _ in 0..cfg.repeats {
        let dir = cfg.temp_dir("bus-floor");
        let mut conn = raw_db(dir.path());
        floors.push(floor(&mut conn, &bodies).as_secs_f64() * 1e6 / (2 * messages) as f64);
        drop(conn);
        for (i, wait_for_ack) in [true, false].into_iter().enumerate() {
            let store = cfg.store("bus", Durability::Batch);
            let r = ring(&rt, &store, &bodies, wait_for_ack);
            rates[i].push(messages as f64 / r.wall.as_secs_f64());
            batches[i].push(r.per_commit);
            in_store[i].push(r.commit_us_per_event);
        }
    }
    let floor = median(&floors);
    print(lines, Line::new("bus.floor (canon+sha256+raw insert)", floor, "us/ev", None, Target::Info));
    for (i, what) in ["acked, default", "pipelined"].into_iter().enumerate() {
        let rate = median(&rates[i]);
        let target = if i == 0 { Target::AtLeast(TARGET_MSG_S) } else { Target::Info };
        print(lines, Line::new(&format!("bus.16 agents ring ({what})"), rate, "msg/s", None, target));
        let per_event = 1e6 / (2.0 * rate);
        print(
            lines,
            Line::new(&format!("bus.  per event ({what})"), per_event, "us/ev", Some(floor), Target::Info),
        );
        let per_commit = median(&batches[i]);
        print(
            lines,
            Line::new(&format!("bus.  events per commit ({what})"), per_commit, "ev", None, Target::Info),
        );
        let store_part = median(&in_store[i]);
        let line = Line::new(
            &format!("bus.  in store commits ({what})"),
            store_part,
            "us/ev",
            Some(floor),
            Target::Info,
        );
        print(lines, line);
    }
    // The acked ring's own batches committed again from one thread: the store's share of the
    // ring, steadier than the ring itself when the machine is noisy (no scheduling in it).
    let store = cfg.store("bus-capture", Durability::Batch);
    let captor = Arc::new(capturing(store.store.clone()));
    ring_on(&rt, captor.clone(), &bodies, true);
    let captured = captor.hooks().take_captured();
    let batch = std::env::var("RETRACE_BENCH_BUS_BATCH").ok().and_then(|n| n.parse::<usize>().ok());
    let (captured, what) = match batch {
        Some(n) if n > 0 => (rebatch(&captured, n), format!("batches of {n}")),
        _ => (captured, "acked batches".to_string()),
    };
    let alone: Vec<f64> = (0..cfg.repeats)
        .map(|_| commit_again(cfg.store("bus-again", Durability::Batch).store.as_ref(), &captured))
        .collect();
    let line = Line::new(
        &format!("bus.  store commits alone ({what})"),
        median(&alone),
        "us/ev",
        Some(floor),
        Target::Info,
    );
    print(lines, line);
}

/// The first `rounds` bodies of every agent.
fn truncated(bodies: &Bodies, rounds: usize) -> Bodies {
    bodies.iter().map(|b| Arc::new(b[..rounds].to_vec())).collect()
}

/// Records the ring: agent `a` sends each of its bodies to `a + 1` and then takes one message.
fn ring(rt: &Runtime, store: &BenchStore, bodies: &Bodies, wait_for_ack: bool) -> Ringed {
    ring_on(rt, Arc::new(counting(store.store.clone())), bodies, wait_for_ack)
}

/// Makes the writes of `captured` again, in order, into `store`: µs per event committed
/// (not inlined, so that `valgrind --toggle-collect='*commit_again*'` counts just this).
#[inline(never)]
fn commit_again(store: &dyn Store, captured: &[Captured]) -> f64 {
    let began = Instant::now();
    let mut events = 0;
    for write in captured {
        match write {
            Captured::Run(meta) => store.create_run(meta).expect("creating the run again"),
            Captured::Batch(batch) => {
                events += batch.events.len();
                store.commit(batch).expect("committing a batch again");
            }
        }
    }
    began.elapsed().as_secs_f64() * 1e6 / events.max(1) as f64
}

/// The captured writes with their events regrouped into batches of `n` (the last may be
/// shorter), each carrying the blobs its events name that no earlier batch carried.
fn rebatch(captured: &[Captured], n: usize) -> Vec<Captured> {
    let mut regrouped = vec![];
    let (mut events, mut blobs) = (vec![], HashMap::new());
    let mut run_id = String::new();
    for write in captured {
        match write {
            Captured::Run(meta) => regrouped.push(Captured::Run(meta.clone())),
            Captured::Batch(batch) => {
                assert!(batch.cache.is_empty(), "the ring writes no cache entries");
                run_id.clone_from(&batch.run_id);
                events.extend(batch.events.iter().cloned());
                blobs.extend(batch.blobs.iter().map(|b| (b.digest(), b.clone())));
            }
        }
    }
    for chunk in events.chunks(n) {
        let named = chunk.iter().flat_map(|e| [e.request_ref, e.output_ref]).flatten();
        let blobs = named.filter_map(|d| blobs.remove(&d)).collect();
        regrouped.push(Captured::Batch(Batch {
            run_id: run_id.clone(),
            events: chunk.to_vec(),
            blobs,
            cache: vec![],
        }));
    }
    assert!(blobs.is_empty(), "every captured blob is named by a captured event");
    regrouped
}

/// [`ring`] on a given counting store.
fn ring_on(rt: &Runtime, counting: Arc<Counting>, bodies: &Bodies, wait_for_ack: bool) -> Ringed {
    let options = SessionOptions { wait_for_ack, ..SessionOptions::default() };
    let session = Session::record(counting.clone(), options).expect("starting a recording");
    let began = Instant::now();
    rt.block_on(async {
        let tasks: Vec<_> = bodies
            .iter()
            .enumerate()
            .map(|(a, mine)| {
                let mine = mine.clone();
                let next = agent_name((a + 1) % AGENTS);
                let prev = (a + AGENTS - 1) % AGENTS;
                session.spawn(&agent_name(a), move |agent| async move {
                    for (n, body) in mine.iter().enumerate() {
                        agent.send(&next, KIND, body, None).await?;
                        let m = agent.recv(None).await?.expect("no timeout was set");
                        if m.body["from"] != prev || m.body["n"] != n {
                            return Err(RuntimeError::Usage(format!(
                                "agent {a} got {} in round {n}",
                                m.body
                            )));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("an agent task panicked").expect("a ring step");
        }
    });
    let report = session.finish(Outcome::default()).expect("finishing the ring");
    let elapsed = began.elapsed();
    let messages: usize = bodies.iter().map(|b| b.len()).sum();
    assert_eq!(report.steps, 2 * messages, "a send and a recv per message");
    let commits = counting.hooks().counts();
    assert_eq!(commits.events, 2 * messages as u64, "every event committed");
    Ringed { wall: elapsed, per_commit: commits.per_commit(), commit_us_per_event: commits.us_per_event() }
}

/// What one ring measured.
#[derive(Debug)]
struct Ringed {
    /// From the first step to `finish` returning.
    wall: Duration,
    /// Events per store commit (the writer's group commit at work).
    per_commit: f64,
    /// Time inside the store's `commit`, per event (µs).
    commit_us_per_event: f64,
}

/// The floor of recording the ring's events: per message the send's request (canonical JSON,
/// sha256, one blob row) and the delivery's (canonical JSON, sha256), and two event rows.
fn floor(conn: &mut Connection, bodies: &Bodies) -> Duration {
    let messages: Vec<(Value, Value)> = (0..bodies[0].len())
        .flat_map(|n| {
            bodies.iter().enumerate().map(move |(a, b)| {
                let to = agent_name((a + 1) % AGENTS);
                let send = json!({"to": to, "kind": KIND, "body": b[n]});
                (send, json!({"from": agent_name(a), "kind": KIND}))
            })
        })
        .collect();
    let began = Instant::now();
    let mut row = vec![0u8; EVENT_ROW];
    let mut seq = 0i64;
    for chunk in messages.chunks(ROWS_PER_TX / 2) {
        let hashed: Vec<_> = chunk
            .iter()
            .map(|(send, deliver)| {
                let (send, deliver) =
                    (canonical_value(send).expect("c"), canonical_value(deliver).expect("c"));
                (Sha256::digest(&send), send, Sha256::digest(&deliver))
            })
            .collect();
        let tx = conn.transaction().expect("raw transaction");
        {
            let mut blob =
                tx.prepare_cached("INSERT INTO blobs (digest, data) VALUES (?1, ?2)").expect("prepare");
            let mut event = tx
                .prepare_cached("INSERT INTO events (run_id, seq, payload) VALUES (?1, ?2, ?3)")
                .expect("prepare");
            for (digest, send, deliver) in &hashed {
                blob.execute(params![digest.as_slice(), send]).expect("raw blob insert");
                for d in [digest, deliver] {
                    row[..32].copy_from_slice(d);
                    seq += 1;
                    event.execute(params!["run-floor", seq, row]).expect("raw event insert");
                }
            }
        }
        tx.commit().expect("raw commit");
    }
    began.elapsed()
}
