//! Garbage collection in SQLite: one `BEGIN IMMEDIATE` transaction deletes the runs, marks the
//! blobs still referenced (temp table `gc_keep`), sweeps the rest with their cache entries,
//! request prefixes and unused packed segments; a dry run rolls the same transaction back.
//!
//! What a collection deletes is gone from the file, not only unlinked from its tables: the
//! transaction runs under `PRAGMA secure_delete` (deleted rows are zeroed in their pages), the
//! bytes of deleted blobs packed beside kept ones are zeroed in their segments, and a truncating
//! checkpoint, tried once without waiting, drops the WAL frames that held the old pages.
//!
//! Blob files are moved into `blobs/.trash/` inside the transaction (so no other process can
//! write a blob file of the same digest between our commit and the unlink) and removed after
//! the commit; if the commit fails they are moved back. After a crash between the two, the next
//! collection puts back each trashed file whose row still exists and removes the others.
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use retrace_core::run::RunMeta;
use retrace_core::Digest;
use rusqlite::{params, Connection, TransactionBehavior};

use super::files::Files;
use super::rows::decode_json;
use super::schema::{KIND_FILE, KIND_MANIFEST, KIND_PACKED};
use super::SqliteStore;
use crate::error::ResultExt;
use crate::gc::{edit_blobs, refuse_while_running, settle, Compacted, GcReport, GcRequest, GcStore};
use crate::{manifest, StoreError, StoreResult};

const WHAT: &str = "collecting garbage";

/// Blobs no row of `gc_keep` names.
const UNKEPT: &str = "NOT EXISTS (SELECT 1 FROM temp.gc_keep k WHERE k.digest = blobs.digest)";

impl GcStore for SqliteStore {
    fn collect_garbage(&self, request: &GcRequest) -> StoreResult<GcReport> {
        self.writable(WHAT)?;
        let mut conn = self.writer.lock();
        conn.execute_batch("PRAGMA secure_delete = ON").ctx(|| WHAT)?;
        let collected = self.collect_locked(&mut conn, request);
        let _ = conn.execute_batch("PRAGMA secure_delete = OFF");
        let report = collected?;
        if !report.dry_run && (report.events_deleted > 0 || report.blobs_deleted > 0) {
            // Once, without waiting: a reader holding an old snapshot keeps the frames until a
            // later checkpoint (`gc --compact` waits for it).
            let _ = conn.busy_timeout(Duration::ZERO);
            let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
            let _ = conn.busy_timeout(Duration::from_millis(self.busy_timeout_ms));
        }
        Ok(report)
    }

    fn compact(&self) -> StoreResult<Compacted> {
        const WHAT: &str = "compacting the store";
        self.writable(WHAT)?;
        let bytes_before = self.database_bytes();
        let mut conn = self.writer.lock();
        // Checked under the write lock, so no run of this process starts meanwhile; one of another
        // process that starts now waits for the lock (its busy timeout) like any commit.
        let metas: Vec<RunMeta> = {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).ctx(|| WHAT)?;
            let metas = running_metas(&tx)?;
            tx.commit().ctx(|| WHAT)?;
            metas
        };
        refuse_while_running(&metas)?;
        // VACUUM rewrites the database into the WAL; the checkpoint copies it back and truncates
        // the file to its new size, then empties the WAL. Under `synchronous=NORMAL` the
        // checkpoint syncs the WAL before it writes the database, and the database before it
        // truncates the WAL.
        conn.execute_batch("VACUUM").ctx(|| WHAT)?;
        if let Some(wal) = &self.wal_sync {
            wal.sync().ctx(|| format!("{WHAT}: syncing the WAL"))?;
        }
        // The background checkpointer may be running one (SQLite then answers busy at once, without
        // waiting), and a reader of another process may hold an old snapshot (it waits for that
        // up to the busy timeout): tried again for a while, after which the file shrinks at a
        // later checkpoint (`bytes_after` says what happened now).
        let deadline = Instant::now() + Duration::from_millis(self.busy_timeout_ms.max(1_000));
        loop {
            let busy: i64 =
                conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0)).ctx(|| WHAT)?;
            if busy == 0 || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(conn);
        Ok(Compacted { bytes_before, bytes_after: self.database_bytes() })
    }
}

