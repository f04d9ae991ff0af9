//! `fork` of a program: the edits it takes, refused before anything runs when they can't
//! apply, and what it says when its program fails.
use std::time::Duration;

use super::launch::run_of;
use super::*;

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
        .map(|r| r.split(':').next().unwrap().to_owned())
        .unwrap();
    home.run(&["replay", &fork]).expect(0, &["edited by hand"], &["ok"]);
    // Imported without its source, the fork can't be replayed or forked: said before the
    // program runs, an input error (QA35 D1: every step failed and it read as a divergence).
    let file = home.file("fork-only.jsonl");
    home.run(&["export", &fork, "-o", file.to_str().unwrap()]).expect(0, &[], &[]);
    let elsewhere = Home::new();
    elsewhere.run(&["import", file.to_str().unwrap()]).expect(
        0,
        &[],
        &[&format!("is a fork of run {run}, which this store doesn't hold")],
    );
    let missing = format!("run {fork} is a fork of run {run}, which this store doesn't hold");
    elsewhere.run(&["replay", &fork]).expect(2, &[], &[&missing, &format!("import {run}'s trace too")]);
    elsewhere.run(&["fork", &fork, "--at", "1"]).expect(2, &[], &[&missing]);
    let runs = elsewhere.run(&["runs", "--json"]).stdout();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&runs).unwrap().as_array().unwrap().len(),
        1,
        "{runs}"
    );
    // The edited step is served as `recorded`: show says whose output it is (QA25 D5).
    home.run(&["show", &fork]).expect(0, &["[edited]"], &[]);
    home.run(&["show", &fork, "--seq", "1"]).expect(
        0,
        &["edited", "its output is the edit's, not the source's: model-output:1=@sha256:"],
        &[],
    );
    // The edited response keeps the source's headers but those of its old body (QA28 S2: only
    // content-type, so a program reading its request id got none).
    let headers = |run: &str| {
        let shown = home.run(&["show", run, "--seq", "1", "--json"]).expect(0, &[], &[]).json();
        shown["output"]["json"]["headers"].to_string()
    };
    let (source, edited) = (headers(&run), headers(&fork));
    assert!(source.contains("x-request-id") && edited.contains("x-request-id"), "{source}\n{edited}");
    assert!(!edited.contains("content-length"), "{edited}");

    // A streamed answer can't be replaced by a plain body: said before anything runs.
    let streamed = record(&["stream"]);
    home.run(&["fork", &streamed, "--edit", &edit]).expect(2, &[], &["streamed response"]);

    // What an edit says in its own text is masked before the fork stores it, and said so.
    let forked = home.run(&["fork", &run, "--json", "--edit", "param:default.user=ada@example.com"]);
    forked.expect(0, &[], &["edit param:default.user=rtk_email_", "stored as tokens"]);
    assert!(!forked.stderr().contains("ada@example.com"), "{}", forked.stderr());
    let last = forked.stdout().lines().last().map(str::to_owned).unwrap_or_default();
    let outcome: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(outcome["exit_status"], 0, "{outcome}");
    let warned = outcome["warnings"].as_array().unwrap().iter().filter_map(|w| w.as_str());
    assert!(warned.into_iter().any(|w| w.contains("stored as tokens")), "scripts see it too: {outcome}");
    let fork = outcome["fork"].as_str().unwrap().to_owned();
    home.run(&["show", &fork, "--json"]).expect(0, &["param:default.user=rtk_email_"], &[]);
    // A fork stores the upstreams it called (its source's here), so a fork of it calls them too,
    // not the public API (QA22 D1).
    let shown = home.run(&["show", &fork, "--json"]).expect(0, &[], &[]).json();
    assert_eq!(shown["run"]["upstreams"]["openai"], upstream.as_str(), "{shown}");
    let again = home.run(&["fork", &fork, "--edit", "param:default.user=someone-else"]);
    again.expect(0, &["chat.completion"], &["1 changed"]);
    for file in ["retrace.db", "retrace.db-wal"] {
        let bytes = std::fs::read(home.file(file)).unwrap_or_default();
        assert!(!bytes.windows(15).any(|w| w == b"ada@example.com"), "{file} holds the email");
    }
    // `[prices]` of the project's retrace.toml prices the recording's model calls, over the
    // built-in table (QA32 D1: only the demo read it).
    std::fs::write(home.file("retrace.toml"), "[prices]\n\"gpt-sim\" = { input = 1000000, output = 0 }\n")
        .unwrap();
    let priced = Ran(home
        .command(&[
            "record",
            "--json",
            "--upstream-openai",
            &upstream,
            "--",
            "python3",
            program.to_str().unwrap(),
        ])
        .current_dir(home.dir.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap());
    priced.expect(0, &[], &[]);
    let shown = home.run(&["show", &run_of(&priced), "--json"]).expect(0, &[], &[]).json();
    let usage = &shown["events"][0]["usage"];
    assert_eq!(usage["cost_usd"].as_f64(), usage["input_tokens"].as_f64(), "a dollar a token: {shown}");
    runtime.block_on(providers.stop());
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
    // A query selects recordings: one only forks match says so, and how to name them.
    let named = home.run(&["record", "--json", "--name", "nightly", "--", "true"]);
    named.expect(0, &[], &[]);
    home.run(&["fork", &run_of(&named), "--", "true"]).expect(0, &[], &[]);
    home.run(&["fork", "--runs", "name~fork of nightly", "--", "true"]).expect(
        2,
        &[],
        &["--runs name~fork of nightly: no recorded run matches (1 fork and 0 replays do", "name them by id"],
    );
    // `runs --name` lists a recording's forks with it: they go by its name (QA21 D1).
    let listed = home.run(&["runs", "--name", "nightly", "--json"]);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&listed.stdout()).unwrap();
    let modes: Vec<&str> = listed.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["record", "fork"], "{listed:#?}");
}

