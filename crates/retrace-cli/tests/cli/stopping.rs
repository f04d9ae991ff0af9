//! Re-executing a run that is not finished, and stopping a replay: `replay` and `fork` of a run
//! still being recorded are refused before anything starts, and a replay the user stops with
//! SIGINT or SIGTERM (sent to its process group, as a terminal does) is `interrupted`, not
//! diverged.
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::*;

/// One agent taking two steps through the daemon's SDK route (plain HTTP, no SDK), printing a
/// line after each; between them it waits until the file `$GO` exists, when `GO` is set.
const WAITER: &str = r#"
import json, os, time, urllib.request
def step(n):
    url = f"{os.environ['RETRACE_URL']}/api/runs/{os.environ['RETRACE_RUN']}/agents/planner/steps"
    body = {"type": "clock", "name": "wall", "request": {}, "output": {"unix_ms": n}}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["output"]
print("first", step(1), flush=True)
go = os.environ.get("GO")
while go and not os.path.exists(go):
    time.sleep(0.02)
print("second", step(2), flush=True)
"#;

/// A folder holding the waiter, where the commands run.
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("waiter.py"), WAITER).unwrap();
    dir
}

/// `retrace ARGS` from `dir`, started in its own process group, standard output piped.
fn start(home: &Home, dir: &Path, args: &[&str], go: &Path) -> Child {
    use std::os::unix::process::CommandExt;
    home.command(args)
        .current_dir(dir)
        .env("GO", go)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap()
}

/// Waits until the program's first step is taken (its first line), and returns the reader.
fn first_step(child: &mut Child) -> BufReader<std::process::ChildStdout> {
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("first"), "the program's first line: {line:?}");
    out
}

fn record_in(home: &Home, dir: &Path) -> String {
    let recorded = Ran(home
        .command(&["record", "--json", "--", "python3", "waiter.py"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap());
    recorded.expect(0, &["second"], &[]);
    let last = recorded.stdout().lines().last().unwrap().to_owned();
    serde_json::from_str::<serde_json::Value>(&last).unwrap()["run"].as_str().unwrap().to_owned()
}

fn ran_in(home: &Home, dir: &Path, args: &[&str]) -> Ran {
    Ran(home.command(args).current_dir(dir).stdin(Stdio::null()).output().unwrap())
}

#[test]
fn a_run_still_being_recorded_is_not_replayed_forked_or_gated_until_it_has_finished() {
    let home = Home::new();
    let dir = project();
    let go = dir.path().join("go");
    let mut recorder = start(&home, dir.path(), &["record", "--", "python3", "waiter.py"], &go);
    let _out = first_step(&mut recorder);
    // The recorder is alive, between two steps, and holds the run's lease.
    let run = runs_of(&home).into_iter().map(|(id, _, _)| id).next().unwrap();

    let replay = ran_in(&home, dir.path(), &["replay", &run]);
    replay.expect(
        2,
        &[],
        &[
            &format!("error: run {run} is still being recorded (by process "),
            "; replay it once it has finished",
        ],
    );
    // Refused before the program starts: one sentence, once, and no divergence.
    assert_eq!(replay.stderr().matches("still being recorded").count(), 1, "{}", replay.stderr());
    assert!(!replay.stderr().contains("divergence"), "{}", replay.stderr());
    assert!(!replay.stdout().contains("first"), "the program was not started: {}", replay.stdout());
    ran_in(&home, dir.path(), &["fork", &run]).expect(2, &[], &["still being recorded", "fork it once"]);
    ran_in(&home, dir.path(), &["gate", &run]).expect(
        2,
        &["still being recorded"],
        &["could not be replayed"],
    );
    let runs = runs_of(&home);
    assert_eq!(runs.len(), 1, "no replay or fork run is left: {runs:?}");

    std::fs::write(&go, "").unwrap();
    let recorded = recorder.wait_with_output().unwrap();
    assert_eq!(recorded.status.code(), Some(0), "{}", String::from_utf8_lossy(&recorded.stderr));
    // Finished, it replays.
    ran_in(&home, dir.path(), &["replay", &run]).expect(0, &["second"], &["ok: every step matched"]);
}

/// Replays `run` with the program stuck between its steps, sends `signal` to the replay's
/// process group once the first step is taken, and returns how `retrace replay` ended.
fn stop_replay(home: &Home, dir: &Path, run: &str, signal: Signal) -> Ran {
    let never = dir.join("never");
    let mut replay = start(home, dir, &["replay", run], &never);
    let out = first_step(&mut replay);
    killpg(Pid::from_raw(replay.id() as i32), signal).unwrap();
    let ended = replay.wait_with_output().unwrap();
    drop(out);
    Ran(ended)
}

fn replay_statuses(home: &Home) -> Vec<String> {
    runs_of(home).into_iter().filter(|(_, mode, _)| mode == "replay").map(|(_, _, status)| status).collect()
}

#[test]
fn a_replay_stopped_by_sigint_or_sigterm_is_interrupted_not_diverged() {
    let home = Home::new();
    let dir = project();
    let run = record_in(&home, dir.path());

    let stopped = stop_replay(&home, dir.path(), &run, Signal::SIGINT);
    stopped.expect(130, &[], &["interrupted (SIGINT)", "stored as interrupted"]);
    assert!(!stopped.stderr().contains("divergence"), "{}", stopped.stderr());
    assert_eq!(replay_statuses(&home), ["interrupted"]);

    stop_replay(&home, dir.path(), &run, Signal::SIGTERM).expect(143, &[], &["interrupted (SIGTERM)"]);
    assert_eq!(replay_statuses(&home), ["interrupted", "interrupted"]);
}

/// A recording the user stops (Ctrl-C to its process group) ends where the program stopped:
/// stored `interrupted`, saying so, not `failed` (QA23 S6), with the child's status.
#[test]
fn a_recording_stopped_by_sigint_is_interrupted() {
    let home = Home::new();
    let dir = project();
    let never = dir.path().join("never");
    let mut recorder = start(&home, dir.path(), &["record", "--", "python3", "waiter.py"], &never);
    let out = first_step(&mut recorder);
    killpg(Pid::from_raw(recorder.id() as i32), Signal::SIGINT).unwrap();
    let ended = Ran(recorder.wait_with_output().unwrap());
    drop(out);
    ended.expect(130, &[], &["stopped by SIGINT before the program ended"]);
    let runs = runs_of(&home);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].2, "interrupted", "{runs:?}");
}