/// The metadata of the runs stored as `running`.
fn running_metas(conn: &Connection) -> StoreResult<Vec<RunMeta>> {
    let rows: Vec<(String, Vec<u8>)> = conn
        .prepare("SELECT id, meta FROM runs WHERE status = 'running' ORDER BY pk")
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, super::runs::record_bytes(r, 1)?)))?.collect())
        .ctx(|| "compacting the store")?;
    rows.into_iter().map(|(id, json)| decode_json(&json, &format!("run {id}"))).collect()
}

impl SqliteStore {
    /// [`GcStore::collect_garbage`] under the write lock: one transaction, then the files.
    fn collect_locked(&self, conn: &mut Connection, request: &GcRequest) -> StoreResult<GcReport> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).ctx(|| WHAT)?;
        // Every blob indexed first, so that what follows finds each by its digest alone and
        // deletes only indexed rows (see `super::tail`).
        self.merge_tail(&tx)?;
        super::tail::merge_cache(&tx)?;
        if !request.dry_run {
            restore_trash(&tx, &self.files)?;
        }
        let (report, files) = collect(&tx, request)?;
        if request.dry_run {
            return Ok(report); // dropping `tx` rolls it back
        }
        let trashed = trash(&self.files, &files)?;
        if let Err(e) = tx.commit() {
            for (from, to) in &trashed {
                let _ = std::fs::rename(to, from);
            }
            return Err(StoreError::from_sqlite(e, WHAT));
        }
        if let Some(wal) = &self.wal_sync {
            // Until the deletions are on disk, the trashed files stay (the next run restores
            // the ones whose rows survived).
            wal.sync().ctx(|| format!("{WHAT}: syncing the WAL"))?;
        }
        for (_, to) in &trashed {
            let _ = std::fs::remove_file(to);
        }
        self.files.forget_all();
        if let Some(syncer) = &self.syncer {
            syncer.committed();
        }
        if let Some(checkpointer) = &self.checkpointer {
            checkpointer.committed();
        }
        // The ack logs of deleted runs go too (a reused run key must not find them).
        let _ = self.recover_dead_ack_logs();
        Ok(report)
    }

    /// Bytes of the database file and its write-ahead log (0 for either that is missing).
    fn database_bytes(&self) -> u64 {
        let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        size(&self.path) + size(std::path::Path::new(&wal))
    }
}

