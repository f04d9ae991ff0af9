//! A VFS that writes a commit's WAL frames with one `pwrite` instead of two per frame.
//!
//! SQLite writes each WAL frame as two calls (its 24-byte header, then the page), and a
//! system call costs more than copying a page on the VMs this runs on (measured: 2.9 µs per
//! frame as two `pwrite`s, 0.7-0.9 µs as part of one). `retrace-wal` is SQLite's `unix` VFS
//! with one change: frames *appended* to a `-wal` file (a header at or past the furthest byte
//! this handle wrote, then the page right after it) are gathered in memory and handed to the
//! `unix` file in one call, at the latest when the page of a commit frame arrives. Every other
//! call on the file (a read, a sync, a truncate, its size, a file control, a lock, a close)
//! and every other write hands them over first, so the file is never seen without them.
//!
//! Why this is safe:
//! - SQLite makes a transaction's frames visible (to other connections, a checkpoint, a
//!   crash's recovery) only after writing them all, by updating the wal-index, and its commit
//!   frame (the one whose header holds the database size, never zero: `walFrames`) is the last
//!   frame it appends. So a commit's bytes reach the kernel before it can be seen, before
//!   `sqlite3_step` returns, and so before the store acknowledges anything or syncs the WAL
//!   through its own handle (`sync.rs`).
//! - A WAL gathers only while its connection holds the WAL write lock, as seen on the shm
//!   lock calls of its database file (which this VFS also wraps, linked to the WAL with
//!   `sqlite3_database_file_object`); in exclusive locking mode, where SQLite takes no shm
//!   locks, nothing is gathered. Frames a large transaction spills before it commits may stay
//!   gathered, but never past the end of the transaction: when the write lock is released,
//!   whatever is left (frames of a transaction that rolled back, past the log's end) is
//!   dropped, before any other writer can own the log. So another writer's frames are never
//!   overwritten, and a transaction that failed never leaves a whole commit frame behind.
//! - When handing bytes over fails (a full disk), they are not written again: every later
//!   call that needs them fails until the transaction ends, so nothing after them commits.
//! - Rewrites of frames already written (a page written twice in one transaction, checksum
//!   repairs), split or odd-sized writes (sector padding) go straight to the file.
//!
//! Only `-wal` files gather; the database file, the `-shm` map and temporary files are the
//! `unix` VFS's own.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use rusqlite::ffi;

/// The VFS's name, as given to `sqlite3_open_v2`.
pub(crate) const NAME: &str = "retrace-wal";
const NAME_C: &CStr = c"retrace-wal";

/// Past this many gathered bytes a new frame is not added: the `unix` VFS writes at most
/// 128 KiB - 1 in one call (it masks the length with `0x1ffff`), and a frame (a header and a
/// page of at most 64 KiB) must fit after them.
const GATHER_UP_TO: usize = 60 << 10;
/// A WAL frame header.
const FRAME_HEADER: usize = 24;
/// The WAL header, at offset 0.
const WAL_HEADER: usize = 32;
/// The shm lock slot of the WAL's write lock (`WAL_WRITE_LOCK` in sqlite3.c).
const WAL_WRITE_LOCK: c_int = 0;

/// Registers the VFS once per process; `Err` holds SQLite's code when that fails.
pub(crate) fn register() -> Result<(), c_int> {
    static REGISTERED: OnceLock<Result<(), c_int>> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        // SAFETY: `sqlite3_vfs_find` returns a registered VFS, which lives as long as the
        // process; the copy we register is leaked, so it does too. None of `unix`'s methods
        // but `xOpen` reads `pAppData` or `szOsFile`, and our `open` hands its own `xOpen`
        // the `unix` VFS itself.
        unsafe {
            let rc = ffi::sqlite3_initialize();
            if rc != ffi::SQLITE_OK {
                return Err(rc);
            }
            let base = ffi::sqlite3_vfs_find(c"unix".as_ptr());
            if base.is_null() {
                return Err(ffi::SQLITE_ERROR);
            }
            let mut vfs = *base;
            vfs.zName = NAME_C.as_ptr();
            vfs.pNext = std::ptr::null_mut();
            vfs.pAppData = base.cast();
            vfs.szOsFile = (std::mem::size_of::<ShimFile>() + (*base).szOsFile as usize) as c_int;
            vfs.xOpen = Some(open);
            let rc = ffi::sqlite3_vfs_register(Box::into_raw(Box::new(vfs)), 0);
            if rc == ffi::SQLITE_OK {
                Ok(())
            } else {
                Err(rc)
            }
        }
    })
}

