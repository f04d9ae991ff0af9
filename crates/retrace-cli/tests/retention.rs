//! The real `retrace` binary on retention and the vault: `retain`, `gc`, `vault reveal`,
//! `vault audit`, against a temporary RETRACE_HOME (which is also the working directory, for
//! `retrace.toml`).
#[path = "../../retrace-store/tests/trace_fixture/mod.rs"]
mod trace_fixture;

#[path = "common/ran.rs"]
mod ran;

use std::process::{Command, Stdio};

use ran::Ran;
use retrace_core::run::{Retention, RunMeta, RunMode, RunStatus};
use retrace_core::vault::VaultKey;
use retrace_store::vault::store_originals;
use retrace_store::{open_store, Store, StoreConfig};
use trace_fixture::{conversation, Fixture};

const KEPT: &str = "01retainkept00000000000000";
const EXPIRED: &str = "01retainexpired00000000000";
const SOURCE: &str = "01retainsource000000000000";
const FORK: &str = "01retainfork00000000000000";
const TOKEN: &str = "rtk_email_abcdefghijklmnopqrstuvwxyz";

struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home { dir: tempfile::tempdir().unwrap() }
    }

    fn store(&self) -> std::sync::Arc<dyn Store> {
        open_store(&StoreConfig::in_home(self.dir.path())).unwrap()
    }

    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Ran {
        let mut command = Command::new(env!("CARGO_BIN_EXE_retrace"));
        command.args(args).current_dir(self.dir.path()).env("RETRACE_HOME", self.dir.path());
        for var in ["RETRACE_STORE", "RETRACE_BLOBS", "RETRACE_URL", "RETRACE_RUN", "RETRACE_VAULT_KEY"] {
            command.env_remove(var);
        }
        command.env("USER", "tester");
        command.envs(env.iter().copied());
        Ran(command.stdin(Stdio::null()).output().unwrap())
    }
}

/// A pinned fork of `source` at seq `at`: two events of its own, continuing the source's chain.
fn pinned_fork(source: &Fixture, id: &str, at: u64) -> Fixture {
    let mut fork = trace_fixture::fork_of(source, id, at);
    fork.meta.retention = Retention::Pinned;
    fork
}

#[test]
fn the_new_commands_teach_with_help() {
    let home = Home::new();
    for args in [
        &["retain", "--help"][..],
        &["gc", "--help"],
        &["delete", "--help"],
        &["vault", "--help"],
        &["vault", "reveal", "--help"],
    ] {
        home.run(args, &[]).expect(0, &["Usage: retrace", "Examples:\n  "], &[]);
    }
    home.run(&["gc", "--help"], &[]).expect(0, &["routine_days", "--dry-run", "fork"], &[]);
    home.run(&["vault", "reveal", "--help"], &[]).expect(
        0,
        &["RETRACE_VAULT_KEY", "audit log", "Exit codes"],
        &[],
    );
    home.run(&["retain", "x", "forever"], &[]).expect(2, &[], &["routine", "pinned"]);
}

