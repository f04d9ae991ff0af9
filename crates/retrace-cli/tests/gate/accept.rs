//! `gate --accept`: re-recording a diverging trace beside it, refusing a re-recording that went
//! wrong, and what it prints for scripts.
use super::*;

#[test]
fn accept_rerecords_a_diverging_trace_beside_it_and_shows_the_diff() {
    let bench = Bench::new();
    let sim = Simulator::start();
    bench.record(&sim, "asker", &[]);
    let changed = ["--", "python3", "asker.py", "--variant", "terse"];
    let mut argv = vec!["gate", "traces", "--accept"];
    argv.extend(changed);
    bench.retrace(&argv, &[("CI", "true")]).expect(
        2,
        &[],
        &["refusing to run --accept under CI=true", "--force"],
    );
    // CI services set CI to their own name too (QA19 D7).
    bench.retrace(&argv, &[("CI", "woodpecker")]).expect(
        2,
        &[],
        &["refusing to run --accept under CI=woodpecker", "--force"],
    );
    assert!(!bench.path("traces/asker.accepted.jsonl").exists());

    // Without an API key the re-recorded program fails: nothing is written.
    bench.retrace(&argv, &[]).expect(1, &["not accepted traces/asker.jsonl", "exited with status 1"], &[]);
    assert!(!bench.path("traces/asker.accepted.jsonl").exists());
    let key = [("OPENAI_API_KEY", "sk-test-gate-never-stored")];
    bench.retrace(&argv, &key).expect(
        1,
        &[
            "DIVERGED  traces/asker.jsonl at seq 1",
            "accepted traces/asker.jsonl -> traces/asker.accepted.jsonl",
            "steps: ",
            "changed (",
        ],
        &["re-recording traces/asker.jsonl against live services"],
    );
    let old = read(&bench.path("traces/asker.jsonl"));
    assert!(read(&bench.path("traces/asker.accepted.jsonl")).contains("users.name (terse)"));
    std::fs::remove_file(bench.path("traces/asker.accepted.jsonl")).unwrap();

    // A program that shrugs off failed calls exits 0 against an upstream that isn't there: the
    // re-recording holds the proxy's own 502s, not the service's answers, and is refused.
    let nowhere = [
        "--upstream-openai",
        "http://127.0.0.1:1/v1",
        "--",
        "python3",
        "asker.py",
        "--variant",
        "terse",
        "--tolerant",
    ];
    let mut unreachable = vec!["gate", "traces", "--accept"];
    unreachable.extend(nowhere);
    bench.retrace(&unreachable, &key).expect(
        1,
        &[
            "not accepted traces/asker.jsonl",
            "2 model calls of the re-recording never got an answer from the upstream (seq 1, 2)",
            "502",
        ],
        &[],
    );
    assert!(!bench.path("traces/asker.accepted.jsonl").exists(), "nothing written");
    bench.retrace(&argv, &key).expect(
        1,
        &["accepted traces/asker.jsonl -> traces/asker.accepted.jsonl"],
        &[],
    );
    // Never over an existing file.
    bench.retrace(&argv, &key).expect(1, &["not accepted traces/asker.jsonl", "already exists"], &[]);
    assert_eq!(read(&bench.path("traces/asker.jsonl")), old, "the old trace is untouched");
    drop(sim);

    // The accepted trace passes against the changed program, with the upstream gone; --force
    // lets --accept run under CI (nothing diverges here, so nothing is re-recorded).
    let mut argv = vec!["gate", "traces/asker.accepted.jsonl", "--accept", "--force"];
    argv.extend(changed);
    bench.retrace(&argv, &[("CI", "true")]).expect(0, &["ok        traces/asker.accepted.jsonl"], &[]);
}

