//! A program Retrace launched does not outlive Retrace: `kill -9` of `retrace record` ends it
//! (its recorder is gone, so every step it took would fail closed anyway).
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether process `pid` still runs (a zombie waiting to be reaped does not).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            !matches!(stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next()), Some("Z"))
        }
        Err(_) => false,
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[test]
fn killing_retrace_record_ends_the_program_it_launched() {
    let home = tempfile::tempdir().unwrap();
    let pid_file = home.path().join("program.pid");
    let script = format!("echo $$ > {}; exec sleep 120", pid_file.display());
    let mut retrace = Command::new(env!("CARGO_BIN_EXE_retrace"))
        .args(["record", "--", "sh", "-c", &script])
        .env("RETRACE_HOME", home.path())
        .env_remove("RETRACE_STORE")
        .env_remove("RETRACE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the program to start", || read_pid(&pid_file).is_some());
    let program = read_pid(&pid_file).unwrap();
    assert!(alive(program));

    retrace.kill().unwrap(); // SIGKILL: no handler runs, nothing is forwarded
    retrace.wait().unwrap();
    wait_for("the orphaned program to end", || !alive(program));
}
