//! The real `retrace` binary against a temporary RETRACE_HOME: runs, show, verify, export, import.
#[path = "../../retrace-store/tests/trace_fixture/mod.rs"]
mod trace_fixture;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use retrace_store::{open_store, StoreConfig};
use trace_fixture::{conversation, Builder, Fixture};

/// A store folder and the binary pointed at it.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home { dir: tempfile::tempdir().unwrap() }
    }

    /// A home holding `fixture`, committed through the store API.
    fn with(fixture: &Fixture) -> Home {
        let home = Home::new();
        let store = open_store(&StoreConfig::in_home(home.dir.path())).unwrap();
        fixture.commit(&*store);
        home
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_retrace"));
        command.args(args).env("RETRACE_HOME", self.dir.path());
        for var in ["RETRACE_STORE", "RETRACE_BLOBS", "RETRACE_URL", "RETRACE_RUN"] {
            command.env_remove(var);
        }
        command
    }

    fn run(&self, args: &[&str]) -> Result {
        Result(self.command(args).stdin(Stdio::null()).output().unwrap())
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

struct Result(Output);

impl Result {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.0.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.0.stderr).into_owned()
    }
    /// Asserts the exit code and that stdout (`out`) and stderr (`err`) contain each needle.
    fn expect(&self, code: i32, out: &[&str], err: &[&str]) -> &Self {
        let context = format!(
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.0.status.code(),
            self.stdout(),
            self.stderr()
        );
        assert_eq!(self.0.status.code(), Some(code), "{context}");
        for needle in out {
            assert!(self.stdout().contains(needle), "stdout lacks {needle:?}\n{context}");
        }
        for needle in err {
            assert!(self.stderr().contains(needle), "stderr lacks {needle:?}\n{context}");
        }
        assert!(!self.stderr().contains("panicked"), "{context}");
        self
    }
}

const RUN: &str = "01clirun00000000000000000a";

#[test]
fn every_command_teaches_with_help() {
    let home = Home::new();
    let commands = [
        "demo", "record", "replay", "fork", "diff", "resolve", "runs", "knew", "show", "verify", "serve",
        "simulate", "export", "import", "retain", "gc", "delete", "vault", "gate", "ledger", "approve",
        "agents",
    ];
    for command in commands {
        // `-h` shows the examples; `--help` the whole account before them.
        let short = home.run(&[command, "-h"]);
        short.expect(0, &["Usage: retrace", "Examples:\n  "], &[]);
        let long = home.run(&[command, "--help"]);
        long.expect(0, &["Usage: retrace", "Examples:\n  "], &[]);
        assert!(
            long.stdout().len() > short.stdout().len() + 200,
            "`retrace {command} --help` explains no more than -h"
        );
    }
    // The edits a fork takes are listed where `--edit` points.
    let fork = home.run(&["fork", "--help"]);
    fork.expect(
        0,
        &["swap:A,B", "tool-output:SEQ=@FILE", "model:AGENT=NAME[@SNAP]", "each explained under --help"],
        &[],
    );
    home.run(&["show"]).expect(2, &[], &["RUN"]);
    home.run(&["verify"]).expect(2, &[], &["--all"]);
}

#[test]
fn runs_lists_a_table_or_json() {
    let empty = Home::new();
    // Reading creates nothing: a mistyped RETRACE_HOME is said, not answered with an empty store.
    empty.run(&["runs"]).expect(2, &[], &["no store at", "retrace.db", "hint: record a run first"]);
    assert!(!empty.file("retrace.db").exists());
    let made = Result(empty.command(&["runs"]).env("RETRACE_HOME", empty.file("sub")).output().unwrap());
    made.expect(2, &[], &["no store at"]);
    assert!(!empty.file("sub").exists(), "`runs` made the folder of a store it then found empty");
    std::fs::write(empty.file("a-file"), "x").unwrap();
    let file = Result(empty.command(&["runs"]).env("RETRACE_HOME", empty.file("a-file")).output().unwrap());
    file.expect(2, &[], &["a-file is a file", "RETRACE_HOME names a folder"]);
    // A store that exists and holds nothing.
    empty.run(&["record", "--", "true"]).expect(0, &[], &[]);
    let home = Home::with(&conversation(RUN, 2));
    home.run(&["runs"]).expect(
        0,
        &["ID", "STATUS", RUN, "fixture", "record", "ok", "2023-11-14 22:13:20"],
        &[],
    );
    let json: serde_json::Value = serde_json::from_str(&home.run(&["runs", "--json"]).stdout()).unwrap();
    assert_eq!((json[0]["id"].as_str(), json[0]["events"].as_u64()), (Some(RUN), Some(9)));
}