/// Our file: SQLite sees `head`; the `unix` file it wraps follows this struct in the same
/// allocation (`szOsFile` covers both).
#[repr(C)]
struct ShimFile {
    head: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    /// Present for a `-wal` file: the frames gathered so far.
    gather: Option<Box<Gather>>,
    /// A database file's open WAL (set by the WAL's `open`, cleared by its `close`); a WAL's
    /// database file. Both belong to one connection, which SQLite uses from one thread at a
    /// time.
    peer: *mut ShimFile,
    /// A database file: its connection holds the WAL write lock (shm lock 0, exclusive).
    write_locked: bool,
}

/// Appended bytes not yet handed to the `unix` file.
struct Gather {
    buf: Vec<u8>,
    /// Where `buf` starts in the file.
    start: i64,
    /// The end of the furthest write through this handle: a header at or after it appends.
    end: i64,
    /// The last gathered write was a frame header; `Some(true)` for a commit frame's.
    header: Option<bool>,
    /// Handing `buf` over failed with this code: it stays gathered, and every call that
    /// needs it fails, until the transaction ends.
    failed: c_int,
}

impl Gather {
    fn next(&self) -> i64 {
        self.start + self.buf.len() as i64
    }
}

static SHIM_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let base = (*vfs).pAppData as *mut ffi::sqlite3_vfs;
    let shim = file as *mut ShimFile;
    let inner = (shim as *mut u8).add(std::mem::size_of::<ShimFile>()) as *mut ffi::sqlite3_file;
    std::ptr::write_bytes(shim, 0, 1);
    let Some(base_open) = (*base).xOpen else { return ffi::SQLITE_ERROR };
    let rc = base_open(base, name, inner, flags, out_flags);
    if (*inner).pMethods.is_null() {
        // SQLite calls no method (not even close) on a file whose `pMethods` is null.
        return rc;
    }
    let wal = flags & ffi::SQLITE_OPEN_WAL != 0 && !name.is_null();
    let mut peer = std::ptr::null_mut();
    if wal {
        // The database file this WAL belongs to: ours, as the connection opened it through
        // this VFS (checked, so a WAL opened any other way simply never gathers).
        let db = ffi::sqlite3_database_file_object(name) as *mut ShimFile;
        if !db.is_null() && std::ptr::eq((*db).head.pMethods, &SHIM_METHODS) {
            peer = db;
        }
    }
    let gather = (!peer.is_null()).then(|| {
        Box::new(Gather { buf: Vec::with_capacity(64 << 10), start: 0, end: 0, header: None, failed: 0 })
    });
    let head = ffi::sqlite3_file { pMethods: &SHIM_METHODS };
    std::ptr::write(shim, ShimFile { head, inner, gather, peer, write_locked: false });
    if !peer.is_null() {
        (*peer).peer = shim;
    }
    rc
}

/// The wrapped file and its methods.
unsafe fn parts<'a>(file: *mut ffi::sqlite3_file) -> (&'a mut ShimFile, &'a ffi::sqlite3_io_methods) {
    let shim = &mut *(file as *mut ShimFile);
    let methods = &*(*shim.inner).pMethods;
    (shim, methods)
}

