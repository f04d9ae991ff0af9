//! The levelled digest index and cache of the SQLite store (`sqlite/tail.rs`): a blob stored
//! is found and never stored twice whether it sits in the tail or in a digest table, whichever
//! store handle (as another process would) stored it; each blob sits in one level, and
//! `blob_mark` counts them; a collection that deletes blobs takes their digests too and leaves
//! no handle taking them for stored; a store of version 12 keeps every blob through the
//! upgrade; the newest cache entry wins across merges; blobs stored on their own (an import's)
//! wait in the tail past the usual merge threshold, for the next commit.
use std::path::Path;

use retrace_core::envelope::Usage;
use retrace_core::run::{RunMeta, RunStatus};
use retrace_core::Digest;
use retrace_store::conformance::sample_run;
use retrace_store::gc::{GcRequest, GcStore};
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Batch, BlobHint, BlobPut, BlobStore, Cache, CacheEntry, Durability, EventStore};
use rusqlite::Connection;

fn open(dir: &Path) -> SqliteStore {
    SqliteStore::open(&dir.join("retrace.db"), &dir.join("blobs"), Durability::Os, 5_000).unwrap()
}

fn raw(dir: &Path) -> Connection {
    Connection::open(dir.join("retrace.db")).unwrap()
}

/// Rows holding `digest`, and how many digest table rows name it.
fn rows_of(conn: &Connection, digest: &Digest) -> (i64, i64) {
    conn.query_row(
        "SELECT (SELECT count(*) FROM blobs WHERE digest = ?1), \
         (SELECT count(*) FROM blob_digests WHERE digest = ?1) + \
         (SELECT count(*) FROM blob_digests_recent WHERE digest = ?1)",
        [digest.as_bytes()],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Blob rows in no digest table under their own digest (looked up by digest, the tables' key:
/// by id, each row scanned a whole table).
fn unindexed(conn: &Connection) -> i64 {
    count(
        conn,
        "SELECT count(*) FROM blobs b \
         WHERE NOT EXISTS (SELECT 1 FROM blob_digests x WHERE x.digest = b.digest AND x.id = b.id) \
         AND NOT EXISTS (SELECT 1 FROM blob_digests_recent x WHERE x.digest = b.digest AND x.id = b.id)",
    )
}

/// `(blob_digests rows, blob_digests_recent rows, tail rows)`, checked against `blob_mark`'s
/// counts and against the blob rows: each row in exactly one place, under its own digest.
fn levels(conn: &Connection) -> (i64, i64, i64) {
    let indexed = count(conn, "SELECT count(*) FROM blob_digests");
    let recent = count(conn, "SELECT count(*) FROM blob_digests_recent");
    let tail = count(conn, "SELECT count(*) FROM blobs WHERE id > (SELECT merged_to FROM blob_mark)");
    let marked: (i64, i64) = conn
        .query_row("SELECT indexed_rows, recent_rows FROM blob_mark", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!(marked, (indexed, recent), "blob_mark counts the rows of each level");
    assert_eq!(unindexed(conn), tail, "the blobs in no digest table are the tail");
    let misfiled = count(
        conn,
        "SELECT count(*) FROM (SELECT digest, id FROM blob_digests UNION ALL \
         SELECT digest, id FROM blob_digests_recent) x LEFT JOIN blobs b ON b.id = x.id \
         WHERE b.digest IS NOT x.digest",
    );
    assert_eq!(misfiled, 0, "every digest row names the blob row of that digest");
    assert_eq!(indexed + recent + tail, count(conn, "SELECT count(*) FROM blobs"));
    (indexed, recent, tail)
}

fn blob(tag: &str, n: usize) -> BlobPut {
    BlobPut::new(format!("{tag} {n}").into_bytes(), BlobHint::Raw)
}

fn put(store: &SqliteStore, blobs: &[BlobPut]) {
    store
        .commit(&Batch { run_id: "none".into(), events: vec![], blobs: blobs.to_vec(), cache: vec![] })
        .unwrap();
}

/// Two stores on one new file (as two processes would open it), with one running run `r`.
fn two_handles() -> (tempfile::TempDir, SqliteStore, SqliteStore, RunMeta) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (open(dir.path()), open(dir.path()));
    let run = sample_run("r", 1);
    a.create_run(&run).unwrap();
    (dir, a, b, run)
}

/// Ends `run` (any status but running merges the tail).
fn finish(store: &SqliteStore, run: &RunMeta) {
    let mut done = run.clone();
    done.status = RunStatus::Ok;
    store.update_run(&done).unwrap();
}

#[test]
fn a_blob_is_stored_once_whichever_handle_stores_it_and_wherever_it_sits() {
    let (dir, a, b, run) = two_handles();
    let x = blob("x", 0);
    put(&a, std::slice::from_ref(&x));
    let conn = raw(dir.path());
    assert_eq!(rows_of(&conn, &x.digest()), (1, 0), "a new blob waits in the tail");
    // The other handle finds it in the tail (a reader's scan) and doesn't store it again.
    assert_eq!(b.get_blob(&x.digest()).unwrap(), b"x 0");
    put(&b, &[x.clone(), blob("y", 0)]);
    assert_eq!(rows_of(&conn, &x.digest()), (1, 0));
    finish(&b, &run);
    assert_eq!(rows_of(&conn, &x.digest()), (1, 1), "a run's end indexes the tail");
    assert_eq!(unindexed(&conn), 0);
    // Indexed now: neither handle stores it again, and both read it.
    put(&a, std::slice::from_ref(&x));
    put(&b, std::slice::from_ref(&x));
    assert_eq!(rows_of(&conn, &x.digest()), (1, 1));
    assert_eq!(a.get_blob(&x.digest()).unwrap(), b"x 0");
    assert!(b.has_blob(&blob("y", 0).digest()).unwrap());
}

#[test]
fn blobs_read_together_come_from_the_index_and_the_tail_through_any_handle() {
    let (dir, a, b, run) = two_handles();
    let old = blob("old", 0);
    put(&a, std::slice::from_ref(&old));
    finish(&a, &run);
    let (x, y) = (blob("x", 0), blob("y", 0));
    put(&a, std::slice::from_ref(&x));
    put(&b, std::slice::from_ref(&y));
    let conn = raw(dir.path());
    assert_eq!((rows_of(&conn, &old.digest()), rows_of(&conn, &x.digest())), ((1, 1), (1, 0)));
    let wanted = [x.digest(), old.digest(), y.digest()];
    let expected: Vec<Vec<u8>> = vec![b"x 0".to_vec(), b"old 0".to_vec(), b"y 0".to_vec()];
    // `a` knows where `x` is from its copy of the tail, `b` where `y` is; a new handle neither.
    for store in [&a, &b, &open(dir.path())] {
        assert_eq!(store.get_blobs(&wanted).unwrap(), expected);
        assert_eq!(store.get_blob(&y.digest()).unwrap(), b"y 0");
        let missing = store.get_blobs(&[x.digest(), blob("never", 0).digest()]).unwrap_err();
        assert!(missing.message.contains(&blob("never", 0).digest().to_string()), "{missing}");
    }
}

#[test]
fn a_blob_collected_from_the_tail_is_stored_again_not_taken_for_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (open(dir.path()), open(dir.path()));
    let kept = blob("kept", 0);
    put(&a, std::slice::from_ref(&kept));
    let doomed = blob("doomed", 0);
    put(&a, std::slice::from_ref(&doomed));
    // `a` holds `doomed` in its copy of the tail; `b` collects it (no run references it).
    let collect = GcRequest { runs: vec![], named: vec![], blob_cutoff_ms: u64::MAX, dry_run: false };
    let report = b.collect_garbage(&collect).unwrap();
    assert_eq!(report.blobs_deleted, 2);
    assert!(!a.has_blob(&doomed.digest()).unwrap());
    // Stored again through `a`: a new row (whose id the collection may have freed), readable.
    put(&a, std::slice::from_ref(&doomed));
    assert_eq!(a.get_blob(&doomed.digest()).unwrap(), b"doomed 0");
    assert_eq!(b.get_blob(&doomed.digest()).unwrap(), b"doomed 0");
    let conn = raw(dir.path());
    assert_eq!(rows_of(&conn, &doomed.digest()), (1, 0));
    // And again through `a`'s own collection.
    a.collect_garbage(&collect).unwrap();
    put(&a, std::slice::from_ref(&doomed));
    put(&b, std::slice::from_ref(&doomed));
    assert_eq!(rows_of(&conn, &doomed.digest()), (1, 0));
    assert_eq!(a.get_blob(&doomed.digest()).unwrap(), b"doomed 0");
}

#[test]
fn many_blobs_merge_as_they_go_and_known_ones_are_found_past_the_filter() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let run = sample_run("r", 1);
    store.create_run(&run).unwrap();
    let old: Vec<BlobPut> = (0..100).map(|n| blob("old", n)).collect();
    put(&store, &old);
    finish(&store, &run);
    // Enough new digests that the writer stops asking the index for each (its filter), with
    // the old ones among them: found, not stored again.
    let mut fresh: Vec<BlobPut> = (0..6_000).map(|n| blob("new", n)).collect();
    fresh.extend(old.iter().cloned());
    for chunk in fresh.chunks(500) {
        put(&store, chunk);
    }
    let conn = raw(dir.path());
    let rows: i64 = conn.query_row("SELECT count(*) FROM blobs", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 6_100);
    for b in &old {
        assert_eq!(rows_of(&conn, &b.digest()), (1, 1));
    }
    let more: Vec<BlobPut> = (0..30_000).map(|n| blob("more", n)).collect();
    for chunk in more.chunks(5_000) {
        put(&store, chunk);
    }
    assert_eq!(unindexed(&conn), 36_000);
    // Past the merge threshold, the next commit indexes the tail first.
    put(&store, &more[..10]);
    assert_eq!(unindexed(&conn), 0, "the tail was merged, and the blobs were found in the index");
    let rows: i64 = conn.query_row("SELECT count(*) FROM blobs", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 36_100);
    let mut done = run.clone();
    done.status = RunStatus::Failed;
    store.update_run(&done).unwrap();
    assert_eq!(levels(&conn), (36_100, 0, 0), "a young store's recent digests move down at each merge");
    assert_eq!(store.get_blob(&more[29_999].digest()).unwrap(), b"more 29999");
}

#[test]
fn blobs_stored_on_their_own_wait_past_the_merge_threshold_for_the_next_commit() {
    // An import stores its blobs through `put_blobs` while it reads the rest of its file; its
    // first commit of events merges them, all at once.
    let (dir, a, b, _run) = two_handles();
    let many: Vec<BlobPut> = (0..40_000).map(|n| blob("bulk", n)).collect();
    let mut places = Vec::new();
    for chunk in many.chunks(8_000) {
        places.extend(a.put_blobs(chunk).unwrap());
    }
    assert!(places.iter().all(Option::is_some), "every blob stored says where it is");
    let conn = raw(dir.path());
    assert_eq!(unindexed(&conn), 40_000, "past MERGE_AT (32,768), and still in the tail");
    // Another handle finds them in the tail, and storing them again stores nothing.
    assert_eq!(b.get_blob(&many[39_999].digest()).unwrap(), b"bulk 39999");
    b.put_blobs(&many[..100]).unwrap();
    a.put_blobs(&many[39_900..]).unwrap();
    assert_eq!(count(&conn, "SELECT count(*) FROM blobs"), 40_000);
    // The next commit merges the tail first, even from the handle that stored none of it.
    put(&b, &[blob("x", 0)]);
    assert_eq!(levels(&conn), (40_000, 0, 1), "merged, with the commit's own blob in the new tail");
    for store in [&a, &b] {
        assert_eq!(store.get_blob(&many[0].digest()).unwrap(), b"bulk 0");
    }
}

/// Whether a digest lies in the upper half of the digest space (the second of two slices).
fn upper(b: &BlobPut) -> bool {
    b.digest().as_bytes()[0] >= 0x80
}

#[test]
fn recent_digests_move_down_a_slice_per_merge_and_a_collection_takes_the_digests_it_deletes() {
    let (dir, a, b, run) = two_handles();
    // More than half a merge's worth indexed: from now on, two slices.
    let old: Vec<BlobPut> = (0..20_000).map(|n| blob("old", n)).collect();
    for chunk in old.chunks(5_000) {
        put(&a, chunk);
    }
    finish(&a, &run);
    let conn = raw(dir.path());
    assert_eq!(levels(&conn), (20_000, 0, 0), "one slice: straight down");
    let second = sample_run("r2", 2);
    b.create_run(&second).unwrap();
    let mid: Vec<BlobPut> = (0..40).map(|n| blob("mid", n)).collect();
    put(&b, &mid);
    assert_eq!(levels(&conn), (20_000, 0, 40));
    finish(&b, &second);
    let high = mid.iter().filter(|b| upper(b)).count() as i64;
    assert!(high > 0 && high < 40, "both halves hold some of these digests");
    assert_eq!(levels(&conn), (20_040 - high, high, 0), "the lower half moved down, the upper waits");
    // Found in either level by either handle and by a new one, one at a time and together.
    let (waiting, moved) = (mid.iter().find(|b| upper(b)).unwrap(), mid.iter().find(|b| !upper(b)).unwrap());
    let wanted = [waiting.digest(), old[7].digest(), moved.digest()];
    for store in [&a, &b, &open(dir.path())] {
        assert_eq!(store.get_blob(&waiting.digest()).unwrap(), waiting.bytes().to_vec());
        let read = store.get_blobs(&wanted).unwrap();
        assert_eq!(read, vec![waiting.bytes().to_vec(), b"old 7".to_vec(), moved.bytes().to_vec()]);
    }
    put(&a, &[old[0].clone(), waiting.clone(), moved.clone()]);
    put(&b, &mid);
    assert_eq!(levels(&conn), (20_040 - high, high, 0), "nothing stored twice");
    std::thread::sleep(std::time::Duration::from_millis(20));
    let cutoff =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    std::thread::sleep(std::time::Duration::from_millis(20));
    let new: Vec<BlobPut> = (0..20).map(|n| blob("new", n)).collect();
    put(&a, &new);
    // Nothing references the old and mid blobs; the new ones are younger than the cutoff. The
    // collection's merge moves the upper half down (the new ones there too), then deletes.
    let collect = GcRequest { runs: vec![], named: vec![], blob_cutoff_ms: cutoff, dry_run: false };
    assert_eq!(b.collect_garbage(&collect).unwrap().blobs_deleted, 20_040);
    let new_high = new.iter().filter(|b| upper(b)).count() as i64;
    assert_eq!(levels(&conn), (new_high, 20 - new_high, 0), "the collection took 20,040 digests");
    for store in [&a, &b] {
        assert!(!store.has_blob(&old[7].digest()).unwrap());
        assert!(!store.has_blob(&waiting.digest()).unwrap());
        assert_eq!(store.get_blob(&new[4].digest()).unwrap(), b"new 4");
    }
    // Stored again, once, and found.
    put(&a, &[old[7].clone(), new[0].clone()]);
    put(&b, std::slice::from_ref(&old[7]));
    assert_eq!(rows_of(&conn, &old[7].digest()), (1, 0));
    assert_eq!(levels(&conn), (new_high, 20 - new_high, 1));
    assert_eq!(open(dir.path()).get_blob(&old[7].digest()).unwrap(), b"old 7");
}

#[test]
fn a_version_12_store_keeps_every_blob_through_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let indexed: Vec<BlobPut> = (0..50).map(|n| blob("indexed", n)).collect();
    let tail: Vec<BlobPut> = (0..5).map(|n| blob("tail", n)).collect();
    {
        let store = open(dir.path());
        let run = sample_run("r", 1);
        store.create_run(&run).unwrap();
        put(&store, &indexed);
        finish(&store, &run);
        put(&store, &tail);
    }
    // Back to version 12's layout: the indexed digests in a partial index on `blobs`.
    raw(dir.path())
        .execute_batch(
            "UPDATE blobs SET indexed = 1 WHERE id IN (SELECT id FROM blob_digests);
             CREATE UNIQUE INDEX blobs_digest ON blobs (digest) WHERE indexed = 1;
             DROP TABLE blob_digests; DROP TABLE blob_digests_recent;
             ALTER TABLE blob_mark DROP COLUMN recent_rows; ALTER TABLE blob_mark DROP COLUMN indexed_rows;
             ALTER TABLE blob_mark DROP COLUMN sweep;
             PRAGMA user_version = 12;",
        )
        .unwrap();
    let store = open(dir.path());
    let conn = raw(dir.path());
    assert_eq!(count(&conn, "PRAGMA user_version"), retrace_store::sqlite::schema::SCHEMA_VERSION);
    assert_eq!(count(&conn, "SELECT count(*) FROM sqlite_master WHERE name = 'blobs_digest'"), 0);
    assert_eq!(levels(&conn), (50, 0, 5));
    assert_eq!(store.get_blob(&indexed[49].digest()).unwrap(), b"indexed 49");
    assert_eq!(store.get_blob(&tail[4].digest()).unwrap(), b"tail 4");
    put(&store, &[indexed[0].clone(), tail[0].clone()]);
    assert_eq!(levels(&conn), (50, 0, 5), "nothing stored twice");
}

