//! `retrace diff` through the real binary: a fork against its source (and the other way round),
//! two unrelated runs, `--json`, `--limit`, unknown runs; `show` of a fork's inherited event.
#[path = "../../retrace-store/tests/trace_fixture/mod.rs"]
mod trace_fixture;

#[path = "common/ran.rs"]
mod ran;

use std::process::{Command, Stdio};

use ran::Ran;
use retrace_core::envelope::{Decision, Usage};
use retrace_core::run::RunMode;
use retrace_core::{Digest, Source};
use retrace_store::{open_store, Batch, BlobHint, BlobPut, StoreConfig};
use trace_fixture::{conversation, Fixture};

const SOURCE: &str = "01clidiffsource00000000000";
const FORK: &str = "01clidifffork0000000000000";
const OTHER: &str = "01clidiffother000000000000";

/// A planner/reviewer conversation of two turns (9 events), its model calls with usage.
fn source() -> Fixture {
    let mut run = conversation(SOURCE, 2);
    for (i, tokens) in [(0, 1000), (4, 2000)] {
        run.events[i].usage = Some(Usage {
            input_tokens: tokens,
            output_tokens: 100,
            cost_usd: Some(0.25),
            ..Default::default()
        });
    }
    run.reseal_from(0);
    run
}

/// A fork of [`source`] at seq 5: the second model call answered differently, live (1,500 of its
/// prompt tokens from the provider's prompt cache), and the reviewer rejected; the rest was served from the recording.
fn fork(source: &Fixture) -> (Fixture, BlobPut) {
    let mut run = conversation(FORK, 2);
    run.events[..4].clone_from_slice(&source.events[..4]);
    for e in &mut run.events[4..] {
        (e.origin_seq, e.source) = (Some(e.seq), Source::Recorded);
    }
    let revised = br#"{"choices":[{"message":{"content":"step 1, revised"}}]}"#.to_vec();
    let revised = BlobPut::new(revised, BlobHint::Raw);
    let call = &mut run.events[4];
    (call.output_ref, call.output_hash, call.source) =
        (Some(revised.digest()), Some(revised.digest()), Source::Live);
    call.usage = Some(Usage {
        input_tokens: 2100,
        output_tokens: 90,
        cost_usd: Some(0.5),
        cache_read_tokens: 1500,
        ..Default::default()
    });
    let decision = &mut run.events[8];
    decision.key = Digest::of(b"reject step:backfill");
    decision.decision = Some(Decision { action: "reject".into(), target: Some("step:backfill".into()) });
    run.reseal_from(4);
    run.meta.mode = RunMode::Fork;
    (run.meta.source_run, run.meta.fork_at) = (Some(SOURCE.into()), Some(5));
    run.meta.started_at_ms += 1_000;
    (run, revised)
}

/// A store folder holding the source, its fork and an unrelated longer run.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        let home = Home { dir: tempfile::tempdir().unwrap() };
        let store = open_store(&StoreConfig::in_home(home.dir.path())).unwrap();
        let source = source();
        source.commit(&*store);
        let (fork, revised) = fork(&source);
        store.create_run(&fork.meta).unwrap();
        let own = Batch {
            run_id: FORK.into(),
            events: fork.events[4..].to_vec(),
            blobs: vec![revised],
            cache: vec![],
        };
        store.commit(&own).unwrap();
        let mut other = conversation(OTHER, 3);
        other.meta.started_at_ms += 2_000;
        other.commit(&*store);
        home
    }

    fn run(&self, args: &[&str]) -> Ran {
        let mut command = Command::new(env!("CARGO_BIN_EXE_retrace"));
        command.args(args).env("RETRACE_HOME", self.dir.path()).stdin(Stdio::null());
        for var in ["RETRACE_STORE", "RETRACE_BLOBS", "RETRACE_URL", "RETRACE_RUN"] {
            command.env_remove(var);
        }
        Ran(command.output().unwrap())
    }
}

