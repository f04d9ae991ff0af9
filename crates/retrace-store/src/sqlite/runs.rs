//! Runs and leases in SQLite.
use retrace_core::run::{RunMeta, RunStatus};
use rusqlite::{params, Connection, OptionalExtension};

use super::rows::decode_json;
use super::{ack_log, SqliteStore, WalSyncs};
use crate::error::ResultExt;
use crate::memory::{ambiguous, check_prefix};
use crate::writer::lease::{lease_busy, leaseless_dead, now_ms, Lease};
use crate::{LeaseHolder, StoreError, StoreResult};

/// The integer key of run `id`, `NotFound` when absent.
pub(crate) fn run_pk(conn: &Connection, id: &str) -> StoreResult<i64> {
    conn.prepare_cached("SELECT pk FROM runs WHERE id = ?1")
        .and_then(|mut s| s.query_row([id], |r| r.get(0)).optional())
        .ctx(|| format!("looking up run {id}"))?
        .ok_or_else(|| StoreError::not_found(format!("no run {id}")))
}

fn put_lease(conn: &Connection, pk: i64, lease: &Lease) -> rusqlite::Result<()> {
    conn.prepare_cached("INSERT OR REPLACE INTO leases (run_pk, holder, expires_at) VALUES (?1, ?2, ?3)")
        .and_then(|mut s| s.execute(params![pk, lease.holder.0, lease.expires_at_ms as i64]))
        .map(drop)
}

fn delete_lease(conn: &Connection, pk: i64, holder: &LeaseHolder) -> rusqlite::Result<()> {
    conn.prepare_cached("DELETE FROM leases WHERE run_pk = ?1 AND holder = ?2")
        .and_then(|mut s| s.execute(params![pk, holder.0]))
        .map(drop)
}

fn meta_json(meta: &RunMeta) -> StoreResult<String> {
    serde_json::to_string(meta)
        .map_err(|e| StoreError::invalid(format!("run {} can't be encoded: {e}", meta.id)).with_source(e))
}

fn decode_meta(id: &str, json: &[u8]) -> StoreResult<RunMeta> {
    decode_json(json, &format!("run {id}"))
}

