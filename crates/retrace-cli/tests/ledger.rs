//! The replay ledger and the autonomy ladder through the real binary: `retrace gate` filling
//! the ledger (a trace file counted once per content hash), `retrace ledger export` signing it,
//! and `retrace agents` trusting only a ledger signed by the policy's key.
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use retrace_core::ledger::LedgerFile;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_retrace");
const KEY: &str = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";
const OTHER_KEY: &str = "CAgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAg=";

/// One agent reading the clock twice through the daemon's SDK route (plain HTTP, no SDK). With
/// `GO` and `READY` set, between the two it creates the file `$READY` and waits for `$GO`.
const STEPPER: &str = r#"
import json, os, time, urllib.request
def step(body):
    url = f"{os.environ['RETRACE_URL']}/api/runs/{os.environ['RETRACE_RUN']}/agents/planner/steps"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)
for n in (1, 2):
    print(step({"type": "clock", "name": "wall", "request": {}, "output": {"unix_ms": n}})["output"])
    if n == 1 and os.environ.get("GO"):
        open(os.environ["READY"], "w").close()
        while not os.path.exists(os.environ["GO"]):
            time.sleep(0.02)
"#;

struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(toml: &str) -> Project {
        let p = Project { dir: tempfile::tempdir().unwrap() };
        std::fs::write(p.path("stepper.py"), STEPPER).unwrap();
        std::fs::write(p.path("retrace.toml"), toml).unwrap();
        std::fs::create_dir(p.path("traces")).unwrap();
        p
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn retrace(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.command(args, env).output().unwrap()
    }

    /// The command [`Project::retrace`] runs, not started.
    fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut command = Command::new(BIN);
        command.args(args).current_dir(self.dir.path()).env_clear().stdin(Stdio::null());
        for var in ["PATH", "HOME"] {
            if let Some(v) = std::env::var_os(var) {
                command.env(var, v);
            }
        }
        command.env("RETRACE_HOME", self.path("home"));
        command.envs(env.iter().copied());
        command
    }

    fn ok(&self, args: &[&str], env: &[(&str, &str)]) -> String {
        let out = self.retrace(args, env);
        assert!(out.status.success(), "retrace {args:?}: {}\n{}", text(&out.stdout), text(&out.stderr));
        text(&out.stdout)
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

/// Records the stepper into its own store and exports it as `traces/NAME.jsonl`.
fn record(p: &Project, name: &str) -> PathBuf {
    let home = p.path("record-home");
    let home = home.to_str().unwrap();
    let out = p.ok(&["record", "--json", "--", "python3", "stepper.py"], &[("RETRACE_HOME", home)]);
    let last: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let run = last["run"].as_str().unwrap().to_owned();
    let file = p.path(&format!("traces/{name}.jsonl"));
    p.ok(&["export", &run, "-o", file.to_str().unwrap()], &[("RETRACE_HOME", home)]);
    file
}

/// Waits (up to a minute) for the stepper to create `ready`, between its two steps.
fn wait_for_first_step(ready: &std::path::Path) {
    let waited = std::time::Instant::now();
    while !ready.exists() {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(60),
            "the program never took its first step"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn planner(p: &Project) -> Value {
    let entries = json(&p.ok(&["ledger", "show", "--json"], &[]));
    entries
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["agent"] == "planner")
        .cloned()
        .expect("planner in the ledger")
}

#[test]
fn gate_counts_a_recording_once_however_its_file_is_copied() {
    let p = Project::new("[project]\nname = \"billing\"\n");
    let file = record(&p, "a");
    std::fs::copy(&file, p.path("traces/a-copy.jsonl")).unwrap();
    // The same recording in other bytes: CRLF line ends, and a header a tool wrote again.
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(p.path("traces/a-crlf.jsonl"), text.replace('\n', "\r\n")).unwrap();
    let (header, rest) = text.split_once('\n').unwrap();
    let header: Value = serde_json::from_str(header).unwrap();
    let spaced = serde_json::to_string_pretty(&header).unwrap().replace('\n', " ");
    std::fs::write(p.path("traces/a-spaced.jsonl"), format!("{spaced}\n{rest}")).unwrap();
    p.ok(&["gate", "traces"], &[]);
    let e = planner(&p);
    assert_eq!(e["project"], "billing", "[project] name names the project: {e}");
    assert_eq!((e["replays"].as_u64(), e["traces_replayed"].as_u64()), (Some(4), Some(1)), "{e}");
    assert_eq!((e["clean_streak"].as_u64(), e["distinct_traces"].as_u64()), (Some(4), Some(1)), "{e}");
    for copy in ["a-copy", "a-crlf", "a-spaced"] {
        std::fs::remove_file(p.path(&format!("traces/{copy}.jsonl"))).unwrap();
    }
    p.ok(&["gate", "traces/a.jsonl"], &[]);
    let e = planner(&p);
    assert_eq!(
        (e["replays"].as_u64(), e["traces_replayed"].as_u64(), e["clean_streak"].as_u64()),
        (Some(5), Some(1), Some(5))
    );
    assert!(p.ok(&["ledger", "show"], &[]).contains("billing"));
}

/// A replay run's trace and an unedited fork's check the recording they replay: each counts as
/// that recording, not as another distinct trace (QA26 D1: one recording and three of its
/// replays, exported, made four "distinct traces" and an agent autonomous).
#[test]
fn replays_and_unedited_forks_of_a_recording_count_as_that_recording() {
    let p = Project::new("[project]\nname = \"billing\"\n");
    let file = record(&p, "a");
    let home = p.path("record-home");
    let env = [("RETRACE_HOME", home.to_str().unwrap())];
    let header: Value = json(std::fs::read_to_string(&file).unwrap().lines().next().unwrap());
    let run = header["run"]["id"].as_str().unwrap().to_owned();
    let last = |mode: &str| -> String {
        let runs = json(&p.ok(&["runs", "--mode", mode, "--last", "1", "--json"], &env));
        runs[0]["id"].as_str().unwrap().to_owned()
    };
    p.ok(&["replay", &run], &env);
    let replay = last("replay");
    p.ok(&["export", &replay, "-o", p.path("traces/replay.jsonl").to_str().unwrap()], &env);
    p.ok(&["fork", &run], &env);
    let fork = last("fork");
    p.ok(&["export", &fork, "-o", p.path("traces/fork.jsonl").to_str().unwrap()], &env);
    p.ok(&["gate", "traces"], &[]);
    let e = planner(&p);
    assert_eq!((e["replays"].as_u64(), e["distinct_traces"].as_u64()), (Some(3), Some(1)), "{e}");
    // Replay, fork and gate don't read [autonomy] (SPEC §7): a typo there fails none of them
    // (QA26 D4: it failed every replay and every trace).
    std::fs::write(p.path("retrace.toml"), "[project]\nname = \"billing\"\n[autonomy]\nbogus_key = 1\n")
        .unwrap();
    p.ok(&["gate", "traces/a.jsonl"], &[]);
    p.ok(&["replay", &run], &env);
    p.ok(&["fork", &run], &env);
}

/// A gate in which an agent diverged ends with its streak broken, whatever the traces' names:
/// the ledger takes a gate's clean replays before its divergences (QA26 D3: a diverging trace
/// that sorted first was followed by clean ones that built the streak again).
#[test]
fn a_gate_with_a_divergence_ends_the_streak_whatever_the_names() {
    let p = Project::new("[project]\nname = \"billing\"\n");
    let file = record(&p, "z-clean");
    record(&p, "y-clean");
    // The same recording, its command now a program whose first step differs.
    std::fs::write(p.path("other.py"), STEPPER.replace("\"name\": \"wall\"", "\"name\": \"monotonic\""))
        .unwrap();
    let trace = std::fs::read_to_string(&file).unwrap();
    let (header, rest) = trace.split_once('\n').unwrap();
    let mut header: Value = json(header);
    header["run"]["command"]["argv"] = serde_json::json!(["python3", "other.py"]);
    header["run_digest"] = retrace_core::export::run_digest(&header["run"]).unwrap().to_string().into();
    std::fs::write(p.path("traces/0-diverges.jsonl"), format!("{header}\n{rest}")).unwrap();
    let out = p.retrace(&["gate", "traces"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(planner(&p)["clean_streak"].as_u64(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn a_gate_the_user_stops_leaves_the_ledger_as_it_was() {
    use std::os::unix::process::CommandExt;
    let p = Project::new("[project]\nname = \"billing\"\n");
    record(&p, "a");
    p.ok(&["gate", "traces"], &[]);
    let before = planner(&p);
    assert_eq!(before["clean_streak"].as_u64(), Some(1), "{before}");

    // Ctrl-C while the trace's program is between its steps: to the gate's process group, as
    // a terminal sends it.
    let (go, ready) = (p.path("go"), p.path("ready"));
    let env = [("GO", go.to_str().unwrap()), ("READY", ready.to_str().unwrap())];
    let mut command = p.command(&["gate", "traces"], &env);
    let gate = command.stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).spawn().unwrap();
    wait_for_first_step(&ready);
    let group = nix::unistd::Pid::from_raw(gate.id() as i32);
    nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGINT).unwrap();
    let stopped = gate.wait_with_output().unwrap();
    let (out, err) = (text(&stopped.stdout), text(&stopped.stderr));
    assert_eq!(stopped.status.code(), Some(130), "{out}\n{err}");
    assert!(out.contains("STOPPED   traces/a.jsonl: interrupted (SIGINT)"), "{out}");
    assert!(!out.contains("DIVERGED"), "{out}");
    assert!(err.contains("gate interrupted (SIGINT)") && err.contains("ledger was left as it was"), "{err}");
    assert_eq!(planner(&p), before, "the ledger is untouched");
}

#[test]
fn a_ledger_the_gate_cannot_write_is_a_warning_and_the_verdicts_stand() {
    let p = Project::new("[project]\nname = \"billing\"\n");
    record(&p, "a");
    // RETRACE_HOME under a regular file: no store can be opened or made there.
    let home = p.path("stepper.py").join("home");
    let out = p.retrace(&["gate", "traces"], &[("RETRACE_HOME", home.to_str().unwrap())]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "a passing gate passes: {stdout}\n{stderr}");
    assert!(stdout.contains("ok        traces/a.jsonl"), "{stdout}");
    assert!(
        stderr.contains("warning: the replay ledger was not updated for 1 trace(s)")
            && stderr.contains("the verdicts stand"),
        "{stderr}"
    );
}

/// A trace exported while its run was recording imports with a warning, and the complete
/// export of the same run, imported later, replaces that snapshot instead of conflicting.
#[test]
fn the_complete_export_replaces_a_snapshot_exported_while_recording() {
    let p = Project::new("");
    let (go, ready) = (p.path("go"), p.path("ready"));
    let env = [("GO", go.to_str().unwrap()), ("READY", ready.to_str().unwrap())];
    let mut recording = p
        .command(&["record", "--", "python3", "stepper.py"], &env)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_first_step(&ready);
    let runs = json(&p.ok(&["runs", "--json"], &[]));
    let run = runs[0]["id"].as_str().unwrap().to_owned();
    let (live, done) = (p.path("live.jsonl"), p.path("done.jsonl"));
    p.ok(&["export", &run, "-o", live.to_str().unwrap()], &[]);
    std::fs::write(&go, "").unwrap();
    assert!(recording.wait().unwrap().success());
    p.ok(&["export", &run, "-o", done.to_str().unwrap()], &[]);

    let other = p.path("other-home");
    let other = [("RETRACE_HOME", other.to_str().unwrap())];
    let imported = p.retrace(&["import", live.to_str().unwrap()], &other);
    assert!(imported.status.success(), "{}", text(&imported.stderr));
    assert!(text(&imported.stderr).contains("was still being recorded when"), "{}", text(&imported.stderr));
    let replaced = p.retrace(&["import", done.to_str().unwrap()], &other);
    let said = text(&replaced.stderr);
    assert!(replaced.status.success(), "{said}");
    assert!(
        said.contains("exported while it was being recorded: replacing it") && said.contains("imported run"),
        "{said}"
    );
    let shown = json(&p.ok(&["show", &run, "--json"], &other));
    assert_eq!(shown["run"]["status"], "ok", "{shown}");
    assert_eq!(shown["events"].as_array().unwrap().len(), 2, "{shown}");
    let again = p.retrace(&["import", done.to_str().unwrap()], &other);
    assert!(
        again.status.success() && text(&again.stderr).contains("already present"),
        "{}",
        text(&again.stderr)
    );
}

#[test]
fn the_exported_ledger_is_signed_and_only_the_policys_key_is_trusted() {
    let p = Project::new("[project]\nname = \"billing\"\n");
    record(&p, "a");
    p.ok(&["gate", "traces"], &[]);
    p.ok(&["gate", "traces"], &[]);

    let unsigned = p.retrace(&["ledger", "export", "-o", "ledger.json"], &[]);
    assert_eq!(unsigned.status.code(), Some(2), "{}", text(&unsigned.stderr));
    assert!(text(&unsigned.stderr).contains("RETRACE_LEDGER_KEY"), "{}", text(&unsigned.stderr));
    let bad = p.retrace(&["ledger", "export", "-o", "ledger.json"], &[("RETRACE_LEDGER_KEY", "short")]);
    assert_eq!(bad.status.code(), Some(2));
    // A project the ledger doesn't hold: refused, naming those it does (QA15 S3), no file.
    let typo = p.retrace(
        &["ledger", "export", "--project", "biling", "-o", "typo.json"],
        &[("RETRACE_LEDGER_KEY", KEY)],
    );
    assert_eq!(typo.status.code(), Some(2), "{}", text(&typo.stderr));
    assert!(text(&typo.stderr).contains("its projects: billing"), "{}", text(&typo.stderr));
    assert!(!p.path("typo.json").exists());

    let exported = p.retrace(&["ledger", "export", "-o", "ledger.json"], &[("RETRACE_LEDGER_KEY", KEY)]);
    assert!(exported.status.success(), "{}", text(&exported.stderr));
    let file = LedgerFile::parse(&std::fs::read(p.path("ledger.json")).unwrap()).unwrap();
    let pubkey = file.public_key.clone();
    file.verify(&pubkey).unwrap();
    assert!(
        text(&exported.stderr).contains(&format!("ledger_pubkey = \"{pubkey}\"")),
        "{}",
        text(&exported.stderr)
    );
    assert_eq!(file.entry("billing", "planner").unwrap().clean_streak, 2);
    // `-o -` is standard output: the same signed entries, and no file named `-`.
    let piped = p.retrace(&["ledger", "export", "-o", "-"], &[("RETRACE_LEDGER_KEY", KEY)]);
    assert!(piped.status.success(), "{}", text(&piped.stderr));
    let again = LedgerFile::parse(&piped.stdout).unwrap();
    again.verify(&pubkey).unwrap();
    assert_eq!(again.entries, file.entries);
    assert!(!p.path("-").exists(), "no file named -");

    let policy = |traces: u64| {
        format!(
            "[project]\nname = \"billing\"\n[autonomy]\nledger = \"ledger.json\"\nledger_pubkey = \"{pubkey}\"\n\
             side_effect_min_clean = 2\nside_effect_min_traces = {traces}\nbelow = \"hold\"\n"
        )
    };
    let rung = |p: &Project| {
        let agents = json(&p.ok(&["agents", "--json"], &[]));
        let planner =
            agents["agents"].as_array().unwrap().iter().find(|a| a["agent"] == "planner").cloned().unwrap();
        (planner["rung"].as_str().unwrap().to_owned(), agents)
    };
    std::fs::write(p.path("retrace.toml"), policy(1)).unwrap();
    assert_eq!(rung(&p).0, "autonomous");
    std::fs::write(p.path("retrace.toml"), policy(2)).unwrap();
    let (probation, agents) = rung(&p);
    assert_eq!(probation, "probation");
    assert!(agents["scope"].as_str().unwrap().contains("tool(cls=\"side_effect\")"), "{agents}");
    let plain = p.ok(&["agents"], &[]);
    assert!(plain.contains("probation") && plain.contains("tool(cls=\"side_effect\")"), "{plain}");

    // An agent re-signs a better ledger with its own key: ignored, with a warning.
    let mut forged = file.clone();
    forged.entries.iter_mut().for_each(|e| e.distinct_traces = 99);
    let forged = LedgerFile::sign(forged.entries, 1, &retrace_core::ledger::signing_key(OTHER_KEY).unwrap());
    std::fs::write(p.path("ledger.json"), serde_json::to_vec(&forged).unwrap()).unwrap();
    let (lowest, agents) = rung(&p);
    assert_eq!(lowest, "unproven");
    assert!(agents["ledger_warning"].as_str().unwrap().contains("another key"), "{agents}");
    let warned = p.retrace(&["agents"], &[]);
    assert!(text(&warned.stderr).contains("ignored"), "{}", text(&warned.stderr));
}

#[test]
fn approve_needs_a_known_id_and_a_reason() {
    let p = Project::new("");
    // With no store nothing is held: an empty list, and no store made.
    assert_eq!(json(&p.ok(&["approve", "--pending", "--json"], &[])), serde_json::json!([]));
    assert!(!p.path("home").exists(), "listing made no store");
    let both = p.retrace(&["approve", "ap_nope", "--pending"], &[]);
    assert_eq!(both.status.code(), Some(2), "an id and --pending: {}", text(&both.stderr));
    let json = p.retrace(&["approve", "ap_nope", "--reason", "x", "--json"], &[]);
    assert_eq!(json.status.code(), Some(2), "--json without --pending: {}", text(&json.stderr));
    let nowhere = p.retrace(&["approve", "ap_nope", "--reason", "checked"], &[]);
    assert_eq!(nowhere.status.code(), Some(2), "{}", text(&nowhere.stderr));
    assert!(text(&nowhere.stderr).contains("no store at"), "{}", text(&nowhere.stderr));
    // `agents` needs no store: the rungs come from the signed ledger.
    let lonely = p.retrace(&["agents"], &[]);
    assert!(
        lonely.status.success() && text(&lonely.stderr).contains("no store here"),
        "{}",
        text(&lonely.stderr)
    );
    assert_eq!(p.retrace(&["record", "--", "true"], &[]).status.code(), Some(0));
    let unknown = p.retrace(&["approve", "ap_nope", "--reason", "checked"], &[]);
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown.stderr));
    assert!(text(&unknown.stderr).contains("no held side effect ap_nope"), "{}", text(&unknown.stderr));
    let blank = p.retrace(&["approve", "ap_nope", "--reason", " "], &[]);
    assert_eq!(blank.status.code(), Some(2));
    let missing = p.retrace(&["approve", "ap_nope"], &[]);
    assert_eq!(missing.status.code(), Some(2));
    let agents = p.ok(&["agents"], &[]);
    assert!(agents.contains("not governed") && agents.contains("tool(cls=\"side_effect\")"), "{agents}");

    // A call held by a run that has ended can't be released any more: exit 1, nothing decided.
    let store = retrace_store::open_store(&retrace_store::StoreConfig::in_home(&p.path("home"))).unwrap();
    let run = store.runs().unwrap().pop().unwrap();
    let held = retrace_store::ledger::ApprovalRecord {
        id: "ap_ended".into(),
        run: run.id.clone(),
        agent: "pub".into(),
        tool: "publish".into(),
        key: retrace_core::Digest::of(b"publish"),
        rung: "probation".into(),
        why: "below the bar".into(),
        requested_at_ms: 1,
        decision: None,
    };
    store.approval_request(&held).unwrap();
    let late = p.retrace(&["approve", "ap_ended", "--reason", "too late"], &[]);
    assert_eq!(late.status.code(), Some(1), "{}", text(&late.stderr));
    let said = text(&late.stderr);
    assert!(
        said.contains(&format!("run {} has ended (ok)", run.id)) && said.contains("run the program again"),
        "{said}"
    );
    assert_eq!(store.approval("ap_ended").unwrap().unwrap().decision, None, "nothing decided");
    // Nor is it listed as waiting: the list says one more is held by an ended run.
    let listed = p.retrace(&["approve", "--pending"], &[]);
    assert!(listed.status.success() && text(&listed.stdout).is_empty(), "{}", text(&listed.stdout));
    assert!(text(&listed.stderr).contains("1 more held by runs that have ended"), "{}", text(&listed.stderr));
}

/// Before the first gate there is no store: `ledger show` is an empty ledger (QA26 D6: exit 2);
/// `ledger export -o` makes the file's folder, as `gate --junit` does (QA26 D7).
#[test]
fn ledger_show_without_a_store_is_empty_and_export_makes_its_folder() {
    let p = Project::new("[project]\nname = \"billing\"\n");
    assert_eq!(json(&p.ok(&["ledger", "show", "--json"], &[])), serde_json::json!([]));
    assert!(!p.path("home").exists(), "showing made no store");
    record(&p, "a");
    p.ok(&["gate", "traces"], &[]);
    p.ok(&["ledger", "export", "-o", "ci/signed/ledger.json"], &[("RETRACE_LEDGER_KEY", KEY)]);
    let file = json(&std::fs::read_to_string(p.path("ci/signed/ledger.json")).unwrap());
    assert_eq!(file["entries"][0]["agent"], "planner", "{file}");
}
