//! Replay through the Session API (keys computed, outputs read from the store and verified by
//! digest, then checked against what was recorded): events/s and peak RSS on a long run, beside
//! the store-only serving rate (events + output blobs, no Session).
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use retrace_core::canonical::canonical_value;
use retrace_runtime::{Outcome, Session, SessionOptions};
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Durability, Store};
use serde_json::Value;

use crate::drive::{self, agent_name, spec, TOOL};
use crate::env::{note, reset_peak_rss, status_kb, Config};
use crate::payload::{output, request};
use crate::report::{median, print, Line, Target};

/// Steps generated (untimed) and then replayed (timed) at a time.
const CHUNK: u64 = 2_000;

/// Every this many replayed outputs is compared with the recorded one (outside the clock; the
/// store verifies every blob's digest on read anyway).
const VERIFY_EVERY: usize = 16;

/// What one timed replay measured.
#[derive(Debug)]
struct Replayed {
    /// Session open (log load) + steps + finish, seconds.
    total: f64,
    /// Of which `Session::replay` (loading the recorded log), seconds.
    open: f64,
    /// VmHWM of the replaying process at the end, kB.
    peak_kb: u64,
    /// Its VmRSS just before the replay started, kB.
    start_kb: u64,
}

/// The hidden subcommand a replay runs in, so its peak RSS is the replay's alone.
pub const CHILD: &str = "__replay-child";

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let n: u64 = cfg.pick(100_000, 1_000_000);
    note(&format!("replay: recording {n} events of 1 KB request + 1 KB output (setup, untimed)"));
    let store = cfg.store("replay", Durability::Batch);
    let began = Instant::now();
    let run_id = drive::record_generated(store.store.clone(), n, |i| (request(i), output(i)));
    store.sqlite.checkpoint().expect("checkpointing the recorded run");
    note(&format!("recorded in {:.1} s; replaying {} times", began.elapsed().as_secs_f64(), cfg.repeats));

    let (mut served, mut rates, mut opens, mut peaks, mut starts) = (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..cfg.repeats {
        served.push(n as f64 / store_only(store.store.as_ref(), &run_id, n).as_secs_f64());
        let r = in_child(store.dir.path(), &run_id, n);
        rates.push(n as f64 / r.total);
        opens.push(r.open * 1e6 / n as f64);
        peaks.push(r.peak_kb as f64 / 1024.0);
        starts.push(r.start_kb as f64 / 1024.0);
    }
    let served = median(&served);
    let label = if cfg.quick { "100k" } else { "1M" };
    let rate = median(&rates);
    print(
        lines,
        Line::new(
            &format!("replay.session {label} events"),
            rate,
            "ev/s",
            Some(served),
            Target::AtLeast(100_000.0),
        ),
    );
    print(lines, Line::new("replay.session: log load share", median(&opens), "us/ev", None, Target::Info));
    print(lines, Line::new("replay.store-only (events+blobs)", served, "ev/s", None, Target::Info));
    let peak = median(&peaks);
    note(&format!("replay process RSS before the replay: {:.1} MB", median(&starts)));
    print(
        lines,
        Line::new(&format!("replay.peak RSS (VmHWM) {label} events"), peak, "MB", None, Target::Info),
    );
}