#[test]
fn show_gives_few_lanes_room_for_long_labels() {
    const TOOL: &str = "warehouse.inventory.reconcile_backordered_items_v2";
    let run = |agents: &[&str]| {
        let mut b = Builder::new(RUN);
        for agent in agents {
            b.push(agent, retrace_core::EventType::ToolCall, Some(TOOL), None, Some(b"{}".to_vec()), |_| {});
        }
        Home::with(&b.finish(retrace_core::run::RunMode::Record))
    };
    let one = run(&["clerk"]).run(&["show", RUN]).expect(0, &[], &[]).stdout();
    assert!(one.contains(&format!("tool_call {TOOL}")), "one lane shows the whole name:\n{one}");
    let four =
        run(&["a", "b", "c", "d"]).run(&["show", RUN]).expect(0, &["tool_call warehouse"], &[]).stdout();
    assert!(!four.contains(TOOL) && four.contains('…'), "four lanes are cut to fit:\n{four}");
}

#[test]
fn show_draws_lanes_and_one_event() {
    let home = Home::with(&conversation(RUN, 2));
    let timeline =
        home.run(&["show", "01clirun"]).expect(0, &["SEQ", "LAMPORT", "planner", "reviewer"], &[]).stdout();
    let rows: Vec<&str> = timeline.lines().skip(2).collect();
    assert_eq!(rows.len(), 9, "{timeline}");
    assert!(rows[0].contains("model_call gpt-4o") && rows[2].contains("deliver <- planner #2"), "{timeline}");
    // The reviewer's lane is to the right of the planner's.
    assert!(rows[2].find("deliver").unwrap() > rows[0].find("model_call").unwrap(), "{timeline}");
    let lane = home.run(&["show", RUN, "--agent", "reviewer"]).expect(0, &["decision approve"], &[]).stdout();
    assert!(!lane.contains("model_call"), "{lane}");
    home.run(&["show", RUN, "--seq", "1"]).expect(
        0,
        &["seq 1: model_call gpt-4o", "request (sha256:", "JSON):", "\"messages\": [", "output ("],
        &[],
    );
    home.run(&["show", RUN, "--seq", "4"]).expect(0, &["binary, base64", "/wD+AA=="], &[]);
    let json: serde_json::Value =
        serde_json::from_str(&home.run(&["show", RUN, "--seq", "1", "--json"]).stdout()).unwrap();
    assert_eq!(json["request"]["json"]["model"], "gpt-4o");
    let all: serde_json::Value = serde_json::from_str(&home.run(&["show", RUN, "--json"]).stdout()).unwrap();
    assert_eq!(all["events"].as_array().unwrap().len(), 9);
    home.run(&["show", RUN, "--seq", "99"]).expect(2, &[], &["has 9 events; there is no seq 99"]);
    home.run(&["show", RUN, "--agent", "nobody"]).expect(
        2,
        &[],
        &["no agent \"nobody\" (agents: planner, reviewer)"],
    );
    home.run(&["show", "zzzz"]).expect(2, &[], &["error: no run", "hint: list the runs"]);
}

#[test]
fn verify_passes_a_sound_run_and_names_a_tampered_event() {
    let home = Home::with(&conversation(RUN, 2));
    home.run(&["verify", RUN]).expect(0, &["ok: run 01clirun", "9 events"], &[]);
    home.run(&["verify", "--all"]).expect(0, &["ok: 1 runs"], &[]);
    let mut tampered = conversation("01tampered", 2);
    tampered.events[6].latency_ms = Some(1);
    let store = open_store(&StoreConfig::in_home(home.dir.path())).unwrap();
    tampered.commit(&*store);
    drop(store);
    home.run(&["verify", "01tampered"]).expect(
        1,
        &["run 01tampered seq 7: hash mismatch"],
        &["verification found 1 problem"],
    );
    home.run(&["verify", "--all"]).expect(1, &["run 01tampered seq 7"], &[]);
    let json: serde_json::Value =
        serde_json::from_str(&home.run(&["verify", "--all", "--json"]).stdout()).unwrap();
    assert_eq!((json["ok"].as_bool(), json["problems"][0]["kind"].as_str()), (Some(false), Some("hash")));
}