/// A `prompt:` edit naming a version missing from the template's folder in the program's
/// prompts folder is refused before the program runs (it would stop at the agent's first
/// `template()` and the other agents would wait out the stall timeout); where the program
/// keeps no such folder (the pipeline demo writes its templates elsewhere) nothing is checked.
#[test]
fn a_prompt_edit_naming_a_missing_version_is_refused_before_the_program_runs() {
    let home = Home::new();
    let demo = home.command(&["demo", "pipeline"]).current_dir(home.dir.path()).stdin(Stdio::null()).output();
    assert!(demo.unwrap().status.success());
    let recorded: Vec<String> =
        runs_of(&home).into_iter().filter(|(_, mode, _)| mode == "record").map(|(id, _, _)| id).collect();
    let run = &recorded[0];
    let fork = |version: &str| {
        let edit = format!("prompt:critic={version}");
        Ran(home.command(&["fork", run, "--edit", &edit]).current_dir(home.dir.path()).output().unwrap())
    };
    fork("v2").expect(0, &[], &["retrace: fork "]);
    std::fs::create_dir_all(home.file("prompts/critique")).unwrap();
    std::fs::write(home.file("prompts/critique/v1.txt"), "Critique {draft}.").unwrap();
    let started = std::time::Instant::now();
    fork("v9").expect(2, &[], &["prompt:critic=v9: there is no", "versions of critique there: v1"]);
    assert!(started.elapsed() < Duration::from_secs(10), "refused before anything ran");
}

/// A fork's trace imports alone (it holds the events it inherits), but replaying it reads its
/// source: it was imported with them (a fork's trace carries the events it inherits, SPEC §2),
/// so without its source in the store it is still a whole run: `show --seq` and `knew` of an
/// inherited step and `replay` read the fork's own copy (QA22 D4: they said "no seq 3", "no run
/// SOURCE" and refused).
#[test]
fn a_fork_imported_without_its_source_reads_and_replays_whole() {
    const FORK: &str = "01clifork0000000000000000a";
    let source = conversation(RUN, 2);
    let mut b = Builder::new(FORK);
    b.push("planner", retrace_core::EventType::ToolCall, Some("t"), None, Some(b"{}".to_vec()), |_| {});
    let mut fork = b.finish(retrace_core::run::RunMode::Fork);
    let at = 4;
    // After the planner's clock in the events it inherits.
    (fork.events[0].seq, fork.events[0].lamport) = (at, 100);
    fork.events[0].seal(Some(source.events[at as usize - 2].hash)).unwrap();
    fork.meta.source_run = Some(RUN.to_owned());
    fork.meta.fork_at = Some(at);
    fork.meta.head = Some(fork.events[0].hash);
    fork.meta.command = Some(retrace_core::run::Command { argv: vec!["true".into()], cwd: ".".into() });
    let both = Home::with(&source);
    fork.commit(&*open_store(&StoreConfig::in_home(both.dir.path())).unwrap());
    let file = both.file("fork.jsonl");
    both.run(&["export", FORK, "-o", file.to_str().unwrap()]).expect(0, &[], &[]);

    let alone = Home::new();
    alone.run(&["import", file.to_str().unwrap()]).expect(0, &[], &[]);
    let inherited = alone.run(&["show", FORK, "--seq", "2", "--json"]).expect(0, &[], &[]).json();
    assert_eq!(inherited["event"]["seq"], 2, "{inherited}");
    alone.run(&["knew", FORK, "3"]).expect(0, &[], &[]);
    alone.run(&["knew", FORK, "0"]).expect(2, &[], &[&format!("run {FORK} has no event 0")]);
    // `true` takes none of its steps: steps left, not "no run".
    alone.run(&["replay", FORK]).expect(1, &[], &["steps_left"]);
    // With the source imported too, the same replay runs the same.
    let source_file = both.file("source.jsonl");
    both.run(&["export", RUN, "-o", source_file.to_str().unwrap()]).expect(0, &[], &[]);
    alone.run(&["import", source_file.to_str().unwrap()]).expect(0, &[], &[]);
    alone.run(&["replay", FORK]).expect(1, &[], &["steps_left"]);
}

/// An edit refused for not fitting the run is named as the user typed it (`@out.json`), not as
/// the stored blob its file became (`@sha256:…`).
#[test]
fn a_refused_edit_is_named_with_the_file_the_user_typed() {
    let home = Home::new();
    home.run(&["demo", "single", "--runs", "1"]).expect(0, &[], &[]);
    let recorded: Vec<String> =
        runs_of(&home).into_iter().filter(|(_, mode, _)| mode == "record").map(|(id, _, _)| id).collect();
    std::fs::write(home.file("out.json"), r#"{"rows": []}"#).unwrap();
    let file = home.file("out.json");
    let edit = format!("tool-output:5=@{}", file.display());
    let refused = home.run(&["fork", &recorded[0], "--edit", &edit]);
    refused.expect(2, &[], &[&format!("{edit}: seq 5 is a model_call")]);
    assert!(!refused.stderr().contains("sha256:"), "{}", refused.stderr());
}
