//! The conformance suite on [`SqliteStore`], then what only SQLite can get wrong: altered
//! bytes, a locked database, reopening, several stores on one file.
use std::path::Path;
use std::sync::Arc;

use retrace_core::run::{RunMeta, RunStatus};
use retrace_core::Digest;
use retrace_store::conformance::{self, sample_events, sample_run};
use retrace_store::sqlite::schema::{KIND_INLINE, KIND_PACKED};
use retrace_store::sqlite::SqliteStore;
use retrace_store::{
    open_store, Batch, BlobHint, BlobPut, BlobStore, Durability, EventStore, LeaseHolder, RunWriter, Store,
    StoreConfig, StoreErrorKind, INLINE_BLOB_MAX,
};
use rusqlite::Connection;

fn make() -> Arc<dyn Store> {
    Arc::new(SqliteStore::temporary().unwrap())
}

#[test]
fn sqlite_store_conforms() {
    conformance::run_all(&make);
}

/// Again with every commit synced, writers through their ack logs (`sqlite/ack_log.rs`).
#[test]
fn sqlite_store_conforms_under_event_durability() {
    conformance::run_all(&|| {
        Arc::new(SqliteStore::temporary_with(Durability::Event).unwrap()) as Arc<dyn Store>
    });
}

pub(crate) fn open(dir: &Path, durability: Durability, busy_timeout_ms: u64) -> SqliteStore {
    SqliteStore::open(&dir.join("retrace.db"), &dir.join("blobs"), durability, busy_timeout_ms).unwrap()
}

/// A store in a temporary folder (`os` durability) holding one empty run named `run`.
pub(crate) fn store_with_run(run: &str) -> (tempfile::TempDir, SqliteStore, RunMeta) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Durability::Os, 5_000);
    let run = sample_run(run, 1);
    store.create_run(&run).unwrap();
    (dir, store, run)
}

/// How many blob rows the database holds.
pub(crate) fn blob_rows(conn: &Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM blobs", [], |r| r.get(0)).unwrap()
}

pub(crate) fn put_in_run(store: &SqliteStore, run: &str, blob: &BlobPut) {
    store
        .commit(&Batch {
            run_id: run.into(),
            events: Vec::new(),
            blobs: vec![blob.clone()],
            cache: Vec::new(),
        })
        .unwrap();
}

/// Flips one byte of `digest`'s stored bytes, wherever the schema keeps them.
fn alter_stored_bytes(db: &Path, digest: &Digest) {
    let conn = Connection::open(db).unwrap();
    let (kind, data): (i64, rusqlite::types::Value) = conn
        .query_row("SELECT kind, data FROM blobs WHERE digest = ?1", [digest.as_bytes()], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    match (kind, data) {
        (KIND_PACKED, rusqlite::types::Value::Integer(location)) => {
            let (segment, offset) = (location >> 16, location & 0xffff);
            conn.execute(
                "UPDATE segments SET data = CAST(substr(data, 1, ?2) || 'Z' || substr(data, ?2 + 2) AS BLOB) \
                 WHERE id = ?1",
                [segment, offset],
            )
            .unwrap();
        }
        (KIND_INLINE, _) => {
            conn.execute("UPDATE blobs SET data = x'00' || data WHERE digest = ?1", [digest.as_bytes()])
                .unwrap();
        }
        other => panic!("unexpected blob row {other:?}"),
    }
}

#[test]
fn altered_bytes_are_corrupt_naming_the_digest() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Durability::Os, 1000);
    store.create_run(&sample_run("r", 1)).unwrap();
    let packed = BlobPut::new(b"a blob of a few hundred bytes ".repeat(10), BlobHint::Raw);
    let tiny = BlobPut::new(&b"tiny"[..], BlobHint::Raw);
    // Bytes that aren't UTF-8: SQLite's `||` makes the altered row TEXT that isn't UTF-8,
    // which must read as corrupt, not panic.
    let binary = BlobPut::new(vec![0xff, 0xfe, 0x80, 0x00], BlobHint::Raw);
    let request = |n: usize| {
        let messages: Vec<String> =
            (0..n).map(|i| format!("{{\"role\":\"user\",\"content\":\"message {i}\"}}")).collect();
        BlobPut::new(
            format!("{{\"messages\":[{}]}}", messages.join(",")).into_bytes(),
            BlobHint::ModelRequest,
        )
    };
    let (first, second) = (request(2), request(3));
    for blob in [&packed, &tiny, &binary, &first, &second] {
        put_in_run(&store, "r", blob);
    }
    assert!(store.manifest_of(&second.digest()).unwrap().is_some());
    for blob in [&packed, &tiny, &binary] {
        alter_stored_bytes(store.path(), &blob.digest());
        let err = store.get_blob(&blob.digest()).unwrap_err();
        assert_eq!(err.kind, StoreErrorKind::Corrupt, "{err}");
        assert!(err.message.contains(&blob.digest().to_string()), "{err}");
    }
    let element = Digest::of(b"{\"role\":\"user\",\"content\":\"message 2\"}");
    alter_stored_bytes(store.path(), &element);
    let err = store.get_blob(&second.digest()).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Corrupt, "{err}");
    assert!(
        err.message.contains(&second.digest().to_string()) && err.message.contains(&element.to_string()),
        "{err}"
    );
    assert_eq!(store.get_blob(&first.digest()).unwrap(), first.bytes().to_vec(), "other requests still read");
}

