//! A Rust program under the real `retrace record`: `Session::from_env()` is a client of the
//! embedded daemon (`RETRACE_URL`), so its SDK steps and its model call through the proxy are one
//! run with one sequencer (before, the program held the run's lease and the proxy answered 409).
//! The run then replays with the simulator stopped, verifies, and shows both kinds of step.
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use retrace_core::EventType;
use retrace_store::{open_store, StoreConfig};

const BIN: &str = env!("CARGO_BIN_EXE_retrace");

/// `examples/remote_agents.rs`, built with the profile of this test's `retrace`.
fn example() -> PathBuf {
    let profile_dir = PathBuf::from(BIN).parent().unwrap().to_owned();
    let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    build.args(["build", "--quiet", "-p", "retrace-cli", "--example", "remote_agents"]);
    if profile_dir.ends_with("release") {
        build.arg("--release");
    }
    assert!(build.status().unwrap().success(), "building the remote_agents example");
    profile_dir.join("examples").join("remote_agents")
}

/// `retrace simulate` on a free loopback port, stopped on drop.
struct Simulator(Child);

impl Simulator {
    fn start() -> (Simulator, String) {
        let mut child = Command::new(BIN)
            .args(["simulate", "--addr", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        (Simulator(child), format!("{}/v1", line.trim()))
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn retrace(home: &std::path::Path, args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command.args(args).env("RETRACE_HOME", home).env("OPENAI_API_KEY", "sk-test-not-a-key");
    for var in
        ["RETRACE_STORE", "RETRACE_BLOBS", "RETRACE_URL", "RETRACE_RUN", "RETRACE_MODE", "OPENAI_BASE_URL"]
    {
        command.env_remove(var);
    }
    let out = command.stdin(Stdio::null()).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "retrace {args:?}\nstdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

#[test]
fn a_rust_program_and_its_proxied_model_call_record_as_one_run_and_replay() {
    let program = example();
    let home = tempfile::tempdir().unwrap();
    let (simulator, upstream) = Simulator::start();
    let program = program.to_str().unwrap();
    let recorded = retrace(home.path(), &["record", "--json", "--upstream-openai", &upstream, "--", program]);
    drop(simulator);
    let stdout = String::from_utf8_lossy(&recorded.stdout).into_owned();
    assert!(stdout.contains("reviewer: approve (["), "{stdout}");
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let run = last["run"].as_str().unwrap().to_owned();

    let store = open_store(&StoreConfig::in_home(home.path())).unwrap();
    let events = store.events(&run, 1, 100).unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "dense seqs, one sequencer");
    let model = events.iter().find(|e| e.kind == EventType::ModelCall).expect("the proxied model call");
    assert_eq!(model.agent_id, "planner");
    // Each agent was declared with its role (`with_role`): the daemon records it on every event
    // of the agent, the model call through the proxy included.
    for e in &events {
        assert_eq!(e.role.as_deref(), Some(e.agent_id.as_str()), "seq {} ({})", e.seq, e.label());
    }
    for kind in
        [EventType::ToolCall, EventType::Intent, EventType::Clock, EventType::Send, EventType::Deliver]
    {
        assert!(
            events.iter().any(|e| e.kind == kind),
            "{kind} in {:?}",
            events.iter().map(|e| e.kind).collect::<Vec<_>>()
        );
    }
    assert_eq!(store.run(&run).unwrap().status.to_string(), "ok");
    drop(store);

    // The simulator is gone: the replay makes no live call.
    retrace(home.path(), &["replay", &run]);
    retrace(home.path(), &["verify", &run]);
    let shown = retrace(home.path(), &["show", &run]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    for needle in ["planner", "reviewer", "model_call", "tool_call"] {
        assert!(shown.contains(needle), "show lacks {needle:?}:\n{shown}");
    }
}