#[test]
fn vault_reveal_prints_the_original_and_every_attempt_is_audited() {
    let home = Home::new();
    let key = VaultKey::from_bytes([42; 32]);
    let text = key.to_base64();
    store_originals(&*home.store(), &key, None, &[(TOKEN, b"ada@example.com".to_vec())]).unwrap();
    let wrong = VaultKey::from_bytes([7; 32]).to_base64();
    let with_key = [("RETRACE_VAULT_KEY", text.as_str())];

    home.run(&["vault", "reveal", TOKEN], &with_key).expect(2, &[], &["a reason is required", "audit log"]);
    home.run(&["vault", "reveal", TOKEN, "--reason", "INC-42"], &[]).expect(
        2,
        &[],
        &["no vault key", "hint:"],
    );
    home.run(&["vault", "reveal", TOKEN, "--reason", "INC-42"], &[("RETRACE_VAULT_KEY", &wrong)]).expect(
        1,
        &[],
        &["does not open under vault key vk_"],
    );
    let unknown = "rtk_email_aaaaaaaaaaaaaaaaaaaaaaaaaa";
    home.run(&["vault", "reveal", unknown, "--reason", "INC-42"], &with_key).expect(
        1,
        &[],
        &["no original for rtk_email_aaaaaaaaaaaaaaaaaaaaaaaaaa"],
    );
    // Not shaped like a token at all: a usage error that says what a token looks like.
    for malformed in ["rtk_email_nope", "hello"] {
        home.run(&["vault", "reveal", malformed, "--reason", "INC-42"], &with_key).expect(
            2,
            &[],
            &["is not a token: a token is rtk_<kind>_<26 characters of a-z and 2-7>", "hint: copy the token"],
        );
    }
    // A malformed key is said once, not once more as its own cause.
    let bad = home.run(&["vault", "reveal", TOKEN, "--reason", "INC-42"], &[("RETRACE_VAULT_KEY", "bad!!")]);
    bad.expect(2, &[], &["RETRACE_VAULT_KEY is unusable"]);
    let said =
        String::from_utf8_lossy(&bad.0.stderr).lines().find(|l| l.starts_with("error:")).unwrap().to_owned();
    let (_, cause) = said.split_once("unusable: ").unwrap();
    let cause = cause.trim_end_matches(" (this attempt was written to the audit log)");
    assert_eq!(said.matches(cause).count(), 1, "{said}");
    let reason = "INC-42: which customer? liam.reason@example.com";
    let revealed = home.run(&["vault", "reveal", TOKEN, "--reason", reason], &with_key);
    revealed.expect(0, &[], &["revealed", "tester"]);
    assert_eq!(revealed.stdout(), "ada@example.com", "the original alone, byte for byte");

    let log = home.run(&["vault", "audit", "--json"], &[]).expect(0, &[], &[]).json();
    let actions: Vec<&str> = log.as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions.len(), 8, "{log}");
    assert!(actions[..7].iter().all(|a| *a == "reveal_refused") && actions[7] == "reveal", "{log}");
    assert!(log.as_array().unwrap().iter().all(|e| e["who"] == "tester" && e["role"] == "admin"), "{log}");
    // The reason is masked like anything persisted (QA12 D3).
    let logged = log[7]["reason"].as_str().unwrap();
    assert!(logged.starts_with("INC-42: which customer? rtk_email_"), "{log}");
    // Masking the reason made no mask key where the store had none (QA27 S3: a later replay
    // then named the new key as this machine's).
    assert!(!home.dir.path().join("mask.key").exists(), "no mask.key was generated");
    // The log says what the user was told: a malformed token is "not a token", not unknown.
    // By its length only: it is often the original, pasted instead of its token (QA12 D3).
    for (entry, malformed) in [(&log[4], "rtk_email_nope"), (&log[5], "hello")] {
        assert_eq!(entry["subject"], format!("(not a token: {} characters)", malformed.len()), "{log}");
        assert!(entry["outcome"].as_str().unwrap().contains("is not a token"), "{entry}");
    }
    assert!(!log.to_string().contains("ada@example.com"), "the log never holds the original");
    let token = home.run(&["vault", "audit", "--token", TOKEN, "--json"], &[]).json();
    assert_eq!(token.as_array().unwrap().len(), 5, "the other tokens' attempts are about other subjects");
    home.run(&["vault", "audit"], &[]).expect(0, &["ACTION", "reveal_refused", "tester", "INC-42"], &[]);
    let empty = Home::new();
    empty.store();
    empty.run(&["vault", "audit"], &[]).expect(0, &[], &["the audit log is empty"]);

    // --json: the original in a document (QA14 D6), audited like any reveal.
    let json = home.run(&["vault", "reveal", TOKEN, "--reason", "INC-43", "--json"], &with_key);
    assert_eq!(
        json.expect(0, &[], &["revealed"]).json(),
        serde_json::json!({"token": TOKEN, "original": "ada@example.com"})
    );
    let log = home.run(&["vault", "audit", "--json"], &[]).json();
    assert_eq!(log.as_array().unwrap().last().unwrap()["action"], "reveal", "{log}");
}