/// A trace kept for a failing program, whose fix makes it exit 0, is accepted: only another
/// failing status is refused, as a re-recording that went wrong (QA12 D10).
#[test]
fn accept_takes_a_rerecording_fixed_to_exit_0() {
    let bench = Bench::new();
    let home = bench.path("record-home");
    let home = home.to_str().unwrap();
    let ran = bench.retrace(&["record", "--json", "--", "sh", "-c", "exit 3"], &[("RETRACE_HOME", home)]);
    ran.expect(3, &[], &[]);
    let last: serde_json::Value = serde_json::from_str(ran.stdout().lines().last().unwrap()).unwrap();
    let run = last["run"].as_str().unwrap().to_owned();
    let file = bench.path("traces/failing.jsonl");
    bench.retrace(&["export", &run, "-o", file.to_str().unwrap()], &[("RETRACE_HOME", home)]).expect(
        0,
        &[],
        &[],
    );
    bench.retrace(&["gate", "traces", "--accept", "--", "sh", "-c", "exit 4"], &[]).expect(
        1,
        &["not accepted traces/failing.jsonl", "exited with status 4 where the trace recorded 3"],
        &[],
    );
    bench.retrace(&["gate", "traces", "--accept", "--", "sh", "-c", "exit 0"], &[]).expect(
        1,
        &["DIVERGED  traces/failing.jsonl", "accepted traces/failing.jsonl -> traces/failing.accepted.jsonl"],
        &[],
    );
    assert!(bench.path("traces/failing.accepted.jsonl").exists());
}

#[test]
fn accept_with_json_prints_one_document_holding_what_was_accepted() {
    let bench = Bench::new();
    let sim = Simulator::start();
    bench.record(&sim, "asker", &[]);
    let argv = ["gate", "traces", "--accept", "--json", "--", "python3", "asker.py", "--variant", "terse"];
    let accepted_file = bench.path("traces/asker.accepted.jsonl");

    // Refused (no API key: the re-recording fails): the refusal is in the document, its text on
    // standard error.
    let ran = bench.retrace(&argv, &[]);
    ran.expect(
        1,
        &[],
        &["DIVERGED  traces/asker.jsonl", "not accepted traces/asker.jsonl", "exited with status 1"],
    );
    let json = ran.json();
    assert_eq!(json["summary"]["diverged"], 1, "{json:#}");
    let entry = &json["accepted"][0];
    assert_eq!(entry["trace"], "traces/asker.jsonl", "{json:#}");
    assert_eq!(entry["file"], "traces/asker.accepted.jsonl", "{json:#}");
    assert_eq!(entry["status"], "not_accepted", "{json:#}");
    assert!(entry["error"]["message"].as_str().unwrap().contains("exited with status 1"), "{json:#}");
    assert!(!accepted_file.exists());

    // Accepted: the new file, its run and the diff are in the document.
    let key = [("OPENAI_API_KEY", "sk-test-gate-never-stored")];
    let ran = bench.retrace(&argv, &key);
    ran.expect(1, &[], &["accepted traces/asker.jsonl -> traces/asker.accepted.jsonl", "steps: "]);
    let json = ran.json();
    let entry = &json["accepted"][0];
    assert_eq!(entry["status"], "accepted", "{json:#}");
    assert_eq!(entry["file"], "traces/asker.accepted.jsonl", "{json:#}");
    assert_eq!(entry["exit_status"], 0, "{json:#}");
    let run = entry["run"].as_str().unwrap();
    assert!(read(&accepted_file).contains(run), "the run written is the one named");
    assert_eq!(entry["diff"]["b"]["id"], run, "{json:#}");
    assert!(entry["diff"]["counts"]["changed"].as_u64().unwrap() >= 1, "{json:#}");
    assert!(entry["error"].is_null(), "{json:#}");

    // Never over an existing file, and nothing re-recorded nor announced as being.
    let ran = bench.retrace(&argv, &key);
    ran.expect(1, &[], &["not accepted traces/asker.jsonl", "already exists"]);
    assert!(!ran.stderr().contains("re-recording"), "{}", ran.stderr());
    let json = ran.json();
    assert_eq!(json["accepted"][0]["status"], "not_accepted", "{json:#}");
    assert!(json["accepted"][0]["error"]["message"].as_str().unwrap().contains("already exists"));

    // `--junit -` holds standard output too: the accept report goes to standard error.
    let mut argv = argv.to_vec();
    argv.retain(|a| *a != "--json");
    argv.splice(3..3, ["--junit", "-"]);
    let ran = bench.retrace(&argv, &key);
    ran.expect(1, &[], &["not accepted traces/asker.jsonl"]);
    assert!(ran.stdout().trim_end().ends_with("</testsuites>"), "{}", ran.stdout());
    drop(sim);
}