#[test]
fn an_altered_blob_file_is_corrupt_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Durability::Batch, 1000);
    let bytes = vec![b'x'; INLINE_BLOB_MAX + 1];
    let digest = store.put_blob(&bytes, BlobHint::Raw).unwrap();
    let file = store.blob_file(&digest);
    assert_eq!(std::fs::read(&file).unwrap(), bytes, "large blobs are files at {}", file.display());
    let leftovers: Vec<_> = std::fs::read_dir(file.parent().unwrap()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no temp file is left behind");
    // Readable by whoever may read the database (0644 less the umask), not only by its writer:
    // a store shared by several users (QA21 D2). Tests run under a umask that leaves reads.
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o644, "{mode:o}");
    std::fs::write(&file, b"altered").unwrap();
    let err = store.get_blob(&digest).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Corrupt);
    assert!(
        err.message.contains(&digest.to_string()) && err.message.contains(&file.display().to_string()),
        "{err}"
    );
    // The same bytes stored again (a new recording, an import) heal the file (QA21 D3): the
    // damage no longer breaks every later run that holds them.
    assert_eq!(store.put_blob(&bytes, BlobHint::Raw).unwrap(), digest);
    assert_eq!(store.get_blob(&digest).unwrap(), bytes, "healed");
    std::fs::remove_file(&file).unwrap();
    let err = store.get_blob(&digest).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Corrupt);
    assert!(err.message.contains(&file.display().to_string()), "{err}");
    store.put_blob(&bytes, BlobHint::Raw).unwrap();
    assert_eq!(store.get_blob(&digest).unwrap(), bytes, "written again");

    // A model request or response is kept as a manifest whose large message is a file: that
    // file gone, the same request stored again is stored whole again (QA24 D1).
    let big = "y".repeat(INLINE_BLOB_MAX + 10);
    for (hint, body) in [
        (
            BlobHint::ModelRequest,
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": big}]}),
        ),
        (
            BlobHint::ModelResponse,
            serde_json::json!({"id": "r", "choices": [{"index": 0, "message": {"role": "assistant", "content": big}}]}),
        ),
    ] {
        let bytes = retrace_core::canonical::canonical_value(&body).unwrap();
        let digest = store.put_blob(&bytes, hint).unwrap();
        let blobs = dir.path().join("blobs");
        let files: Vec<_> = walk(&blobs);
        assert!(!files.is_empty(), "{hint:?}: its message is a file");
        files.iter().for_each(|f| std::fs::remove_file(f).unwrap());
        assert_eq!(store.get_blob(&digest).unwrap_err().kind, StoreErrorKind::Corrupt, "{hint:?}");
        assert_eq!(store.put_blob(&bytes, hint).unwrap(), digest);
        assert_eq!(store.get_blob(&digest).unwrap(), bytes, "{hint:?}: stored again");
    }
}

/// Every file under `dir`, at any depth (hidden temp files aside).
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else if !entry.file_name().to_string_lossy().starts_with('.') {
            found.push(path);
        }
    }
    found
}