#[test]
fn retain_then_gc_deletes_only_what_expired_and_the_rest_still_verifies() {
    let home = Home::new();
    {
        let store = home.store();
        conversation(KEPT, 1).commit(&*store);
        conversation(EXPIRED, 3).commit(&*store);
        // Expired too, but a pinned fork inherits from it; it shares EXPIRED's 100 KB blob file.
        let source = conversation(SOURCE, 2);
        source.commit(&*store);
        pinned_fork(&source, FORK, 4).commit(&*store);
        let mut replay = RunMeta::new("01retainreplay000000000000", RunMode::Replay, 1_700_000_100_000);
        replay.source_run = Some(EXPIRED.into());
        replay.status = RunStatus::Ok;
        store.create_run(&replay).unwrap();
    }
    std::fs::write(
        home.dir.path().join("retrace.toml"),
        "[prices]\n\"x\" = { input = 1, output = 1 }\n\n[retention]\nblob_grace_minutes = 0\n",
    )
    .unwrap();

    let retained = home.run(&["retain", "01retainkept", "pinned", "--json"], &[]).expect(0, &[], &[]).json();
    assert_eq!(
        (retained["retention"].as_str(), retained["previous"].as_str()),
        (Some("pinned"), Some("routine"))
    );
    home.run(&["retain", "01retainreplay", "pinned"], &[]).expect(
        2,
        &[],
        &["is a replay", "retrace retain 01retainexpired"],
    );
    home.run(&["gc", "--dry-run", "--older-than", "100000"], &[]).expect(0, &["would delete 0 runs"], &[]);

    let planned = home.run(&["gc", "--dry-run", "--json"], &[]).expect(0, &[], &[]).json();
    assert_eq!(planned["runs_deleted"], serde_json::json!([EXPIRED, "01retainreplay000000000000"]));
    assert!(planned["bytes_freed"].as_u64().unwrap() > 0, "{planned}");
    home.run(&["gc", "--dry-run"], &[]).expect(
        0,
        &["would delete run 01retainexpired", "would be freed"],
        &[],
    );
    home.run(&["runs", "--json"], &[]).expect(0, &[EXPIRED], &[]);

    let done = home.run(&["gc", "--json"], &[]).expect(0, &[], &[]).json();
    for field in ["runs_deleted", "events_deleted", "blobs_deleted", "bytes_freed"] {
        assert_eq!(done[field], planned[field], "{field}: the dry run said what gc did");
    }
    assert_eq!(done["dry_run"], false);
    let runs = home.run(&["runs", "--json"], &[]).json();
    let left: Vec<(&str, &str)> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r["retention"].as_str().unwrap()))
        .collect();
    assert_eq!(left, [(KEPT, "pinned"), (SOURCE, "routine"), (FORK, "pinned")]);
    home.run(&["verify", "--all"], &[]).expect(0, &["ok: 3 runs"], &[]);
    home.run(&["export", KEPT], &[]).expect(0, &["retrace-trace/1"], &[]);
    home.run(&["export", FORK], &[]).expect(0, &["retrace-trace/1", SOURCE], &[]);
    home.run(&["gc"], &[]).expect(0, &["deleted 0 runs (0 events) and 0 blobs; 0 bytes freed"], &[]);

    std::fs::write(home.dir.path().join("retrace.toml"), "[retention]\nroutine_days = \"soon\"\n").unwrap();
    home.run(&["gc"], &[]).expect(2, &[], &["retrace.toml line 2", "whole number"]);
    // Not TOML at all: refused, naming the line, not read in part (QA21 D6).
    std::fs::write(home.dir.path().join("retrace.toml"), "[retention]\nroutine_days = soon\n").unwrap();
    home.run(&["gc"], &[]).expect(2, &[], &["retrace.toml line 2", "string values must be quoted"]);
}

