//! A store this process can't write (a read-only mount, a CI artifact), read as it is:
//! [`SqliteStore::open_read_only`]. Folders and files are made read-only with `chattr +i`,
//! which holds even for root; each test is skipped, saying so, where it can't be set.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use retrace_core::run::RunStatus;
use retrace_store::conformance::{sample_events, sample_run};
use retrace_store::sqlite::SqliteStore;
use retrace_store::{
    open_store, why_read_only, Batch, BlobHint, BlobPut, BlobStore, EventStore, LeaseHolder, StoreConfig,
    StoreErrorKind, INLINE_BLOB_MAX,
};

/// Paths made immutable for the test's length (undone when dropped, failures included).
struct Immutable(Vec<PathBuf>);

impl Immutable {
    /// `chattr +i` on every path, or `None` (said on stderr) where that doesn't make `folder`
    /// read-only.
    fn set(folder: &Path, paths: &[PathBuf]) -> Option<Immutable> {
        let set = Command::new("chattr").arg("+i").args(paths).stderr(Stdio::null()).status();
        let undo = Immutable(paths.to_vec());
        if !set.is_ok_and(|s| s.success()) {
            eprintln!("skipped: chattr +i is not available here");
            return None;
        }
        if std::fs::write(folder.join("probe"), "x").is_ok() {
            eprintln!("skipped: chattr +i did not make the folder read-only");
            return None;
        }
        Some(undo)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").args(&self.0).status();
    }
}

/// A store under `home` holding run "kept" (3 events and a blob file) and run "dead" (whose
/// recorder died), closed; returns the large blob.
fn recorded(home: &Path) -> BlobPut {
    let store = open_store(&StoreConfig::in_home(home)).unwrap();
    store.create_run(&sample_run("kept", 1)).unwrap();
    store.create_run(&sample_run("dead", 1)).unwrap();
    let big = BlobPut::new(vec![7u8; INLINE_BLOB_MAX * 3], BlobHint::Raw);
    let events = sample_events("kept", 1, 3, None);
    store
        .commit(&Batch { run_id: "kept".into(), events, blobs: vec![big.clone()], cache: Vec::new() })
        .unwrap();
    store.acquire_lease("dead", &LeaseHolder("elsewhere:1:1".into()), 1).unwrap();
    drop(store);
    big
}

/// The database [`leaves_a_wal`] renames a run in, when this test binary runs it as a child.
const LEAVE_WAL_IN: &str = "RETRACE_TEST_LEAVE_WAL_IN";

/// Renames run "kept" of the database `LEAVE_WAL_IN` names to "renamed in the WAL", leaving the
/// change in the WAL only: the process exits without closing its connection (which would
/// checkpoint), as a recorder killed or a store copied while open leaves it. Run in a child
/// process by [`rename_in_the_wal`], so that no connection of the tests' process shares its
/// `-shm` mapping.
#[test]
#[ignore = "run as a child by rename_in_the_wal"]
fn leaves_a_wal() {
    let Some(db) = std::env::var_os(LEAVE_WAL_IN) else { return };
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch("PRAGMA wal_autocheckpoint = 0").unwrap();
    conn.execute(
        "UPDATE runs SET meta = json_set(meta, '$.name', 'renamed in the WAL') WHERE id = 'kept'",
        [],
    )
    .unwrap();
    std::process::exit(0);
}

/// [`leaves_a_wal`] on `db`, in a child process.
fn rename_in_the_wal(db: &Path) {
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["read_only::leaves_a_wal", "--exact", "--ignored", "--test-threads", "1"])
        .env(LEAVE_WAL_IN, db)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let wal = std::fs::metadata(db.with_extension("db-wal")).map(|m| m.len()).unwrap_or(0);
    assert!(wal > 0, "the child left its change in the WAL");
}

fn files(home: &Path, names: &[&str]) -> Vec<PathBuf> {
    std::iter::once(home.to_path_buf()).chain(names.iter().map(|n| home.join(n))).collect()
}

#[test]
fn a_store_in_a_read_only_folder_reads_as_it_was_left_and_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let big = recorded(&home);
    let config = StoreConfig::in_home(&home);
    assert_eq!(why_read_only(&config), None);
    let Some(_undo) = Immutable::set(&home, &files(&home, &["retrace.db"])) else { return };
    let why = why_read_only(&config).expect("an immutable folder can't be written");
    assert!(why.contains("is not writable"), "{why}");
    assert!(open_store(&config).is_err(), "opening for writing fails");

    let store = SqliteStore::open_read_only(&home.join("retrace.db"), &home.join("blobs"), &why).unwrap();
    assert_eq!(store.read_only(), Some(why.as_str()));
    assert_eq!(store.read_only_copy(), None, "no WAL: read in place");
    assert_eq!(store.events("kept", 1, 10).unwrap().len(), 3);
    assert_eq!(store.get_blob(&big.digest()).unwrap(), big.bytes().to_vec());
    assert_eq!(store.run("dead").unwrap().status, RunStatus::Running, "not recovered: seen as left");
    assert_eq!(store.runs().unwrap().len(), 2);

    let refused = store.create_run(&sample_run("new", 1)).unwrap_err();
    assert_eq!(refused.kind, StoreErrorKind::ReadOnly);
    assert!(refused.message.contains("is open read-only") && refused.message.contains(&why), "{refused}");
    assert!(store.checkpoint().is_err());
    assert_eq!(
        std::fs::read_dir(&home).unwrap().count(),
        3,
        "nothing was created beside the database, blobs and the .gitignore made with the folder"
    );
}

#[test]
fn a_read_only_store_reads_what_its_wal_holds_with_or_without_its_shm_file() {
    for keep_shm in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        recorded(&home);
        let db = home.join("retrace.db");
        rename_in_the_wal(&db);
        if !keep_shm {
            std::fs::remove_file(home.join("retrace.db-shm")).unwrap();
        }
        let names: &[&str] = match keep_shm {
            true => &["retrace.db", "retrace.db-wal", "retrace.db-shm"],
            false => &["retrace.db", "retrace.db-wal"],
        };
        let Some(_undo) = Immutable::set(&home, &files(&home, names)) else { return };
        let why = why_read_only(&StoreConfig::in_home(&home)).unwrap();
        let store = SqliteStore::open_read_only(&db, &home.join("blobs"), &why).unwrap();
        let name = store.run("kept").unwrap().name;
        assert_eq!(name.as_deref(), Some("renamed in the WAL"), "keep_shm: {keep_shm}");
        assert_eq!(store.read_only_copy().is_some(), !keep_shm, "a copy only without the -shm file");
        assert_eq!(store.events("kept", 1, 10).unwrap().len(), 3);
    }
}