/// Deletes, marks and sweeps inside `tx`; returns the report and the files of deleted blobs.
fn collect(tx: &Connection, request: &GcRequest) -> StoreResult<(GcReport, Vec<String>)> {
    let (runs, damaged) = stored_runs(tx)?;
    let metas: Vec<RunMeta> = runs.iter().map(|(_, m)| m.clone()).collect();
    let mut doomed =
        settle(&metas, request.runs.iter().cloned().collect(), &request.named.iter().cloned().collect());
    // A run whose record can't be read goes only when asked for by id (`retrace delete`, which
    // checked that no fork needs it) and not marked running; a collection keeps it.
    let (damaged_gone, damaged_kept): (Vec<&Damaged>, Vec<&Damaged>) =
        damaged.iter().partition(|d| !d.running && request.runs.contains(&d.id));
    // Their replays stay with them as with any kept source ([`settle`] takes a source it can't
    // read for one not stored).
    let kept_sources: HashSet<&str> = damaged_kept.iter().map(|d| d.id.as_str()).collect();
    if !kept_sources.is_empty() {
        let sources: HashMap<&str, &str> =
            metas.iter().filter_map(|m| Some((m.id.as_str(), m.source_run.as_deref()?))).collect();
        doomed.retain(|id| {
            !sources.get(id.as_str()).is_some_and(|s| kept_sources.contains(s)) || request.named.contains(id)
        });
    }
    doomed.extend(damaged_gone.iter().map(|d| d.id.clone()));
    let gone: HashSet<&str> = doomed.iter().map(String::as_str).collect();
    let mut events_deleted = 0;
    let mut vault_originals_deleted = 0;
    let pks = runs
        .iter()
        .map(|(pk, m)| (*pk, m.id.as_str()))
        .chain(damaged_gone.iter().map(|d| (d.pk, d.id.as_str())));
    for (pk, id) in pks.filter(|(_, id)| gone.contains(id)) {
        events_deleted += tx
            .execute("DELETE FROM events WHERE id >= ?1 << 32 AND id < (?1 + 1) << 32", [pk])
            .ctx(|| WHAT)? as u64;
        super::head_blocks::delete_run(tx, pk).ctx(|| WHAT)?;
        super::deliveries::delete_run(tx, pk).ctx(|| WHAT)?;
        for table in ["leases", "prefixes"] {
            tx.execute(&format!("DELETE FROM {table} WHERE run_pk = ?1"), [pk]).ctx(|| WHAT)?;
        }
        // A deleted run's held side effects go with it (QA27 D2: a reason stayed behind).
        tx.execute("DELETE FROM approvals WHERE run = ?1", [id]).ctx(|| WHAT)?;
        vault_originals_deleted += forget_originals(tx, id)?;
        tx.execute("DELETE FROM runs WHERE pk = ?1", [pk]).ctx(|| format!("deleting run {id}"))?;
    }
    let remaining = runs.iter().map(|(_, m)| m).filter(|m| !gone.contains(m.id.as_str()));
    // A kept damaged run's fork edits can't be read: every digest its record still spells is
    // kept, and, if it may still be recording, every blob stored since it began.
    let mut extra: Vec<Digest> = remaining.flat_map(edit_blobs).collect();
    extra.extend(damaged_kept.iter().flat_map(|d| spelled_digests(&d.record)));
    let cutoff = damaged_kept
        .iter()
        .filter(|d| d.running)
        .map(|d| d.started_at_ms)
        .fold(request.blob_cutoff_ms, u64::min);
    mark(tx, extra, cutoff)?;

    let doomed_blobs: Vec<(i64, i64, Option<String>)> = tx
        .prepare(&format!(
            "SELECT kind, CASE kind WHEN {KIND_FILE} THEN size WHEN {KIND_PACKED} THEN 0 ELSE length(data) END, \
             CASE kind WHEN {KIND_FILE} THEN data END FROM blobs WHERE {UNKEPT}"
        ))
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect())
        .ctx(|| WHAT)?;
    let files: Vec<String> = doomed_blobs.iter().filter_map(|(_, _, f)| f.clone()).collect();
    let mut bytes_freed: u64 = doomed_blobs.iter().map(|(_, n, _)| *n as u64).sum();
    let blobs_deleted = tx.execute(&format!("DELETE FROM blobs WHERE {UNKEPT}"), []).ctx(|| WHAT)? as u64;
    // Every row was in a digest table (merged above): its digest goes with it.
    let unkept = |table: &str| {
        tx.execute(
            &format!("DELETE FROM {table} WHERE NOT EXISTS (SELECT 1 FROM temp.gc_keep k WHERE k.digest = {table}.digest)"),
            [],
        )
        .ctx(|| WHAT)
    };
    let (indexed, recent) = (unkept("blob_digests")?, unkept("blob_digests_recent")?);
    tx.execute(
        "UPDATE blob_mark SET indexed_rows = indexed_rows - ?1, recent_rows = recent_rows - ?2",
        [indexed as i64, recent as i64],
    )
    .ctx(|| WHAT)?;
    tx.execute("DELETE FROM prefixes WHERE blob_id NOT IN (SELECT id FROM blobs)", []).ctx(|| WHAT)?;
    let cache_entries_dropped = tx
        .execute("DELETE FROM cache WHERE output_blob NOT IN (SELECT digest FROM blobs)", [])
        .ctx(|| WHAT)? as u64;
    bytes_freed += sweep_segments(tx)?;
    tx.execute_batch("DROP TABLE temp.gc_keep").ctx(|| WHAT)?;
    // A new row's id is above every id left (and so is in the tail), even where the deleted
    // rows had the largest ids.
    let top: Option<i64> = tx.query_row("SELECT max(id) FROM blobs", [], |r| r.get(0)).ctx(|| WHAT)?;
    super::tail::set_mark(tx, top.unwrap_or(0))?;
    let report = GcReport {
        dry_run: request.dry_run,
        runs_deleted: doomed,
        events_deleted,
        blobs_deleted,
        bytes_freed,
        cache_entries_dropped,
        vault_originals_deleted,
    };
    Ok((report, files))
}

