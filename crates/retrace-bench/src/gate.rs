//! `retrace gate` (issue 8): 100 traces of 1,000 steps each, replayed by the real `retrace`
//! binary. Measures the gate's own overhead per trace beyond the replayed program's runtime
//! (import into a temporary store, the embedded daemon, the outcome, cleanup; target ≤ 50 ms)
//! and the wall time of `--jobs 2` against `--jobs 1` (target ≥ 1.4× on two cores).
//!
//! The replayed program is this binary's hidden `__gate-program N`: a `Session::from_env()`
//! program taking N tool steps. It is recorded once with `retrace record` and exported; the
//! gate gets 100 copies of that file. `retrace` is `$RETRACE_BIN`, else the `retrace` beside
//! this binary (`cargo build --release -p retrace-cli` first).
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use retrace_runtime::{Outcome, Session};
use serde_json::{json, Value};

use crate::drive::{spec, TOOL};
use crate::env::{note, Config};
use crate::report::{median, print, Line, Target};

/// The hidden subcommand the gate replays.
pub const PROGRAM: &str = "__gate-program";

/// Steps per trace.
const STEPS: u64 = 1_000;

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let Some(retrace) = retrace_bin() else {
        note("gate: no retrace binary beside this one and no RETRACE_BIN; run `cargo build --release -p retrace-cli`");
        return;
    };
    let traces: usize = cfg.pick(20, 100);
    let dir = cfg.temp_dir("gate");
    let file = record_trace(&retrace, dir.path());
    let folder = dir.path().join("traces");
    std::fs::create_dir(&folder).expect("creating the traces folder");
    for i in 0..traces {
        std::fs::copy(&file, folder.join(format!("trace-{i:03}.jsonl"))).expect("copying a trace");
    }
    note(&format!(
        "gate: {traces} traces of {STEPS} steps; {} gates at --jobs 1 and at --jobs 2",
        cfg.repeats
    ));
    let (mut overheads, mut wall_overheads, mut walls1, mut walls2) = (vec![], vec![], vec![], vec![]);
    for _ in 0..cfg.repeats {
        let (wall, report) = gate(&retrace, dir.path(), &folder, 1);
        let per_trace: Vec<f64> = report.iter().map(|(total, program)| (total - program) * 1e3).collect();
        overheads.push(median(&per_trace));
        let programs: f64 = report.iter().map(|(_, program)| program).sum();
        wall_overheads.push((wall - programs) * 1e3 / traces as f64);
        walls1.push(wall);
        walls2.push(gate(&retrace, dir.path(), &folder, 2).0);
    }
    let label = format!("{traces}x{STEPS}");
    print(
        lines,
        Line::new(
            &format!("gate.overhead/trace {label} (jobs 1)"),
            median(&overheads),
            "ms",
            None,
            Target::AtMost(50.0),
        ),
    );
    print(
        lines,
        Line::new(
            "gate.overhead/trace from wall (jobs 1)",
            median(&wall_overheads),
            "ms",
            None,
            Target::Info,
        ),
    );
    let (w1, w2) = (median(&walls1), median(&walls2));
    print(lines, Line::new(&format!("gate.wall {label} --jobs 1"), w1, "s", None, Target::Info));
    print(
        lines,
        Line::new(&format!("gate.wall {label} --jobs 2 vs 1"), w1, "s", Some(w2), Target::RatioAtLeast(1.4)),
    );
}

/// The `retrace` binary to drive.
fn retrace_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("RETRACE_BIN") {
        return Some(PathBuf::from(bin));
    }
    let beside = std::env::current_exe().ok()?.with_file_name("retrace");
    beside.is_file().then_some(beside)
}

/// Records one run of [`PROGRAM`] with `retrace record` and exports it; returns the file.
fn record_trace(retrace: &Path, dir: &Path) -> PathBuf {
    let home = dir.join("record-home");
    let exe = std::env::current_exe().expect("locating the bench binary");
    let recorded = Command::new(retrace)
        .args(["record", "--json", "--"])
        .arg(&exe)
        .args([PROGRAM, &STEPS.to_string()])
        .current_dir(dir)
        .env("RETRACE_HOME", &home)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("running retrace record");
    assert!(recorded.status.success(), "retrace record failed: {recorded:?}");
    // `record --json`: the run, as the last line of standard output.
    let last = String::from_utf8_lossy(&recorded.stdout).lines().last().unwrap_or_default().to_owned();
    let run: serde_json::Value = serde_json::from_str(&last).expect("record --json ends with the run");
    let run = run["run"].as_str().expect("the run's id").to_owned();
    let file = dir.join("recorded.jsonl");
    let exported = Command::new(retrace)
        .args(["export", &run, "-o"])
        .arg(&file)
        .env("RETRACE_HOME", &home)
        .stderr(Stdio::null())
        .status()
        .expect("running retrace export");
    assert!(exported.success(), "retrace export failed");
    file
}

/// One `retrace gate --json` over `folder`: its wall time (s) and each trace's (seconds,
/// program seconds).
fn gate(retrace: &Path, dir: &Path, folder: &Path, jobs: usize) -> (f64, Vec<(f64, f64)>) {
    let began = Instant::now();
    let out = Command::new(retrace)
        .args(["gate", "--json", "--jobs", &jobs.to_string()])
        .arg(folder)
        .current_dir(dir)
        .env("RETRACE_HOME", dir.join("gate-home"))
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("running retrace gate");
    let wall = began.elapsed().as_secs_f64();
    assert!(out.status.success(), "retrace gate failed: {}", String::from_utf8_lossy(&out.stdout));
    let report: Value = serde_json::from_slice(&out.stdout).expect("gate --json prints JSON");
    let traces = report["traces"].as_array().expect("a traces array");
    let times = traces
        .iter()
        .map(|t| (t["seconds"].as_f64().unwrap_or(0.0), t["program_seconds"].as_f64().unwrap_or(0.0)))
        .collect();
    (wall, times)
}

/// The replayed program: `N` tool steps of one agent through `Session::from_env()`.
pub fn program(args: &[String]) -> ExitCode {
    let n: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(STEPS);
    let session = Session::from_env().expect("joining the session named by the environment");
    let agent = session.agent("worker");
    for i in 0..n {
        let request = json!({"q": format!("query {i}"), "page": i % 7});
        let _: Value = agent
            .tool(TOOL, &request, spec(), move || {
                Ok::<_, String>(json!({"hits": i * 3, "title": format!("result {i}")}))
            })
            .expect("a step");
    }
    session.finish(Outcome { exit_status: Some(0) }).expect("finishing the session");
    ExitCode::SUCCESS
}