#[test]
fn delete_removes_named_runs_whatever_their_tier_and_a_deleted_run_imports_again() {
    let home = Home::new();
    {
        let store = home.store();
        // Three turns: its third holds blobs the two-turn source doesn't.
        let mut kept = conversation(KEPT, 3);
        kept.meta.retention = Retention::Pinned;
        kept.commit(&*store);
        let source = conversation(SOURCE, 2);
        source.commit(&*store);
        pinned_fork(&source, FORK, 4).commit(&*store);
        let mut replay = RunMeta::new("01deletereplay000000000000", RunMode::Replay, 1_700_000_100_000);
        replay.source_run = Some(KEPT.into());
        replay.status = RunStatus::Ok;
        store.create_run(&replay).unwrap();
    }
    std::fs::write(home.dir.path().join("retrace.toml"), "[retention]\nblob_grace_minutes = 0\n").unwrap();
    let trace = home.dir.path().join("kept.jsonl");
    home.run(&["export", KEPT, "-o", trace.to_str().unwrap()], &[]).expect(0, &[], &[]);

    // A fork inherits its source's first events: the source alone is refused, naming the fork.
    home.run(&["delete", "01retainsource"], &[]).expect(
        2,
        &[],
        &["needed by fork run 01retainfork", "retrace delete 01retainfork00000000000000 01retainsource"],
    );
    home.run(&["delete", "01nosuchrun"], &[]).expect(2, &[], &["retrace runs"]);
    home.run(&["delete"], &[]).expect(2, &[], &["RUN"]);

    let planned =
        home.run(&["delete", "01retainkept", "--dry-run", "--json"], &[]).expect(0, &[], &[]).json();
    assert_eq!(planned["runs_deleted"], serde_json::json!([KEPT, "01deletereplay000000000000"]));
    assert!(planned["blobs_deleted"].as_u64().unwrap() > 0, "{planned}");
    home.run(&["runs", "--json"], &[]).expect(0, &[KEPT], &[]);
    let done = home.run(&["delete", "01retainkept", "--json"], &[]).expect(0, &[], &[]).json();
    for field in ["runs_deleted", "events_deleted", "blobs_deleted", "bytes_freed"] {
        assert_eq!(done[field], planned[field], "{field}: the dry run said what delete did");
    }
    let ids = |home: &Home| -> Vec<String> {
        let runs = home.run(&["runs", "--json"], &[]).json();
        runs.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids(&home), [SOURCE, FORK], "a pinned run goes when named, its replay with it");
    home.run(&["verify", "--all"], &[]).expect(0, &["ok: 2 runs"], &[]);

    // Delete, then import: how a run is replaced by a trace file of the same id.
    home.run(&["import", trace.to_str().unwrap()], &[]).expect(0, &[], &[]);
    home.run(&["export", KEPT], &[]).expect(0, &[], &[]);
    assert_eq!(
        home.run(&["export", KEPT], &[]).stdout(),
        std::fs::read_to_string(&trace).unwrap(),
        "the run is back as it was exported"
    );
    home.run(&["delete", "01retainfork", "01retainsource"], &[]).expect(
        0,
        &[
            "deleted run 01retainsource",
            "deleted run 01retainfork",
            "deleted 2 runs",
            "the database file keeps its size",
        ],
        &[],
    );
    assert_eq!(ids(&home), [KEPT]);
    home.run(&["verify", "--all"], &[]).expect(0, &["ok: 1 run"], &[]);

    // Under the default grace, the blobs of a run imported (stored) just now stay: said, with
    // how many, so "0 blobs" isn't taken for the content being gone (QA14 S2).
    std::fs::remove_file(home.dir.path().join("retrace.toml")).unwrap();
    let dry = home.run(&["delete", KEPT, "--json", "--dry-run"], &[]).expect(0, &[], &[]).json();
    let held = home.run(&["delete", KEPT, "--json"], &[]).expect(0, &[], &[]).json();
    // A dry run says as much as the delete then does (QA21 D5).
    assert_eq!(dry["blobs_in_grace"], held["blobs_in_grace"], "{dry} {held}");
    assert_eq!(held["blobs_deleted"], 0, "{held}");
    let in_grace = held["blobs_in_grace"].as_u64().unwrap();
    assert!(in_grace > 0, "{held}");
    home.run(&["import", trace.to_str().unwrap()], &[]).expect(0, &[], &[]);
    home.run(&["delete", KEPT], &[]).expect(
        0,
        &[&format!("{in_grace} blobs no run uses are kept for now"), "blob_grace_minutes", "retrace gc"],
        &[],
    );
    std::fs::write(home.dir.path().join("retrace.toml"), "[retention]\nblob_grace_minutes = 0\n").unwrap();
    let swept = home.run(&["gc", "--json"], &[]).expect(0, &[], &[]).json();
    assert_eq!(swept["blobs_deleted"].as_u64(), Some(in_grace), "{swept}");
}

