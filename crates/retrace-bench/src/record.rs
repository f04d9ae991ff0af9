//! Recording with batched durability (the default): µs per event for one pipelined writer and
//! for 16 writer threads, against the same-run floor and against Burr's per-step cost; with the
//! process CPU per event of each (INFO), steadier than wall time on a shared VM, and what each
//! one's commits carried and cost inside the store (INFO, through [`crate::counting`]): 16 acked
//! writers on 2 CPUs settle into commits of 5 to 7 events, which cost more per event than the
//! pipelined writers' large ones (twice as much until schema 12 took the random-key index
//! inserts off the commit: `retrace_store`'s `sqlite/tail.rs`). Last, once, the same
//! recordings into a store that already holds [`AT_SCALE`] events (INFO): the targets are
//! measured on fresh stores, where the digest index and the cache are small enough to stay in
//! memory, and a store in use for weeks is not; with the slowest acknowledgment of the 16
//! writers there, which waits for whatever merge of the digest tables its commit ran; and a
//! short recording into that store through a new handle, as the next process would make.
use std::sync::Arc;

use retrace_store::sqlite::SqliteStore;
use retrace_store::{Durability, Store};
use serde_json::Value;

use crate::counting::{counting, Commits};
use crate::drive;
use crate::env::{note, BenchStore, Config};
use crate::floor::{raw_db, record_floor};
use crate::payload::{output, request};
use crate::report::{median, print, Line, Target};

/// Burr + SQLitePersister, default connection, per step (perf-anchors A, 1 KB state: +1.35 ms;
/// 8 KB: +1.54 ms); the issue fixes it at 1.5 ms.
pub const BURR_STEP_US: f64 = 1500.0;

/// Writer threads of the concurrent measurement.
pub const THREADS: usize = 16;

/// Events a store holds before the at-scale measurements (`--quick`: a tenth).
pub const AT_SCALE: u64 = 500_000;

/// The steps every recording bench records: `count` pairs of ~1 KB request and output.
pub fn steps(count: usize) -> Vec<(Value, Value)> {
    (0..count as u64).map(|i| (request(i), output(i))).collect()
}

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let n = cfg.pick(10_000, 50_000);
    note(&format!(
        "record (batch durability): {n} events of 1 KB request + 1 KB output, {} repeats",
        cfg.repeats
    ));
    let data = steps(n);
    let warm = cfg.store("warm", Durability::Batch);
    drive::record(warm.store.clone(), &data[..n.min(2_000)], 1, false);
    drop(warm);

    let per_event = |d: std::time::Duration| d.as_secs_f64() * 1e6 / n as f64;
    let (mut floor, mut floor_sql, mut one, mut many, mut many_piped) =
        (vec![], vec![], vec![], vec![], vec![]);
    // Process CPU per event of each measurement (both CPUs' worth): steadier than wall time.
    let mut cpu: [Vec<f64>; 3] = Default::default();
    // Events per commit and µs per event inside the store's commits, of each measurement.
    let mut commits: [Vec<Commits>; 3] = Default::default();
    let mut timed = |i: usize, store: Arc<dyn Store>, threads: usize, acked: bool, wall: &mut Vec<f64>| {
        let counted = Arc::new(counting(store));
        let recorded = drive::record(counted.clone(), &data, threads, acked);
        wall.push(per_event(recorded.wall));
        cpu[i].extend(recorded.cpu.map(per_event));
        commits[i].push(counted.hooks().counts());
    };
    for _ in 0..cfg.repeats {
        let dir = cfg.temp_dir("floor");
        let mut conn = raw_db(dir.path());
        let (wall, sql) = record_floor(&mut conn, &data);
        drop(conn);
        floor.push(per_event(wall));
        floor_sql.push(per_event(sql));

        let store = cfg.store("record1", Durability::Batch);
        timed(0, store.store.clone(), 1, false, &mut one);
        drop(store);

        let store = cfg.store("record16", Durability::Batch);
        timed(1, store.store.clone(), THREADS, true, &mut many);
        drop(store);

        let store = cfg.store("record16p", Durability::Batch);
        timed(2, store.store.clone(), THREADS, false, &mut many_piped);
    }
    let floor = median(&floor);
    let us = "us/ev";
    print(lines, Line::new("record.batch floor (canon+sha256+raw insert)", floor, us, None, Target::Info));
    print(
        lines,
        Line::new("record.batch floor: raw SQLite part", median(&floor_sql), us, None, Target::Info),
    );
    let (one, many, many_piped) = (median(&one), median(&many), median(&many_piped));
    print(
        lines,
        Line::new("record.batch 1 writer (pipelined)", one, us, Some(floor), Target::RatioAtMost(2.0)),
    );
    print(
        lines,
        Line::new("record.batch 16 writers (acked)", many, us, Some(floor), Target::RatioAtMost(2.0)),
    );
    print(lines, Line::new("record.batch 16 writers (pipelined)", many_piped, us, Some(floor), Target::Info));
    let names = ["1 writer (pipelined)", "16 writers (acked)", "16 writers (pipelined)"];
    for (name, cpu) in names.iter().zip(&cpu) {
        if !cpu.is_empty() {
            let line = format!("record.batch CPU, {name}");
            print(lines, Line::new(&line, median(cpu), us, None, Target::Info));
        }
    }
    for (name, commits) in ["1 writer", "16 acked", "16 pipelined"].iter().zip(&commits) {
        let per_commit: Vec<f64> = commits.iter().map(Commits::per_commit).collect();
        let line = format!("record.batch events/commit, {name}");
        print(lines, Line::new(&line, median(&per_commit), "ev", None, Target::Info));
        let in_store: Vec<f64> = commits.iter().map(Commits::us_per_event).collect();
        let line = format!("record.batch in-store commit, {name}");
        print(lines, Line::new(&line, median(&in_store), us, Some(floor), Target::Info));
    }
    at_scale(cfg, &data, lines);
    let burr = Some(BURR_STEP_US);
    print(lines, Line::new("record.batch 1 writer vs Burr 1.5 ms", one, us, burr, Target::TimesBelow(50.0)));
    print(
        lines,
        Line::new("record.batch 16 writers vs Burr 1.5 ms", many, us, burr, Target::TimesBelow(50.0)),
    );
}

