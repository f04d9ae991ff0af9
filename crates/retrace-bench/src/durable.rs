//! Recording with `event` durability (fsync before each acknowledgment): one writer's
//! per-event latency against the raw fsync latency of the same disk, and the group-commit
//! rate of 16 writers against one writer's. The same 16 writers with no sync at all bound
//! what any group commit can reach: their rate over one `event` writer's is the ratio's
//! ceiling on this machine (printed as INFO beside the target line), and the process's CPU time
//! per event in both 16-writer runs says how close to the two cores' limit each one ran. The
//! 16 `event` writers' commits are counted too: events per commit (how much group commit
//! gathered) and the time of each inside the store (its SQLite commit and the ack log's flush,
//! which overlap), the serial part that bounds the rate.
//!
//! The 10x target asks 16 writers for ten times one `event` writer's rate. The same-run floor
//! of a step's work ([`record_floor`]: canonicalise, sha256, raw batched insert, on one thread)
//! says how many CPUs that rate needs before any sync, hand-off or group commit: ten times
//! one writer's rate times the floor's time per event. Printed beside the CPUs this process may
//! use, it shows whether the target is reachable on this machine at all.
use std::sync::Arc;

use retrace_store::Durability;

use crate::counting::{counting, Commits};
use crate::drive;
use crate::env::{note, Config};
use crate::floor::{commit_latencies, fsync_floor, raw_db, raw_db_with, record_floor};
use crate::record::{steps, THREADS};
use crate::report::{median, median_us, print, Line, Target};

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let single = cfg.pick(300, 1_000);
    let each = cfg.pick(60, 200);
    note(&format!(
        "record (event durability): 1 writer x {single} events, {THREADS} writers x {each} events, {} repeats",
        cfg.repeats
    ));
    let data = steps(single.max(THREADS * each));
    let warm = cfg.store("warm", Durability::Event);
    drive::record(warm.store.clone(), &data[..50], 1, true);
    drop(warm);

    let (mut fsync, mut raw, mut latency, mut rate_one, mut rate_many, mut unsynced) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut unsynced_many = vec![];
    let (mut cpu_many, mut cpu_unsynced) = (vec![], vec![]);
    let per_event = |rec: &drive::Recorded, n: usize| rec.cpu.map(|c| c.as_secs_f64() * 1e6 / n as f64);
    let mut tails = vec![];
    let mut commits_many: Vec<Commits> = vec![];
    let mut floor = vec![];
    for _ in 0..cfg.repeats {
        let floor_dir = cfg.temp_dir("floor");
        let (wall, _) = record_floor(&mut raw_db(floor_dir.path()), &data[..THREADS * each]);
        floor.push(wall.as_secs_f64() * 1e6 / (THREADS * each) as f64);
        drop(floor_dir);

        let dir = cfg.temp_dir("fsync");
        fsync.push(median_us(&fsync_floor(dir.path(), single)));
        let mut conn = raw_db_with(dir.path(), "FULL", 8192);
        raw.push(median_us(&commit_latencies(&mut conn, &data[..single])));
        drop(conn);

        let store = cfg.store("event1", Durability::Event);
        let rec = drive::record(store.store.clone(), &data[..single], 1, true);
        latency.push(median_us(&rec.latencies));
        tails.push(percentiles(&rec.latencies));
        rate_one.push(single as f64 / rec.wall.as_secs_f64());
        drop(store);

        // The same acknowledged steps with no sync at all: what the latency holds besides it.
        let store = cfg.store("os1", Durability::Os);
        unsynced.push(median_us(&drive::record(store.store.clone(), &data[..single], 1, true).latencies));
        drop(store);

        let store = cfg.store("event16", Durability::Event);
        let total = THREADS * each;
        let counted = Arc::new(counting(store.store.clone()));
        let rec = drive::record(counted.clone(), &data[..total], THREADS, true);
        rate_many.push(total as f64 / rec.wall.as_secs_f64());
        cpu_many.extend(per_event(&rec, total));
        commits_many.push(counted.hooks().counts());
        drop(store);

        // The same 16 acknowledged writers with no sync: the most group commit can give back.
        let store = cfg.store("os16", Durability::Os);
        let rec = drive::record(store.store.clone(), &data[..total], THREADS, true);
        unsynced_many.push(total as f64 / rec.wall.as_secs_f64());
        cpu_unsynced.extend(per_event(&rec, total));
    }
    let fsync = median(&fsync);
    let one = median(&rate_one);
    print(lines, Line::new("record.event raw append+fdatasync p50", fsync, "us", None, Target::Info));
    let raw = median(&raw);
    print(
        lines,
        Line::new("record.event raw SQLite FULL 1 step/tx p50", raw, "us", Some(fsync), Target::Info),
    );
    if let Some(tail) = tails.get(tails.len() / 2) {
        note(&format!("1 writer latency p50/p90/p99/mean (a middle repeat): {tail}"));
    }
    print(
        lines,
        Line::new(
            "record.event 1 writer latency p50",
            median(&latency),
            "us",
            Some(fsync),
            Target::RatioAtMost(1.5),
        ),
    );
    print(
        lines,
        Line::new("record.os (no sync) 1 writer latency p50", median(&unsynced), "us", None, Target::Info),
    );
    print(lines, Line::new("record.event 1 writer rate", one, "ev/s", None, Target::Info));
    print(
        lines,
        Line::new(
            "record.event 16 writers rate",
            median(&rate_many),
            "ev/s",
            Some(one),
            Target::RatioAtLeast(10.0),
        ),
    );
    print(
        lines,
        Line::new(
            "record.os (no sync) 16 writers rate: ceiling",
            median(&unsynced_many),
            "ev/s",
            Some(one),
            Target::Info,
        ),
    );
    // What ten times one writer's rate needs in CPUs, by the floor's work alone.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let needed = 10.0 * one * median(&floor) * 1e-6;
    print(
        lines,
        Line::new(
            "record.event 16 writers at 10x: CPUs the floor needs",
            needed,
            "CPUs",
            Some(cpus),
            Target::Info,
        ),
    );
    let per_commit: Vec<f64> = commits_many.iter().map(Commits::per_commit).collect();
    let commit_us: Vec<f64> = commits_many.iter().map(|c| c.in_store_us / c.commits.max(1) as f64).collect();
    print(
        lines,
        Line::new("record.event 16 writers events/commit", median(&per_commit), "ev", None, Target::Info),
    );
    print(
        lines,
        Line::new(
            "record.event 16 writers in-store commit",
            median(&commit_us),
            "us/commit",
            None,
            Target::Info,
        ),
    );
    // CPU time of the whole process (every thread's, both cores) per event: the 16 writers'
    // rate can't exceed the CPUs over this, whatever the disk does.
    let cpu_lines =
        [("record.event 16 writers CPU", &cpu_many), ("record.os (no sync) 16 writers CPU", &cpu_unsynced)];
    for (name, cpu) in cpu_lines {
        if !cpu.is_empty() {
            print(lines, Line::new(name, median(cpu), "us/ev", None, Target::Info));
        }
    }
}

/// `p50/p90/p99/mean` of `latencies`, in µs.
fn percentiles(latencies: &[std::time::Duration]) -> String {
    let mut us: Vec<f64> = latencies.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us.get(((us.len() as f64 * q) as usize).min(us.len().saturating_sub(1))).copied();
    let mean = us.iter().sum::<f64>() / us.len().max(1) as f64;
    let show = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
    format!("{}/{}/{}/{mean:.0} us", show(at(0.5)), show(at(0.9)), show(at(0.99)))
}