/// Drops run `id`'s hold on its tokens, and the originals of those no other run holds (QA38
/// D1: deleting a run left its secrets revealable with the vault key); returns how many.
fn forget_originals(tx: &Connection, id: &str) -> StoreResult<u64> {
    let tokens: Vec<String> = tx
        .prepare_cached("SELECT token FROM vault_refs WHERE run = ?1")
        .and_then(|mut s| s.query_map([id], |r| r.get(0))?.collect())
        .ctx(|| WHAT)?;
    tx.execute("DELETE FROM vault_refs WHERE run = ?1", [id]).ctx(|| WHAT)?;
    let mut unheld = tx
        .prepare_cached(
            "DELETE FROM vault WHERE token = ?1 AND NOT EXISTS (SELECT 1 FROM vault_refs WHERE token = ?1)",
        )
        .ctx(|| WHAT)?;
    let mut deleted = 0;
    for token in &tokens {
        deleted += unheld.execute([token]).ctx(|| WHAT)? as u64;
    }
    Ok(deleted)
}

/// A run whose stored record can't be decoded (see `super::runs::record_bytes`), as its
/// columns still tell it.
struct Damaged {
    pk: i64,
    id: String,
    started_at_ms: u64,
    running: bool,
    record: Vec<u8>,
}

/// Stored runs whose record decodes, with their row keys.
type Readable = Vec<(i64, RunMeta)>;

