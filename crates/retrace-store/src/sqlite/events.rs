//! Events in SQLite: the one atomic write path (`commit`: events, blobs, cache entries) and the
//! reads.
use std::collections::HashMap;

use retrace_core::run::RunMeta;
use retrace_core::{Digest, Event};
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension};

use super::deliveries;
use super::head_blocks::{self, RawHead};
use super::rows::{decode_json, event_from_row, event_values, EVENT_COLUMNS, EVENT_COLUMN_COUNT};
use super::runs::run_pk;
use super::staged::Staged;
use super::tail;
use super::{ack_log, blobs, cache, schema, SqliteStore, WalSyncs};
use crate::cache::check_batch;
use crate::error::ResultExt;
use crate::writer::check_seqs;
use crate::{Batch, BlobAt, BlobPut, LocatedEvent, StoreError, StoreResult};

fn last_seq(conn: &Connection, run: &str, pk: i64) -> StoreResult<u64> {
    let last: Option<i64> = conn
        .prepare_cached(
            "SELECT max(id) & 4294967295 FROM events WHERE id >= ?1 << 32 AND id < (?1 + 1) << 32",
        )
        .and_then(|mut s| s.query_row([pk], |r| r.get(0)))
        .ctx(|| format!("reading the last seq of run {run}"))?;
    Ok(last.map_or(0, |s| s as u64))
}

/// The run's `fork_at`, read only when a batch could start there.
fn fork_at(conn: &Connection, run: &str, pk: i64) -> StoreResult<Option<u64>> {
    let json: Vec<u8> = conn
        .prepare_cached("SELECT meta FROM runs WHERE pk = ?1")
        .and_then(|mut s| s.query_row([pk], |r| super::runs::record_bytes(r, 0)))
        .ctx(|| format!("reading run {run}"))?;
    Ok(decode_json::<RunMeta>(&json, &format!("run {run}"))?.fork_at)
}

impl SqliteStore {
    /// Commits `batch` in one transaction (its blobs' digests hold by construction:
    /// [`crate::BlobPut`]). Under `Durability::Event`, a batch of a run whose lease this store
    /// holds is made durable in the run's ack log, other batches by syncing the WAL.
    pub(crate) fn commit_impl(&self, batch: &Batch) -> StoreResult<()> {
        let log = match self.wal_sync.is_some() && !batch.events.is_empty() {
            true => self.ack_logs.get(&batch.run_id),
            false => None,
        };
        let (Some(log), Some(flusher)) = (log, &self.flusher) else {
            return self.commit_tx(batch, WalSyncs::Now);
        };
        let (first, last) = (batch.events[0].seq, batch.events[batch.events.len() - 1].seq);
        // Held through the commit, so the log can't close between the commit and its record.
        let mut log = log.lock();
        let record = match log.takes(first) && ack_log::takes(batch) {
            true => ack_log::encode(batch),
            false => None,
        };
        let Some(record) = record else {
            self.commit_tx(batch, WalSyncs::Now)?;
            log.committed(last);
            return Ok(());
        };
        let what = |log: &ack_log::AckLog| {
            format!(
                "committing {} of run {}: writing its ack log {}",
                crate::error::seqs(first, last),
                batch.run_id,
                log.path().display()
            )
        };
        // The record's sync runs on the flusher's thread while the batch commits.
        let at = log.stage(&record, || self.sync_wal()).ctx(|| what(&log))?;
        let syncing = log.start_sync(flusher);
        let committed = self.commit_tx(batch, WalSyncs::Later);
        let synced = flusher.wait(syncing);
        if let Err(e) = committed {
            log.withdraw(at);
            return Err(e);
        }
        log.synced(at, record.len(), synced).ctx(|| what(&log))?;
        log.committed(last);
        Ok(())
    }