/// Hands gathered bytes to the `unix` file. After a failure they are never written: the
/// error is the answer until the transaction ends.
unsafe fn flush(shim: &mut ShimFile, methods: &ffi::sqlite3_io_methods) -> c_int {
    let Some(gather) = shim.gather.as_mut() else { return ffi::SQLITE_OK };
    if gather.failed != ffi::SQLITE_OK {
        return gather.failed;
    }
    if gather.buf.is_empty() {
        return ffi::SQLITE_OK;
    }
    let Some(write) = methods.xWrite else { return ffi::SQLITE_IOERR_WRITE };
    let rc = write(shim.inner, gather.buf.as_ptr().cast(), gather.buf.len() as c_int, gather.start);
    #[cfg(test)]
    if gather.buf.len() > FRAME_HEADER + 4096 {
        tests::GATHERED_WRITES.with(|n| n.set(n.get() + 1));
    }
    if rc == ffi::SQLITE_OK {
        gather.buf.clear();
        gather.header = None;
        gather.failed = ffi::SQLITE_OK;
    } else {
        gather.failed = rc;
    }
    rc
}

/// The transaction of the WAL `shim` ended. A commit has handed over its frames; whatever is
/// left belongs to a transaction that rolled back or failed, past the log's end: dropped.
unsafe fn end_of_write(shim: &mut ShimFile) {
    if let Some(gather) = shim.gather.as_mut() {
        gather.buf.clear();
        gather.header = None;
        gather.failed = ffi::SQLITE_OK;
    }
}

/// Flushes, then runs `call` on the `unix` file unless flushing failed.
unsafe fn after_flush(
    file: *mut ffi::sqlite3_file,
    call: impl FnOnce(*mut ffi::sqlite3_file, &ffi::sqlite3_io_methods) -> c_int,
) -> c_int {
    let (shim, methods) = parts(file);
    let rc = flush(shim, methods);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    call(shim.inner, methods)
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    let (shim, methods) = parts(file);
    let flushed = flush(shim, methods);
    if !shim.peer.is_null() && std::ptr::eq((*shim.peer).peer, shim) {
        (*shim.peer).peer = std::ptr::null_mut();
    }
    let rc = methods.xClose.map_or(ffi::SQLITE_OK, |close| close(shim.inner));
    drop(shim.gather.take());
    if flushed != ffi::SQLITE_OK {
        flushed
    } else {
        rc
    }
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    out: *mut c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    after_flush(file, |inner, m| {
        m.xRead.map_or(ffi::SQLITE_IOERR_READ, |read| read(inner, out, amount, offset))
    })
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let (shim, methods) = parts(file);
    let Some(inner_write) = methods.xWrite else { return ffi::SQLITE_IOERR_WRITE };
    let Some(gather) = shim.gather.as_mut() else { return inner_write(shim.inner, data, amount, offset) };
    let len = amount as usize;
    let bytes = std::slice::from_raw_parts(data as *const u8, len);
    let end = offset + amount as i64;
    let locked = !shim.peer.is_null() && (*shim.peer).write_locked;
    if locked && gather.failed == ffi::SQLITE_OK {
        // A frame header that appends: after the gathered bytes, or past everything written.
        let appends = if gather.buf.is_empty() { offset >= gather.end } else { offset == gather.next() };
        if len == FRAME_HEADER && gather.header.is_none() && appends && gather.buf.len() <= GATHER_UP_TO {
            if gather.buf.is_empty() {
                gather.start = offset;
            }
            gather.buf.extend_from_slice(bytes);
            gather.end = gather.end.max(end);
            // Bytes 4..8 of a frame header hold the database size after a commit frame, else 0.
            gather.header = Some(bytes[4..8] != [0, 0, 0, 0]);
            return ffi::SQLITE_OK;
        }
        // The page of the header just gathered.
        if let Some(commit) = gather.header {
            if offset == gather.next() && len >= 512 && len.is_power_of_two() {
                gather.buf.extend_from_slice(bytes);
                gather.end = gather.end.max(end);
                gather.header = None;
                return if commit { flush(shim, methods) } else { ffi::SQLITE_OK };
            }
        }
    }
    // Anything else: the gathered bytes first, then this write as it comes.
    let rc = flush(shim, methods);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    let rc = inner_write(shim.inner, data, amount, offset);
    if let Some(gather) = shim.gather.as_mut() {
        // A new WAL header starts the log again: what follows it appends.
        gather.end = if offset == 0 && len == WAL_HEADER { WAL_HEADER as i64 } else { gather.end.max(end) };
    }
    rc
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    let (shim, methods) = parts(file);
    let rc = flush(shim, methods);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    if let Some(gather) = shim.gather.as_mut() {
        gather.end = gather.end.min(size);
    }
    methods.xTruncate.map_or(ffi::SQLITE_IOERR_TRUNCATE, |truncate| truncate(shim.inner, size))
}

unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    after_flush(file, |inner, m| m.xSync.map_or(ffi::SQLITE_IOERR_FSYNC, |sync| sync(inner, flags)))
}

unsafe extern "C" fn file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    after_flush(file, |inner, m| {
        m.xFileSize.map_or(ffi::SQLITE_IOERR_FSTAT, |file_size| file_size(inner, size))
    })
}

unsafe extern "C" fn lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    after_flush(file, |inner, m| m.xLock.map_or(ffi::SQLITE_IOERR_LOCK, |lock| lock(inner, level)))
}

unsafe extern "C" fn unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    after_flush(file, |inner, m| m.xUnlock.map_or(ffi::SQLITE_IOERR_UNLOCK, |unlock| unlock(inner, level)))
}

unsafe extern "C" fn check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    let (shim, methods) = parts(file);
    methods.xCheckReservedLock.map_or(ffi::SQLITE_IOERR_CHECKRESERVEDLOCK, |check| check(shim.inner, out))
}

unsafe extern "C" fn file_control(file: *mut ffi::sqlite3_file, op: c_int, arg: *mut c_void) -> c_int {
    after_flush(file, |inner, m| {
        m.xFileControl.map_or(ffi::SQLITE_NOTFOUND, |control| control(inner, op, arg))
    })
}

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    let (shim, methods) = parts(file);
    methods.xSectorSize.map_or(4096, |sector_size| sector_size(shim.inner))
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    let (shim, methods) = parts(file);
    methods.xDeviceCharacteristics.map_or(0, |characteristics| characteristics(shim.inner))
}

unsafe extern "C" fn shm_map(
    file: *mut ffi::sqlite3_file,
    page: c_int,
    page_size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    let (shim, methods) = parts(file);
    methods.xShmMap.map_or(ffi::SQLITE_IOERR_SHMMAP, |map| map(shim.inner, page, page_size, extend, out))
}

unsafe extern "C" fn shm_lock(file: *mut ffi::sqlite3_file, offset: c_int, n: c_int, flags: c_int) -> c_int {
    let (shim, methods) = parts(file);
    let write_lock = offset <= WAL_WRITE_LOCK && offset + n > WAL_WRITE_LOCK;
    if write_lock && flags == ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_EXCLUSIVE {
        // Before the lock goes, while no other writer can own the log.
        if !shim.peer.is_null() {
            end_of_write(&mut *shim.peer);
        }
        shim.write_locked = false;
    }
    let rc = methods.xShmLock.map_or(ffi::SQLITE_IOERR_SHMLOCK, |lock| lock(shim.inner, offset, n, flags));
    if write_lock && flags == ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE && rc == ffi::SQLITE_OK {
        shim.write_locked = true;
    }
    rc
}

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    let (shim, methods) = parts(file);
    if let Some(barrier) = methods.xShmBarrier {
        barrier(shim.inner);
    }
}

unsafe extern "C" fn shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    let (shim, methods) = parts(file);
    methods.xShmUnmap.map_or(ffi::SQLITE_OK, |unmap| unmap(shim.inner, delete))
}

