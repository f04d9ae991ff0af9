//! `record`, `replay` and `fork` of a program: what they launch, what it leaves, what replay says.
use std::time::{Duration, Instant};

use super::*;

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
        Ran(c.stdin(Stdio::null()).output().unwrap())
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

    // Its replay, once the run holds tokens, needs the vault's key too: refused before the
    // program starts, not a failure at every step reported as a divergence.
    let run = runs_of(&home).into_iter().map(|(id, _, _)| id).next_back().unwrap();
    let store = open_store(&StoreConfig::in_home(home.dir.path())).unwrap();
    let mut meta = store.run(&run).unwrap();
    meta.holds_tokens = true;
    store.update_run(&meta).unwrap();
    drop(store);
    let replay = |vault: Option<&str>| {
        let mut c = home.command(&["replay", &run]);
        c.current_dir(project.path()).env_remove("RETRACE_MASK_KEY").env_remove("RETRACE_VAULT_KEY");
        if let Some(key) = vault {
            c.env("RETRACE_VAULT_KEY", key);
        }
        Ran(c.stdin(Stdio::null()).output().unwrap())
    };
    replay(None).expect(2, &[], &["rule(s) acct hand the program the originals", "RETRACE_VAULT_KEY"]);
    replay(Some(vault_key)).expect(0, &[], &["ok"]);
    // A fork too: refused before a fork run exists or its program starts.
    let before = runs_of(&home).len();
    let mut fork = home.command(&["fork", &run, "--at", "1"]);
    fork.current_dir(project.path()).env_remove("RETRACE_MASK_KEY").env_remove("RETRACE_VAULT_KEY");
    Ran(fork.stdin(Stdio::null()).output().unwrap()).expect(
        2,
        &[],
        &["can't fork", "rule(s) acct hand the program the originals"],
    );
    assert_eq!(runs_of(&home).len(), before, "nothing created");

    // Its trace file can't be gated: the originals stay in the vault of the store that recorded
    // it. Said up front, as a trace that could not be replayed (exit 2), not as a divergence.
    let file = home.file("vaulted.jsonl");
    home.run(&["export", &run, "-o", file.to_str().unwrap()]).expect(0, &[], &[]);
    let mut gate = home.command(&["gate", file.to_str().unwrap()]);
    gate.current_dir(project.path()).env("RETRACE_VAULT_KEY", vault_key);
    Ran(gate.stdin(Stdio::null()).output().unwrap()).expect(
        2,
        &["which a trace file doesn't carry"],
        &["could not be replayed"],
    );
}