    /// Commits `batch` in one transaction, syncing the WAL under `Durability::Event` as `sync` says.
    pub(super) fn commit_tx(&self, batch: &Batch, sync: WalSyncs) -> StoreResult<()> {
        let run = &batch.run_id;
        let (first, last) = match (batch.events.first(), batch.events.last()) {
            (Some(f), Some(l)) => (f.seq, l.seq),
            _ => (0, 0),
        };
        let what = format!("committing {} of run {run}", crate::error::seqs(first, last));
        let mut fresh_agents: HashMap<String, i64> = HashMap::new();
        let mut fresh_names: HashMap<String, i64> = HashMap::new();
        // Rows of about this size, and the blobs' bytes.
        const EVENT_ROW_BYTES: usize = 300;
        let bytes =
            batch.events.len() * EVENT_ROW_BYTES + batch.blobs.iter().map(|b| b.bytes().len()).sum::<usize>();
        self.write_with(&what, bytes, sync, |tx| {
            let pk = match run_pk(tx, run) {
                Ok(pk) => Some(pk),
                // Blobs alone may be stored without a run (no chaining of requests then).
                Err(e) if e.kind == crate::StoreErrorKind::NotFound && batch.events.is_empty() => None,
                Err(e) => return Err(e),
            };
            if let Some(pk) = pk.filter(|_| !batch.events.is_empty()) {
                let stored = last_seq(tx, run, pk)?;
                let fork = if stored == 0 && first > 1 { fork_at(tx, run, pk)? } else { None };
                check_seqs(run, stored, fork, &batch.events)?;
            }
            let mut tail = self.caught_up_tail(tx, tail::MERGE_AT)?;
            check_batch(batch, |digest| Ok(tail.find(tx, digest)?.is_some()))?;
            let mut staged = Staged::new(&self.files, &mut tail);
            blobs::put_all(tx, &mut staged, pk, &batch.blobs)?;
            let known = std::mem::take(&mut staged.known);
            staged.finish(tx)?;
            drop(tail);
            for (key, entry) in &batch.cache {
                cache::put(tx, key, entry)?;
            }
            if !batch.cache.is_empty() {
                self.merge_cache_if_full(tx, batch.cache.len())?;
            }
            let Some(pk) = pk else { return Ok(()) };
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO events (id, agent_pk, type, lamport, causal_parent, name, key, \
                     request_ref, output_ref, output_hash, flags, prev, hash, extra, request_blob, \
                     output_blob) \
                     VALUES ((?1 << 32) | ?3, ?2, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
                )
                .ctx(|| what.clone())?;
            let mut heads = Vec::with_capacity(batch.events.len());
            let mut first_delivery = None;
            for event in &batch.events {
                schema::check_event_id(run, pk, event.seq)?;
                let agent = self.agent_pk(tx, &event.agent_id, &mut fresh_agents)?;
                let values = event_values(run, event)?;
                let all = [Value::Integer(pk), Value::Integer(agent)];
                // The row ids of blobs this batch carried (a blob stored earlier and not
                // carried again stays NULL: readers look its digest up).
                let id = |digest: Option<Digest>| match digest.and_then(|d| known.get(&d).copied().flatten()) {
                    Some(id) => Value::Integer(id),
                    None => Value::Null,
                };
                let ids = [id(event.request_ref), id(event.output_ref)];
                let params = all.iter().chain(values.iter()).chain(ids.iter());
                insert.execute(params_from_iter(params)).ctx(|| what.clone())?;
                let name_pk = match &event.name {
                    Some(name) => Some(self.name_pk(tx, name, &mut fresh_names).ctx(|| what.clone())?),
                    None => None,
                };
                if event.kind == retrace_core::EventType::Deliver {
                    first_delivery.get_or_insert(event.seq);
                }
                heads.push(RawHead {
                    seq: event.seq,
                    parent: event.causal_parent,
                    agent_pk: agent,
                    name_pk,
                    code: event.kind.code(),
                });
            }
            deliveries::follow(tx, pk, first, first_delivery, last).ctx(|| what.clone())?;
            head_blocks::put(tx, pk, &heads).ctx(|| what.clone())
        })?;
        self.state.agents.lock().extend(fresh_agents);
        self.state.names.lock().extend(fresh_names);
        Ok(())
    }

    pub(crate) fn put_blobs_impl(&self, blobs: &[BlobPut]) -> StoreResult<Vec<Option<BlobAt>>> {
        let what = format!("storing {} blobs", blobs.len());
        let bytes = blobs.iter().map(|b| b.bytes().len()).sum();
        self.write_sized(&what, bytes, |tx| {
            let mut tail = self.caught_up_tail(tx, tail::BULK_MERGE_AT)?;
            let mut staged = Staged::new(&self.files, &mut tail);
            blobs::put_all(tx, &mut staged, None, blobs)?;
            let at = |b: &BlobPut| staged.known.get(&b.digest()).copied().flatten().map(BlobAt::new);
            let located = blobs.iter().map(at).collect();
            staged.finish(tx)?;
            Ok(located)
        })
    }