/// A run's stored record as bytes: a record with a byte that is not UTF-8 (damage) is then a
/// run that can't be decoded, named and listed as unreadable, not an error of the listing.
pub(crate) fn record_bytes(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Vec<u8>> {
    use rusqlite::types::{FromSqlError, ValueRef};
    match r.get_ref(i)? {
        ValueRef::Text(b) | ValueRef::Blob(b) => Ok(b.to_vec()),
        other => Err(rusqlite::Error::FromSqlConversionFailure(
            i,
            other.data_type(),
            Box::new(FromSqlError::InvalidType),
        )),
    }
}

fn lease_of(conn: &Connection, pk: i64) -> StoreResult<Option<Lease>> {
    conn.prepare_cached("SELECT holder, expires_at FROM leases WHERE run_pk = ?1")
        .and_then(|mut s| {
            s.query_row([pk], |r| {
                Ok(Lease { holder: LeaseHolder(r.get(0)?), expires_at_ms: r.get::<_, i64>(1)? as u64 })
            })
            .optional()
        })
        .ctx(|| "reading a lease")
}

impl SqliteStore {
    pub(crate) fn create_run_impl(&self, meta: &RunMeta) -> StoreResult<()> {
        let json = meta_json(meta)?;
        self.write(&format!("creating run {}", meta.id), |tx| {
            let inserted = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO runs (id, started_at, status, meta) VALUES (?1, ?2, ?3, ?4)",
                )
                .and_then(|mut s| {
                    s.execute(params![meta.id, meta.started_at_ms as i64, meta.status.as_str(), json])
                })
                .ctx(|| format!("creating run {}", meta.id))?;
            if inserted == 0 {
                return Err(StoreError::conflict(format!("run {} already exists", meta.id)));
            }
            Ok(())
        })
    }

    pub(crate) fn update_run_impl(&self, meta: &RunMeta) -> StoreResult<()> {
        let json = meta_json(meta)?;
        self.write(&format!("updating run {}", meta.id), |tx| {
            let updated = tx
                .prepare_cached("UPDATE runs SET started_at = ?2, status = ?3, meta = ?4 WHERE id = ?1")
                .and_then(|mut s| {
                    s.execute(params![meta.id, meta.started_at_ms as i64, meta.status.as_str(), json])
                })
                .ctx(|| format!("updating run {}", meta.id))?;
            if updated == 0 {
                return Err(StoreError::not_found(format!("no run {}", meta.id)));
            }
            if meta.status != RunStatus::Running {
                // What the run stored is indexed before anyone reads it (its export, a fork
                // of it) by digest, rather than found by scanning the tail.
                self.merge_tail(tx)?;
            }
            Ok(())
        })
    }

    pub(crate) fn run_impl(&self, id: &str) -> StoreResult<RunMeta> {
        let json: Option<Vec<u8>> = self.read(|conn| {
            conn.prepare_cached("SELECT meta FROM runs WHERE id = ?1")
                .and_then(|mut s| s.query_row([id], |r| record_bytes(r, 0)).optional())
                .ctx(|| format!("reading run {id}"))
        })?;
        decode_meta(id, &json.ok_or_else(|| StoreError::not_found(format!("no run {id}")))?)
    }

    pub(crate) fn find_run_impl(&self, prefix: &str) -> StoreResult<RunMeta> {
        match self.run_impl(prefix) {
            Err(e) if e.kind == crate::StoreErrorKind::NotFound => {}
            other => return other,
        }
        check_prefix(prefix)?;
        let found: Vec<(String, Vec<u8>)> = self.read(|conn| {
            conn.prepare_cached("SELECT id, meta FROM runs WHERE id >= ?1 ORDER BY id LIMIT 2")
                .and_then(|mut s| s.query_map([prefix], |r| Ok((r.get(0)?, record_bytes(r, 1)?)))?.collect())
                .ctx(|| format!("finding run {prefix}"))
        })?;
        let found: Vec<_> = found.into_iter().filter(|(id, _)| id.starts_with(prefix)).collect();
        match found.as_slice() {
            [] => Err(StoreError::not_found(format!("no run matches {prefix}"))),
            [(id, json)] => decode_meta(id, json),
            [(a, _), (b, _), ..] => Err(ambiguous(prefix, a, b)),
        }
    }

    pub(crate) fn runs_impl(&self) -> StoreResult<Vec<RunMeta>> {
        self.run_rows()?.iter().map(|(id, json)| decode_meta(id, json)).collect()
    }

    pub(crate) fn runs_and_unreadable_impl(&self) -> StoreResult<(Vec<RunMeta>, Vec<crate::UnreadableRun>)> {
        let (mut runs, mut unreadable) = (Vec::new(), Vec::new());
        for (id, json) in self.run_rows()? {
            match decode_meta(&id, &json) {
                Ok(meta) => runs.push(meta),
                Err(error) => unreadable.push(crate::UnreadableRun { id, error }),
            }
        }
        Ok((runs, unreadable))
    }

    /// Every run's id and stored record, oldest first.
    fn run_rows(&self) -> StoreResult<Vec<(String, Vec<u8>)>> {
        self.read(|conn| {
            conn.prepare_cached("SELECT id, meta FROM runs ORDER BY started_at, pk")
                .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, record_bytes(r, 1)?)))?.collect())
                .ctx(|| "listing runs")
        })
    }

    /// Takes the lease of `run`, then recovers what its ack log holds (a recorder that held
    /// the lease before may have died) and, under `Durability::Event`, starts a new log.
    pub(crate) fn acquire_lease_impl(&self, run: &str, holder: &LeaseHolder, ttl_ms: u64) -> StoreResult<()> {
        // Taken again by the store that holds it (a renewal, in effect): its log stays.
        let ours = self.ack_logs.get(run).is_some();
        let what = format!("taking the lease of run {run}");
        let (pk, previous) = self.write(&what, |tx| {
            let pk = run_pk(tx, run)?;
            let now = now_ms();
            let previous = lease_of(tx, pk)?;
            if let Some(lease) = previous.as_ref().filter(|l| l.is_live(now)) {
                if lease.holder != *holder {
                    return Err(lease_busy(run, lease, now));
                }
                if ours {
                    put_lease(tx, pk, &Lease { holder: holder.clone(), expires_at_ms: now + ttl_ms })
                        .ctx(|| &what)?;
                    return Ok((pk, None));
                }
                // The same process holds it: another store of this process may be recording
                // (its ack log is locked). The lease can't tell; the log can.
                let path = ack_log::path_of(self.ack_logs.dir(), pk);
                if let ack_log::Claim::Busy = ack_log::claim(&path).ctx(|| &what)? {
                    return Err(StoreError::busy(format!(
                        "run {run} is being recorded by another store of this process (its ack log {} is \
                         locked)",
                        path.display()
                    )));
                }
            }
            put_lease(tx, pk, &Lease { holder: holder.clone(), expires_at_ms: now + ttl_ms })
                .ctx(|| &what)?;
            Ok((pk, previous))
        })?;
        if ours {
            return Ok(());
        }
        let ready = self.recover_ack_log_waiting(run, pk).and_then(|()| {
            let next = self.last_seq_impl(run)? + 1;
            match self.wal_sync.is_some() {
                true => match self.ack_logs.open(run, pk, next) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(StoreError::busy(
                        format!("run {run} is being recorded by another store of this process"),
                    )),
                    // No log here (a filesystem without hard links, say): every commit of the
                    // run syncs the WAL, as without a lease.
                    Err(_) => Ok(()),
                },
                false => Ok(()),
            }
        });
        if let Err(e) = ready {
            // The lease goes back to what it was.
            let _ = self.write(&format!("releasing the lease of run {run}"), |tx| {
                match &previous {
                    Some(lease) => put_lease(tx, pk, lease),
                    None => delete_lease(tx, pk, holder),
                }
                .ctx(|| format!("releasing the lease of run {run}"))
            });
            return Err(e);
        }
        Ok(())
    }

    /// Recovers the ack log of `run` (key `pk`), waiting up to the busy timeout for a store
    /// that holds it to let go; `Busy` after that.
    fn recover_ack_log_waiting(&self, run: &str, pk: i64) -> StoreResult<()> {
        let path = ack_log::path_of(self.ack_logs.dir(), pk);
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(self.busy_timeout_ms);
        loop {
            let claim = ack_log::claim(&path)
                .map_err(|e| StoreError::from_io(e, format!("opening the ack log {}", path.display())))?;
            match claim {
                ack_log::Claim::Absent => return Ok(()),
                ack_log::Claim::Found(found) => return self.recover_ack_log(run, found).map(drop),
                ack_log::Claim::Busy if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                ack_log::Claim::Busy => {
                    return Err(StoreError::busy(format!(
                        "run {run} is being recorded by another store (its ack log {} is locked)",
                        path.display()
                    )))
                }
            }
        }
    }

    /// Commits the batches in the ack log `found` of `run` that the database lacks, syncs the
    /// WAL and deletes the log; how many events it committed. A log of another run (a deleted
    /// run whose key was reused) is stale: deleted without committing anything.
    fn recover_ack_log(&self, run: &str, found: ack_log::Found) -> StoreResult<usize> {
        let path = found.path().to_path_buf();
        let bytes = found
            .bytes()
            .map_err(|e| StoreError::from_io(e, format!("reading the ack log {}", path.display())))?;
        let where_ = |first: u64, last: u64, offset: usize| {
            format!(
                "recovering {} of run {run} from its ack log {} (byte {offset})",
                crate::error::seqs(first, last),
                path.display()
            )
        };
        let mut records = ack_log::scan(&bytes);
        // One store appends a run's records in seq order; sorting costs nothing and holds
        // even if two committers of one run interleaved.
        records.sort_by_key(|r| r.first);
        let mut batches = Vec::with_capacity(records.len());
        for record in &records {
            let at = where_(record.first, record.last, record.offset);
            let batch = record
                .decode()
                .map_err(|why| StoreError::corrupt(format!("{at}: the record holds {why}")))?;
            batches.push(batch);
        }
        let theirs = batches.iter().filter(|b| b.run_id != run).count();
        if theirs > 0 && theirs < batches.len() {
            return Err(StoreError::corrupt(format!(
                "the ack log {} of run {run} holds records of other runs",
                path.display()
            )));
        }
        if theirs > 0 {
            // The log of a deleted run whose key was reused: stale.
            batches.clear();
        }
        let mut stored = self.last_seq_impl(run)?;
        let newest = batches.iter().filter_map(|b| b.events.last().map(|e| e.seq)).max().unwrap_or(0);
        let mut applied = 0;
        for (record, batch) in records.iter().zip(&batches) {
            let (first, last) = (record.first, record.last);
            if last <= stored {
                continue;
            }
            let at = where_(first, last, record.offset);
            if first <= stored {
                return Err(StoreError::corrupt(format!(
                    "{at}: the database holds seqs up to {stored}, part of this batch"
                )));
            }
            if let Err(e) = self.commit_tx(batch, WalSyncs::Later) {
                stored = self.last_seq_impl(run)?;
                if stored >= last {
                    continue;
                }
                // The newest record may be of a batch whose commit failed on its content and
                // whose record a crash kept from being withdrawn: never acknowledged, so
                // dropped. (A batch that doesn't continue the run is never written, so a gap
                // is never that.)
                use crate::StoreErrorKind::{Invalid, NotFound};
                if last == newest && matches!(e.kind, Invalid | NotFound) {
                    break;
                }
                return Err(match e.kind {
                    // A gap: the disk lost events it had synced.
                    crate::StoreErrorKind::Conflict => {
                        StoreError::corrupt(format!("{at}: {e}; acknowledged events are missing"))
                    }
                    _ => e.context(at),
                });
            }
            stored = last;
            applied += batch.events.len();
        }
        self.sync_wal().map_err(|e| StoreError::from_io(e, format!("syncing the WAL of {}", self.label)))?;
        found
            .remove()
            .map_err(|e| StoreError::from_io(e, format!("deleting the ack log {}", path.display())))?;
        Ok(applied)
    }

    /// Names the ack log of `run` if one is left that no store holds: recovery (at every
    /// open) could not apply it. The log is only looked at (and locked for that moment).
    pub(crate) fn unrecovered_impl(&self, run: &str) -> Option<String> {
        let pk = self.read(|conn| run_pk(conn, run)).ok()?;
        let path = ack_log::path_of(self.ack_logs.dir(), pk);
        match ack_log::claim(&path) {
            Ok(ack_log::Claim::Found(_)) => Some(format!(
                "its ack log {} holds acknowledged batches recovery could not apply; taking the \
                 run's lease (retrace record or fork with RETRACE_RUN={run}) retries and says why",
                path.display()
            )),
            Ok(_) => None,
            Err(e) => Some(format!("its ack log {} can't be read: {e}", path.display())),
        }
    }

    /// Recovers the ack logs no live store holds (their recorders died). A log that can't be
    /// recovered is left in place and its run is returned, so that it isn't marked interrupted
    /// as if nothing were missing; taking its lease reports why.
    pub(super) fn recover_dead_ack_logs(&self) -> StoreResult<std::collections::HashSet<String>> {
        let mut failed = std::collections::HashSet::new();
        let pks = self
            .ack_logs
            .on_disk()
            .map_err(|e| StoreError::from_io(e, format!("listing {}", self.ack_logs.dir().display())))?;
        ack_log::remove_dead_temps(self.ack_logs.dir());
        for pk in pks {
            let path = ack_log::path_of(self.ack_logs.dir(), pk);
            // A log that can't even be opened is left for taking the lease to report.
            let Ok(ack_log::Claim::Found(found)) = ack_log::claim(&path) else { continue };
            let id: Option<String> = self.read(|conn| {
                conn.prepare_cached("SELECT id FROM runs WHERE pk = ?1")
                    .and_then(|mut s| s.query_row([pk], |r| r.get(0)).optional())
                    .ctx(|| format!("reading the run of the ack log {}", path.display()))
            })?;
            let Some(run) = id else {
                // The log of a deleted run.
                let _ = found.remove();
                continue;
            };
            if self.recover_ack_log(&run, found).is_err() {
                failed.insert(run);
            }
        }
        Ok(failed)
    }

    pub(crate) fn renew_lease_impl(&self, run: &str, holder: &LeaseHolder, ttl_ms: u64) -> StoreResult<()> {
        self.write(&format!("renewing the lease of run {run}"), |tx| {
            let pk = run_pk(tx, run)?;
            let renewed = tx
                .prepare_cached("UPDATE leases SET expires_at = ?3 WHERE run_pk = ?1 AND holder = ?2")
                .and_then(|mut s| s.execute(params![pk, holder.0, (now_ms() + ttl_ms) as i64]))
                .ctx(|| format!("renewing the lease of run {run}"))?;
            if renewed == 0 {
                return Err(StoreError::conflict(format!("{holder} no longer holds the lease of run {run}")));
            }
            Ok(())
        })
    }

    pub(crate) fn release_lease_impl(&self, run: &str, holder: &LeaseHolder) -> StoreResult<()> {
        // The recorder lets go: first the run's deliveries are indexed whole, in a transaction
        // of its own, so that the lease goes even if that fails (the rows then lag, which
        // readers allow for).
        let holds = self.lease_holder_impl(run)?.as_ref() == Some(holder);
        let indexed = match holds {
            true => self.write(&format!("indexing the deliveries of run {run}"), |tx| {
                super::deliveries::complete(tx, run_pk(tx, run)?)
                    .ctx(|| format!("indexing the deliveries of run {run}"))
            }),
            false => Ok(()),
        };
        // Then the ack log, while the lease still keeps others from starting a new one:
        // everything in it is committed, so once the WAL is on the disk it goes.
        let logged = match self.ack_logs.take(run) {
            Some(log) => {
                let mut log = log.lock();
                log.close();
                let path = log.path().to_path_buf();
                self.sync_wal()
                    .map_err(|e| StoreError::from_io(e, format!("syncing the WAL of {}", self.label)))
                    .and_then(|()| {
                        log.delete().map_err(|e| {
                            StoreError::from_io(e, format!("deleting the ack log {}", path.display()))
                        })
                    })
            }
            None => Ok(()),
        };
        let released = self.write(&format!("releasing the lease of run {run}"), |tx| {
            tx.prepare_cached(
                "DELETE FROM leases WHERE run_pk = (SELECT pk FROM runs WHERE id = ?1) AND holder = ?2",
            )
            .and_then(|mut s| s.execute(params![run, holder.0]))
            .ctx(|| format!("releasing the lease of run {run}"))?;
            Ok(())
        });
        released.and(indexed).and(logged)
    }

    pub(crate) fn lease_holder_impl(&self, run: &str) -> StoreResult<Option<LeaseHolder>> {
        let lease = self.read(|conn| lease_of(conn, run_pk(conn, run)?))?;
        let now = now_ms();
        Ok(lease.filter(|l| l.is_live(now)).map(|l| l.holder))
    }

    pub(crate) fn keep_run_impl(&self, run: &str, keeper: &LeaseHolder) -> StoreResult<()> {
        let what = format!("naming the keeper of run {run}");
        self.write(&what, |tx| {
            let updated = tx
                .prepare_cached("UPDATE runs SET keeper = ?2 WHERE id = ?1")
                .and_then(|mut s| s.execute(params![run, keeper.0]))
                .ctx(|| &what)?;
            match updated {
                0 => Err(StoreError::not_found(format!("no run {run}"))),
                _ => Ok(()),
            }
        })
    }

    pub(crate) fn recover_interrupted_impl(&self) -> StoreResult<Vec<String>> {
        // Best effort: a store whose blob folder can't be written (a dry run's private copy of
        // a read-only store) still opens, its trash as it was.
        let _ = self.restore_stopped_collection();
        let unrecovered = self.recover_dead_ack_logs()?;
        // Looked for first without the write lock, which every command opening the store would
        // otherwise wait for (up to the busy timeout) while a long write holds it, for nothing
        // in the usual case: no run's recorder died.
        if self.read(|conn| dead_runs(conn, &unrecovered))?.is_empty() {
            return Ok(Vec::new());
        }
        self.write("recovering interrupted runs", |tx| {
            let what = || "recovering interrupted runs";
            let mut recovered = Vec::new();
            for (pk, id, json) in dead_runs(tx, &unrecovered)? {
                // A record that can't be decoded is left as it is: listed as unreadable, not a
                // store that can't be opened.
                let Ok(mut meta) = decode_meta(&id, &json) else { continue };
                meta.status = RunStatus::Interrupted;
                let json = meta_json(&meta)?;
                tx.prepare_cached("UPDATE runs SET status = ?2, meta = ?3 WHERE pk = ?1")
                    .and_then(|mut s| s.execute(params![pk, meta.status.as_str(), json]))
                    .ctx(what)?;
                tx.prepare_cached("DELETE FROM leases WHERE run_pk = ?1")
                    .and_then(|mut s| s.execute([pk]))
                    .ctx(what)?;
                recovered.push(id);
            }
            Ok(recovered)
        })
    }
}