#[test]
fn a_fork_recorded_here_imports_back_as_already_present() {
    let home = Home::new();
    {
        let store = home.store();
        let source = conversation(SOURCE, 2);
        source.commit(&*store);
        pinned_fork(&source, FORK, 4).commit(&*store);
    }
    // The fork stores its own events; its file holds the inherited ones too.
    let trace = home.dir.path().join("fork.jsonl");
    home.run(&["export", FORK, "-o", trace.to_str().unwrap()], &[]).expect(0, &[], &[]);
    let file = trace.to_str().unwrap();
    home.run(&["import", file], &[]).expect(0, &[FORK], &["already present with the same events"]);
    // Elsewhere the same file is the fork whole, and importing it again changes nothing either.
    let other = Home::new();
    other.run(&["import", file], &[]).expect(0, &[FORK], &["imported run"]);
    other.run(&["import", file], &[]).expect(0, &[FORK], &["already present"]);
    assert_eq!(other.run(&["export", FORK], &[]).stdout(), std::fs::read_to_string(&trace).unwrap());
}

#[test]
fn importing_a_file_with_a_stronger_tier_raises_the_stored_runs_and_a_weaker_one_leaves_it() {
    let home = Home::new();
    conversation(SOURCE, 2).commit(&*home.store());
    let routine = home.dir.path().join("routine.jsonl");
    let incident = home.dir.path().join("incident.jsonl");
    home.run(&["export", SOURCE, "-o", routine.to_str().unwrap()], &[]).expect(0, &[], &[]);
    home.run(&["retain", SOURCE, "incident"], &[]).expect(0, &[], &[]);
    home.run(&["export", SOURCE, "-o", incident.to_str().unwrap()], &[]).expect(0, &[], &[]);

    let other = Home::new();
    other.run(&["import", routine.to_str().unwrap()], &[]).expect(0, &[SOURCE], &["imported run"]);
    other.run(&["import", incident.to_str().unwrap()], &[]).expect(
        0,
        &[SOURCE],
        &["nothing imported but its retention, raised from routine to incident as the file has it"],
    );
    assert_eq!(other.store().run(SOURCE).unwrap().retention, Retention::Incident);
    // The routine file again: the run stays kept, and the output says only that it is there.
    let again = other.run(&["import", routine.to_str().unwrap()], &[]);
    again.expect(0, &[SOURCE], &["already present with the same events; nothing imported"]);
    assert!(!again.stderr().contains("raised"), "{}", again.stderr());
    assert_eq!(other.store().run(SOURCE).unwrap().retention, Retention::Incident);
}

#[test]
fn gc_compact_is_refused_while_a_run_is_running_and_then_shrinks_the_database() {
    let home = Home::new();
    const LIVE: &str = "01retainlive00000000000000";
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    {
        let store = home.store();
        conversation(KEPT, 1).commit(&*store);
        conversation(EXPIRED, 3).commit(&*store);
        let mut live = RunMeta::new(LIVE, RunMode::Record, now);
        live.status = RunStatus::Running;
        store.create_run(&live).unwrap();
        // Kept by this process, which outlives the commands below.
        store.keep_run(LIVE, &retrace_store::LeaseHolder::current()).unwrap();
    }
    std::fs::write(home.dir.path().join("retrace.toml"), "[retention]\nblob_grace_minutes = 0\n").unwrap();
    home.run(&["gc", "--help"], &[]).expect(0, &["--compact", "VACUUM"], &[]);
    home.run(&["retain", KEPT, "pinned"], &[]).expect(0, &[], &[]);

    home.run(&["gc", "--compact"], &[]).expect(
        2,
        &[],
        &["run 01retainlive00000000000000 is running", "retrace runs --status running", "without --compact"],
    );
    home.run(&["runs", "--json"], &[]).expect(0, &[EXPIRED], &[]);

    {
        let store = home.store();
        let mut live = store.run(LIVE).unwrap();
        live.status = RunStatus::Ok;
        live.retention = Retention::Pinned;
        store.update_run(&live).unwrap();
    }
    let planned = home.run(&["gc", "--compact", "--dry-run", "--json"], &[]).expect(0, &[], &[]).json();
    assert_eq!(planned["compacted"], serde_json::Value::Null, "{planned}");
    let done = home.run(&["gc", "--compact", "--json"], &[]).expect(0, &[], &[]).json();
    assert!(done["runs_deleted"].as_array().unwrap().contains(&serde_json::json!(EXPIRED)), "{done}");
    let (before, after) = (
        done["compacted"]["bytes_before"].as_u64().unwrap(),
        done["compacted"]["bytes_after"].as_u64().unwrap(),
    );
    assert!(after > 0 && after <= before, "{done}");
    home.run(&["gc", "--compact"], &[]).expect(0, &["deleted 0 runs", "compacted the database: "], &[]);
    home.run(&["verify", "--all"], &[]).expect(0, &["ok: 2 runs"], &[]);
}

