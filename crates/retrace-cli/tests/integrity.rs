//! Damage found from the outside, on real SQLite stores in temp dirs: an event row edited in the
//! database, two blobs swapped, an export cut short, missing a blob line, with an edited event or
//! swapped blob texts. `verify --all` and `import` name the run, seq, digest or line; `import
//! --force` stores a damaged file so that `verify` can name what is wrong with it. A run whose
//! ack log recovery could not apply is flagged by `runs` and `verify`.
#[path = "../../retrace-store/tests/power_cut/mod.rs"]
mod power_cut;
#[path = "../../retrace-store/tests/trace_fixture/mod.rs"]
mod trace_fixture;

#[path = "common/ran.rs"]
mod ran;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ran::Ran;
use retrace_core::Digest;
use retrace_store::{open_store, StoreConfig};
use trace_fixture::conversation;

/// A RETRACE_HOME in a temp dir.
struct Home(tempfile::TempDir);

impl Home {
    fn new() -> Home {
        Home(tempfile::tempdir().unwrap())
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    fn file(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }

    fn run(&self, args: &[&str]) -> Ran {
        let mut command = Command::new(env!("CARGO_BIN_EXE_retrace"));
        command.args(args).env("RETRACE_HOME", self.path()).stdin(Stdio::null());
        for var in ["RETRACE_STORE", "RETRACE_BLOBS", "RETRACE_URL", "RETRACE_RUN"] {
            command.env_remove(var);
        }
        Ran(command.output().unwrap())
    }

    fn db(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(self.file("retrace.db")).unwrap()
    }
}

const SOUND: &str = "01sound0000000000000000000";
const DAMAGED: &str = "01damaged00000000000000000";

#[test]
fn verify_all_names_an_edited_event_row_and_two_swapped_blobs_in_sqlite() {
    let home = Home::new();
    let damaged = conversation(DAMAGED, 3);
    {
        let store = open_store(&StoreConfig::in_home(home.path())).unwrap();
        conversation(SOUND, 1).commit(&*store);
        damaged.commit(&*store);
    }
    home.run(&["verify", "--all"]).expect(0, &["ok: 2 runs", "18 events"], &[]);

    let db = home.db();
    // The tool call at seq 8 now claims another tool name; its hash no longer covers it.
    let edited = db
        .execute(
            "UPDATE events SET name = 'sql.querx' WHERE seq = 8 AND run_pk = (SELECT pk FROM runs WHERE id = ?1)",
            [DAMAGED],
        )
        .unwrap();
    assert_eq!(edited, 1);
    // The message bodies of seq 6 and seq 10 trade places in the blob table.
    let (a, b) = (damaged.events[5].request_ref.unwrap(), damaged.events[9].request_ref.unwrap());
    swap_blob_rows(&db, &a, &b);
    drop(db);

    let hash = format!("run {DAMAGED} seq 8: hash mismatch");
    let blob_a = format!("run {DAMAGED} seq 6 blob {a}");
    let blob_b = format!("run {DAMAGED} seq 10 blob {b}");
    home.run(&["verify", "--all"]).expect(1, &[&hash, &blob_a, &blob_b], &["verification found 3 problems"]);
    // Export refuses the damaged run at its edited event, the first damage in file order, and
    // still exports the sound one.
    home.run(&["export", DAMAGED, "-o", home.file("damaged.jsonl").to_str().unwrap()]).expect(
        1,
        &[],
        &[&hash],
    );
    assert!(!home.file("damaged.jsonl").exists(), "no partial file is left");
    home.run(&["export", SOUND, "-o", home.file("sound.jsonl").to_str().unwrap()]).expect(0, &[], &[]);
    assert!(!home.run(&["verify", "--all"]).stdout().contains(SOUND), "the sound run is not blamed");
    home.run(&["verify", SOUND]).expect(0, &["ok: run 01sound"], &[]);

    let json: serde_json::Value =
        serde_json::from_str(&home.run(&["verify", "--all", "--json"]).stdout()).unwrap();
    let problems: Vec<(String, Option<u64>, String)> = json["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["run"].as_str().unwrap().into(), p["seq"].as_u64(), p["kind"].as_str().unwrap().into()))
        .collect();
    let want = [(8, "hash"), (6, "blob_corrupt"), (10, "blob_corrupt")];
    for (seq, kind) in want {
        assert!(problems.contains(&(DAMAGED.into(), Some(seq), kind.into())), "{problems:?}");
    }
    assert_eq!((json["ok"].as_bool(), json["runs"].as_u64(), problems.len()), (Some(false), Some(2), 3));
}

/// Exchanges the stored bytes (whatever their kind: inline, packed, file) of two blob rows.
fn swap_blob_rows(db: &rusqlite::Connection, a: &Digest, b: &Digest) {
    type Row = (i64, i64, rusqlite::types::Value);
    let read = |d: &Digest| -> Row {
        db.query_row("SELECT kind, size, data FROM blobs WHERE digest = ?1", [&d.as_bytes()[..]], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap()
    };
    let (ra, rb) = (read(a), read(b));
    let write = |d: &Digest, (kind, size, data): Row| {
        db.execute(
            "UPDATE blobs SET kind = ?1, size = ?2, data = ?3 WHERE digest = ?4",
            rusqlite::params![kind, size, data, &d.as_bytes()[..]],
        )
        .unwrap();
    };
    write(a, rb);
    write(b, ra);
}

const RUN: &str = "01export000000000000000000";

/// An exported 3-turn conversation: its lines and where it was written.
fn exported() -> (Home, Vec<String>) {
    let home = Home::new();
    let store = open_store(&StoreConfig::in_home(home.path())).unwrap();
    conversation(RUN, 3).commit(&*store);
    drop(store);
    let file = home.file("good.jsonl");
    home.run(&["export", RUN, "-o", file.to_str().unwrap()]).expect(0, &[], &[]);
    let text = std::fs::read_to_string(&file).unwrap();
    (home, text.lines().map(str::to_owned).collect())
}

/// Writes `text` as `name` in `home`; its path.
fn write(home: &Home, name: &str, text: &str) -> String {
    let file = home.file(name);
    std::fs::write(&file, text).unwrap();
    file.to_str().unwrap().to_owned()
}

fn join(lines: &[String]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

fn digest_of_blob_line(line: &str) -> String {
    serde_json::from_str::<serde_json::Value>(line).unwrap()["blob"].as_str().unwrap().to_owned()
}

/// Imports `path` into a fresh store with `--force`, then verifies it there: `verify`'s result.
fn forced_then_verified(path: &str, warning: &str) -> Ran {
    let fresh = Home::new();
    fresh.run(&["import", "--force", path]).expect(0, &[RUN], &["warning:", warning, "imported anyway"]);
    // The run carries the mark wherever it is listed.
    fresh.run(&["runs"]).expect(0, &["ok!", "was imported with --force despite", "failed check"], &[]);
    let ran = fresh.run(&["verify", "--all"]);
    drop(fresh);
    ran
}

#[test]
fn a_truncated_export_is_refused_naming_the_line_and_force_keeps_its_whole_lines() {
    let (home, lines) = exported();
    let whole = join(&lines);
    let last = lines.len();
    let lost = digest_of_blob_line(&lines[last - 1]);
    let cut = write(&home, "cut.jsonl", &whole[..whole.len() - 30]);
    let fresh = Home::new();
    fresh.run(&["import", &cut]).expect(
        2,
        &[],
        &[
            &format!("cut.jsonl:{last}: truncated: the file ends inside line {last}"),
            "hint: `retrace import --force",
        ],
    );
    fresh.run(&["runs", "--json"]).expect(0, &["[]"], &[]);
    let verified = forced_then_verified(&cut, "ends inside line");
    verified.expect(1, &[&format!("run {RUN} seq"), &format!("blob {lost}")], &[]);
}

#[test]
fn an_export_missing_a_blob_line_names_the_blob_and_the_seq_that_needs_it() {
    let (home, mut lines) = exported();
    let at = lines.iter().position(|l| l.contains("\"base64\"")).expect("a binary tool output");
    let digest = digest_of_blob_line(&lines[at]);
    lines.remove(at);
    let path = write(&home, "missing.jsonl", &join(&lines));
    Home::new().run(&["import", &path]).expect(
        2,
        &[],
        &[
            "missing.jsonl:",
            "truncated: the header announces",
            &format!("blob {digest}, referenced by seq 4, is missing"),
        ],
    );
    forced_then_verified(&path, "is missing").expect(1, &[&format!("run {RUN} seq 4 blob {digest}")], &[]);
}

#[test]
fn the_good_file_imported_over_a_forced_damaged_copy_takes_its_place() {
    let (home, mut lines) = exported();
    let good = write(&home, "good-again.jsonl", &join(&lines));
    let at = lines.iter().position(|l| l.contains("\"base64\"")).expect("a binary tool output");
    lines.remove(at);
    let damaged = write(&home, "missing.jsonl", &join(&lines));
    let fresh = Home::new();
    fresh.run(&["import", "--force", &damaged]).expect(0, &[RUN], &["imported anyway"]);
    fresh.run(&["verify", "--all"]).expect(1, &[], &[]);
    // Not "already present": the stored copy lacks a blob this file holds.
    fresh.run(&["import", &good]).expect(
        0,
        &[RUN],
        &["was stored from a damaged file (imported with --force): replacing it", "imported run"],
    );
    fresh.run(&["verify", "--all"]).expect(0, &[], &[]);
    let runs = fresh.run(&["runs"]);
    assert!(!runs.stdout().contains("--force"), "{}", runs.stdout());
    fresh.run(&["import", &good]).expect(0, &[RUN], &["already present"]);

    // The same where an event was damaged, which makes the stored copy differ from the good
    // file's (QA40 D6: refused as a conflict).
    let (_, mut lines) = exported();
    let at = lines.iter().position(|l| l.contains("sql.query")).expect("a tool call");
    lines[at] = lines[at].replace("sql.query", "sql.querx");
    let edited = write(&home, "edited-event.jsonl", &join(&lines));
    let fresh = Home::new();
    fresh.run(&["import", "--force", &edited]).expect(0, &[RUN], &["imported anyway"]);
    fresh.run(&["import", &good]).expect(
        0,
        &[RUN],
        &["was stored from a damaged file (imported with --force): replacing it", "imported run"],
    );
    fresh.run(&["verify", "--all"]).expect(0, &[], &[]);
    // A damaged file never takes the place of a forced copy: it is checked whole first.
    fresh.run(&["import", "--force", &edited]).expect(1, &[], &[]);
}

#[test]
fn an_edited_event_line_is_refused_and_once_forced_verify_names_its_seq() {
    let (home, mut lines) = exported();
    assert!(lines[4].contains("\"seq\":4") && lines[4].contains("sql.query"), "{}", lines[4]);
    lines[4] = lines[4].replace("sql.query", "sql.querx");
    let path = write(&home, "edited.jsonl", &join(&lines));
    Home::new().run(&["import", &path]).expect(
        1,
        &[],
        &["edited.jsonl:5: hash mismatch at seq 4", "--force"],
    );
    forced_then_verified(&path, "hash mismatch at seq 4").expect(
        1,
        &[&format!("run {RUN} seq 4: hash mismatch")],
        &[],
    );
}

#[test]
fn swapped_blob_texts_are_refused_by_digest_and_once_forced_verify_finds_them_missing() {
    let (home, mut lines) = exported();
    let sends: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("backfill_ready") && l.starts_with("{\"blob\""))
        .map(|(i, _)| i)
        .collect();
    let (i, j) = (sends[0], sends[1]);
    let text = |l: &str| serde_json::from_str::<serde_json::Value>(l).unwrap()["text"].clone();
    let (ti, tj) = (text(&lines[i]), text(&lines[j]));
    let (di, dj) = (digest_of_blob_line(&lines[i]), digest_of_blob_line(&lines[j]));
    lines[i] = serde_json::json!({"blob": di, "text": tj}).to_string();
    lines[j] = serde_json::json!({"blob": dj, "text": ti}).to_string();
    let path = write(&home, "swapped.jsonl", &join(&lines));
    Home::new().run(&["import", &path]).expect(
        1,
        &[],
        &[&format!("swapped.jsonl:{}: digest mismatch for blob {di}", i + 1)],
    );
    let verified = forced_then_verified(&path, &format!("digest mismatch for blob {dj}"));
    verified.expect(1, &[&format!("run {RUN} seq 2 blob {di}"), &format!("run {RUN} seq 6 blob {dj}")], &[]);
}

/// A power cut under `RETRACE_DURABILITY=event` left a run's ack log that recovery can't apply
/// (the database lost more than the log still holds): `runs` marks the run and says why, in
/// the table and as `unrecovered` in `--json`, and `verify` names the log.
#[test]
fn a_run_whose_ack_log_cant_be_recovered_is_flagged_by_runs_and_verify() {
    let (live, home) = (tempfile::tempdir().unwrap(), Home::new());
    // 45 outputs of 60 KB lap the 1 MB log: what the database lost after seq 10 is gone from it.
    power_cut::record_then_lose(live.path(), home.path(), 45, 10, 60 << 10);
    home.db().execute("UPDATE leases SET holder = 'elsewhere:1:1', expires_at = 0", []).unwrap();
    let run = power_cut::RUN;

    let table = home.run(&["runs"]);
    table.expect(0, &[run, "running*", "may lack acknowledged events", "acklog"], &[]);
    let listed = home.run(&["runs", "--json"]);
    listed.expect(0, &[], &[]);
    let runs: serde_json::Value = serde_json::from_slice(&listed.0.stdout).unwrap();
    let why = runs[0]["unrecovered"].as_str().expect("the reason, as unrecovered");
    assert!(why.contains("acklog") && why.contains("could not apply"), "{why}");
    home.run(&["verify", run]).expect(1, &["acklog"], &[]);
}

/// A store holding one recording of `retrace demo single`, and its id.
fn demo_recording() -> (Home, String) {
    let home = Home::new();
    home.run(&["demo", "single", "--runs", "1"]).expect(0, &[], &[]);
    let runs: serde_json::Value = serde_json::from_str(&home.run(&["runs", "--json"]).stdout()).unwrap();
    let recorded = runs.as_array().unwrap().iter().find(|r| r["mode"] == "record").expect("a recording")
        ["id"]
        .as_str()
        .unwrap()
        .to_owned();
    (home, recorded)
}

/// The output blob of `run`'s first step that has one.
fn first_output(home: &Home, run: &str) -> Digest {
    let store = open_store(&StoreConfig::in_home(home.path())).unwrap();
    let events = store.events(run, 1, 1000).unwrap();
    events.iter().find_map(|e| e.output_ref).expect("a step with an output")
}

/// A replay whose recording can't be read (two of its output blobs swapped in the database)
/// judges nothing: it is an error naming the run to verify (exit 1: the stored run is damaged,
/// as verify says), never "ok" and never an
/// exit-status divergence made of the program's reaction to the failure.
#[test]
fn a_replay_that_cannot_read_its_recording_fails_naming_the_run() {
    let (home, recorded) = demo_recording();
    let outputs: Vec<Digest> = {
        let store = open_store(&StoreConfig::in_home(home.path())).unwrap();
        let events = store.events(&recorded, 1, 1000).unwrap();
        let mut outputs: Vec<Digest> = events.iter().filter_map(|e| e.output_ref).collect();
        outputs.dedup();
        outputs
    };
    assert!(outputs.len() >= 2, "the demo's steps have outputs");
    swap_blob_rows(&home.db(), &outputs[0], &outputs[1]);
    let verify = format!("retrace verify {recorded}");
    home.run(&["replay", &recorded]).expect(1, &[], &["could not be read to its end", "is damaged", &verify]);
}

/// An event edited in the database (its Lamport clock, which its hash covers) is caught by the
/// commands that read a run whole, not only by `verify`: a replay refuses to serve it, naming
/// the seq (exit 1, as `verify`: the stored run is damaged), and an export refuses to write a file
/// that its own import would refuse (exit 1, as `verify`).
#[test]
fn an_event_edited_in_the_store_is_refused_by_replay_and_export_naming_its_seq() {
    let (home, recorded) = demo_recording();
    let edited = home
        .db()
        .execute(
            "UPDATE events SET lamport = lamport + 100 WHERE seq = 2 AND run_pk = (SELECT pk FROM runs WHERE id = ?1)",
            [&recorded],
        )
        .unwrap();
    assert_eq!(edited, 1);
    let mismatch = format!("run {recorded} seq 2: hash mismatch");
    home.run(&["verify", &recorded]).expect(1, &[&mismatch], &[]);
    home.run(&["replay", &recorded]).expect(1, &[], &["could not be read to its end", &mismatch]);
    let file = home.file("edited.jsonl");
    home.run(&["export", &recorded, "-o", file.to_str().unwrap()]).expect(1, &[], &[&mismatch]);
    assert!(!file.exists(), "no file its import would refuse");
}

/// A run whose last events are gone from the store (deleted by hand) is refused by export as
/// verify refuses it (QA40 D2: it exported with exit 0, a file its own import then refused).
#[test]
fn a_run_missing_its_last_events_is_refused_by_export() {
    let (home, recorded) = demo_recording();
    let last: i64 = home
        .db()
        .query_row(
            "SELECT max(seq) FROM events WHERE run_pk = (SELECT pk FROM runs WHERE id = ?1)",
            [&recorded],
            |r| r.get(0),
        )
        .unwrap();
    let deleted = home
        .db()
        .execute(
            "DELETE FROM events WHERE seq >= ?2 AND run_pk = (SELECT pk FROM runs WHERE id = ?1)",
            rusqlite::params![&recorded, last - 1],
        )
        .unwrap();
    assert_eq!(deleted, 2);
    home.run(&["verify", &recorded]).expect(1, &["run head is"], &[]);
    let file = home.file("short.jsonl");
    home.run(&["export", &recorded, "-o", file.to_str().unwrap()]).expect(
        1,
        &[],
        &["events are missing from its end", "retrace verify"],
    );
    assert!(!file.exists(), "no file its import would refuse");
}

/// A run whose stored record is damaged (bad JSON in its row) doesn't blind the commands that
/// list or check the whole store: `runs` lists it as `unreadable` beside the others, and
/// `verify --all` names it as a problem and still checks the others.
#[test]
fn a_run_whose_record_is_damaged_is_listed_as_unreadable_and_the_others_still_verify() {
    let home = Home::new();
    {
        let store = open_store(&StoreConfig::in_home(home.path())).unwrap();
        conversation(SOUND, 1).commit(&*store);
        conversation(DAMAGED, 3).commit(&*store);
    }
    let edited = home.db().execute("UPDATE runs SET meta = '{' WHERE id = ?1", [DAMAGED]).unwrap();
    assert_eq!(edited, 1);
    home.run(&["runs"]).expect(0, &[SOUND, DAMAGED, "unreadable", "its record can't be read"], &[]);
    let listed: serde_json::Value = serde_json::from_str(&home.run(&["runs", "--json"]).stdout()).unwrap();
    let damaged = listed.as_array().unwrap().iter().find(|r| r["id"] == DAMAGED).expect("listed");
    assert!(damaged["unreadable"].as_str().unwrap().contains("bad JSON"), "{damaged}");
    let problem = format!("run {DAMAGED}: its record can't be read");
    home.run(&["verify", "--all"]).expect(1, &[&problem], &["verification found 1 problem"]);
    let json: serde_json::Value =
        serde_json::from_str(&home.run(&["verify", "--all", "--json"]).stdout()).unwrap();
    assert_eq!(
        (json["runs"].as_u64(), json["events"].as_u64()),
        (Some(2), Some(5)),
        "{json}: the sound run's 5 events"
    );
    home.run(&["verify", SOUND]).expect(0, &["ok: run"], &[]);
    // `gate RUN` of it says what `show` says, not that there is no such run.
    home.run(&["gate", DAMAGED]).expect(1, &[], &["its run can't be read", "stored as bad JSON"]);
    // A byte that is not UTF-8 is the same damage, not an error of the whole listing (QA21 D4).
    let edited =
        home.db().execute("UPDATE runs SET meta = CAST(X'7BFF7D' AS TEXT) WHERE id = ?1", [DAMAGED]).unwrap();
    assert_eq!(edited, 1);
    home.run(&["runs"]).expect(0, &[SOUND, DAMAGED, "unreadable", "its record can't be read"], &[]);
    home.run(&["verify", "--all"]).expect(1, &[&problem], &["verification found 1 problem"]);
}

/// An event row that can't be read (bad JSON in it) is a problem at its own seq, not at the
/// start of the page it is in, and `verify` goes on past it: an event edited further on is
/// named too, and the events beside the hole raise no problem of their own.
#[test]
fn verify_names_an_unreadable_event_by_its_seq_and_checks_past_it() {
    let home = Home::new();
    {
        let store = open_store(&StoreConfig::in_home(home.path())).unwrap();
        conversation(DAMAGED, 3).commit(&*store);
    }
    let db = home.db();
    let edit = |sql: &str| {
        let sql = format!("{sql} AND run_pk = (SELECT pk FROM runs WHERE id = ?1)");
        assert_eq!(db.execute(&sql, [DAMAGED]).unwrap(), 1, "{sql}");
    };
    edit("UPDATE events SET extra = '{' WHERE seq = 4");
    edit("UPDATE events SET name = 'sql.querx' WHERE seq = 8");
    drop(db);

    let unreadable = format!("run {DAMAGED} seq 4: cannot read the event");
    let hash = format!("run {DAMAGED} seq 8: hash mismatch");
    home.run(&["verify", DAMAGED]).expect(1, &[&unreadable, "bad JSON", &hash], &["found 2 problems"]);
    let json: serde_json::Value =
        serde_json::from_str(&home.run(&["verify", DAMAGED, "--json"]).stdout()).unwrap();
    let problems: Vec<(Option<u64>, &str)> = json["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["seq"].as_u64(), p["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(problems, [(Some(4), "unreadable"), (Some(8), "hash")], "{json}");
}

/// Event lines out of order are refused even with `--force` (the seqs couldn't be stored
/// densely), so the refusal doesn't suggest it; a blob line a forced import leaves out because
/// it doesn't verify is named as such by the seq that needs it, not as missing from the file.
#[test]
fn force_is_suggested_only_where_it_helps_and_a_left_out_blob_is_said_so() {
    let (home, mut lines) = exported();
    lines.swap(3, 4);
    let path = write(&home, "swapped_seqs.jsonl", &join(&lines));
    let refused = Home::new().run(&["import", &path]);
    refused.expect(1, &[], &["swapped_seqs.jsonl:4: expected seq 3, found seq 4"]);
    assert!(!refused.stderr().contains("--force"), "{}", refused.stderr());
    Home::new().run(&["import", "--force", &path]).expect(1, &[], &["expected seq 3, found seq 4"]);

    let (home, mut lines) = exported();
    let at = lines.iter().position(|l| l.contains("backfill_ready") && l.starts_with("{\"blob\"")).unwrap();
    let digest = digest_of_blob_line(&lines[at]);
    lines[at] = serde_json::json!({"blob": digest, "text": "edited"}).to_string();
    let path = write(&home, "edited_blob.jsonl", &join(&lines));
    let left_out = format!("references blob {digest}, whose line was left out: it doesn't verify");
    let forced = Home::new().run(&["import", "--force", &path]);
    forced.expect(0, &[RUN], &[&format!("digest mismatch for blob {digest}"), &left_out]);
    assert!(!forced.stderr().contains("which is not in the file"), "{}", forced.stderr());
}

/// A blob the run's events name, deleted from the database, is a damaged stored run to every
/// command that reads it: export and replay exit 1, as verify does, naming the digest.
#[test]
fn a_blob_row_deleted_from_the_store_is_damage_to_export_and_replay() {
    let (home, recorded) = demo_recording();
    let output = first_output(&home, &recorded);
    let deleted = home.db().execute("DELETE FROM blobs WHERE digest = ?1", [&output.as_bytes()[..]]).unwrap();
    assert_eq!(deleted, 1);
    let digest = output.to_string();
    home.run(&["verify", &recorded]).expect(1, &[&digest], &[]);
    let file = home.file("damaged.jsonl");
    home.run(&["export", &recorded, "-o", file.to_str().unwrap()]).expect(1, &[], &[&digest]);
    home.run(&["replay", &recorded]).expect(1, &[], &["could not be read to its end", "is damaged", &digest]);
}

/// A database file SQLite finds damaged fails every command the same way; the error comes
/// with where to start: copy the folder, recover what is readable (QA9 S7).
#[test]
fn a_damaged_database_file_says_where_to_start() {
    let (home, _) = demo_recording();
    let db = home.path().join("retrace.db");
    let mut bytes = std::fs::read(&db).unwrap();
    bytes[..100].fill(0x5a);
    std::fs::write(&db, bytes).unwrap();
    for wal in ["retrace.db-wal", "retrace.db-shm"] {
        let _ = std::fs::remove_file(home.path().join(wal));
    }
    let said = home.run(&["runs"]);
    assert_ne!(said.0.status.code(), Some(0), "{}", said.stderr());
    let hint = "hint: the store's database file is damaged: copy its folder first";
    assert!(said.stderr().contains(hint), "{}", said.stderr());
}

/// A blob row whose bytes were changed is named by export as verify names it: by what its
/// content hashes to, not as a row of an unknown kind (QA9 D3).
#[test]
fn export_names_a_changed_blob_row_as_verify_does() {
    let (home, recorded) = demo_recording();
    let output = first_output(&home, &recorded);
    let changed = home
        .db()
        .execute("UPDATE blobs SET data = X'7b7d' WHERE digest = ?1", [&output.as_bytes()[..]])
        .unwrap();
    assert_eq!(changed, 1);
    let hashes_to = format!("blob {output} is corrupt: its stored content hashes to {}", Digest::of(b"{}"));
    // verify's line names the run, seq and blob first, then what is wrong, once.
    let listed = format!("blob {output}: corrupt: its stored content hashes to {}", Digest::of(b"{}"));
    home.run(&["verify", &recorded]).expect(1, &[&listed], &[]);
    let file = home.file("changed.jsonl");
    home.run(&["export", &recorded, "-o", file.to_str().unwrap()]).expect(1, &[], &[&hashes_to]);
}