#[test]
fn export_then_import_elsewhere_round_trips_byte_for_byte() {
    let home = Home::with(&conversation(RUN, 3));
    let file = home.file("t.jsonl");
    let path = file.to_str().unwrap();
    home.run(&["export", "01clir", "-o", path]).expect(0, &[], &["exported run 01clirun", "13 events"]);
    let exported = std::fs::read(&file).unwrap();
    assert_eq!(home.run(&["export", RUN]).0.stdout, exported, "stdout and -o give the same bytes");

    let other = Home::new();
    other.run(&["import", path]).expect(0, &[RUN], &["imported run 01clirun", "13 events"]);
    other.run(&["import", path]).expect(0, &[RUN], &["already present"]);
    assert_eq!(other.run(&["export", RUN]).0.stdout, exported);
    // The same events with another outcome in the header is another run.
    let text = String::from_utf8(exported.clone()).unwrap();
    let (header, rest) = text.split_once('\n').unwrap();
    let mut header: serde_json::Value = serde_json::from_str(header).unwrap();
    header["run"]["exit_status"] = 3.into();
    let edited = other.file("edited-header.jsonl");
    std::fs::write(&edited, format!("{header}\n{rest}")).unwrap();
    other.run(&["import", edited.to_str().unwrap()]).expect(
        1,
        &[],
        &["same events but a different exit status", "retrace delete 01"],
    );
    other.run(&["verify", RUN]).expect(0, &["ok:"], &[]);

    // The same id with different events is refused, naming the first differing seq.
    let mut changed = conversation(RUN, 3);
    changed.events[4].latency_ms = Some(5);
    changed.reseal_from(4);
    let third = Home::with(&changed);
    third.run(&["import", path]).expect(
        1,
        &[],
        &["already in the store with different events", "seq 5", "retrace delete 01"],
    );
}

fn corrupt(lines: &mut [String], at: usize, from: &str, to: &str) {
    assert!(lines[at].contains(from), "{}", lines[at]);
    lines[at] = lines[at].replacen(from, to, 1);
}

fn write(dir: &Path, name: &str, lines: &[String]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, trace_fixture::join(lines)).unwrap();
    path.to_str().unwrap().to_owned()
}

/// `-o` into something that is not a regular file writes into it (as `> /dev/null` would)
/// rather than renaming a file over it, and `-o` to a symbolic link replaces the file it names
/// and keeps the link. (A rename over `/dev/null` once replaced the machine's `/dev/null` with
/// a regular file, so this test uses a FIFO of its own.)
#[test]
fn export_writes_into_a_fifo_and_through_a_symlink() {
    use std::os::unix::fs::FileTypeExt;
    let home = Home::with(&conversation(RUN, 3));
    let exported = home.run(&["export", RUN]).0.stdout;
    let fifo = home.file("pipe");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo");
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    home.run(&["export", RUN, "-o", fifo.to_str().unwrap()]).expect(0, &[], &["exported run"]);
    assert_eq!(reader.join().unwrap(), exported, "the FIFO's reader got the whole trace");
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "still a FIFO");
    let leftovers: Vec<_> = std::fs::read_dir(home.dir.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary file left: {leftovers:?}");

    let real = home.file("real.jsonl");
    std::fs::write(&real, b"old contents").unwrap();
    let link = home.file("link.jsonl");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    home.run(&["export", RUN, "-o", link.to_str().unwrap()]).expect(0, &[], &["exported run"]);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays");
    assert_eq!(std::fs::read(&real).unwrap(), exported, "the file it names holds the trace");

    let dir = home.file("a-folder");
    std::fs::create_dir(&dir).unwrap();
    home.run(&["export", RUN, "-o", dir.to_str().unwrap()]).expect(2, &[], &["is a directory"]);
}