    /// The interned id of `agent`, inserting it in `tx` when new (`fresh` collects those, to
    /// be cached once the transaction commits).
    fn agent_pk(&self, tx: &Connection, agent: &str, fresh: &mut HashMap<String, i64>) -> StoreResult<i64> {
        if let Some(pk) = self.state.agents.lock().get(agent).or_else(|| fresh.get(agent)) {
            return Ok(*pk);
        }
        let what = || format!("interning agent {agent}");
        tx.prepare_cached("INSERT OR IGNORE INTO agents (name) VALUES (?1)")
            .and_then(|mut s| s.execute([agent]))
            .ctx(what)?;
        let pk: i64 = tx
            .prepare_cached("SELECT pk FROM agents WHERE name = ?1")
            .and_then(|mut s| s.query_row([agent], |r| r.get(0)))
            .ctx(what)?;
        fresh.insert(agent.to_string(), pk);
        Ok(pk)
    }

    /// The interned id of step name `name` (see [`SqliteStore::agent_pk`]).
    fn name_pk(
        &self,
        tx: &Connection,
        name: &str,
        fresh: &mut HashMap<String, i64>,
    ) -> rusqlite::Result<i64> {
        if let Some(pk) = self.state.names.lock().get(name) {
            return Ok(*pk);
        }
        head_blocks::intern_name(tx, fresh, name)
    }

    pub(crate) fn events_impl(&self, run: &str, from: u64, limit: usize) -> StoreResult<Vec<Event>> {
        self.read(|conn| {
            let pk = run_pk(conn, run)?;
            let sql = format!(
                "SELECT {EVENT_COLUMNS} FROM events e JOIN agents a ON a.pk = e.agent_pk \
                 WHERE e.id >= (?1 << 32) + ?2 AND e.id < (?1 + 1) << 32 ORDER BY e.id LIMIT ?3"
            );
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let from = schema::seq_bound(from);
            conn.prepare_cached(&sql)
                .and_then(|mut s| {
                    s.query_map(params![pk, from, limit], |r| event_from_row(run, r))?.collect()
                })
                .ctx(|| format!("reading events of run {run} from seq {from}"))
                .and_then(|rows: Vec<StoreResult<Event>>| rows.into_iter().collect())
        })
    }