#[test]
fn a_program_that_exits_130_by_itself_is_judged_on_its_status() {
    let home = Home::new();
    let recorded = home.run(&["record", "--json", "--", "sh", "-c", "exit 130"]);
    recorded.expect(130, &[], &[]);
    let run = runs_of(&home).into_iter().map(|(id, _, _)| id).next().unwrap();
    // No signal reached retrace: the same status matches, another one diverges.
    home.run(&["replay", &run]).expect(0, &[], &["ok: every step matched, exit status 130"]);
    home.run(&["replay", &run, "--", "true"]).expect(1, &[], &["recorded exit status 130, replay exited 0"]);
    let record_0 = home.run(&["record", "--json", "--", "true"]);
    record_0.expect(0, &[], &[]);
    let run_0 = runs_of(&home).into_iter().find(|(id, mode, _)| mode == "record" && *id != run).unwrap().0;
    home.run(&["replay", &run_0, "--", "sh", "-c", "exit 130"]).expect(
        1,
        &[],
        &["recorded exit status 0, replay exited 130"],
    );
    assert_eq!(replay_statuses(&home), ["ok", "diverged", "diverged"]);
}

#[test]
fn a_replay_whose_working_directory_is_gone_says_so_and_leaves_no_run() {
    let home = Home::new();
    let gone = tempfile::tempdir().unwrap();
    let path: PathBuf = gone.path().to_path_buf();
    let recorded = Ran(home.command(&["record", "--", "true"]).current_dir(&path).output().unwrap());
    recorded.expect(0, &[], &[]);
    let run = runs_of(&home)[0].0.clone();
    drop(gone);
    assert!(!path.exists());
    for verb in ["replay", "fork"] {
        home.run(&[verb, &run]).expect(
            2,
            &[],
            &[
                &format!("error: the working directory {} does not exist", path.display()),
                "give the program to run after `--`",
            ],
        );
    }
    let ran = home.run(&["replay", &run]);
    assert!(!ran.stderr().contains("program not found"), "{}", ran.stderr());
    assert_eq!(runs_of(&home).len(), 1, "no replay or fork run is left: {:?}", runs_of(&home));
    // Another command, run here, replays it.
    home.run(&["replay", &run, "--", "true"]).expect(0, &[], &["ok"]);
}