#[test]
fn import_refuses_bad_files_with_the_right_code_and_line() {
    let source = Home::with(&conversation(RUN, 3));
    let lines = trace_fixture::lines(&source.run(&["export", RUN]).0.stdout);
    let home = Home::new();
    let dir = home.dir.path();

    let mut flipped = lines.clone();
    corrupt(&mut flipped, 4, "\"reviewer\"", "\"reviewes\"");
    let path = write(dir, "flipped.jsonl", &flipped);
    home.run(&["import", &path]).expect(1, &[], &["flipped.jsonl:5", "hash mismatch at seq 4"]);

    let mut newer = lines.clone();
    corrupt(&mut newer, 0, "retrace-trace/1", "retrace-trace/2");
    home.run(&["import", &write(dir, "newer.jsonl", &newer)]).expect(
        2,
        &[],
        &["newer.jsonl:1", "unsupported trace format"],
    );

    let path = write(dir, "text.jsonl", &["not json".to_owned()]);
    home.run(&["import", &path]).expect(2, &[], &["text.jsonl:1", "not JSON"]);

    let path = write(dir, "short.jsonl", &lines[..lines.len() - 2]);
    home.run(&["import", &path]).expect(2, &[], &["short.jsonl", "truncated"]);

    home.run(&["import", "/nonexistent/trace.jsonl"]).expect(
        2,
        &[],
        &["cannot open /nonexistent/trace.jsonl"],
    );
    home.run(&["runs"]).expect(0, &[], &["no runs yet"]);
}