/// Every stored run, oldest first: those whose record decodes, and those whose record doesn't.
fn stored_runs(tx: &Connection) -> StoreResult<(Readable, Vec<Damaged>)> {
    let rows: Vec<Damaged> = tx
        .prepare("SELECT pk, id, started_at, status = 'running', meta FROM runs ORDER BY started_at, pk")
        .and_then(|mut s| {
            s.query_map([], |r| {
                Ok(Damaged {
                    pk: r.get(0)?,
                    id: r.get(1)?,
                    started_at_ms: r.get::<_, i64>(2)?.max(0) as u64,
                    running: r.get(3)?,
                    record: super::runs::record_bytes(r, 4)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .ctx(|| WHAT)?;
    let (mut runs, mut damaged) = (Vec::new(), Vec::new());
    for row in rows {
        match decode_json::<RunMeta>(&row.record, &format!("run {}", row.id)) {
            Ok(meta) => runs.push((row.pk, meta)),
            Err(_) => damaged.push(row),
        }
    }
    Ok((runs, damaged))
}

/// The digests `record` spells (`sha256:` and 64 hex digits), wherever they stand.
fn spelled_digests(record: &[u8]) -> Vec<Digest> {
    const PREFIX: &[u8] = b"sha256:";
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = record[at..].windows(PREFIX.len()).position(|w| w == PREFIX) {
        let start = at + i;
        if let Some(text) =
            record.get(start..start + PREFIX.len() + 64).and_then(|b| std::str::from_utf8(b).ok())
        {
            if let Ok(digest) = text.parse::<Digest>() {
                found.push(digest);
            }
        }
        at = start + PREFIX.len();
    }
    found
}

/// Fills `temp.gc_keep` with every blob to keep: those the remaining events reference, `extra`
/// (fork edits), those stored at or after `cutoff`, and, transitively, what kept manifests name.
fn mark(tx: &Connection, extra: Vec<Digest>, cutoff: u64) -> StoreResult<()> {
    tx.execute_batch(
        "DROP TABLE IF EXISTS temp.gc_keep; CREATE TEMP TABLE gc_keep (digest BLOB PRIMARY KEY) WITHOUT ROWID;",
    )
    .ctx(|| WHAT)?;
    for column in ["request_ref", "output_ref"] {
        tx.execute(
            &format!(
                "INSERT OR IGNORE INTO temp.gc_keep SELECT {column} FROM events WHERE {column} IS NOT NULL"
            ),
            [],
        )
        .ctx(|| WHAT)?;
    }
    tx.execute(
        "INSERT OR IGNORE INTO temp.gc_keep SELECT digest FROM blobs WHERE stored_at >= ?1",
        [i64::try_from(cutoff).unwrap_or(i64::MAX)],
    )
    .ctx(|| WHAT)?;
    let mut keep = tx.prepare("INSERT OR IGNORE INTO temp.gc_keep (digest) VALUES (?1)").ctx(|| WHAT)?;
    for digest in &extra {
        keep.execute([digest.as_bytes()]).ctx(|| WHAT)?;
    }
    let manifests: HashMap<Digest, Vec<u8>> = tx
        .prepare(&format!("SELECT digest, data FROM blobs WHERE kind = {KIND_MANIFEST}"))
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?)))?.collect()
        })
        .ctx(|| WHAT)
        .and_then(|rows: Vec<(Vec<u8>, Vec<u8>)>| {
            rows.into_iter()
                .map(|(d, data)| {
                    let d = Digest::from_slice(&d)
                        .ok_or_else(|| StoreError::corrupt("a blob row holds a bad digest"))?;
                    Ok((d, data))
                })
                .collect()
        })?;
    let mut stack: Vec<Digest> = tx
        .prepare(&format!(
            "SELECT b.digest FROM blobs b JOIN temp.gc_keep k ON k.digest = b.digest WHERE b.kind = {KIND_MANIFEST}"
        ))
        .and_then(|mut s| s.query_map([], |r| r.get::<_, Vec<u8>>(0))?.collect::<rusqlite::Result<Vec<_>>>())
        .ctx(|| WHAT)?
        .iter()
        .filter_map(|d| Digest::from_slice(d))
        .collect();
    while let Some(digest) = stack.pop() {
        let Some(data) = manifests.get(&digest) else { continue };
        let named =
            manifest::references(data).map_err(|e| e.context(format!("the manifest of blob {digest}")))?;
        for reference in named {
            let new = keep.execute([reference.as_bytes()]).ctx(|| WHAT)?;
            if new == 1 && manifests.contains_key(&reference) {
                stack.push(reference);
            }
        }
    }
    Ok(())
}

/// Deletes the packed segments no remaining packed blob reaches into, and zeroes the bytes of
/// deleted blobs in the segments it keeps (a deleted run's model output shared a segment with a
/// kept run's: it must not stay readable in the database); returns the bytes of the deleted
/// segments.
fn sweep_segments(tx: &Connection) -> StoreResult<u64> {
    let segments: Vec<(i64, i64)> = tx
        .prepare("SELECT id, length(data) FROM segments ORDER BY id")
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .ctx(|| WHAT)?;
    let index: HashMap<i64, usize> = segments.iter().enumerate().map(|(i, (id, _))| (*id, i)).collect();
    let mut used = vec![false; segments.len()];
    // The byte ranges of each segment that kept blobs use.
    let mut covered: Vec<Vec<(usize, usize)>> = vec![Vec::new(); segments.len()];
    let packed: Vec<(i64, i64)> = tx
        .prepare(&format!("SELECT data, size FROM blobs WHERE kind = {KIND_PACKED}"))
        .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .ctx(|| WHAT)?;
    for (location, size) in packed {
        let (first, mut offset) = (location >> 16, location & 0xffff);
        let Some(mut i) = index.get(&first).copied() else { continue };
        let mut left = size;
        while left > 0 && i < segments.len() {
            used[i] = true;
            let end = segments[i].1.min(offset + left);
            covered[i].push((offset.max(0) as usize, end.max(offset) as usize));
            left -= (segments[i].1 - offset).max(0);
            offset = 0;
            i += 1;
        }
    }
    for (i, ranges) in covered.iter_mut().enumerate().filter(|(i, _)| used[*i]) {
        ranges.sort_unstable();
        if !gaps(ranges, segments[i].1 as usize).is_empty() {
            scrub(tx, segments[i].0, ranges)?;
        }
    }
    let mut freed = 0;
    let mut delete = tx.prepare("DELETE FROM segments WHERE id = ?1").ctx(|| WHAT)?;
    for ((id, len), used) in segments.iter().zip(used) {
        if !used {
            delete.execute(params![id]).ctx(|| WHAT)?;
            freed += *len as u64;
        }
    }
    Ok(freed)
}

/// The ranges of `0..len` that none of `ranges` (sorted by start) covers.
fn gaps(ranges: &[(usize, usize)], len: usize) -> Vec<(usize, usize)> {
    let mut gaps = Vec::new();
    let mut at = 0;
    for &(start, end) in ranges {
        if start > at {
            gaps.push((at, start.min(len)));
        }
        at = at.max(end);
    }
    if at < len {
        gaps.push((at, len));
    }
    gaps
}

/// Zeroes the bytes of segment `id` outside `ranges` (sorted) where any is not zero yet.
fn scrub(tx: &Connection, id: i64, ranges: &[(usize, usize)]) -> StoreResult<()> {
    let mut data: Vec<u8> =
        tx.query_row("SELECT data FROM segments WHERE id = ?1", [id], |r| r.get(0)).ctx(|| WHAT)?;
    let mut changed = false;
    for (start, end) in gaps(ranges, data.len()) {
        let gap = &mut data[start..end];
        if gap.iter().any(|b| *b != 0) {
            gap.fill(0);
            changed = true;
        }
    }
    if changed {
        tx.execute("UPDATE segments SET data = ?1 WHERE id = ?2", params![data, id]).ctx(|| WHAT)?;
    }
    Ok(())
}

fn trash_dir(files: &Files) -> PathBuf {
    files.dir.join(".trash")
}

/// Moves the files of deleted blobs into the trash; returns (original, trashed) paths.
fn trash(files: &Files, relatives: &[String]) -> StoreResult<Vec<(PathBuf, PathBuf)>> {
    if relatives.is_empty() {
        return Ok(Vec::new());
    }
    let dir = trash_dir(files);
    std::fs::create_dir_all(&dir).ctx(|| format!("creating {}", dir.display()))?;
    let mut moved = Vec::new();
    for relative in relatives {
        let from = files.dir.join(relative);
        let to = dir.join(relative.replace('/', ""));
        match std::fs::rename(&from, &to) {
            Ok(()) => moved.push((from, to)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                for (from, to) in &moved {
                    let _ = std::fs::rename(to, from);
                }
                return Err(StoreError::from_io(e, format!("moving {} to the trash", from.display())));
            }
        }
    }
    Ok(moved)
}

impl SqliteStore {
    /// Puts back what a `gc` or `delete` stopped between trashing blob files and committing
    /// (SIGKILL, a CI timeout) left in the trash ([`restore_trash`]): run when the store is
    /// opened, so a killed collection never leaves a run whose blob files are missing until the
    /// next collection happens to run. Costs one `read_dir` in the usual case. The write lock
    /// is only tried: one held means a collection is under way (it restores the trash itself),
    /// and a store this process can't write is left as it is.
    pub(crate) fn restore_stopped_collection(&self) -> StoreResult<()> {
        let trashed = std::fs::read_dir(trash_dir(&self.files)).is_ok_and(|mut e| e.next().is_some());
        if !trashed || self.writable(WHAT).is_err() {
            return Ok(());
        }
        let what = || "restoring blob files a stopped collection left in the trash";
        let mut conn = self.writer.lock();
        conn.busy_timeout(std::time::Duration::ZERO).ctx(what)?;
        let restored = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => restore_trash(&tx, &self.files).and_then(|()| tx.commit().ctx(what)),
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => Ok(()),
            Err(e) => Err(e).ctx(what),
        };
        conn.busy_timeout(std::time::Duration::from_millis(self.busy_timeout_ms)).ctx(what)?;
        restored
    }
}

/// After a crash between trashing and committing: puts back each trashed file whose blob row
/// still names it, removes the others.
fn restore_trash(tx: &Connection, files: &Files) -> StoreResult<()> {
    let dir = trash_dir(files);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Ok(()) };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let digest = name.parse::<Digest>().ok().or_else(|| format!("sha256:{name}").parse().ok());
        let relative = digest.map(|d| Files::relative_path(&d));
        let row: Option<String> = match digest {
            Some(d) => tx
                .query_row(
                    &format!(
                        "SELECT data FROM blobs b WHERE b.id = {} AND b.kind = {KIND_FILE}",
                        super::tail::id_of("?1")
                    ),
                    [d.as_bytes()],
                    |r| r.get(0),
                )
                .ok(),
            None => None,
        };
        match (row, relative) {
            (Some(row), Some(relative)) if row == relative && !files.dir.join(&relative).exists() => {
                std::fs::rename(&path, files.dir.join(&relative))
                    .ctx(|| format!("restoring {} from the trash", path.display()))?;
            }
            _ => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    Ok(())
}