#[test]
fn a_fork_against_its_source_shows_what_changed_moved_and_cost() {
    let home = Home::new();
    let text = home
        .run(&["diff", "01clidiffs", "01clidifff"])
        .expect(
            0,
            &[
                "aligned by origin_seq: B is a fork of A at seq 5",
                "steps: 7 same, 2 changed, 0 only in A, 0 only in B",
                "changed (2):",
                "--- A seq 5 output",
                "+++ B seq 5 output",
                "-        \"content\": \"step 1\"",
                "+        \"content\": \"step 1, revised\"",
                "decisions that moved (1):",
                "tokens and cost",
                "$0.5000",
                "B inherited  1      1000          0                   100            $0.2500",
                "B live       1      2100          1500                90             $0.5000",
                "OF THEM CACHE READ: input tokens the provider's prompt cache served",
                "B inherited: A's live usage on the events before seq 5",
            ],
            &[],
        )
        .stdout();
    let row = |start: &str| text.lines().find(|l| l.trim_start().starts_with(start)).unwrap_or("").to_owned();
    let moved = row("reviewer  step:backfill");
    assert!(moved.contains("approve") && moved.ends_with("reject"), "{text}");
    let changed = row("5      5");
    assert!(changed.contains("planner") && changed.contains("model_call gpt-4o"), "{text}");
    let costs = (row("A live"), row("B live"), row("B saved"));
    assert!(costs.0.contains("3000") && costs.1.contains("2100") && costs.2.contains(" 0 "), "{text}");

    // Named the other way round: the roles swap.
    home.run(&["diff", FORK, SOURCE]).expect(
        0,
        &["aligned by origin_seq: A is a fork of B at seq 5", "A saved", "--- A seq 5 output"],
        &[],
    );
}

#[test]
fn json_limit_and_unrelated_runs() {
    let home = Home::new();
    let json: serde_json::Value =
        serde_json::from_str(&home.run(&["diff", SOURCE, FORK, "--json"]).expect(0, &[], &[]).stdout())
            .unwrap();
    assert_eq!(json["alignment"]["by"], "origin_seq");
    assert_eq!(json["counts"]["changed"], 2);
    assert_eq!(json["changed"][0]["seq_a"], 5);
    assert!(json["changed"][0]["diff"].as_str().unwrap().contains("+++ B seq 5 output"));
    assert_eq!(json["decisions"][0]["b"], "reject");
    assert_eq!(json["b"]["live"]["input_tokens"], 2100);
    assert_eq!(json["b"]["live"]["cache_read_tokens"], 1500);
    assert_eq!(json["b"]["live"]["cache_write_tokens"], 0);
    assert_eq!(json["a"]["live"]["cache_read_tokens"], 0);
    assert_eq!(json["b"]["inherited"]["steps"], 1);

    home.run(&["diff", SOURCE, FORK, "--limit", "1"]).expect(
        0,
        &["(showing 1 of 2; --limit N shows more)"],
        &[],
    );

    // With --json and no --limit every step is listed (the text cuts the list at 20).
    let long = "01clidifflong0000000000000";
    {
        let store = open_store(&StoreConfig::in_home(home.dir.path())).unwrap();
        let mut run = conversation(long, 30);
        run.meta.started_at_ms += 3_000;
        run.commit(&*store);
    }
    let all: serde_json::Value =
        serde_json::from_str(&home.run(&["diff", long, SOURCE, "--json"]).expect(0, &[], &[]).stdout())
            .unwrap();
    let only = all["counts"]["only_in_a"].as_u64().unwrap();
    assert!(only > 100, "{}", all["counts"]);
    assert_eq!(all["only_in_a"].as_array().unwrap().len() as u64, only, "the whole list");
    home.run(&["diff", long, SOURCE]).expect(
        0,
        &[&format!("(showing 20 of {only}; --limit N shows more)")],
        &[],
    );

    // A longer unrelated conversation: paired with the older run as source; more steps in B.
    home.run(&["diff", OTHER, SOURCE]).expect(
        0,
        &["aligned by key, then by type and name, with B (the older run) as source", "only in A (4):"],
        &[],
    );
}

#[test]
fn unknown_runs_are_usage_errors_and_help_teaches() {
    let home = Home::new();
    home.run(&["diff", SOURCE, "zzzz"]).expect(2, &[], &["error: no run", "hint: list the runs"]);
    home.run(&["diff", "nope-run", SOURCE]).expect(2, &[], &["error: no run"]);
    home.run(&["diff", SOURCE]).expect(2, &[], &["RUN_B"]);
    home.run(&["diff", "--help"]).expect(
        0,
        &["Usage: retrace diff", "origin_seq", "Examples:\n  retrace diff"],
        &[],
    );
}