/// The `running` runs whose recorder died (its lease lapsed, or it never took one within
/// [`LEASELESS_GRACE_MS`]), but for those named in `unrecovered`: pk, id and meta.
fn dead_runs(
    conn: &Connection,
    unrecovered: &std::collections::HashSet<String>,
) -> StoreResult<Vec<(i64, String, Vec<u8>)>> {
    let what = || "recovering interrupted runs";
    type Candidate = (i64, String, i64, Vec<u8>, Option<String>, Option<i64>, Option<String>);
    let candidates: Vec<Candidate> = conn
        .prepare_cached(
            "SELECT r.pk, r.id, r.started_at, r.meta, l.holder, l.expires_at, r.keeper FROM runs r \
             LEFT JOIN leases l ON l.run_pk = r.pk WHERE r.status = 'running' ORDER BY r.pk",
        )
        .and_then(|mut s| {
            s.query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, record_bytes(r, 3)?, r.get(4)?, r.get(5)?, r.get(6)?))
            })?
            .collect()
        })
        .ctx(what)?;
    let now = now_ms();
    let dead = |(_, _, started, _, holder, expires, keeper): &Candidate| match (holder, expires) {
        (Some(holder), Some(expires)) => {
            !Lease { holder: LeaseHolder(holder.clone()), expires_at_ms: *expires as u64 }.is_live(now)
        }
        _ => leaseless_dead(keeper.clone().map(LeaseHolder).as_ref(), *started as u64, now),
    };
    Ok(candidates
        .into_iter()
        .filter(|c| dead(c) && !unrecovered.contains(&c.1))
        .map(|(pk, id, _, json, ..)| (pk, id, json))
        .collect())
}
