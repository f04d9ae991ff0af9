//! Runs and leases in SQLite.
use retrace_core::run::{RunMeta, RunStatus};
use rusqlite::{params, Connection, OptionalExtension};

use super::rows::decode_json;
use super::{ack_log, SqliteStore, WalSyncs};
use crate::error::ResultExt;
use crate::memory::{ambiguous, check_prefix};
use crate::writer::lease::{lease_busy, now_ms, Lease, LEASELESS_GRACE_MS};
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

fn decode_meta(id: &str, json: &str) -> StoreResult<RunMeta> {
    decode_json(json.as_bytes(), &format!("run {id}"))
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
            Ok(())
        })
    }

    pub(crate) fn run_impl(&self, id: &str) -> StoreResult<RunMeta> {
        let json: Option<String> = self.read(|conn| {
            conn.prepare_cached("SELECT meta FROM runs WHERE id = ?1")
                .and_then(|mut s| s.query_row([id], |r| r.get(0)).optional())
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
        let found: Vec<(String, String)> = self.read(|conn| {
            conn.prepare_cached("SELECT id, meta FROM runs WHERE id >= ?1 ORDER BY id LIMIT 2")
                .and_then(|mut s| s.query_map([prefix], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
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
        let rows: Vec<(String, String)> = self.read(|conn| {
            conn.prepare_cached("SELECT id, meta FROM runs ORDER BY started_at, pk")
                .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
                .ctx(|| "listing runs")
        })?;
        rows.iter().map(|(id, json)| decode_meta(id, json)).collect()
    }

    /// Takes the lease of `run`, then recovers what its ack log holds (a recorder that held
    /// the lease before may have died) and, under `Durability::Event`, starts a new log.
    pub(crate) fn acquire_lease_impl(&self, run: &str, holder: &LeaseHolder, ttl_ms: u64) -> StoreResult<()> {
        let pk = self.write(&format!("taking the lease of run {run}"), |tx| {
            let pk = run_pk(tx, run)?;
            let now = now_ms();
            if let Some(lease) = lease_of(tx, pk)? {
                if lease.holder != *holder && lease.is_live(now) {
                    return Err(lease_busy(run, &lease, now));
                }
            }
            put_lease(tx, pk, &Lease { holder: holder.clone(), expires_at_ms: now + ttl_ms })
                .ctx(|| format!("taking the lease of run {run}"))?;
            Ok(pk)
        })?;
        let ready = self.recover_ack_log(run, pk).and_then(|_| match self.wal_sync.is_some() {
            true => self.ack_logs.open(run, pk).ctx(|| format!("creating the ack log of run {run}")),
            false => Ok(()),
        });
        if let Err(e) = ready {
            let _ = self.write(&format!("releasing the lease of run {run}"), |tx| {
                delete_lease(tx, pk, holder).ctx(|| format!("releasing the lease of run {run}"))
            });
            return Err(e);
        }
        Ok(())
    }

    /// Commits the batches in the ack log of `run` (key `pk`) that the database lacks, syncs the
    /// WAL and deletes the log; how many events it committed. The caller holds the lease.
    pub(super) fn recover_ack_log(&self, run: &str, pk: i64) -> StoreResult<usize> {
        let path = ack_log::path_of(self.ack_logs.dir(), pk);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(StoreError::from_io(e, format!("reading the ack log {}", path.display()))),
        };
        let where_ = |first: u64, last: u64, offset: usize| {
            format!(
                "recovering seqs {first}..={last} of run {run} from its ack log {} (byte {offset})",
                path.display()
            )
        };
        let mut stored = self.last_seq_impl(run)?;
        let mut applied = 0;
        for record in ack_log::scan(&bytes) {
            let (first, last) = (record.first, record.last);
            if last <= stored {
                continue;
            }
            if first <= stored {
                return Err(StoreError::corrupt(format!(
                    "{}: the database holds seqs up to {stored}, part of this batch",
                    where_(first, last, record.offset)
                )));
            }
            let batch = record.decode().map_err(|why| {
                StoreError::corrupt(format!("{}: the record holds {why}", where_(first, last, record.offset)))
            })?;
            if batch.run_id != run {
                return Err(StoreError::corrupt(format!(
                    "{}: the record is of run {}",
                    where_(first, last, record.offset),
                    batch.run_id
                )));
            }
            self.commit_tx(&batch, WalSyncs::Now).map_err(|e| match e.kind {
                // A gap: the disk lost events it had synced.
                crate::StoreErrorKind::Conflict => StoreError::corrupt(format!(
                    "{}: {e}; acknowledged events are missing",
                    where_(first, last, record.offset)
                )),
                _ => e.context(where_(first, last, record.offset)),
            })?;
            stored = last;
            applied += batch.events.len();
        }
        self.sync_wal().map_err(|e| StoreError::from_io(e, format!("syncing the WAL of {}", self.label)))?;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(StoreError::from_io(e, format!("deleting the ack log {}", path.display())))
            }
            _ => Ok(applied),
        }
    }

    /// Recovers the ack logs of runs whose recorder is gone: for each, takes the lease if no
    /// live one binds, recovers, and puts the lease back as it was (so that
    /// [`SqliteStore::recover_interrupted_impl`] judges the run as before).
    fn recover_dead_ack_logs(&self) -> StoreResult<()> {
        let pks = self
            .ack_logs
            .on_disk()
            .map_err(|e| StoreError::from_io(e, format!("listing {}", self.ack_logs.dir().display())))?;
        let me = LeaseHolder::current();
        for pk in pks {
            let id: Option<String> = self.read(|conn| {
                conn.prepare_cached("SELECT id FROM runs WHERE pk = ?1")
                    .and_then(|mut s| s.query_row([pk], |r| r.get(0)).optional())
                    .ctx(|| "reading the run of an ack log")
            })?;
            let Some(run) = id else {
                let _ = std::fs::remove_file(ack_log::path_of(self.ack_logs.dir(), pk));
                continue;
            };
            let what = format!("recovering the ack log of run {run}");
            let taken = self.write(&what, |tx| {
                let before = lease_of(tx, pk)?;
                let now = now_ms();
                if before.as_ref().is_some_and(|l| l.is_live(now)) {
                    return Ok(None);
                }
                put_lease(tx, pk, &Lease { holder: me.clone(), expires_at_ms: now + 60_000 })
                    .ctx(|| &what)?;
                Ok(Some(before))
            })?;
            let Some(before) = taken else { continue };
            let recovered = self.recover_ack_log(&run, pk);
            self.write(&what, |tx| {
                match &before {
                    Some(lease) => put_lease(tx, pk, lease),
                    None => delete_lease(tx, pk, &me),
                }
                .ctx(|| &what)
            })?;
            recovered?;
        }
        Ok(())
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
        let released = self.write(&format!("releasing the lease of run {run}"), |tx| {
            tx.prepare_cached(
                "DELETE FROM leases WHERE run_pk = (SELECT pk FROM runs WHERE id = ?1) AND holder = ?2",
            )
            .and_then(|mut s| s.execute(params![run, holder.0]))
            .ctx(|| format!("releasing the lease of run {run}"))?;
            Ok(())
        });
        if let Some(log) = self.ack_logs.close(run) {
            // Everything the log holds is committed: once the WAL is on the disk, it goes.
            let path = log.lock().path().to_path_buf();
            let gone = self
                .sync_wal()
                .and_then(|()| std::fs::remove_file(&path))
                .map_err(|e| StoreError::from_io(e, format!("deleting the ack log {}", path.display())));
            return released.and(indexed).and(gone);
        }
        released.and(indexed)
    }

    pub(crate) fn lease_holder_impl(&self, run: &str) -> StoreResult<Option<LeaseHolder>> {
        let lease = self.read(|conn| lease_of(conn, run_pk(conn, run)?))?;
        let now = now_ms();
        Ok(lease.filter(|l| l.is_live(now)).map(|l| l.holder))
    }

    pub(crate) fn recover_interrupted_impl(&self) -> StoreResult<Vec<String>> {
        self.recover_dead_ack_logs()?;
        self.write("recovering interrupted runs", |tx| {
            let what = || "recovering interrupted runs";
            type Candidate = (i64, String, i64, String, Option<String>, Option<i64>);
            let candidates: Vec<Candidate> = tx
                .prepare_cached(
                    "SELECT r.pk, r.id, r.started_at, r.meta, l.holder, l.expires_at FROM runs r \
                     LEFT JOIN leases l ON l.run_pk = r.pk WHERE r.status = 'running' ORDER BY r.pk",
                )
                .and_then(|mut s| {
                    s.query_map([], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
                    })?
                    .collect()
                })
                .ctx(what)?;
            let now = now_ms();
            let mut recovered = Vec::new();
            for (pk, id, started, json, holder, expires) in candidates {
                let dead = match (holder, expires) {
                    (Some(holder), Some(expires)) => {
                        !Lease { holder: LeaseHolder(holder), expires_at_ms: expires as u64 }.is_live(now)
                    }
                    _ => (started as u64).saturating_add(LEASELESS_GRACE_MS) <= now,
                };
                if !dead {
                    continue;
                }
                let mut meta = decode_meta(&id, &json)?;
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