#[test]
fn import_reads_standard_input() {
    let source = Home::with(&conversation(RUN, 1));
    let bytes = source.run(&["export", RUN]).0.stdout;
    let home = Home::new();
    let mut child = home
        .command(&["import", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &bytes).unwrap();
    let out = Result(child.wait_with_output().unwrap());
    out.expect(0, &[RUN], &["from <stdin>"]);
}

#[test]
fn a_closed_pipe_ends_export_quietly() {
    let home = Home::with(&conversation(RUN, 3)); // holds a 100 KB blob: more than a pipe buffers
    let mut child =
        home.command(&["export", RUN]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut head = [0u8; 10];
    child.stdout.take().unwrap().read_exact(&mut head).unwrap();
    let out = Result(child.wait_with_output().unwrap());
    out.expect(0, &[], &[]);
    assert_eq!(out.stderr(), "");
}

#[test]
fn record_generates_a_private_mask_key_and_refuses_original_rules_without_a_vault_key() {
    let home = Home::new();
    let project = tempfile::tempdir().unwrap();
    let record = |vault: Option<&str>| {
        let mut c = home.command(&["record", "--", "true"]);
        c.current_dir(project.path()).env_remove("RETRACE_MASK_KEY").env_remove("RETRACE_VAULT_KEY");
        if let Some(key) = vault {
            c.env("RETRACE_VAULT_KEY", key);
        }
        Result(c.stdin(Stdio::null()).output().unwrap())
    };
    // No key anywhere: one is generated into RETRACE_HOME/mask.key, mode 0600, with a notice.
    record(None).expect(0, &[], &["generated a mask key", "RETRACE_MASK_KEY"]);
    let key_file = home.file("mask.key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777, 0o600);
    let key = std::fs::read_to_string(&key_file).unwrap();
    record(None).expect(0, &[], &[]);
    assert_eq!(std::fs::read_to_string(&key_file).unwrap(), key, "the key is generated once");

    // A rule that replays the original needs the vault.
    let config = "[[mask.rules]]\nname = \"acct\"\nkind = \"acct\"\njson_path = \"$..account\"\nreplay = \"original\"\n";
    std::fs::write(project.path().join("retrace.toml"), config).unwrap();
    record(None).expect(2, &[], &["acct", "RETRACE_VAULT_KEY"]);
    let vault_key = "dmF1bHQta2V5LWZvci10aGUtY2xpLXRlc3Qtb2YtMzI=";
    record(Some(vault_key)).expect(0, &[], &[]);
}

/// The run a `record --json` printed last.
fn run_of(recorded: &Result) -> String {
    let last = recorded.stdout().lines().last().map(str::to_owned).unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(&last).unwrap_or_else(|e| panic!("{e}: {last:?}"));
    json["run"].as_str().unwrap().to_owned()
}

#[test]
fn a_program_that_records_its_own_model_calls_is_not_recorded_again_by_the_proxy() {
    // The trio records each model call through the SDK; `record` points OPENAI_BASE_URL at its
    // proxy, which would record the same call again under the agent `default`.
    let home = Home::new();
    let recorded = home.run(&["record", "--json", "--", "retrace", "demo", "run", "trio", "--seed", "3"]);
    recorded.expect(0, &["reviewer: "], &[]);
    let run = run_of(&recorded);
    let shown: serde_json::Value =
        serde_json::from_str(&home.run(&["show", &run, "--json"]).stdout()).unwrap();
    let events = shown["events"].as_array().unwrap();
    let agents: std::collections::BTreeSet<&str> =
        events.iter().map(|e| e["agent_id"].as_str().unwrap()).collect();
    assert_eq!(agents, ["planner", "reviewer", "schema"].into(), "{shown}");
    let models = events.iter().filter(|e| e["type"] == "model_call").count();
    assert_eq!(models, 4, "one event per call");
    let replayed = home.run(&["replay", &run]);
    replayed.expect(0, &["reviewer: "], &["ok"]);
    // How the run ended is the launcher's line; the program's session, let go while the run is
    // the daemon's, doesn't say "running" first.
    assert!(!replayed.stderr().contains(" running ("), "{}", replayed.stderr());
    // A program that diverges: the report is printed once, by replay; the program says it stopped.
    let diverged = home.run(&["replay", &run, "--", "retrace", "demo", "run", "single", "--seed", "3"]);
    diverged.expect(1, &[], &["the program stopped at the divergence"]);
    assert_eq!(diverged.stderr().matches("divergence [").count(), 1, "{}", diverged.stderr());

    // A fork's changed steps run live against the demo's simulator (the source named no
    // upstream), once each, and nothing is new.
    let forked = home.run(&["fork", &run, "--edit", "model:reviewer=sim-2", "--json"]);
    // The program's line, then the report: one line, the last.
    let out = forked.stdout();
    let last = out.lines().last().unwrap_or_default();
    let fork: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(fork["status"], "ok", "{fork}");
    assert_eq!(fork["diff"]["counts"]["only_in_b"], 0, "{fork}");
    let replayed = home.run(&["replay", fork["fork"].as_str().unwrap(), "--json"]);
    replayed.expect(0, &["reviewer: "], &["ok"]);
    let last: serde_json::Value = serde_json::from_str(replayed.stdout().lines().last().unwrap()).unwrap();
    assert_eq!((last["status"].as_str(), last["exit_status"].as_i64()), (Some("ok"), Some(0)), "{last}");

    // A program that never joins the run leaves every step: the report names each agent's first.
    let none = home.run(&["replay", &run, "--json", "--", "true"]);
    none.expect(1, &[], &["steps_left", "agent \"schema\": first unconsumed step is seq"]);
    let last: serde_json::Value = serde_json::from_str(none.stdout().lines().last().unwrap()).unwrap();
    let d = &last["divergence"];
    assert_eq!((d["code"].as_str(), d["seq"].as_u64()), (Some("steps_left"), Some(1)), "{last}");
    assert!(d["step"].is_string() && d["agent"] != "*", "{last}");
}

#[test]
fn a_replay_whose_program_never_joins_names_each_agents_first_step() {
    // A run the demo recorded itself: no daemon hosted it, so replay finds the steps left.
    let home = Home::new();
    home.run(&["demo", "--runs", "1"]).expect(0, &[], &[]);
    let run = runs_of(&home)[0].0.clone();
    let none = home.run(&["replay", &run, "--json", "--", "true"]);
    none.expect(1, &[], &["steps_left", "agent \"reviewer\": first unconsumed step is seq"]);
    let last: serde_json::Value = serde_json::from_str(none.stdout().lines().last().unwrap()).unwrap();
    let d = &last["divergence"];
    assert_eq!((d["agent"].as_str(), d["seq"].as_u64()), (Some("planner"), Some(1)), "{last}");
    assert!(d["step"].as_str().is_some_and(|s| s.starts_with("model_call")), "{last}");
}

#[test]
fn a_model_output_edit_may_be_the_plain_body_the_provider_returns() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let providers = runtime.block_on(retrace_demo::providers::Providers::start("127.0.0.1:0")).unwrap();
    let home = Home::new();
    let program = home.file("ask.py");
    std::fs::write(
        &program,
        "import json, os, sys, urllib.request\n\
         body = {'model': 'gpt-sim', 'stream': len(sys.argv) > 1, 'messages': [{'role': 'user', 'content': 'hi'}]}\n\
         req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions',\n\
             data=json.dumps(body).encode(), headers={'content-type': 'application/json'})\n\
         print(urllib.request.urlopen(req).read().decode())\n",
    )
    .unwrap();
    let upstream = providers.openai_url();
    let record = |extra: &[&str]| {
        let mut args = vec![
            "record",
            "--json",
            "--upstream-openai",
            &upstream,
            "--",
            "python3",
            program.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let recorded = home.run(&args);
        recorded.expect(0, &[], &[]);
        run_of(&recorded)
    };
    let plain = home.file("plain.json");
    std::fs::write(
        &plain,
        r#"{"id": "chatcmpl-edited", "object": "chat.completion", "model": "gpt-sim",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "edited by hand"}, "finish_reason": "stop"}]}"#,
    )
    .unwrap();
    let edit = format!("model-output:1=@{}", plain.display());

    let run = record(&[]);
    let forked = home.run(&["fork", &run, "--edit", &edit]);
    forked.expect(0, &["edited by hand"], &[]);
    let fork = forked
        .stderr()
        .lines()
        .find_map(|l| l.split(" as ").nth(1))
        .map(|r| r.split(':').next().unwrap().to_owned());
    home.run(&["replay", &fork.unwrap()]).expect(0, &["edited by hand"], &["ok"]);

    // A streamed answer can't be replaced by a plain body: said before anything runs.
    let streamed = record(&["stream"]);
    home.run(&["fork", &streamed, "--edit", &edit]).expect(2, &[], &["streamed response"]);
    runtime.block_on(providers.stop());
}

#[test]
fn record_and_fork_leave_standard_output_to_the_program() {
    let home = Home::new();
    let recorded = home.run(&["record", "--", "echo", "hi"]);
    recorded.expect(0, &[], &["retrace: run "]);
    assert_eq!(recorded.stdout(), "hi\n", "only the program's output");
    let run = runs_of(&home)[0].0.clone();
    let replayed = home.run(&["replay", &run]);
    replayed.expect(0, &[], &["ok"]);
    assert_eq!(replayed.stdout(), "hi\n", "only the program's output");
    let forked = home.run(&["fork", &run]);
    forked.expect(0, &[], &["retrace: fork "]);
    assert_eq!(forked.stdout(), "hi\n", "only the program's output");
    let json = home.run(&["record", "--json", "--", "echo", "hi"]);
    let last: serde_json::Value = serde_json::from_str(json.stdout().lines().last().unwrap()).unwrap();
    assert_eq!(
        (last["status"].as_str(), last["events"].as_u64(), last["exit_status"].as_i64()),
        (Some("ok"), Some(0), Some(0))
    );
    assert!(json.stdout().starts_with("hi\n"));
}

/// The run ids `retrace runs --json` lists, with their mode and status.
fn runs_of(home: &Home) -> Vec<(String, String, String)> {
    let out = home.run(&["runs", "--json"]);
    out.expect(0, &[], &[]);
    let runs: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    let field = |r: &serde_json::Value, k: &str| r[k].as_str().unwrap_or_default().to_owned();
    runs.as_array().unwrap().iter().map(|r| (field(r, "id"), field(r, "mode"), field(r, "status"))).collect()
}

#[test]
fn a_recording_with_no_step_replays_clean_and_a_program_that_cant_start_leaves_no_run() {
    let home = Home::new();
    let recorded = home.run(&["record", "--json", "--", "true"]);
    recorded.expect(0, &[], &["(0 events)"]);
    let run = run_of(&recorded);
    // Nothing was recorded and nothing was asked: no divergence (it was `steps_left`).
    home.run(&["replay", &run]).expect(0, &[], &["ok"]);
    // A different exit status still diverges.
    home.run(&["replay", &run, "--", "false"]).expect(1, &[], &["exit_status", "recorded exit status 0"]);

    home.run(&["replay", &run, "--", "no-such-program-5e1d"]).expect(
        2,
        &[],
        &["no-such-program-5e1d", "ended failed: its program never started"],
    );
    let replays: Vec<_> = runs_of(&home).into_iter().filter(|(_, mode, _)| mode == "replay").collect();
    assert_eq!(replays.len(), 3, "{replays:?}");
    // The one that never started is kept, as every replay is, and `failed` at once, not
    // `running` until its lease lapses.
    assert_eq!(replays.iter().filter(|(_, _, status)| status == "failed").count(), 1, "{replays:?}");
    assert!(replays.iter().all(|(_, _, status)| status != "running"), "{replays:?}");
    // A recording or a fork of a mistyped command leaves no run behind.
    home.run(&["record", "--", "/no/such/program-5e1d"]).expect(
        2,
        &[],
        &["program not found", "discarded: its program never started"],
    );
    home.run(&["fork", &run, "--at", "1", "--", "/no/such/program-5e1d"]).expect(
        2,
        &[],
        &["program not found", "discarded: its program never started"],
    );
    assert_eq!(runs_of(&home).len(), 4, "the recording and its three replays");
}

#[test]
fn a_fork_whose_program_fails_exits_1_and_says_so() {
    let home = Home::new();
    let recorded = home.run(&["record", "--json", "--", "true"]);
    recorded.expect(0, &[], &[]);
    let run = run_of(&recorded);
    let forked = home.run(&["fork", &run, "--", "sh", "-c", "exit 3"]);
    forked.expect(1, &[], &["failed: the program exited with status 3"]);
    assert!(runs_of(&home).iter().any(|(_, mode, status)| mode == "fork" && status == "failed"));
    // Many at once: a fork that failed is said, and fails the command, not "no decision moved".
    let many = home.run(&["fork", "--runs", &run, "--", "sh", "-c", "exit 3"]);
    many.expect(1, &[], &["failed (exit status 3)", "1 of 1 forks did not finish"]);
    home.run(&["fork", "--runs", &run, "--", "true"]).expect(0, &[], &["no decision moved"]);
}

#[test]
fn a_recorded_retrace_command_replays_with_this_binary_off_path() {
    let home = Home::new();
    // PATH without the build's folder: `retrace` is this executable all the same.
    let path = "/usr/bin:/bin";
    let recorded = Result(
        home.command(&["record", "--json", "--", "retrace", "--version"]).env("PATH", path).output().unwrap(),
    );
    recorded.expect(0, &["retrace "], &["retrace --version"]);
    let run = run_of(&recorded);
    let replayed = Result(home.command(&["replay", &run]).env("PATH", path).output().unwrap());
    replayed.expect(0, &["retrace "], &["ok"]);
}

#[test]
fn a_closed_stdout_ends_printing_commands_quietly() {
    let home = Home::with(&conversation(RUN, 3));
    // The reading end is closed before the command writes: its first write fails, whether
    // through a returned error (the listings) or `println!` (the demo's story, a record's id).
    for args in [
        &["runs", "--json"][..],
        &["runs"],
        &["show", RUN],
        &["demo", "--runs", "1"],
        &["record", "--", "true"],
    ] {
        let mut child = home.command(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let out = Result(child.wait_with_output().unwrap());
        out.expect(0, &[], &[]);
        if !matches!(args[0], "record" | "demo") {
            assert_eq!(out.stderr(), "", "{args:?}");
        }
    }
}

#[test]
fn replaying_an_interrupted_recording_that_the_program_never_reaches_is_log_ended() {
    let mut fixture = conversation(RUN, 2);
    fixture.meta.status = retrace_core::run::RunStatus::Interrupted;
    fixture.meta.command = Some(retrace_core::run::Command { argv: vec!["true".into()], cwd: ".".into() });
    let home = Home::with(&fixture);
    // `true` takes no step: the recording's end (its recorder died) is what the report names.
    home.run(&["replay", RUN]).expect(1, &[], &["log_ended", "the recording ends at seq"]);
}

/// SPEC §7: an interrupted recording replays its events and then stops with `log_ended`, also
/// when the program takes every recorded step and finishes: with no recorded outcome to compare
/// the ending with, the replay is never "ok". `replay`, its `--json` and `gate` say the same.
#[test]
fn replaying_an_interrupted_recording_to_its_end_is_log_ended_in_replay_and_gate() {
    let home = Home::new();
    let recorded = home.run(&["demo", "single", "--runs", "1", "--replays", "0", "--json"]);
    recorded.expect(0, &[], &[]);
    let report: serde_json::Value = serde_json::from_str(&recorded.stdout()).unwrap();
    let run = report["runs"][0]["recorded"].as_str().unwrap().to_owned();
    // What a recorder killed mid-run leaves once the store is opened again: the run
    // `interrupted`, with no exit status or final decisions.
    let store = open_store(&StoreConfig::in_home(home.dir.path())).unwrap();
    let mut meta = store.run(&run).unwrap();
    meta.status = retrace_core::run::RunStatus::Interrupted;
    meta.exit_status = None;
    meta.finished_at_ms = None;
    meta.decisions.clear();
    store.update_run(&meta).unwrap();
    let last = store.last_seq(&run).unwrap();
    drop(store);
    let ends = format!("the recording ends at seq {last}");

    let replayed = home.run(&["replay", &run, "--json"]);
    replayed.expect(1, &[], &[&format!("divergence [log_ended] at seq {last}"), &ends]);
    assert!(!replayed.stderr().contains("ok: every step matched"), "{}", replayed.stderr());
    let outcome: serde_json::Value = serde_json::from_str(replayed.stdout().lines().last().unwrap()).unwrap();
    let d = &outcome["divergence"];
    assert_eq!((d["code"].as_str(), d["seq"].as_u64()), (Some("log_ended"), Some(last)), "{outcome}");
    assert_eq!(outcome["status"], "diverged", "{outcome}");

    let trace = home.file("interrupted.jsonl");
    home.run(&["export", &run, "-o", trace.to_str().unwrap()]).expect(0, &[], &[]);
    home.run(&["gate", trace.to_str().unwrap()]).expect(
        1,
        &["DIVERGED", &format!("at seq {last}: log_ended"), &ends],
        &["1 of 1 traces diverged"],
    );
}

#[test]
fn demo_run_counts_start_at_one_and_json_follows_a_demo_s_name() {
    let home = Home::new();
    for args in [&["demo", "--runs", "0"][..], &["demo", "single", "--runs", "0"]] {
        home.run(args).expect(2, &[], &["invalid value '0' for '--runs <RUNS>': want at least 1 run"]);
    }
    // Refused before anything ran: not even a store was made.
    home.run(&["runs"]).expect(2, &[], &["nothing has been recorded there"]);
    let single = home.run(&["demo", "single", "--runs", "1", "--replays", "1", "--json"]);
    single.expect(0, &[], &[]);
    let report: serde_json::Value = serde_json::from_str(&single.stdout()).unwrap();
    assert_eq!(report["runs"].as_array().map(Vec::len), Some(1), "{report}");
    assert_eq!(report["runs"][0]["live_calls_replayed"], 0, "{report}");
}

#[test]
fn bad_arguments_are_named_before_anything_runs() {
    let home = Home::with(&conversation(RUN, 1));
    home.run(&["record", "--upstream-openai", "notaurl", "--", "true"]).expect(
        2,
        &[],
        &["\"notaurl\"", "--upstream-openai", "not an http:// or https:// URL"],
    );
    home.run(&["retain", RUN, "forever"]).expect(2, &[], &["(want one of: routine, incident, pinned)"]);
    home.run(&["export", RUN, "-o", "/nonexistent-7d2c/x.jsonl"]).expect(
        2,
        &[],
        &["cannot write /nonexistent-7d2c/x.jsonl: no folder /nonexistent-7d2c"],
    );
    assert_eq!(runs_of(&home).len(), 1, "no run was created for a bad upstream");
}

#[test]
fn a_timeout_flag_takes_seconds_up_to_a_year() {
    let home = Home::new();
    for value in ["1e308", "--upstream-timeout=-1", "soon"] {
        let args = match value.starts_with("--") {
            true => vec!["record", value, "--", "true"],
            false => vec!["record", "--upstream-timeout", value, "--", "true"],
        };
        home.run(&args).expect(2, &[], &[value.trim_start_matches("--upstream-timeout="), "seconds"]);
    }
    home.run(&["serve", "--stall-timeout", "NaN"]).expect(2, &[], &["NaN", "seconds"]);
    home.run(&["record", "--upstream-timeout", "0.5", "--", "true"]).expect(0, &[], &[]);
}

#[test]
fn opening_an_older_store_says_it_upgraded_it_once() {
    let home = Home::with(&conversation(RUN, 2));
    home.run(&["runs"]).expect(0, &[RUN], &[]);
    assert!(!home.run(&["runs"]).stderr().contains("upgraded"), "a current store is not upgraded");
    // Version 1 is version 2 without the cache table.
    rusqlite::Connection::open(home.file("retrace.db"))
        .unwrap()
        .execute_batch("DROP TABLE cache; PRAGMA user_version = 1;")
        .unwrap();
    let version = retrace_store::sqlite::schema::SCHEMA_VERSION.to_string();
    let notice = format!("from schema version 1 to {version}");
    home.run(&["runs"]).expect(
        0,
        &[RUN],
        &["upgraded the store", "retrace.db", &notice, "older than this one"],
    );
    let again = home.run(&["runs", "--json"]);
    again.expect(0, &[RUN], &[]);
    assert_eq!(again.stderr(), "", "the upgrade is said once");
}