#[test]
fn the_newest_cache_entry_wins_across_merges_and_handles() {
    let (dir, a, b, run) = two_handles();
    let outputs: Vec<BlobPut> = (0..3).map(|n| blob("out", n)).collect();
    put(&a, &outputs);
    let key = Digest::of(b"step key");
    let entry = |n: usize| CacheEntry {
        output_ref: outputs[n].digest(),
        usage: Some(Usage { input_tokens: n as u64, output_tokens: 1, cost_usd: None, ..Default::default() }),
        stored_at_ms: 1_000 + n as u64,
        class: None,
        ttl_s: None,
        snapshot: Some(format!("snapshot-{n}")),
    };
    // A collection that deletes nothing merges the log into the table.
    let merge = GcRequest { runs: vec![], named: vec![], blob_cutoff_ms: 0, dry_run: false };
    a.cache_put(&key, &entry(0)).unwrap();
    assert_eq!(b.cache_get(&key).unwrap(), Some(entry(0)), "read from the log");
    a.collect_garbage(&merge).unwrap();
    assert_eq!(b.cache_get(&key).unwrap(), Some(entry(0)), "read from the table");
    b.cache_put(&key, &entry(1)).unwrap();
    assert_eq!(a.cache_get(&key).unwrap(), Some(entry(1)), "the log's newer entry wins");
    a.cache_put(&key, &entry(2)).unwrap();
    assert_eq!(b.cache_get(&key).unwrap(), Some(entry(2)));
    finish(&b, &run);
    assert_eq!(a.cache_get(&key).unwrap(), Some(entry(2)), "a run's end leaves the log as it is");
    b.collect_garbage(&merge).unwrap();
    assert_eq!(a.cache_get(&key).unwrap(), Some(entry(2)), "merged in order: the last one stays");
    let conn = raw(dir.path());
    let (log, table): (i64, i64) = conn
        .query_row("SELECT (SELECT count(*) FROM cache_log), (SELECT count(*) FROM cache)", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((log, table), (0, 1));
}