    /// [`SqliteStore::events_impl`] with each event's blob row ids.
    pub(crate) fn events_located_impl(
        &self,
        run: &str,
        from: u64,
        limit: usize,
    ) -> StoreResult<Vec<LocatedEvent>> {
        self.read(|conn| {
            let pk = run_pk(conn, run)?;
            let sql = format!(
                "SELECT {EVENT_COLUMNS}, e.request_blob, e.output_blob FROM events e \
                 JOIN agents a ON a.pk = e.agent_pk \
                 WHERE e.id >= (?1 << 32) + ?2 AND e.id < (?1 + 1) << 32 ORDER BY e.id LIMIT ?3"
            );
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let from = schema::seq_bound(from);
            let located = |r: &rusqlite::Row<'_>| -> rusqlite::Result<StoreResult<LocatedEvent>> {
                let at = |i: usize| Ok::<_, rusqlite::Error>(r.get::<_, Option<i64>>(i)?.map(BlobAt::new));
                let (request_at, output_at) = (at(EVENT_COLUMN_COUNT)?, at(EVENT_COLUMN_COUNT + 1)?);
                Ok(event_from_row(run, r)?.map(|event| LocatedEvent { event, request_at, output_at }))
            };
            conn.prepare_cached(&sql)
                .and_then(|mut s| s.query_map(params![pk, from, limit], located)?.collect())
                .ctx(|| format!("reading events of run {run} from seq {from}"))
                .and_then(|rows: Vec<StoreResult<LocatedEvent>>| rows.into_iter().collect())
        })
    }

    pub(crate) fn event_impl(&self, run: &str, seq: u64) -> StoreResult<Event> {
        self.read(|conn| {
            let pk = run_pk(conn, run)?;
            let sql = format!(
                "SELECT {EVENT_COLUMNS} FROM events e JOIN agents a ON a.pk = e.agent_pk \
                 WHERE e.id = (?1 << 32) + ?2"
            );
            let found = conn
                .prepare_cached(&sql)
                .and_then(|mut s| {
                    s.query_row(params![pk, schema::seq_bound(seq)], |r| event_from_row(run, r)).optional()
                })
                .ctx(|| format!("reading event {seq} of run {run}"))?;
            match found {
                Some(event) => event,
                None => Err(StoreError::not_found(format!(
                    "run {run} has no event {seq} (its last seq is {})",
                    last_seq(conn, run, pk)?
                ))),
            }
        })
    }

    /// The seqs from `deliveries` (an agent's on a few pages), each event then by its key.
    pub(crate) fn deliveries_to_impl(&self, run: &str, agent: &str, before: u64) -> StoreResult<Vec<Event>> {
        let what = || format!("reading the deliveries to agent {agent} in run {run}");
        self.read_one_snapshot(what, |conn| {
            let pk = run_pk(conn, run)?;
            let before = schema::seq_bound(before);
            let mut out = Vec::new();
            for part in deliveries::to_agent_parts() {
                let sql = format!(
                    "SELECT {EVENT_COLUMNS} FROM ({part}) d \
                     CROSS JOIN events e ON e.id = (?1 << 32) + d.seq \
                     JOIN agents a ON a.pk = e.agent_pk ORDER BY d.seq"
                );
                let rows: Vec<StoreResult<Event>> = conn
                    .prepare_cached(&sql)
                    .and_then(|mut s| {
                        s.query_map(params![pk, agent, before], |r| event_from_row(run, r))?.collect()
                    })
                    .ctx(what)?;
                for row in rows {
                    out.push(row?);
                }
            }
            Ok(out)
        })
    }

    /// One query for any number of seqs (passed as a JSON array to `json_each`; `CROSS JOIN`
    /// keeps it the outer loop, see [`SqliteStore::heads_at_impl`]).
    pub(crate) fn events_at_impl(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<Event>> {
        let list = serde_json::to_string(seqs).unwrap_or_else(|_| "[]".to_string());
        let found: Vec<Event> = self.read(|conn| {
            let pk = run_pk(conn, run)?;
            let sql = format!(
                "SELECT {EVENT_COLUMNS} FROM json_each(?2) j \
                 CROSS JOIN events e ON e.id = (?1 << 32) + j.value AND j.value < 4294967296 \
                 JOIN agents a ON a.pk = e.agent_pk ORDER BY j.key"
            );
            conn.prepare_cached(&sql)
                .and_then(|mut s| s.query_map(params![pk, list], |r| event_from_row(run, r))?.collect())
                .ctx(|| format!("reading {} events of run {run}", seqs.len()))
                .and_then(|rows: Vec<StoreResult<Event>>| rows.into_iter().collect())
        })?;
        if found.len() != seqs.len() {
            let have: std::collections::HashSet<u64> = found.iter().map(|e| e.seq).collect();
            let missing = seqs.iter().find(|s| !have.contains(s)).copied().unwrap_or_default();
            return Err(StoreError::not_found(format!("run {run} has no event {missing}")));
        }
        Ok(found)
    }

    pub(crate) fn last_seq_impl(&self, run: &str) -> StoreResult<u64> {
        self.read(|conn| last_seq(conn, run, run_pk(conn, run)?))
    }

    /// From the head blocks: no index by agent is kept, as nothing on a hot path asks this and
    /// each such index costs every commit a page per agent.
    pub(crate) fn agent_seqs_impl(&self, run: &str, agent: &str) -> StoreResult<Vec<u64>> {
        let what = || format!("reading the seqs of agent {agent} in run {run}");
        self.read(|conn| {
            let pk = run_pk(conn, run)?;
            let agent_pk: Option<i64> = conn
                .prepare_cached("SELECT pk FROM agents WHERE name = ?1")
                .and_then(|mut s| s.query_row([agent], |r| r.get(0)).optional())
                .ctx(what)?;
            match agent_pk {
                None => Ok(Vec::new()),
                Some(agent_pk) => head_blocks::agent_seqs(conn, pk, agent_pk).ctx(what),
            }
        })
    }
}
