//! What a one-event commit writes: the WAL frames of 40 consecutive commits of a tool call with a
//! 1 KB request and a 1 KB output (and of one with a request and an output of a message body's
//! size, about 200 B), read back from a real `-wal` file and named by `dbstat`. A
//! commit's cost is about its pages (each is copied into the WAL, checksummed, later
//! checkpointed, and fdatasynced wherever no ack log covers the commit), so this pins which
//! b-trees such a commit may touch and how many pages it writes: an index or a table added to
//! the commit path shows here first.
use std::collections::{BTreeMap, BTreeSet};

use retrace_core::Digest;
use retrace_store::conformance::sample_run;
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Durability, EventStore};
use rusqlite::Connection;

/// The b-trees a plain tool call's commit writes: the event row (`events`), its head
/// (`heads`), two packed blobs (`blobs`, their digest index, the `segments` they are packed
/// into) and page 1, whose header counts the database's pages and changes whenever it grows
/// (`dbstat` names it after the schema table whose root it holds).
const EXPECTED: [&str; 6] =
    ["blobs", "events", "heads", "segments", "sqlite_autoindex_blobs_1", "sqlite_schema"];

/// The b-trees a commit of a tool call whose blobs stay in their rows (up to 256 B each, as a
/// message body) writes: the packed blobs' `segments` are not among them.
const EXPECTED_SMALL: [&str; 5] = ["blobs", "events", "heads", "sqlite_autoindex_blobs_1", "sqlite_schema"];

/// A tool call's request and output at `seq`: each `repeats` times its label and seq.
type Sizes = fn(u64) -> (String, String);

fn kilobyte(seq: u64) -> (String, String) {
    (format!("request {seq} ").repeat(80), format!("output {seq} ").repeat(90))
}

fn message_sized(seq: u64) -> (String, String) {
    (format!("request {seq:>6} ").repeat(14), format!("output {seq:>6} ").repeat(15))
}

fn commit_one(store: &SqliteStore, run: &str, seq: u64, prev: Option<Digest>, sizes: Sizes) -> Digest {
    let (request, output) = sizes(seq);
    let batch = crate::steps::tool_call(run, seq, request, output, prev);
    store.commit(&batch).unwrap();
    batch.events[0].hash
}

/// `(page number, commit size)` of each frame after the WAL's 32-byte header; a commit's last
/// frame has a non-zero size.
fn frames(wal: &[u8], page_size: usize) -> Vec<(u32, u32)> {
    let word = |at: usize| u32::from_be_bytes(wal[at..at + 4].try_into().unwrap());
    (0..)
        .map(|i| 32 + i * (24 + page_size))
        .take_while(|at| at + 24 + page_size <= wal.len())
        .map(|at| (word(at), word(at + 4)))
        .collect()
}

#[test]
fn a_one_event_commit_writes_few_pages_of_the_expected_b_trees() {
    let (touched, mut commits) = frames_of_40_commits(kilobyte);
    let expected: BTreeSet<String> = EXPECTED.iter().map(|s| s.to_string()).collect();
    assert!(touched.is_subset(&expected), "b-trees written: {touched:?}, expected only {expected:?}");
    commits.sort_unstable();
    let (median, max) = (commits[commits.len() / 2], commits[commits.len() - 1]);
    // Measured: 6-13 frames, median 9 (2 digest-index leaves, one leaf each of events, heads
    // and blobs, 1-2 segment leaves, and when the file grows page 1 and an internal page).
    assert!(median <= 9, "median frames per one-event commit: {median} ({commits:?})");
    assert!(max <= 16, "most frames in a one-event commit: {max} ({commits:?})");
}

#[test]
fn blobs_of_a_message_body_s_size_stay_in_their_rows_and_write_no_segment() {
    let sizes = message_sized(1);
    assert!((200..=256).contains(&sizes.0.len()) && (200..=256).contains(&sizes.1.len()), "{sizes:?}");
    let (touched, mut commits) = frames_of_40_commits(message_sized);
    let expected: BTreeSet<String> = EXPECTED_SMALL.iter().map(|s| s.to_string()).collect();
    assert!(touched.is_subset(&expected), "b-trees written: {touched:?}, expected only {expected:?}");
    commits.sort_unstable();
    let median = commits[commits.len() / 2];
    // Measured: median 5 (2 digest-index leaves, one leaf each of events, heads and blobs).
    assert!(median <= 6, "median frames per one-event commit: {median} ({commits:?})");
}

/// Commits 2,000 tool calls of `sizes`, then 40 more whose WAL frames are kept: the b-trees
/// those 40 wrote, and how many frames each commit wrote.
fn frames_of_40_commits(sizes: Sizes) -> (BTreeSet<String>, Vec<usize>) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("retrace.db");
    // A store of no run's lease (no ack log): every commit is in the WAL.
    let store = SqliteStore::open(&db, &dir.path().join("blobs"), Durability::Event, 5_000).unwrap();
    store.create_run(&sample_run("pages", 1)).unwrap();
    let mut prev = None;
    for seq in 1..=2_000 {
        prev = Some(commit_one(&store, "pages", seq, prev, sizes));
    }
    store.checkpoint().unwrap();
    // A reader whose snapshot predates the 40 commits keeps the background checkpointer from
    // copying any of them back, so the WAL can't start over under the test.
    let pin = Connection::open(&db).unwrap();
    pin.execute_batch("BEGIN").unwrap();
    let _: i64 = pin.query_row("SELECT count(*) FROM runs", [], |r| r.get(0)).unwrap();
    for seq in 2_001..=2_040 {
        prev = Some(commit_one(&store, "pages", seq, prev, sizes));
    }
    let wal = std::fs::read(dir.path().join("retrace.db-wal")).unwrap();
    drop(pin);
    // Name the pages on a copy of the database and its WAL (the commits as of now).
    let copy = dir.path().join("copy.db");
    std::fs::copy(&db, &copy).unwrap();
    std::fs::write(dir.path().join("copy.db-wal"), &wal).unwrap();
    let conn = Connection::open(&copy).unwrap();
    let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
    let names: BTreeMap<u32, String> = conn
        .prepare("SELECT pageno, name FROM dbstat")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();

    let (mut commits, mut current, mut touched) = (Vec::new(), 0, BTreeSet::new());
    for (page, size) in frames(&wal, page_size as usize) {
        current += 1;
        touched.insert(names.get(&page).cloned().unwrap_or_else(|| format!("unnamed page {page}")));
        if size != 0 {
            commits.push(current);
            current = 0;
        }
    }
    assert_eq!(commits.len(), 40, "one WAL commit per store commit");
    (touched, commits)
}