#[test]
fn a_store_locked_by_another_writer_is_busy() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Durability::Batch, 100);
    store.create_run(&sample_run("locked", 1)).unwrap();
    let other = Connection::open(store.path()).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let events = sample_events("locked", 1, 1, None);
    let err = store
        .commit(&Batch {
            run_id: "locked".into(),
            events: events.clone(),
            blobs: Vec::new(),
            cache: Vec::new(),
        })
        .unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Busy);
    assert!(err.message.contains("the store is locked by another writer"), "{err}");
    assert!(err.message.contains("run locked"), "{err}");
    assert_eq!(store.last_seq("locked").unwrap(), 0, "reads still work");
    other.execute_batch("COMMIT").unwrap();
    store.commit(&Batch { run_id: "locked".into(), events, blobs: Vec::new(), cache: Vec::new() }).unwrap();
}

#[test]
fn a_reopened_store_keeps_everything_and_recovers_dead_recorders() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig::in_home(&dir.path().join("home"));
    let store = open_store(&config).unwrap();
    assert_eq!(store.backend(), "sqlite");
    store.create_run(&sample_run("kept", 1)).unwrap();
    store.create_run(&sample_run("crashed", 1)).unwrap();
    let events = sample_events("kept", 1, 3, None);
    let big = BlobPut::new(vec![7u8; INLINE_BLOB_MAX * 3], BlobHint::Raw);
    store
        .commit(&Batch {
            run_id: "kept".into(),
            events: events.clone(),
            blobs: vec![big.clone()],
            cache: Vec::new(),
        })
        .unwrap();
    store.acquire_lease("kept", &LeaseHolder::current(), 60_000).unwrap();
    store.acquire_lease("crashed", &LeaseHolder("elsewhere:1:1".into()), 1).unwrap();
    drop(store);
    std::thread::sleep(std::time::Duration::from_millis(5));
    let store = open_store(&config).unwrap();
    assert_eq!(store.events("kept", 1, 10).unwrap(), events);
    assert_eq!(store.get_blob(&big.digest()).unwrap(), big.bytes().to_vec());
    assert_eq!(store.run("crashed").unwrap().status, RunStatus::Interrupted);
    assert_eq!(store.run("kept").unwrap().status, RunStatus::Running, "its recorder is alive");
}

