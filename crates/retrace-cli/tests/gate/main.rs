//! `retrace gate` through the real binary: programs recorded with `retrace record` against
//! `retrace simulate` (real processes, real SQLite stores, loopback HTTP), exported, then gated
//! with the simulator stopped and the environment scrubbed of keys.
#[path = "../common/ran.rs"]
mod ran;

mod accept;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use ran::Ran;

const BIN: &str = env!("CARGO_BIN_EXE_retrace");

/// A program that asks the model twice over plain HTTP: no SDK, no `openai` package.
/// `--variant X` asks differently; `--clock` puts the wall clock in the first prompt; `--swap`
/// asks the same two questions in the other order.
const ASKER: &str = r#"
import argparse, datetime, json, os, urllib.request
p = argparse.ArgumentParser()
p.add_argument("--variant", default="")
p.add_argument("--clock", action="store_true")
p.add_argument("--tolerant", action="store_true")
p.add_argument("--swap", action="store_true")
a = p.parse_args()

def ask(text):
    try:
        return ask_once(text)
    except Exception as e:
        if not a.tolerant:
            raise
        return f"(no answer: {e})"

def ask_once(text):
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]}).encode()
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                 headers={"content-type": "application/json",
                                          "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["choices"][0]["message"]["content"]

first = "Plan the migration of users.name" + (f" ({a.variant})" if a.variant else "")
if a.clock:
    first += " as of " + datetime.datetime.now().isoformat(timespec="microseconds")
if a.swap:
    review = ask("Review the plan")
print("plan:", ask(first))
print("review:", review if a.swap else ask("Review the plan"))
"#;

/// A folder with the program, a recording store, a gating store and the exported traces.
struct Bench {
    dir: tempfile::TempDir,
}

impl Bench {
    fn new() -> Bench {
        let bench = Bench { dir: tempfile::tempdir().unwrap() };
        std::fs::write(bench.path("asker.py"), ASKER).unwrap();
        std::fs::create_dir(bench.path("traces")).unwrap();
        bench
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `retrace ARGS` from the bench folder, with only PATH and HOME of the outer environment
    /// (no API key, no proxy, no Retrace variable) plus `env`.
    fn retrace(&self, args: &[&str], env: &[(&str, &str)]) -> Ran {
        Ran(self.command(args, env).output().unwrap())
    }

    /// The command [`Bench::retrace`] runs, not started.
    fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut command = Command::new(BIN);
        command.args(args).current_dir(self.dir.path()).env_clear().stdin(Stdio::null());
        for var in ["PATH", "HOME"] {
            if let Some(v) = std::env::var_os(var) {
                command.env(var, v);
            }
        }
        command.env("RETRACE_HOME", self.path("gate-home"));
        command.envs(env.iter().copied());
        command
    }

    /// Records `python3 asker.py ARGS` against `sim` and exports it as `traces/NAME.jsonl`.
    fn record(&self, sim: &Simulator, name: &str, args: &[&str]) -> String {
        let home = self.path("record-home");
        let home = home.to_str().unwrap();
        let mut argv = vec!["record", "--json", "--upstream-openai", &sim.url, "--", "python3", "asker.py"];
        argv.extend(args);
        let ran =
            self.retrace(&argv, &[("RETRACE_HOME", home), ("OPENAI_API_KEY", "sk-test-gate-never-stored")]);
        ran.expect(0, &["plan:"], &[]);
        let last: serde_json::Value = serde_json::from_str(ran.stdout().lines().last().unwrap()).unwrap();
        let run = last["run"].as_str().unwrap().to_owned();
        let file = self.path(&format!("traces/{name}.jsonl"));
        self.retrace(&["export", &run, "-o", file.to_str().unwrap()], &[("RETRACE_HOME", home)]).expect(
            0,
            &[],
            &[],
        );
        run
    }
}

/// `retrace simulate` on a free loopback port, stopped on drop.
struct Simulator {
    child: Child,
    url: String,
}

impl Simulator {
    fn start() -> Simulator {
        let mut child = Command::new(BIN)
            .args(["simulate", "--addr", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        Simulator { child, url: format!("{}/v1", line.trim()) }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn good_traces_pass_with_no_api_key_and_no_upstream() {
    let bench = Bench::new();
    let sim = Simulator::start();
    let run = bench.record(&sim, "asker", &[]);
    // A Rust program on the runtime's Session::from_env (its recorded command is `retrace demo
    // run single ...`: the gate puts its own folder first on PATH).
    let home = bench.path("record-home");
    let home = home.to_str().unwrap();
    bench.retrace(&["demo", "single", "--runs", "1", "--replays", "0"], &[("RETRACE_HOME", home)]).expect(
        0,
        &[],
        &[],
    );
    let runs = bench.retrace(&["runs", "--json"], &[("RETRACE_HOME", home)]);
    let runs: serde_json::Value = serde_json::from_str(&runs.stdout()).unwrap();
    let single = runs.as_array().unwrap().iter().find(|r| r["id"] != run.as_str()).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let single_file = bench.path("traces/sub/single.jsonl");
    std::fs::create_dir(single_file.parent().unwrap()).unwrap();
    bench
        .retrace(&["export", &single, "-o", single_file.to_str().unwrap()], &[("RETRACE_HOME", home)])
        .expect(0, &[], &[]);
    // Files that are not `*.jsonl` are not traces: ignored.
    std::fs::write(bench.path("traces/notes.json"), "{\"not\": \"a trace\"}\n").unwrap();
    std::fs::write(bench.path("traces/README.md"), "The traces of the gate.\n").unwrap();
    drop(sim);

    // In a folder that isn't there yet, as `target/` in a fresh clone (QA19 D1).
    let junit = bench.path("target/reports/gate.xml");
    bench.retrace(&["gate", "traces", "--jobs", "2", "--junit", junit.to_str().unwrap()], &[]).expect(
        0,
        &[
            "ok        traces/asker.jsonl (2 steps",
            "ok        traces/sub/single.jsonl (",
            "gate: 2 traces, 2 ok, 0 diverged, 0 errors",
        ],
        &[],
    );
    let xml = read(&junit);
    assert!(xml.contains("tests=\"2\" failures=\"0\" errors=\"0\"") && !xml.contains("<failure"), "{xml}");
    // `--junit -` is standard output, the summary going to standard error; with --json it is
    // refused, since both would write standard output.
    let piped = bench.retrace(&["gate", "traces/asker.jsonl", "--junit", "-"], &[]);
    piped.expect(0, &[], &["gate: 1 trace, 1 ok"]);
    assert!(
        piped.stdout().starts_with("<?xml") && piped.stdout().contains("tests=\"1\""),
        "{}",
        piped.stdout()
    );
    assert!(!bench.path("-").exists(), "no file named -");
    bench.retrace(&["gate", "traces/asker.jsonl", "--junit", "-", "--json"], &[]).expect(
        2,
        &[],
        &["standard output"],
    );

    let json = bench.retrace(&["gate", "traces/asker.jsonl", "--json"], &[]);
    json.expect(0, &[], &["ok        traces/asker.jsonl"]);
    let json: serde_json::Value = serde_json::from_str(&json.stdout()).unwrap();
    assert_eq!(json["summary"]["ok"], 1);
    assert_eq!(json["traces"][0]["status"], "ok");
    assert_eq!(json["traces"][0]["run"], run.as_str());

    // A run id of the real store: exported into a temporary store, replayed there.
    bench.retrace(&["gate", &run[..10]], &[("RETRACE_HOME", home)]).expect(
        0,
        &[&format!("ok        {run}")],
        &[],
    );
    // The gate stored nothing in the real store: its replays ran in temporary ones.
    let after = bench.retrace(&["runs", "--json"], &[("RETRACE_HOME", home)]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&after.stdout()).unwrap().as_array().unwrap().len(),
        2
    );
}

#[test]
fn a_changed_program_fails_at_its_first_divergent_step() {
    let bench = Bench::new();
    let sim = Simulator::start();
    bench.record(&sim, "asker", &[]);
    drop(sim);
    let junit = bench.path("gate.xml");
    bench
        .retrace(
            &[
                "gate",
                "traces",
                "--junit",
                junit.to_str().unwrap(),
                "--",
                "python3",
                "asker.py",
                "--variant",
                "terse",
            ],
            &[],
        )
        .expect(
            1,
            &[
                "DIVERGED  traces/asker.jsonl at seq 1: agent default, expected sha256:",
                "first differing path $.messages[0].content",
                "replayed $.messages[0].content = \"Plan the migration of users.name (terse)\"",
                "gate: 1 trace, 0 ok, 1 diverged, 0 errors",
            ],
            &["1 of 1 traces diverged"],
        );
    let xml = read(&junit);
    assert!(xml.contains("tests=\"1\" failures=\"1\""), "{xml}");
    assert!(xml.contains("<failure type=\"divergence\" message=\"at seq 1: agent default"), "{xml}");

    // The program's last lines, kept in the report, are masked like anything Retrace writes
    // (QA12 S1): CI keeps the JUnit file and the --json document as artifacts.
    let key = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t";
    let script = format!("python3 asker.py --variant terse; echo connecting with {key}");
    let leaky = bench.retrace(&["gate", "traces", "--json", "--", "sh", "-c", &script], &[]);
    let report: serde_json::Value = serde_json::from_str(&leaky.stdout()).unwrap();
    let tail = report["traces"][0]["output_tail"].to_string();
    assert!(tail.contains("connecting with rtk_") && !tail.contains(key), "{report:#}");
    // A secret spanning lines, a PEM private key, is masked whole: its body lines were kept
    // when each line was masked alone (QA27 D3).
    let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAqa27PEMbodyxyz0123456789abcdefghijkl\nQA27PEMline2mnopqrstuvwxyz9876543210\n-----END RSA PRIVATE KEY-----";
    let script =
        format!("python3 asker.py --variant terse; echo could not sign with key:; printf '%s\\n' '{pem}'");
    let leaky = bench.retrace(&["gate", "traces", "--json", "--", "sh", "-c", &script], &[]);
    let report: serde_json::Value = serde_json::from_str(&leaky.stdout()).unwrap();
    let tail = report["traces"][0]["output_tail"].to_string();
    assert!(tail.contains("could not sign with key:") && tail.contains("rtk_"), "{report:#}");
    assert!(
        !tail.contains("PEMbody") && !tail.contains("PEMline2") && !tail.contains("END RSA"),
        "{report:#}"
    );

    // A reader that went away (`retrace gate ... 2>&1 | head -1`) doesn't panic the gate (it
    // did: 101) nor pass it: the verdict is still exit 1, whether standard error closed (the
    // report to standard output, or under --json to standard error) or standard output did.
    for json in [false, true] {
        let mut args = vec!["gate", "traces"];
        args.extend(json.then_some("--json"));
        args.extend(["--", "python3", "asker.py", "--variant", "terse"]);
        let mut child =
            bench.command(&args, &[]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stderr.take());
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "--json {json}: stdout:\n{stdout}");
        let report = if json { "\"diverged\": 1" } else { "gate: 1 trace, 0 ok, 1 diverged" };
        assert!(stdout.contains(report), "--json {json}: the report went out whole:\n{stdout}");
        let mut child =
            bench.command(&args, &[]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "--json {json}, stdout closed: stderr:\n{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// The same steps in another order match by key (SPEC §7): a note under the trace's line, and
/// a divergence with --strict-order (QA19 D2).
#[test]
fn steps_taken_in_another_order_are_noted_and_fail_with_strict_order() {
    let bench = Bench::new();
    let sim = Simulator::start();
    bench.record(&sim, "asker", &[]);
    drop(sim);
    let swapped = ["--", "python3", "asker.py", "--swap"];
    let mut argv = vec!["gate", "traces"];
    argv.extend(swapped);
    bench.retrace(&argv, &[]).expect(
        0,
        &[
            "ok        traces/asker.jsonl",
            r#"note: steps taken in another order than recorded (each matched by key; --strict-order fails this): agent "default": seq 2 (model_call openai/v1/chat/completions) before seq 1 (model_call openai/v1/chat/completions)"#,
        ],
        &[],
    );
    let mut json = vec!["gate", "traces", "--json"];
    json.extend(swapped);
    let doc: serde_json::Value = serde_json::from_str(&bench.retrace(&json, &[]).stdout()).unwrap();
    assert!(doc["traces"][0]["reordered"].as_str().unwrap().contains("seq 2"), "{doc:#}");
    let mut strict = vec!["gate", "traces", "--strict-order"];
    strict.extend(swapped);
    bench.retrace(&strict, &[]).expect(
        1,
        &[
            "DIVERGED  traces/asker.jsonl",
            "out_of_order: an agent took its steps in another order than recorded",
            "--strict-order: steps taken in another order than recorded",
        ],
        &[],
    );
    // In the recorded order: no note.
    let ran = bench.retrace(&["gate", "traces", "--strict-order"], &[]);
    ran.expect(0, &["ok        traces/asker.jsonl"], &[]);
    assert!(!ran.stdout().contains("note:"), "{}", ran.stdout());
}

#[test]
fn a_wall_clock_read_without_the_sdk_is_named_in_a_hint() {
    let bench = Bench::new();
    let sim = Simulator::start();
    let run = bench.record(&sim, "clock", &["--clock"]);
    drop(sim);
    // `replay` gives the same hint, under the divergence and in its --json line (QA9 S5).
    let home = bench.path("record-home");
    let replayed = bench.retrace(&["replay", &run, "--json"], &[("RETRACE_HOME", home.to_str().unwrap())]);
    replayed.expect(1, &[], &["hint: probably a clock read without the SDK"]);
    let last: serde_json::Value = serde_json::from_str(replayed.stdout().lines().last().unwrap()).unwrap();
    assert_eq!(last["hints"][0]["kind"], "clock", "{last:#}");
    let ran = bench.retrace(&["gate", "traces/clock.jsonl"], &[]);
    ran.expect(
        1,
        &[
            "DIVERGED  traces/clock.jsonl at seq 1",
            "hint: seq 1, agent default, model_call openai/v1/chat/completions: probably a clock read without the SDK",
            "agent.now()",
        ],
        &[],
    );
    let json = bench.retrace(&["gate", "traces/clock.jsonl", "--json"], &[]);
    let json: serde_json::Value = serde_json::from_str(&json.stdout()).unwrap();
    assert_eq!(json["traces"][0]["hints"][0]["kind"], "clock", "{json:#}");
}

#[test]
fn a_program_that_cannot_start_is_an_input_error() {
    let bench = Bench::new();
    let sim = Simulator::start();
    bench.record(&sim, "asker", &[]);
    drop(sim);
    bench.retrace(&["gate", "traces", "--", "python3", "gone.py"], &[]).expect(
        2,
        &[
            "ERROR     traces/asker.jsonl: script not found: gone.py for `python3 gone.py`",
            "the checkout the traces were recorded in (a recorded directory is kept relative",
        ],
        &["1 of 1 traces could not be replayed"],
    );
    bench.retrace(&["gate", "traces", "--", "/no/such/agent", "--run"], &[]).expect(
        2,
        &["program not found: `/no/such/agent --run`"],
        &[],
    );
    // A program looked up on PATH: PATH is the lead, not the checkout (QA33 D4).
    let missing = bench.retrace(&["gate", "traces", "--", "no-such-interpreter-xyz", "app.py"], &[]);
    missing.expect(2, &["`no-such-interpreter-xyz` is on no folder of PATH", "put it on PATH"], &[]);
    assert!(!missing.stdout().contains("the checkout the traces were recorded in"), "{}", missing.stdout());
    std::fs::write(bench.path("notes.jsonl"), "hello\n").unwrap();
    bench.retrace(&["gate", "notes.jsonl"], &[]).expect(
        2,
        &["ERROR     notes.jsonl: not a trace file: line 1 is not JSON"],
        &["1 of 1 traces could not be replayed"],
    );
    // With no store to find a run in, it says so, and makes none (QA37 D1).
    bench.retrace(&["gate", "nothing-here"], &[]).expect(
        2,
        &[],
        &["nothing-here: no such file or folder", "no store at"],
    );
    // No time at all would declare a stall wherever an agent waits (QA19 D6).
    bench.retrace(&["gate", "traces", "--stall-timeout", "0"], &[]).expect(
        2,
        &[],
        &["0 would declare a stall wherever an agent waits: give more than 0 seconds"],
    );
    // A program that starts but dies before its first step, as one whose packages CI didn't
    // install does, is an error to fix, not a divergence of every trace (QA19 D4).
    std::fs::write(bench.path("broken.py"), "import a_module_ci_did_not_install\n").unwrap();
    bench.retrace(&["gate", "traces", "--", "python3", "broken.py"], &[]).expect(
        2,
        &[
            "ERROR     traces/asker.jsonl: the program exited with status 1 before taking any of the trace's",
            "hint: a missing package or module",
            "| ModuleNotFoundError: No module named 'a_module_ci_did_not_install'",
        ],
        &["1 of 1 traces could not be replayed"],
    );
    // One that took its first step, then crashed, is a divergence, counted as one (QA33 D1: an
    // error "before taking any of the trace's steps", the ledger's streak kept).
    let half = "import json, os, sys, urllib.request\n\
        body = json.dumps({'model': 'gpt-4o-mini', 'messages': [{'role': 'user', 'content': 'Plan the migration of users.name'}]}).encode()\n\
        req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=body,\n\
            headers={'content-type': 'application/json', 'authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n\
        urllib.request.urlopen(req, timeout=30).read()\n\
        sys.exit('crashed after the first step')\n";
    std::fs::write(bench.path("half.py"), half).unwrap();
    let diverged = bench.retrace(&["gate", "traces", "--", "python3", "half.py"], &[]);
    diverged.expect(1, &["DIVERGED  traces/asker.jsonl at seq 2"], &["1 of 1 traces diverged"]);
    assert!(!diverged.stdout().contains("before taking any"), "{}", diverged.stdout());
    // One that hangs after its steps, outside Retrace, is stopped at the time limit and said
    // so, with its output, rather than hanging the gate (QA33 D2).
    let started = std::time::Instant::now();
    let hung = bench.retrace(
        &[
            "gate",
            "traces",
            "--timeout",
            "3",
            "--",
            "sh",
            "-c",
            "python3 asker.py; echo waiting; exec sleep 600",
        ],
        &[],
    );
    hung.expect(
        2,
        &["ERROR     traces/asker.jsonl: the program ran past the time limit of 3 s", "| waiting"],
        &[],
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "{:?}", started.elapsed());
}

#[test]
fn every_jsonl_file_under_a_folder_is_gated_and_one_that_is_no_trace_is_an_error() {
    let bench = Bench::new();
    let sim = Simulator::start();
    bench.record(&sim, "asker", &[]);
    drop(sim);
    let files: &[(&str, &str, &str)] = &[
        // `retrace export nosuchrun > traces/checkout.jsonl`: the shell made the file.
        ("checkout", "", "not a trace file: empty file"),
        ("cut", "{\"format\":\"retrace-trace/1\"", "not a trace file: cut inside its header line"),
        ("foo", "{\"format\":\"foo/1\"}\n{}\n", "not a trace file: its header says format \"foo/1\""),
        ("noformat", "{\"not\": \"a trace\"}\n", "not a trace file: its first line has no \"format\""),
        ("text", "hello\n", "not a trace file: line 1 is not JSON"),
        (
            "lfs",
            "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 12345\n",
            "not a trace file: a Git LFS pointer",
        ),
    ];
    for (name, text, _) in files {
        std::fs::write(bench.path(&format!("traces/{name}.jsonl")), text).unwrap();
    }
    std::fs::write(bench.path("traces/README.md"), "not a trace, not gated\n").unwrap();
    let junit = bench.path("gate.xml");
    let ran = bench.retrace(&["gate", "traces", "--junit", junit.to_str().unwrap()], &[]);
    let mut lines: Vec<String> =
        files.iter().map(|(name, _, why)| format!("ERROR     traces/{name}.jsonl: {why}")).collect();
    lines.push("ok        traces/asker.jsonl".into());
    lines.push("gate: 7 traces, 1 ok, 0 diverged, 6 errors".into());
    ran.expect(
        2,
        &lines.iter().map(String::as_str).collect::<Vec<_>>(),
        &["6 of 7 traces could not be replayed"],
    );
    assert!(ran.stdout().contains("hint: fetch it: `git lfs pull`"), "{}", ran.stdout());
    let xml = read(&junit);
    assert!(xml.contains("tests=\"7\" failures=\"0\" errors=\"6\""), "{xml}");
    assert!(xml.contains("name=\"traces/checkout.jsonl\""), "{xml}");

    let ran = bench.retrace(&["gate", "traces", "--json"], &[]);
    ran.expect(2, &[], &[]);
    let json = ran.json();
    assert_eq!(json["summary"]["errors"], 6, "{json:#}");
    let checkout = json["traces"].as_array().unwrap().iter().find(|t| t["name"] == "traces/checkout.jsonl");
    assert_eq!(checkout.unwrap()["error"]["message"], "not a trace file: empty file", "{json:#}");

    // Named on the command line, the same file is the same ERROR, and the others named beside
    // it are still judged and reported (QA12 D9).
    let named = bench.retrace(
        &["gate", "traces/checkout.jsonl", "traces/asker.jsonl", "--junit", junit.to_str().unwrap()],
        &[],
    );
    named.expect(
        2,
        &["ERROR     traces/checkout.jsonl: not a trace file: empty file", "ok        traces/asker.jsonl"],
        &["1 of 2 traces could not be replayed"],
    );
    assert!(read(&junit).contains("tests=\"2\" failures=\"0\" errors=\"1\""), "{}", read(&junit));
    // Named twice, and under a folder named too, a trace is gated once (QA12 S5).
    bench.retrace(&["gate", "traces/asker.jsonl", "traces/asker.jsonl", "traces", "--json"], &[]).expect(
        2,
        &["\"traces\": 7"],
        &[],
    );
}

#[test]
fn an_unwritable_junit_path_is_refused_before_anything_replays() {
    let bench = Bench::new();
    let sim = Simulator::start();
    bench.record(&sim, "asker", &[]);
    drop(sim);
    // Under a file, where no folder can be made (a missing folder is made: QA19 D1).
    let ran = bench.retrace(&["gate", "traces", "--junit", "asker.py/gate.xml"], &[]);
    ran.expect(2, &[], &["cannot write asker.py/gate.xml", "check the --junit path"]);
    assert!(!ran.stdout().contains("traces/asker.jsonl"), "nothing was replayed:\n{}", ran.stdout());
    // Checked by creating it, which leaves nothing behind when the gate then fails to run.
    bench.retrace(&["gate", "nothing-here", "--junit", "gate.xml"], &[]).expect(2, &[], &["nothing-here"]);
    assert!(!bench.path("gate.xml").exists());
    // An existing report is written over, as before.
    std::fs::write(bench.path("gate.xml"), "old").unwrap();
    bench.retrace(&["gate", "traces", "--junit", "gate.xml"], &[]).expect(0, &[], &[]);
    assert!(read(&bench.path("gate.xml")).contains("tests=\"1\""));
}

#[test]
fn a_trace_holding_tokens_under_another_mask_key_is_an_input_error() {
    let bench = Bench::new();
    let sim = Simulator::start();
    bench.record(&sim, "asker", &[]);
    drop(sim);
    // The header as a run recorded under another key, holding tokens, would have it.
    let file = bench.path("traces/asker.jsonl");
    let text = read(&file);
    let (first, rest) = text.split_once('\n').unwrap();
    let mut header: serde_json::Value = serde_json::from_str(first).unwrap();
    for pointer in ["", "/run"] {
        let place = header.pointer_mut(pointer).unwrap();
        place["holds_tokens"] = true.into();
        place["mask_key_fingerprint"] = "mk_00000000deadbeef".into();
    }
    header["run_digest"] = retrace_core::export::run_digest(&header["run"]).unwrap().to_string().into();
    std::fs::write(&file, format!("{header}\n{rest}")).unwrap();
    // A key that is set but another: both fingerprints named.
    let key = ("RETRACE_MASK_KEY", "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=");
    let other = bench.retrace(&["gate", "traces"], &[key]);
    other.expect(
        2,
        &[
            "ERROR     traces/asker.jsonl: run ",
            "holds masked tokens made under mask key mk_00000000deadbeef, but this machine's key is mk_",
        ],
        &["1 of 1 traces could not be replayed"],
    );
    // No key at all (the commonest CI mistake: the secret not configured): said as such, never
    // as a mismatch with the throwaway key the gate replays under, whose fingerprint changes
    // every run.
    for _ in 0..2 {
        let ran = bench.retrace(&["gate", "traces"], &[]);
        ran.expect(
            2,
            &[
                "ERROR     traces/asker.jsonl: run ",
                "holds masked tokens made under mask key mk_00000000deadbeef, and no mask key is set: \
                 RETRACE_MASK_KEY is unset and ",
                "has no mask.key",
                "hint: set RETRACE_MASK_KEY to the key with fingerprint mk_00000000deadbeef",
            ],
            &["1 of 1 traces could not be replayed"],
        );
        assert!(!ran.stdout().contains("this machine's key"), "{}", ran.stdout());
    }
}

#[test]
fn gate_help_teaches_with_examples() {
    let bench = Bench::new();
    bench.retrace(&["gate", "--help"], &[]).expect(
        0,
        &[
            "Usage: retrace gate",
            "Examples:\n  retrace gate tests/traces",
            "--accept",
            "CI=true",
            "Every *.jsonl file under a folder",
            "never skipped",
            "Exit codes",
        ],
        &[],
    );
    bench.retrace(&["gate"], &[]).expect(2, &[], &["PATH"]);
    bench.retrace(&["gate", "x", "--force"], &[]).expect(2, &[], &["--accept"]);
}