/// Replays in a child process (this binary's [`CHILD`] subcommand) and reads its one result line.
fn in_child(dir: &Path, run_id: &str, n: u64) -> Replayed {
    let exe = std::env::current_exe().expect("locating the bench binary");
    let out = Command::new(exe)
        .args([CHILD, &dir.display().to_string(), run_id, &n.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .expect("starting the replay process");
    let text = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = text.split_whitespace().collect();
    match (out.status.success(), fields.as_slice()) {
        (true, [total, open, peak, start]) => Replayed {
            total: total.parse().expect("total"),
            open: open.parse().expect("open"),
            peak_kb: peak.parse().expect("peak"),
            start_kb: start.parse().expect("start"),
        },
        _ => panic!("the replay process failed ({}): {text}", out.status),
    }
}

/// The child: `__replay-child <store folder> <run id> <events>`; prints
/// `<total s> <open s> <VmHWM kB> <VmRSS at start kB>`.
pub fn child(args: &[String]) -> ExitCode {
    let [dir, run_id, n] = args else {
        eprintln!("usage: {CHILD} <store folder> <run id> <events>");
        return ExitCode::from(2);
    };
    let dir = Path::new(dir);
    let store = SqliteStore::open(&dir.join("retrace.db"), &dir.join("blobs"), Durability::Batch, 5_000)
        .expect("opening the recorded store");
    let r = session_replay(Arc::new(store), run_id, n.parse().expect("an event count"));
    println!("{} {} {} {}", r.total, r.open, r.peak_kb, r.start_kb);
    ExitCode::SUCCESS
}

/// Reads every event of the run, page by page, and its output blob (digest-verified by the store).
fn store_only(store: &dyn Store, run_id: &str, n: u64) -> Duration {
    let began = Instant::now();
    let (mut from, mut count, mut bytes) = (1, 0u64, 0usize);
    loop {
        let page = store.events(run_id, from, 4096).expect("reading events");
        let Some(last) = page.last() else { break };
        from = last.seq + 1;
        for event in &page {
            let digest = event.output_ref.expect("every step has an output");
            bytes += store.get_blob(&digest).expect("reading an output").len();
            count += 1;
        }
    }
    assert_eq!(count, n, "the store served every event");
    assert!(bytes > 0);
    began.elapsed()
}

/// Replays the run through a new replay session; the program's requests are regenerated a chunk
/// at a time outside the clock, and every output it gets back is compared with the recorded one
/// (outside the clock too).
fn session_replay(store: Arc<dyn Store>, run_id: &str, n: u64) -> Replayed {
    let reset = reset_peak_rss();
    let start_kb = status_kb("VmRSS").unwrap_or(0);
    let began = Instant::now();
    let session = Session::replay(store, run_id, SessionOptions::default()).expect("opening a replay");
    let open = began.elapsed();
    let mut total = open;
    let agent = session.agent(&agent_name(0));
    let mut next = 0;
    let mut got = Vec::with_capacity(CHUNK as usize);
    while next < n {
        let end = (next + CHUNK).min(n);
        let requests: Vec<Value> = (next..end).map(request).collect();
        let clock = Instant::now();
        for req in &requests {
            let value: Value = agent
                .tool(TOOL, req, spec(), || -> Result<Value, String> { Err("replay ran a live call".into()) })
                .expect("replaying a step");
            got.push(value);
        }
        total += clock.elapsed();
        for (i, value) in (next..end).zip(got.drain(..)).step_by(VERIFY_EVERY) {
            // The program gets the decoded canonical form (1.0 comes back as 1), in record too.
            let same = canonical_value(&value).ok() == canonical_value(&output(i)).ok();
            assert!(same, "replayed output {i} differs from the recorded one");
        }
        next = end;
    }
    // Of the peak, file pages (SQLite's read connections map the database) and the process's own.
    note(&format!(
        "replay process at the end: RssAnon {:.1} MB, RssFile {:.1} MB (mapped database pages)",
        status_kb("RssAnon").unwrap_or(0) as f64 / 1024.0,
        status_kb("RssFile").unwrap_or(0) as f64 / 1024.0
    ));
    let clock = Instant::now();
    session.finish(Outcome::default()).expect("the replay matched");
    total += clock.elapsed();
    let peak_kb = status_kb("VmHWM").unwrap_or(0);
    if !reset {
        note("could not reset VmHWM: the peak RSS includes the recording");
    }
    Replayed { total: total.as_secs_f64(), open: open.as_secs_f64(), peak_kb, start_kb }
}