#[test]
fn two_stores_on_one_file_write_concurrently() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (open(dir.path(), Durability::Batch, 5000), open(dir.path(), Durability::Event, 5000));
    a.create_run(&sample_run("from-a", 1)).unwrap();
    b.create_run(&sample_run("from-b", 2)).unwrap();
    std::thread::scope(|s| {
        for (store, run) in [(&a, "from-a"), (&b, "from-b")] {
            s.spawn(move || {
                let events = sample_events(run, 1, 60, None);
                for chunk in events.chunks(3) {
                    let blob = BlobPut::new(format!("{run} {}", chunk[0].seq).into_bytes(), BlobHint::Raw);
                    store
                        .commit(&Batch {
                            run_id: run.into(),
                            events: chunk.to_vec(),
                            blobs: vec![blob],
                            cache: Vec::new(),
                        })
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(a.last_seq("from-b").unwrap(), 60);
    assert_eq!(b.events("from-a", 1, 100).unwrap(), sample_events("from-a", 1, 60, None));
    assert_eq!(a.agent_seqs("from-b", "a1").unwrap(), b.agent_seqs("from-b", "a1").unwrap());
}

/// Stores opened at once on a database that doesn't exist yet all open it: creating it (the
/// switch to WAL, the schema) answers `SQLITE_BUSY` at once, past the busy handler, to those
/// that lose the race, and the open tries again. Each store has its own connections, as a
/// process would; a barrier releases them together, round after round.
#[test]
fn stores_opened_at_once_on_a_new_database_all_open_it() {
    const ROUNDS: usize = 30;
    const STORES: usize = 6;
    for round in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig::in_home(&dir.path().join("fresh"));
        let start = std::sync::Barrier::new(STORES);
        let opened: Vec<_> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..STORES)
                .map(|i| {
                    let (config, start) = (&config, &start);
                    s.spawn(move || {
                        start.wait();
                        let store = open_store(config)?;
                        store.create_run(&sample_run(&format!("run-{i}"), 1)).map(|()| store)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let failed: Vec<_> = opened.iter().filter_map(|o| o.as_ref().err()).collect();
        assert!(failed.is_empty(), "round {round}: {failed:?}");
        let store = open_store(&config).unwrap();
        assert_eq!(store.runs().unwrap().len(), STORES, "round {round}");
    }
}

#[test]
fn foreign_and_newer_databases_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("retrace.db");
    std::fs::write(&db, vec![b'#'; 8192]).unwrap();
    let err = SqliteStore::open(&db, &dir.path().join("blobs"), Durability::Os, 100).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Corrupt, "{err}");
    assert!(err.message.contains(&db.display().to_string()), "{err}");
    std::fs::remove_file(&db).unwrap();
    Connection::open(&db).unwrap().execute_batch("PRAGMA user_version = 99").unwrap();
    let err = SqliteStore::open(&db, &dir.path().join("blobs"), Durability::Os, 100).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Invalid, "{err}");
    assert!(err.message.contains("99"), "{err}");
}

#[test]
fn a_version_1_store_gains_the_cache_table_and_keeps_its_data() {
    use retrace_store::sqlite::schema::SCHEMA_VERSION;
    use retrace_store::{Cache, CacheEntry};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("retrace.db");
    let events = sample_events("old", 1, 4, None);
    let blob = BlobPut::new(&b"an output from before the cache"[..], BlobHint::Raw);
    {
        let store = open(dir.path(), Durability::Os, 1000);
        assert_eq!(store.schema_upgrade(), None, "a new store is created, not upgraded");
        store.create_run(&sample_run("old", 1)).unwrap();
        let batch =
            Batch { run_id: "old".into(), events: events.clone(), blobs: vec![blob.clone()], cache: vec![] };
        store.commit(&batch).unwrap();
    }
    // Version 1 is version 2 without the cache table.
    Connection::open(&db).unwrap().execute_batch("DROP TABLE cache; PRAGMA user_version = 1;").unwrap();
    let version = |db: &Path| -> i64 {
        Connection::open(db).unwrap().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap()
    };
    assert_eq!(version(&db), 1);
    // Two processes opening the old store at once: both succeed, the upgrade happens once.
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| open(dir.path(), Durability::Os, 5000));
        let b = s.spawn(|| open(dir.path(), Durability::Batch, 5000));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(version(&db), SCHEMA_VERSION);
    // Exactly one of them upgraded, and says so.
    let upgrades: Vec<_> = [&a, &b].iter().filter_map(|s| s.schema_upgrade()).collect();
    assert_eq!(upgrades.len(), 1, "{upgrades:?}");
    assert_eq!((upgrades[0].from, upgrades[0].to), (1, SCHEMA_VERSION));
    assert!(upgrades[0].store.ends_with("retrace.db"), "{upgrades:?}");
    assert!(upgrades[0].to_string().contains("from schema version 1 to"), "{}", upgrades[0]);
    assert_eq!(open(dir.path(), Durability::Os, 1000).schema_upgrade(), None, "upgraded twice");
    assert_eq!(a.events("old", 1, 10).unwrap(), events);
    assert_eq!(b.get_blob(&blob.digest()).unwrap(), blob.bytes().to_vec());
    let key = Digest::of(b"key");
    let entry = CacheEntry {
        output_ref: blob.digest(),
        usage: None,
        stored_at_ms: 7,
        class: None,
        ttl_s: None,
        snapshot: Some("gpt-sim-2024-08-06".into()),
    };
    a.cache_put(&key, &entry).unwrap();
    assert_eq!(b.cache_get(&key).unwrap(), Some(entry));
    drop((a, b));
    assert_eq!(
        open(dir.path(), Durability::Os, 1000).last_seq("old").unwrap(),
        4,
        "reopens as the current version"
    );
}

/// Version 14 kept no snapshot with a cache entry: its entries read back with none, and the
/// upgraded store keeps the snapshot of the entries stored after (QA8 D1).
#[test]
fn a_version_14_store_keeps_its_cache_entries_and_gains_their_snapshots() {
    use retrace_store::sqlite::schema::SCHEMA_VERSION;
    use retrace_store::{Cache, CacheEntry};
    let dir = tempfile::tempdir().unwrap();
    let blob = BlobPut::new(b"a cached answer".to_vec(), BlobHint::Raw);
    let entry = |snapshot: Option<&str>| CacheEntry {
        output_ref: blob.digest(),
        usage: None,
        stored_at_ms: 7,
        class: None,
        ttl_s: None,
        snapshot: snapshot.map(str::to_owned),
    };
    let (old, new) = (Digest::of(b"old key"), Digest::of(b"new key"));
    {
        let store = open(dir.path(), Durability::Os, 1000);
        store.put_blob(blob.bytes(), BlobHint::Raw).unwrap();
        store.cache_put(&old, &entry(None)).unwrap();
    }
    let db = dir.path().join("retrace.db");
    Connection::open(&db)
        .unwrap()
        .execute_batch(
            "ALTER TABLE cache DROP COLUMN snapshot; ALTER TABLE cache_log DROP COLUMN snapshot; \
             PRAGMA user_version = 14;",
        )
        .unwrap();
    let store = open(dir.path(), Durability::Os, 1000);
    let upgrade = store.schema_upgrade().expect("upgraded");
    assert_eq!((upgrade.from, upgrade.to), (14, SCHEMA_VERSION));
    assert_eq!(store.cache_get(&old).unwrap(), Some(entry(None)));
    store.cache_put(&new, &entry(Some("gpt-sim-2024-08-06"))).unwrap();
    assert_eq!(store.cache_get(&new).unwrap(), Some(entry(Some("gpt-sim-2024-08-06"))));
}

/// `get_blobs` answers like `get_blob`, in order, and fails as it would on a missing blob.
#[test]
fn get_blobs_reads_many_in_one_call() {
    let store = make();
    let sizes = [10usize, 1000, 70 * 1024];
    let digests: Vec<Digest> = sizes
        .iter()
        .map(|n| store.put_blob(&vec![b'a' + (*n % 7) as u8; *n], BlobHint::Raw).unwrap())
        .collect();
    let mut asked = digests.clone();
    asked.push(digests[0]);
    let got = store.get_blobs(&asked).unwrap();
    let one_by_one: Vec<Vec<u8>> = asked.iter().map(|d| store.get_blob(d).unwrap()).collect();
    assert_eq!(got, one_by_one);
    assert!(store.get_blobs(&[]).unwrap().is_empty());
    let missing = Digest::of(b"not stored");
    assert_eq!(store.get_blobs(&[digests[0], missing]).unwrap_err().kind, StoreErrorKind::NotFound);
    // The failed call left no read transaction open on a pooled connection.
    assert_eq!(store.get_blobs(&digests).unwrap().len(), 3);
}

/// Inside `with_snapshot` this thread reads one snapshot: later commits are not seen.
#[test]
fn with_snapshot_reads_one_snapshot() {
    let store = make();
    store.create_run(&sample_run("snap", 1)).unwrap();
    let events = sample_events("snap", 1, 4, None);
    let first = Batch { run_id: "snap".into(), events: events[..2].to_vec(), ..Batch::default() };
    store.commit(&first).unwrap();
    let mut seen = (0, 0, 0);
    store.with_snapshot(&mut || {
        let before = store.last_seq("snap").unwrap();
        let rest = Batch { run_id: "snap".into(), events: events[2..].to_vec(), ..Batch::default() };
        store.commit(&rest).unwrap();
        let inside = store.last_seq("snap").unwrap();
        let mut nested = 0;
        store.with_snapshot(&mut || nested = store.last_seq("snap").unwrap());
        seen = (before, inside, nested);
    });
    assert_eq!(seen, (2, 2, 2));
    assert_eq!(store.last_seq("snap").unwrap(), 4);
}

/// SQLite keeps the WAL beside the file a symlink names, and so does the store: its WAL syncs
/// (`event` after each commit the ack log doesn't take, `batch` on its syncer thread) and its
/// ack logs. They used to look beside the link: `event` failed to sync (no such WAL) and
/// `batch` synced nothing.
#[test]
fn a_database_opened_through_a_symlink_syncs_and_logs_beside_the_real_file() {
    let (real, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    drop(open(real.path(), Durability::Os, 5_000));
    let link = elsewhere.path().join("retrace.db");
    std::os::unix::fs::symlink(real.path().join("retrace.db"), &link).unwrap();
    for (name, durability) in [("event", Durability::Event), ("batch", Durability::Batch)] {
        let store =
            Arc::new(SqliteStore::open(&link, &elsewhere.path().join("blobs"), durability, 5_000).unwrap());
        let run = format!("linked-{name}");
        store.create_run(&sample_run(&run, 1)).unwrap();
        store.recover_interrupted().unwrap();
        let writer = RunWriter::open(store.clone(), &run, LeaseHolder::unique()).unwrap();
        for event in sample_events(&run, 1, 5, None) {
            writer.append_sync(event, Vec::new()).unwrap();
        }
        let logs = |dir: &Path| std::fs::read_dir(dir.join("retrace.db-acklog")).map_or(0, |d| d.count());
        if durability == Durability::Event {
            assert_eq!(logs(real.path()), 1, "the run's ack log is beside the real file");
        }
        assert_eq!(logs(elsewhere.path()), 0, "nothing is beside the link");
        writer.close().unwrap();
        assert_eq!(open(real.path(), Durability::Os, 5_000).last_seq(&run).unwrap(), 5);
    }
}

/// `gc` leaves the database file its size; compacting gives the space back, keeps what
/// remains readable (in this store and in another one open on the same file), and is refused
/// while a run of another store is running.
#[test]
fn compacting_shrinks_the_file_after_a_collection() {
    use retrace_core::run::{Retention, RunMode};
    use retrace_store::conformance::{aged_run, record_with_outputs};
    use retrace_store::gc::{collect, GcConfig};
    use retrace_store::GcStore;

    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Durability::Batch, 5_000);
    let other = open(dir.path(), Durability::Batch, 5_000);
    let db = dir.path().join("retrace.db");
    let file_bytes = || {
        let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        size(&db) + size(&dir.path().join("retrace.db-wal"))
    };
    let blob = |i: u32| BlobPut::new(format!("{i:05}{}", "z".repeat(20_000)).into_bytes(), BlobHint::Raw);
    let old: Vec<BlobPut> = (0..400).map(blob).collect();
    record_with_outputs(
        &store,
        &aged_run("old", RunMode::Record, 90, Retention::Routine, None),
        &old.iter().collect::<Vec<_>>(),
    );
    let kept = blob(1_000_000);
    record_with_outputs(&store, &aged_run("kept", RunMode::Record, 0, Retention::Pinned, None), &[&kept]);

    let now_ms =
        || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let mut config = GcConfig::new(now_ms() + 1_000, 30);
    config.blob_grace_ms = 0;
    assert_eq!(collect(&store, &config).unwrap().runs_deleted, ["old"]);
    let collected = file_bytes();
    assert!(collected > 8_000_000, "gc alone leaves the file its size: {collected} bytes");
    let mut live = sample_run("live", 1);
    live.status = RunStatus::Running;
    other.create_run(&live).unwrap();

    let refused = store.compact().unwrap_err();
    assert_eq!(refused.kind, StoreErrorKind::Busy);
    assert!(refused.to_string().contains("run live is running"), "{refused}");
    assert_eq!(store.runs().unwrap().len(), 2, "a refused compaction changes nothing");

    live.status = RunStatus::Ok;
    other.update_run(&live).unwrap();
    let compacted = store.compact().unwrap();
    assert!(compacted.bytes_before > 8_000_000, "{compacted:?}");
    assert_eq!(compacted.bytes_after, file_bytes());
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    assert!(
        compacted.bytes_after < 1_000_000,
        "{compacted:?} db {} wal {}",
        size(&db),
        size(&dir.path().join("retrace.db-wal"))
    );
    for s in [&store, &other] {
        assert_eq!(s.get_blob(&kept.digest()).unwrap(), &kept.bytes()[..]);
        assert_eq!(s.events("kept", 1, 10).unwrap().len(), 1);
        assert_eq!(s.runs().unwrap().len(), 2);
    }
    drop((store, other));
    let reopened = open(dir.path(), Durability::Batch, 5_000);
    assert_eq!(reopened.get_blob(&kept.digest()).unwrap(), &kept.bytes()[..]);
    assert!(retrace_store::verify::verify_run(&reopened, "kept").is_empty());
}

/// The database file deleted (or replaced) under an open store: a write fails, naming it,
/// instead of committing into the unlinked file, acknowledged and lost at exit (QA24 D3).
#[test]
fn a_database_deleted_under_the_store_fails_its_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Durability::Batch, 1000);
    store.create_run(&sample_run("before", 1)).unwrap();
    std::fs::remove_file(store.path()).unwrap();
    let err = store.create_run(&sample_run("after", 1)).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::Io, "{err}");
    assert!(err.message.contains("was deleted or replaced") && err.message.contains("retrace.db"), "{err}");
    let events = sample_events("before", 1, 1, None);
    let batch = Batch { run_id: "before".into(), events, blobs: Vec::new(), cache: Vec::new() };
    assert_eq!(store.commit(&batch).unwrap_err().kind, StoreErrorKind::Io);
}