unsafe extern "C" fn fetch(
    file: *mut ffi::sqlite3_file,
    offset: i64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    let (shim, methods) = parts(file);
    match methods.xFetch {
        Some(fetch) if methods.iVersion >= 3 => fetch(shim.inner, offset, amount, out),
        _ => {
            *out = std::ptr::null_mut();
            ffi::SQLITE_OK
        }
    }
}

unsafe extern "C" fn unfetch(file: *mut ffi::sqlite3_file, offset: i64, page: *mut c_void) -> c_int {
    let (shim, methods) = parts(file);
    match methods.xUnfetch {
        Some(unfetch) if methods.iVersion >= 3 => unfetch(shim.inner, offset, page),
        _ => ffi::SQLITE_OK,
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::path::Path;

    use rusqlite::{params, Connection, OpenFlags};

    use super::*;

    thread_local! {
        /// Writes that handed more than one frame to the `unix` file at once, on this thread.
        pub(super) static GATHERED_WRITES: Cell<u64> = const { Cell::new(0) };
    }

    fn gathered() -> u64 {
        GATHERED_WRITES.with(Cell::get)
    }

    fn open(path: &Path) -> Connection {
        register().expect("registering the VFS");
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
        let conn = Connection::open_with_flags_and_vfs(path, flags, NAME).unwrap();
        // A small page cache makes large transactions spill frames before they commit, and
        // rewrite spilled frames (then repair their checksums) when a page changes again.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA cache_size = 16;
             PRAGMA wal_autocheckpoint = 0;
             CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL);",
        )
        .unwrap();
        conn
    }

    /// A second connection to `path`, as another store or process would hold.
    fn open_again(path: &Path) -> Connection {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE;
        let conn = Connection::open_with_flags_and_vfs(path, flags, NAME).unwrap();
        conn.execute_batch("PRAGMA cache_size = 16;").unwrap();
        conn
    }

    /// What a crash right now would leave: the database and its WAL as the kernel holds them,
    /// opened with SQLite's own VFS (recovery rebuilds the index from the WAL, checking every
    /// frame's checksum, so a frame still gathered in memory or a stale header would be lost).
    fn as_on_disk(dir: &Path, round: usize) -> Vec<(i64, Vec<u8>)> {
        let copy = dir.join(format!("copy-{round}"));
        std::fs::create_dir(&copy).unwrap();
        std::fs::copy(dir.join("db"), copy.join("db")).unwrap();
        std::fs::copy(dir.join("db-wal"), copy.join("db-wal")).unwrap();
        let conn = Connection::open(copy.join("db")).unwrap();
        let mut stmt = conn.prepare("SELECT id, body FROM t ORDER BY id").unwrap();
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        rows.collect::<Result<_, _>>().unwrap()
    }

    #[test]
    fn every_committed_frame_is_in_the_file_when_the_commit_returns() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open(&dir.path().join("db"));
        let mut expected = std::collections::BTreeMap::new();
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        // Transactions of one small row, of a few pages, of far more than one gathered write
        // (128 KiB), and ones that change the same rows again after they spilled.
        for round in 0..40 {
            let rows = match round % 4 {
                0 => 1,
                1 => 5,
                2 => 400,
                _ => 150,
            };
            conn.execute_batch("BEGIN").unwrap();
            for _ in 0..rows {
                let id = (next() % 600) as i64;
                let body = vec![(next() & 0xff) as u8; 200 + (next() % 3000) as usize];
                conn.execute("INSERT OR REPLACE INTO t VALUES (?1, ?2)", params![id, body]).unwrap();
                expected.insert(id, body);
            }
            if round % 4 == 3 {
                // Read back through the writer inside its transaction: spilled frames must be
                // readable before they are written out.
                let count: i64 = conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
                assert_eq!(count as usize, expected.len());
                conn.execute("UPDATE t SET body = CAST(body || x'00' AS BLOB)", []).unwrap();
                for body in expected.values_mut() {
                    body.push(0);
                }
            }
            conn.execute_batch("COMMIT").unwrap();
            if round == 0 {
                // A small commit writes its frames (a few pages) in one call.
                let before = gathered();
                conn.execute_batch("BEGIN").unwrap();
                for id in 1000..1003 {
                    conn.execute("INSERT OR REPLACE INTO t VALUES (?1, ?2)", params![id, vec![3u8; 3000]])
                        .unwrap();
                    expected.insert(id, vec![3; 3000]);
                }
                conn.execute_batch("COMMIT").unwrap();
                assert!(gathered() > before, "the commit's frames were not gathered");
            }
            let found = as_on_disk(dir.path(), round);
            let want: Vec<(i64, Vec<u8>)> = expected.iter().map(|(k, v)| (*k, v.clone())).collect();
            assert_eq!(found.len(), want.len(), "round {round}");
            assert!(found == want, "round {round}: the copy differs from what was committed");
        }
    }

    #[test]
    fn nothing_is_gathered_in_exclusive_locking_mode() {
        // SQLite takes no shm locks then, so the end of a transaction can't be seen.
        let dir = tempfile::tempdir().unwrap();
        let conn = open(&dir.path().join("db"));
        conn.execute_batch("PRAGMA locking_mode = EXCLUSIVE;").unwrap();
        let before = gathered();
        for id in 0..20 {
            conn.execute("INSERT INTO t VALUES (?1, ?2)", params![id, vec![5u8; 3000]]).unwrap();
        }
        assert_eq!(gathered(), before);
        let count: i64 = conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(count, 20);
    }

    #[test]
    fn frames_a_rolled_back_transaction_spilled_never_land_on_another_writers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let conn = open(&path);
        conn.execute("INSERT INTO t VALUES (1, x'01')", []).unwrap();
        // A transaction that spills a few frames (fewer than one gathered write holds) and
        // rolls back; then another writer on the same file (another store, another process)
        // commits frames where those were.
        conn.execute_batch("BEGIN").unwrap();
        for id in 2..40 {
            conn.execute("INSERT INTO t VALUES (?1, ?2)", params![id, vec![7u8; 2000]]).unwrap();
        }
        conn.execute_batch("ROLLBACK").unwrap();
        let other = open_again(&path);
        other.execute("INSERT INTO t VALUES (9, ?1)", params![vec![9u8; 40_000]]).unwrap();
        let want = vec![(1, vec![1]), (9, vec![9; 40_000])];
        assert_eq!(as_on_disk(dir.path(), 0), want);
        // The first connection reads, writes and closes: none of that may bring the
        // rolled-back frames back over the other's.
        let count: i64 = conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(count, 2);
        assert_eq!(as_on_disk(dir.path(), 1), want);
        drop(conn);
        assert_eq!(as_on_disk(dir.path(), 2), want);
        let body: Vec<u8> = other.query_row("SELECT body FROM t WHERE id = 9", [], |r| r.get(0)).unwrap();
        assert_eq!(body, vec![9; 40_000]);
    }

    #[test]
    fn a_rolled_back_transaction_leaves_the_committed_ones_whole() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open(&dir.path().join("db"));
        conn.execute("INSERT INTO t VALUES (1, x'01')", []).unwrap();
        conn.execute_batch("BEGIN").unwrap();
        for id in 2..300 {
            conn.execute("INSERT INTO t VALUES (?1, ?2)", params![id, vec![7u8; 2000]]).unwrap();
        }
        conn.execute_batch("ROLLBACK").unwrap();
        conn.execute("INSERT INTO t VALUES (2, x'02')", []).unwrap();
        assert_eq!(as_on_disk(dir.path(), 0), vec![(1, vec![1]), (2, vec![2])]);
        // A checkpoint that resets the log, then a commit that restarts it from its header.
        conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(())).unwrap();
        conn.execute("INSERT INTO t VALUES (3, x'03')", []).unwrap();
        assert_eq!(as_on_disk(dir.path(), 1), vec![(1, vec![1]), (2, vec![2]), (3, vec![3])]);
    }
}