/// `show --seq` on a fork reaches the events it inherits (they are its source's), and counts
/// them when a seq is past its end; so does `runs`.
#[test]
fn show_of_a_forks_inherited_event_is_its_sources() {
    let home = Home::new();
    let shown = home.run(&["show", SOURCE, "--seq", "2", "--json"]);
    shown.expect(0, &[], &[]);
    let fork = home.run(&["show", FORK, "--seq", "2", "--json"]);
    fork.expect(0, &[], &[]);
    let (a, b): (serde_json::Value, serde_json::Value) =
        (serde_json::from_str(&shown.stdout()).unwrap(), serde_json::from_str(&fork.stdout()).unwrap());
    assert_eq!(a["event"], b["event"], "the source's seq 2");
    assert_eq!(b["run"], FORK);
    home.run(&["show", FORK, "--seq", "5"]).expect(0, &["model_call"], &[]);
    home.run(&["show", FORK, "--seq", "10"]).expect(2, &[], &["has 9 events; there is no seq 10"]);

    // A fork that took no step of its own (`--at` past the end) still counts what it inherits.
    let empty = "01clidiffemptyfork00000000";
    let store = open_store(&StoreConfig::in_home(home.dir.path())).unwrap();
    let mut meta = source().meta;
    (meta.id, meta.mode, meta.source_run, meta.fork_at) =
        (empty.into(), RunMode::Fork, Some(SOURCE.into()), Some(10));
    store.create_run(&meta).unwrap();
    drop(store);
    let runs = home.run(&["runs", "--json"]);
    runs.expect(0, &[], &[]);
    let runs: serde_json::Value = serde_json::from_str(&runs.stdout()).unwrap();
    let listed = runs.as_array().unwrap().iter().find(|r| r["id"] == empty).unwrap().clone();
    assert_eq!(listed["events"], 9, "{listed}");
}

/// A replay run stores only its outcome: one that ended ok is its source's steps, the same
/// throughout, and no decision moved; one that diverged has no steps, its stored decisions,
/// and a note that says so; in the JSON too.
#[test]
fn a_replay_is_compared_by_what_it_reproduced() {
    use retrace_core::run::{FinalDecision, RunMeta, RunStatus};
    let home = Home::new();
    let (ok, bad) = ("01clidiffreplayok000000000", "01clidiffreplaybad00000000");
    {
        let store = open_store(&StoreConfig::in_home(home.dir.path())).unwrap();
        let source = store.run(SOURCE).unwrap();
        for (id, status) in [(ok, RunStatus::Ok), (bad, RunStatus::Diverged)] {
            let mut replay = RunMeta::new(id, RunMode::Replay, source.started_at_ms + 5_000);
            replay.source_run = Some(SOURCE.into());
            replay.status = status;
            if status == RunStatus::Ok {
                replay.decisions = source.decisions.clone();
            } else {
                replay.divergence = Some(serde_json::json!({"code": "step_mismatch", "seq": 5}));
                replay.decisions =
                    vec![FinalDecision { agent: "reviewer".into(), action: "hold".into(), target: None }];
            }
            store.create_run(&replay).unwrap();
        }
    }
    let same = home.run(&["diff", SOURCE, ok, "--json"]).expect(0, &[], &[]).json();
    assert_eq!(same["counts"], serde_json::json!({"same": 9, "changed": 0, "only_in_a": 0, "only_in_b": 0}));
    assert_eq!(same["decisions"], serde_json::json!([]), "{same}");
    assert!(same["notes"][0]
        .as_str()
        .unwrap()
        .contains("B is a replay of 01clidiffsource00000000000 that ended ok"));
    assert_eq!(same["b"]["live"]["steps"], 0, "a replay costs nothing: {same}");
    home.run(&["diff", ok, SOURCE]).expect(0, &["note: A is a replay", "steps: 9 same, 0 changed"], &[]);

    let diverged = home.run(&["diff", SOURCE, bad, "--json"]).expect(0, &[], &[]).json();
    let note = diverged["notes"][0].as_str().unwrap();
    assert!(
        note.contains("ended diverged (step_mismatch at seq 5)") && note.contains("diff 01clidiffsource"),
        "{note}"
    );
    let moved: Vec<(String, String)> = diverged["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["agent"].as_str().unwrap().to_owned(), d["b"].as_str().unwrap_or("-").to_owned()))
        .collect();
    assert!(moved.contains(&("reviewer".into(), "hold".into())), "its stored decision: {diverged}");
}