/// A run whose stored record is damaged neither stops `gc` nor loses what it holds: `gc` keeps
/// it, its replay and every blob its events use, and says how to remove it; `delete` removes it
/// by a prefix of its id, with its replay, and the next `gc` frees its blobs.
#[test]
fn a_damaged_run_is_kept_by_gc_and_deleted_by_its_id() {
    const DAMAGED: &str = "01retaindamaged00000000000";
    const ITS_REPLAY: &str = "01retaindamagedreplay00000";
    let home = Home::new();
    {
        let store = home.store();
        conversation(EXPIRED, 3).commit(&*store);
        conversation(DAMAGED, 2).commit(&*store);
        let mut replay = RunMeta::new(ITS_REPLAY, RunMode::Replay, 1_700_000_100_000);
        replay.source_run = Some(DAMAGED.into());
        replay.status = RunStatus::Ok;
        store.create_run(&replay).unwrap();
    }
    std::fs::write(home.dir.path().join("retrace.toml"), "[retention]\nblob_grace_minutes = 0\n").unwrap();
    let db = rusqlite::Connection::open(home.dir.path().join("retrace.db")).unwrap();
    assert_eq!(db.execute("UPDATE runs SET meta = '{' || meta WHERE id = ?1", [DAMAGED]).unwrap(), 1);
    let missing_blobs = || -> i64 {
        db.query_row(
            "SELECT count(*) FROM events e JOIN runs r ON e.id >= r.pk << 32 AND e.id < (r.pk + 1) << 32 \
             WHERE r.id = ?1 AND ((e.output_ref IS NOT NULL AND e.output_ref NOT IN (SELECT digest FROM blobs)) \
             OR (e.request_ref IS NOT NULL AND e.request_ref NOT IN (SELECT digest FROM blobs)))",
            [DAMAGED],
            |r| r.get(0),
        )
        .unwrap()
    };

    let ran = home.run(&["gc", "--json"], &[]);
    let report = ran.expect(0, &[], &[&format!("`retrace delete {DAMAGED}` removes it")]).json();
    assert_eq!(report["runs_deleted"], serde_json::json!([EXPIRED]), "{report}: its replay stays with it");
    assert_eq!(report["unreadable_kept"], serde_json::json!([DAMAGED]));
    assert!(report["blobs_deleted"].as_u64().unwrap() > 0, "{report}: the expired run's blobs went");
    assert_eq!(missing_blobs(), 0, "every blob the damaged run's events use is kept");

    home.run(&["delete", "01retaindamaged", "--dry-run"], &[]).expect(2, &[], &["ambiguous"]);
    let ran = home.run(&["delete", &DAMAGED[..20], "--json"], &[]);
    let report = ran.expect(0, &[], &["record can't be read; deleting it by its id"]).json();
    assert_eq!(report["runs_deleted"], serde_json::json!([ITS_REPLAY, DAMAGED]), "oldest first");
    assert!(report["blobs_deleted"].as_u64().unwrap() > 0, "{report}: the damaged run's blobs went");
    let report = home.run(&["gc", "--json"], &[]).expect(0, &[], &[]).json();
    assert_eq!(report["unreadable_kept"], serde_json::json!([]));
    home.run(&["runs", "--json"], &[]).expect(0, &["[]"], &[]);
    home.run(&["verify", "--all"], &[]).expect(0, &[], &[]);
}