/// The run a `record --json` printed last.
pub(crate) fn run_of(recorded: &Ran) -> String {
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
    // `show` of the diverged replay, which stores no events of its own, shows the report.
    let runs: serde_json::Value = serde_json::from_str(&home.run(&["runs", "--json"]).stdout()).unwrap();
    let replay =
        runs.as_array().unwrap().iter().find(|r| r["status"] == "diverged").expect("the diverged replay");
    let line = diverged.stderr().lines().find(|l| l.contains("divergence [")).unwrap().to_owned();
    let reported = line[line.find("divergence [").unwrap()..].to_owned();
    home.run(&["show", replay["id"].as_str().unwrap()]).expect(0, &["replay diverged", &reported], &[]);
    // `knew` of a replay, which heard what its source's log says, points at the source.
    let hint = format!("retrace knew {run} 3");
    home.run(&["knew", replay["id"].as_str().unwrap(), "3"]).expect(2, &[], &["is a replay of", &hint]);

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

    // Which edits made the fork is in its timeline's and the diff's headers, and the JSON.
    let f = fork["fork"].as_str().unwrap().to_owned();
    assert_eq!(fork["divergence"], serde_json::Value::Null, "{fork}");
    home.run(&["show", &f]).expect(0, &["edits model:reviewer=sim-2"], &[]);
    home.run(&["diff", &run, &f]).expect(0, &["fork of", "edits: model:reviewer=sim-2"], &[]);
    // A fork of that fork, gated beside it without the first source: the error follows the
    // chain to the run whose trace is missing.
    let ff = home.run(&["fork", &f, "--json"]);
    let ff: serde_json::Value = serde_json::from_str(ff.stdout().lines().last().unwrap()).unwrap();
    let ff = ff["fork"].as_str().unwrap().to_owned();
    let traces = home.file("fork-traces");
    std::fs::create_dir(&traces).unwrap();
    for (id, name) in [(&f, "f.jsonl"), (&ff, "ff.jsonl")] {
        home.run(&["export", id, "-o", traces.join(name).to_str().unwrap()]).expect(0, &[], &[]);
    }
    let gated = home.run(&["gate", traces.to_str().unwrap()]);
    let said = format!("{}{}", gated.stdout(), gated.stderr());
    assert!(said.contains(&format!("is a fork of run {f} (")), "{said}");
    assert!(
        said.contains(&format!("itself a fork of run {run}, whose trace is not among the traces gated")),
        "{said}"
    );

    // Many runs, one the edit doesn't fit (no model call): skipped with why, the other forked.
    let empty = home.run(&["record", "--json", "--", "true"]);
    let empty = run_of(&empty);
    let many =
        home.run(&["fork", "--runs", &format!("{run},{empty}"), "--edit", "model:reviewer=sim-2", "--json"]);
    many.expect(0, &[], &[&format!("skipping {empty}"), "made no model call"]);
    let out = many.stdout();
    let summary: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(
        (summary["runs"].as_u64(), summary["forks"][0]["source"].as_str()),
        (Some(1), Some(run.as_str()))
    );
    assert_eq!(summary["skipped"][0]["source"], empty.as_str(), "{summary}");
    assert!(summary["skipped"][0]["reason"].as_str().unwrap().contains("made no model call"), "{summary}");
    // Past the reviewer's last model call the edit reaches nothing, and the fork says so.
    let shown: serde_json::Value =
        serde_json::from_str(&home.run(&["show", &run, "--json"]).stdout()).unwrap();
    let last = shown["events"].as_array().map(|e| e.len() as u64).unwrap_or_else(|| panic!("{shown}"));
    let late = home.run(&[
        "fork",
        &run,
        "--at",
        &(last + 1).to_string(),
        "--edit",
        "model:reviewer=sim-2",
        "--json",
    ]);
    late.expect(0, &[], &["warning: model:reviewer=sim-2 changed nothing"]);
    let report: serde_json::Value = serde_json::from_str(late.stdout().lines().last().unwrap()).unwrap();
    assert!(report["warnings"][0].as_str().unwrap().contains("changed nothing"), "{report}");
    assert_eq!(fork["warnings"], serde_json::json!([]), "the first fork's edit reached its steps: {fork}");
    // That late fork holds only inherited steps: a replay whose program takes none of them has
    // steps left, as for any run (it said "ok").
    let late_fork = report["fork"].as_str().unwrap().to_owned();
    home.run(&["replay", &late_fork, "--", "true"]).expect(1, &[], &["steps_left"]);
    // A fork whose program ends before the fork point took none of the source's steps: its
    // edit never applied, and it says so (QA22 D3: stored `ok`, its steps "same").
    let short =
        home.run(&["fork", &run, "--at", &last.to_string(), "--edit", "model:reviewer=sim-2", "--", "true"]);
    short.expect(1, &[], &["steps_left", "before the fork point"]);
    // A fork that failed decided nothing: no decision of it "moved" (QA22 D5).
    let failed =
        home.run(&["fork", "--runs", &run, "--edit", "model:reviewer=sim-2", "--json", "--", "false"]);
    failed.expect(1, &[], &["did not finish"]);
    let doc: serde_json::Value = serde_json::from_str(failed.stdout().lines().last().unwrap()).unwrap();
    assert_eq!(doc["runs_with_moved_decisions"], 0, "{doc}");
    assert_eq!(doc["forks"][0]["decisions"], serde_json::json!([]), "{doc}");
    // Two edits of one thing are refused.
    home.run(&["fork", &run, "--edit", "model:reviewer=sim-2", "--edit", "model:reviewer=sim-3"]).expect(
        2,
        &[],
        &["change the same thing"],
    );
    // An edit file holding a value a masking rule takes: stored as a token, and said so.
    let secret = home.file("secret.json");
    std::fs::write(&secret, r#"{"note": "mail bob@example.com"}"#).unwrap();
    let masked = home.run(&["fork", &run, "--edit", &format!("message:10=@{}", secret.display())]);
    assert!(masked.stderr().contains("1 value of"), "{}", masked.stderr());
    // Said before the fork runs, and once (QA14 S5).
    let said = masked.stderr();
    let (warned, forked) = (said.find("1 value of").unwrap(), said.find("retrace: forking").unwrap());
    assert!(warned < forked && said.matches("1 value of").count() == 1, "{said}");
    assert!(masked.stderr().contains("the program gets the tokens"), "{}", masked.stderr());
    // None it fits: nothing forked, exit 2.
    let none = home.run(&["fork", "--runs", &empty, "--edit", "model:reviewer=sim-2"]);
    none.expect(2, &[], &["fit none of the 1 runs"]);
    // With --json the document still says why each was skipped (QA15 S7).
    let none = home.run(&["fork", "--runs", &empty, "--edit", "model:reviewer=sim-2", "--json"]);
    none.expect(2, &[], &["fit none of the 1 runs"]);
    let doc: serde_json::Value = serde_json::from_str(none.stdout().lines().last().unwrap()).unwrap();
    assert_eq!((doc["runs"].as_u64(), doc["skipped"][0]["source"].as_str()), (Some(0), Some(empty.as_str())));
    assert!(doc["skipped"][0]["reason"].as_str().unwrap().contains("made no model call"), "{doc}");

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

#[test]
fn a_recording_with_no_step_replays_clean_and_a_program_that_cant_start_leaves_no_run() {
    let home = Home::new();
    let recorded = home.run(&["record", "--json", "--", "true"]);
    // It says what an empty recording may mean: a client that goes around the proxy (QA10 S3).
    recorded.expect(0, &[], &["(0 events)", "took no step through Retrace", "doesn't set base_url itself"]);
    let run = run_of(&recorded);
    // A program that failed has its own error: base_url is the wrong lead there (QA23 D4).
    let failed = home.run(&["record", "--", "sh", "-c", "exit 7"]);
    failed.expect(7, &[], &["(0 events)"]);
    assert!(!failed.stderr().contains("took no step"), "{}", failed.stderr());
    // Nothing was recorded and nothing was asked: no divergence (it was `steps_left`).
    home.run(&["replay", &run]).expect(0, &[], &["ok"]);
    // A different exit status still diverges.
    home.run(&["replay", &run, "--", "false"]).expect(1, &[], &["exit_status", "recorded exit status 0"]);

    home.run(&["replay", &run, "--", "no-such-program-5e1d"]).expect(
        2,
        &[],
        &["no-such-program-5e1d", "discarded: its program never started"],
    );
    // The one that never started leaves no run (a replay's run holds only its outcome, and
    // there is none), neither `failed` nor `running` until its lease lapses.
    let replays: Vec<_> = runs_of(&home).into_iter().filter(|(_, mode, _)| mode == "replay").collect();
    assert_eq!(replays.len(), 2, "{replays:?}");
    assert!(replays.iter().all(|(_, _, status)| status != "running" && status != "failed"), "{replays:?}");
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
    assert_eq!(runs_of(&home).len(), 4, "the two recordings and the two replays");

    // An empty provider key (a CI's missing secret) gets the placeholder, as an unset one does,
    // so an official client starts; a key that is set is left alone.
    for (given, expected) in [("", "retrace-replay-placeholder"), ("sk-mine", "sk-mine")] {
        let mut replay =
            home.command(&["replay", &run, "--", "sh", "-c", "printf %s \"$OPENAI_API_KEY\" > key.txt"]);
        replay.env("OPENAI_API_KEY", given).current_dir(home.dir.path());
        Ran(replay.stdin(Stdio::null()).output().unwrap()).expect(0, &[], &["ok"]);
        assert_eq!(std::fs::read_to_string(home.file("key.txt")).unwrap(), expected);
    }
}

#[test]
fn a_recorded_retrace_command_replays_with_this_binary_off_path() {
    let home = Home::new();
    // PATH without the build's folder: `retrace` is this executable all the same.
    let path = "/usr/bin:/bin";
    let recorded = Ran(home
        .command(&["record", "--json", "--", "retrace", "--version"])
        .env("PATH", path)
        .output()
        .unwrap());
    recorded.expect(0, &["retrace "], &["retrace --version"]);
    let run = run_of(&recorded);
    let replayed = Ran(home.command(&["replay", &run]).env("PATH", path).output().unwrap());
    replayed.expect(0, &["retrace "], &["ok"]);
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

    // Exported while still being recorded (`running`): export warns, and the gate takes the
    // file as an input to fix (export it again), not as a divergence of the program.
    let store = open_store(&StoreConfig::in_home(home.dir.path())).unwrap();
    let mut meta = store.run(&run).unwrap();
    meta.status = retrace_core::run::RunStatus::Running;
    store.update_run(&meta).unwrap();
    drop(store);
    let running = home.file("running.jsonl");
    let warning = format!(
        "run {run} is still being recorded: the file holds the {last} events stored when it was read"
    );
    home.run(&["export", &run, "-o", running.to_str().unwrap()]).expect(0, &[], &[&warning]);
    let header = std::fs::read_to_string(&running).unwrap();
    assert!(header.lines().next().unwrap().contains(r#""status":"running""#), "the file says so");
    let gated = home.run(&["gate", running.to_str().unwrap()]);
    gated.expect(
        2,
        &[&format!(
            "ERROR     {}: run {run} was still being recorded when it was exported",
            running.display()
        )],
        &["1 of 1 traces could not be replayed"],
    );
    assert!(gated.stdout().contains(&format!("retrace export {run} -o")), "{}", gated.stdout());
}

// A program Retrace launched does not outlive Retrace: `kill -9` of `retrace record` ends it
// (its recorder is gone, so every step it took would fail closed anyway).

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

/// An empty RETRACE_HOME is an unset one for `record` as for every other command, and
/// `RETRACE_STORE=sqlite://name.db` names a file in the current folder: both record, and the
/// store is where `runs` looks for it (the mask key once failed beside a bare file name).
#[test]
fn an_empty_home_and_a_bare_database_name_record_where_runs_finds_them() {
    let dir = tempfile::tempdir().unwrap();
    let retrace = |args: &[&str], var: (&str, &str)| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_retrace"));
        command.args(args).current_dir(dir.path()).stdin(Stdio::null());
        for name in ["RETRACE_STORE", "RETRACE_BLOBS", "RETRACE_URL", "RETRACE_RUN", "RETRACE_HOME"] {
            command.env_remove(name);
        }
        Ran(command.env(var.0, var.1).output().unwrap())
    };
    for var in [("RETRACE_HOME", ""), ("RETRACE_STORE", "sqlite://bare.db")] {
        retrace(&["record", "--name", "here", "--", "true"], var).expect(0, &[], &["ok (0 events)"]);
        retrace(&["runs"], var).expect(0, &["here", "record", "ok"], &[]);
    }
    assert!(dir.path().join(".retrace/retrace.db").is_file() && dir.path().join("bare.db").is_file());
    assert!(dir.path().join("mask.key").is_file(), "the bare database's key beside it");
    // A file where the store's folder goes is said as such (QA18 S5: "File exists").
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let home = file.join("home");
    retrace(&["record", "--", "true"], ("RETRACE_HOME", home.to_str().unwrap())).expect(
        2,
        &[],
        &["a-file is a file, not a folder", "RETRACE_HOME"],
    );
}

/// `--json`'s summary is the last line of standard output even after a program whose output
/// ends mid-line (`printf abc`): it starts a line of its own, and the program's bytes are kept.
#[test]
fn the_json_summary_is_a_line_of_its_own_after_output_that_ends_mid_line() {
    let home = Home::new();
    let recorded = home.run(&["record", "--json", "--", "printf", "abc"]);
    recorded.expect(0, &[], &[]);
    let out = recorded.stdout();
    let (program, summary) = out.trim_end_matches('\n').rsplit_once('\n').expect("two lines");
    assert_eq!(program, "abc", "{out:?}");
    let summary: serde_json::Value = serde_json::from_str(summary).unwrap();
    let run = summary["run"].as_str().unwrap();
    let replayed = home.run(&["replay", run, "--json"]);
    replayed.expect(0, &[], &[]);
    let out = replayed.stdout();
    let (program, summary) = out.trim_end_matches('\n').rsplit_once('\n').expect("two lines");
    assert_eq!(program, "abc", "{out:?}");
    let summary: serde_json::Value = serde_json::from_str(summary).unwrap();
    assert_eq!(summary["status"], "ok", "{summary}");
    // Output that ends its line gets no blank line before the summary.
    let whole = home.run(&["record", "--json", "--", "printf", "abc\\n"]).stdout();
    assert!(whole.starts_with("abc\n{"), "{whole:?}");
}

/// A run its launcher is still running is never taken for one whose recorder died, however long
/// the program goes without the step that would take the run's lease (a replay never takes
/// one): the launcher keeps it. Killed with SIGKILL, the launcher leaves its run `interrupted`
/// at the next command that opens the store, with no grace to wait out (QA5 S12).
#[test]
fn a_launched_run_lives_with_its_launcher_and_is_interrupted_once_it_dies() {
    let home = Home::new();
    home.run(&["record", "--", "true"]).expect(0, &[], &[]);
    let source = runs_of(&home)[0].0.clone();
    let launch = |args: &[&str], pid_file: &Path| {
        let script = format!("echo $$ > {}; exec sleep 120", pid_file.display());
        let mut argv = args.to_vec();
        argv.extend(["--", "sh", "-c", &script]);
        let child =
            home.command(&argv).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn();
        let child = child.unwrap();
        wait_for("the program to start", || read_pid(pid_file).is_some());
        (child, read_pid(pid_file).unwrap())
    };
    let mut launched = vec![
        launch(&["record"], &home.file("record.pid")),
        launch(&["replay", &source], &home.file("replay.pid")),
    ];
    // Long past the grace a run without lease or keeper gets (10 s), by its start time.
    let db = rusqlite::Connection::open(home.file("retrace.db")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db.execute("UPDATE runs SET started_at = 1 WHERE status = 'running'", []).unwrap();
    let statuses = |home: &Home| {
        let mut s: Vec<(String, String)> = runs_of(home)
            .into_iter()
            .filter(|(id, ..)| *id != source)
            .map(|(_, mode, status)| (mode, status))
            .collect();
        s.sort();
        s
    };
    let running = |mode: &str| (mode.to_owned(), "running".to_owned());
    assert_eq!(statuses(&home), [running("record"), running("replay")]);

    for (child, program) in &mut launched {
        child.kill().unwrap(); // SIGKILL: the launcher concludes nothing
        child.wait().unwrap();
        wait_for("the orphaned program to end", || !alive(*program));
    }
    let interrupted = |mode: &str| (mode.to_owned(), "interrupted".to_owned());
    assert_eq!(statuses(&home), [interrupted("record"), interrupted("replay")]);
}

/// A run deleted by another process as soon as it ended (a `gc` hook, say) leaves `record`
/// exiting with the program's status, saying what happened, not a usage error for the run it
/// can no longer read (QA7 D6). Here the program finishes its own run through the daemon's API
/// and deletes it before it exits.
#[test]
fn record_exits_with_the_programs_status_when_its_run_was_deleted_at_its_end() {
    let home = Home::new();
    let finish = "import os, urllib.request as u; \
        u.urlopen(u.Request(os.environ['RETRACE_URL'] + '/api/runs/' + os.environ['RETRACE_RUN'] + '/finish', \
        data=b'{}', method='POST')).read()";
    let script = format!(
        "python3 -c \"{finish}\" && {} delete \"$RETRACE_RUN\" && exit 3",
        env!("CARGO_BIN_EXE_retrace")
    );
    let ran = home.run(&["record", "--json", "--", "sh", "-c", &script]);
    ran.expect(
        3,
        &["\"deleted\":true", "\"exit_status\":3"],
        &["ended (exit status 3) and was deleted at once"],
    );
    assert!(runs_of(&home).is_empty());
}

/// A run is given by id; given its `--name` instead, the error lists the runs of that name
/// with their ids.
#[test]
fn a_run_given_by_its_name_is_refused_listing_the_runs_of_that_name() {
    let home = Home::new();
    home.run(&["record", "--name", "nightly", "--", "true"]).expect(0, &[], &[]);
    let id = runs_of(&home)[0].0.clone();
    for command in [&["replay", "nightly"][..], &["knew", "nightly", "1"], &["show", "nightly"]] {
        let ran = home.run(command);
        ran.expect(
            2,
            &[],
            &["no run matches nightly", "the runs named \"nightly\"", &format!("{id} (record ok)")],
        );
    }
    home.run(&["replay", "nosuch"]).expect(2, &[], &["list the runs in this store with `retrace runs`"]);
}

/// A request over `record --max-body` gets the proxy's 413 and is not recorded; the run keeps
/// its limit, so its replay refuses the same request the same way instead of diverging on a
/// step the recording doesn't hold (QA28 D1). Runs no upstream: the 413 comes first.
#[test]
fn a_replay_refuses_what_its_recording_refused_as_too_large() {
    let home = Home::new();
    let program = "import json, os, urllib.request, urllib.error\n\
        body = json.dumps({'model': 'gpt-4o', 'messages': [{'role': 'user', 'content': 'x' * 5000}]}).encode()\n\
        req = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', body, {'content-type': 'application/json'})\n\
        try:\n    urllib.request.urlopen(req); print('answered')\n\
        except urllib.error.HTTPError as e:\n    print('refused', e.code)\n";
    let recorded = home.run(&["record", "--json", "--max-body", "1000", "--", "python3", "-c", program]);
    recorded.expect(
        0,
        &["refused 413"],
        &["the recording proxy refused 1 request of the program, for its body: it is not in the run"],
    );
    assert!(!recorded.stderr().contains("took no step"), "{}", recorded.stderr());
    let run = run_of(&recorded);
    let meta: serde_json::Value =
        serde_json::from_str(&home.run(&["show", &run, "--json"]).stdout()).unwrap();
    assert_eq!(meta["run"]["max_body"], 1000, "{meta}");
    home.run(&["replay", &run]).expect(0, &["refused 413"], &[]);
    // A run recorded with the default limit stores none.
    let plain = home.run(&["record", "--json", "--", "true"]);
    let meta: serde_json::Value =
        serde_json::from_str(&home.run(&["show", &run_of(&plain), "--json"]).stdout()).unwrap();
    assert!(meta["run"].get("max_body").is_none(), "{meta}");
}
