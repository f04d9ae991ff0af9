//! `retrace import` killed with SIGKILL at random moments: whatever it left, the store verifies
//! and nothing in it looks like the whole run unless it is. The run is absent, or marked as an
//! unfinished import (`retrace runs` says so), or complete; importing the file again gives the
//! whole run, which exports to the file's bytes.
#[path = "../../retrace-store/tests/trace_fixture/mod.rs"]
mod trace_fixture;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use retrace_core::run::RunMode;
use retrace_core::EventType;
use retrace_store::{open_store, BlobHint, StoreConfig};
use trace_fixture::Builder;

const RUN: &str = "01k111ed1mp0r700000000000";
const EVENTS: u64 = 24_000;
const KILLS: usize = 12;

fn retrace(home: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_retrace"));
    command.args(args).env("RETRACE_HOME", home).stdin(Stdio::null());
    for var in ["RETRACE_STORE", "RETRACE_BLOBS", "RETRACE_URL", "RETRACE_RUN"] {
        command.env_remove(var);
    }
    command
}

fn ran(home: &Path, args: &[&str]) -> Output {
    retrace(home, args).output().unwrap()
}

/// A run of [`EVENTS`] small tool calls (several import chunks of 4,096), exported to `file`.
fn exported(dir: &Path) -> std::path::PathBuf {
    let mut b = Builder::new(RUN);
    for i in 0..EVENTS {
        let request = format!(r#"{{"q":"select {i}"}}"#).into_bytes();
        let output = format!(r#"{{"rows":[{i},{}]}}"#, i * 7).into_bytes();
        b.push(
            "agent",
            EventType::ToolCall,
            Some("sql"),
            Some((request, BlobHint::Raw)),
            Some(output),
            |_| {},
        );
    }
    let home = dir.join("source");
    let store = open_store(&StoreConfig::in_home(&home)).unwrap();
    b.finish(RunMode::Record).commit(&*store);
    drop(store);
    let file = dir.join("run.jsonl");
    let out = ran(&home, &["export", RUN, "-o", file.to_str().unwrap()]);
    assert!(out.status.success(), "export: {}", String::from_utf8_lossy(&out.stderr));
    file
}

#[test]
fn an_import_killed_at_any_moment_leaves_no_run_that_looks_whole_and_importing_again_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = exported(dir.path());
    let file = file.to_str().unwrap();
    // How long a whole import takes here: the kills are spread over it.
    let probe = dir.path().join("probe");
    let began = Instant::now();
    assert!(ran(&probe, &["import", file]).status.success());
    let whole = began.elapsed();
    let mut left = [0usize; 3];
    let mut landed: Vec<(Duration, usize)> = Vec::new();
    for kill in 0..KILLS {
        // Spread over the last 80% of it: the events are stored at its end.
        let at = whole.mul_f64(0.2 + 0.8 * (kill as f64 + 0.5) / KILLS as f64);
        let state = kill_import_at(dir.path(), file, kill, at);
        left[state] += 1;
        landed.push((at, state));
    }
    // On a loaded machine the probe's time may not be the kills': when none landed while the
    // events were stored, narrow in on that window between the latest kill that left no run and
    // the earliest that left the whole run.
    for kill in KILLS..2 * KILLS {
        if left[1] > 0 {
            break;
        }
        let before = landed.iter().filter(|(_, s)| *s == 0).map(|(at, _)| *at).max().unwrap_or_default();
        let after = landed.iter().filter(|(_, s)| *s == 2).map(|(at, _)| *at).min().unwrap_or(whole * 2);
        let at = (before + after) / 2;
        let state = kill_import_at(dir.path(), file, kill, at);
        left[state] += 1;
        landed.push((at, state));
    }
    eprintln!(
        "{} kills over a {:?} import: no run {}, an unfinished import {}, the whole run {}",
        landed.len(),
        whole,
        left[0],
        left[1],
        left[2]
    );
    assert!(left[1] > 0 || whole < Duration::from_millis(50), "no kill landed while the events were stored");
}

/// Imports `file` into a new home under `dir`, kills the import `at` after it started, checks
/// what it left and that importing again finishes it; returns what it left: no run (0), an
/// unfinished import (1) or the whole run (2).
fn kill_import_at(dir: &Path, file: &str, kill: usize, at: Duration) -> usize {
    let home = dir.join(format!("home-{kill}"));
    let mut child =
        retrace(&home, &["import", file]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    std::thread::sleep(at);
    let _ = child.kill(); // SIGKILL; the import may have finished already
    child.wait().unwrap();

    let runs = ran(&home, &["runs", "--json"]);
    assert!(runs.status.success(), "kill {kill}: {}", String::from_utf8_lossy(&runs.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&runs.stdout).unwrap_or(serde_json::json!([]));
    let run = listed.as_array().and_then(|l| l.iter().find(|r| r["id"] == RUN)).cloned();
    let state = match &run {
        None => 0,
        Some(r) if r["labels"].get("retrace.unfinished_import").is_some() => 1,
        Some(r) => {
            assert_eq!(r["status"], "ok", "kill {kill}: a run without the mark is the whole run: {r}");
            assert_eq!(r["events"], EVENTS, "kill {kill}: {r}");
            2
        }
    };
    // What it left verifies; an unfinished import is the one problem verify names (exit 1).
    let verified = ran(&home, &["verify", "--all"]);
    let said =
        format!("{}{}", String::from_utf8_lossy(&verified.stdout), String::from_utf8_lossy(&verified.stderr));
    match state {
        1 => {
            assert_eq!(verified.status.code(), Some(1), "kill {kill} at {at:?}: verify: {said}");
            assert!(
                said.contains("an unfinished import") && said.contains("found 1 problem"),
                "kill {kill}: {said}"
            );
        }
        _ => assert!(verified.status.success(), "kill {kill} at {at:?}: verify: {said}"),
    }

    let again = ran(&home, &["import", file]);
    assert!(again.status.success(), "kill {kill}: import again: {}", String::from_utf8_lossy(&again.stderr));
    let copy = home.join("again.jsonl");
    let out = ran(&home, &["export", RUN, "-o", copy.to_str().unwrap()]);
    assert!(out.status.success(), "kill {kill}: export: {}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(file).unwrap(), "kill {kill}: the same bytes");
    let _ = std::fs::remove_dir_all(&home);
    state
}