/// Records `data` with one pipelined writer into a store that already holds [`AT_SCALE`]
/// other events, then as many new steps with 16 acked writers into the same store (holding
/// `data` too by then), and prints both (INFO).
fn at_scale(cfg: &Config, data: &[(Value, Value)], lines: &mut Vec<Line>) {
    let held = cfg.pick(AT_SCALE / 10, AT_SCALE);
    let store = cfg.store("record-at-scale", Durability::Batch);
    let began = std::time::Instant::now();
    // Seeds past the measured ones, so that nothing measured is stored already.
    let offset = data.len() as u64;
    drive::record_generated(store.store.clone(), held, |i| (request(offset + i), output(offset + i)));
    let filling = began.elapsed().as_secs_f64() * 1e6 / held as f64;
    note(&format!("record at scale: {held} events recorded first, pipelined, at {filling:.1} us/ev"));
    let per_event = |d: std::time::Duration| d.as_secs_f64() * 1e6 / data.len() as f64;
    let one = drive::record(store.store.clone(), data, 1, false);
    // New steps again: the same ones would find their blobs and cache rows stored.
    let others: Vec<(Value, Value)> =
        (0..data.len() as u64).map(|i| (request(offset + held + i), output(offset + held + i))).collect();
    let many = drive::record(store.store.clone(), &others, THREADS, true);
    let us = "us/ev";
    let slowest = many.latencies.iter().max().map_or(0.0, |d| d.as_secs_f64() * 1e3);
    for (name, recorded) in [("1 writer (pipelined)", one), ("16 writers (acked)", many)] {
        let line = format!("record.batch {name}, {}k held", held / 1000);
        print(lines, Line::new(&line, per_event(recorded.wall), us, None, Target::Info));
    }
    // A merge of the blobs' digest tables runs inside a commit: the slowest acknowledgment is
    // about the slowest merge (schema 12's took 100-236 ms at this size, growing with the store).
    let line = format!("record.batch 16 writers (acked), {}k held: slowest ack", held / 1000);
    print(lines, Line::new(&line, slowest, "ms", None, Target::Info));
    short_run(&store, offset + held + data.len() as u64, held, lines);
}

/// Steps of [`short_run`]: a few thousand, enough that its writer builds its filter of the
/// indexed digests (after 4,096 look-ups) partway through.
const SHORT_RUN: u64 = 5_000;

/// A short recording into the big store through a handle of its own, as the next process to
/// record there would: one agent, each step acknowledged. Its writer starts with no filter of
/// the indexed digests and builds one from all of them partway through, inside a commit; the
/// slowest acknowledgment shows what that costs at this size (INFO).
fn short_run(store: &BenchStore, first: u64, held: u64, lines: &mut Vec<Line>) {
    let dir = store.dir.path();
    let fresh = SqliteStore::open(&dir.join("retrace.db"), &dir.join("blobs"), Durability::Batch, 5_000)
        .expect("opening the big store again");
    let steps: Vec<(Value, Value)> = (first..first + SHORT_RUN).map(|i| (request(i), output(i))).collect();
    let recorded = drive::record(Arc::new(fresh), &steps, 1, true);
    let per_event = recorded.wall.as_secs_f64() * 1e6 / steps.len() as f64;
    let slowest = recorded.latencies.iter().max().map_or(0.0, |d| d.as_secs_f64() * 1e3);
    let name = format!("record.batch {SHORT_RUN} steps (1 writer, acked), new handle, {}k held", held / 1000);
    print(lines, Line::new(&name, per_event, "us/ev", None, Target::Info));
    print(lines, Line::new(&format!("{name}: slowest ack"), slowest, "ms", None, Target::Info));
}
