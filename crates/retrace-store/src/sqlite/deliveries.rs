//! The `deliveries` table (schema version 6): what `retrace knew` lists, clustered by the
//! receiving agent, so that an agent's deliveries lie together on a few pages however large the
//! run ([`SqliteStore::heard_impl`]).
//!
//! Row: `(run_pk, agent_pk, seq)` of a `deliver` event, its causal parent (`send`), the row id
//! of the blob its parent's `request_ref` names (`blob`) and its own `extra` column. `blob` is
//! resolved when the delivery is committed (or by the upgrade): 0 when the parent has no
//! request, NULL when it couldn't be resolved then (the parent or its blob not stored); readers
//! ask `events` and `blobs` for a NULL one. A blob an event references is never collected, so
//! the id stays that blob's for as long as the row lives.
use std::collections::HashMap;

use retrace_core::Digest;
use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension};

use super::blobs;
use super::runs::run_pk;
use super::SqliteStore;
use crate::error::ResultExt;
use crate::{DeliveryHead, StoreError, StoreResult};

/// A delivery to write.
pub(crate) struct Row {
    pub agent_pk: i64,
    pub seq: u64,
    pub send: Option<u64>,
    /// The event's `extra` column.
    pub extra: Value,
}

/// Writes `rows` (deliveries of run `run_pk` committed in `tx`, whose events are inserted);
/// `requests` holds the `request_ref` of the batch's events by seq, `known` the blob row ids
/// the transaction knows.
pub(crate) fn put(
    tx: &Connection,
    run_pk: i64,
    rows: &[Row],
    requests: &HashMap<u64, Option<Digest>>,
    known: &HashMap<Digest, Option<i64>>,
) -> rusqlite::Result<()> {
    let mut insert = tx.prepare_cached(
        "INSERT OR REPLACE INTO deliveries (run_pk, agent_pk, seq, send, blob, extra) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    let mut request_of =
        tx.prepare_cached("SELECT request_ref FROM events WHERE run_pk = ?1 AND seq = ?2")?;
    let mut blob_of = tx.prepare_cached("SELECT id FROM blobs WHERE digest = ?1")?;
    for row in rows {
        let blob: Option<i64> = match row.send {
            None => None,
            Some(send) => {
                let request: Option<Option<Digest>> = match requests.get(&send) {
                    Some(r) => Some(*r),
                    None => request_of
                        .query_row(params![run_pk, send as i64], |r| r.get::<_, Option<Vec<u8>>>(0))
                        .optional()?
                        .map(|d| d.and_then(|d| Digest::from_slice(&d))),
                };
                match request {
                    // The parent isn't stored in this run: left to readers.
                    None => None,
                    Some(None) => Some(0),
                    Some(Some(digest)) => match known.get(&digest) {
                        Some(id) => *id,
                        None => blob_of.query_row([digest.as_bytes()], |r| r.get(0)).optional()?,
                    },
                }
            }
        };
        insert.execute(params![
            run_pk,
            row.agent_pk,
            row.seq as i64,
            row.send.map(|s| s as i64),
            blob,
            row.extra
        ])?;
    }
    Ok(())
}

/// Deletes the deliveries of run `run_pk`.
pub(crate) fn delete_run(conn: &Connection, run_pk: i64) -> rusqlite::Result<usize> {
    conn.execute("DELETE FROM deliveries WHERE run_pk = ?1", [run_pk])
}

/// Fills the table from every delivery stored (the upgrade to schema version 6).
pub(crate) fn backfill(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "INSERT OR REPLACE INTO deliveries (run_pk, agent_pk, seq, send, blob, extra) \
         SELECT d.run_pk, d.agent_pk, d.seq, d.causal_parent, \
         CASE WHEN s.seq IS NULL THEN NULL WHEN s.request_ref IS NULL THEN 0 \
         ELSE (SELECT b.id FROM blobs b WHERE b.digest = s.request_ref) END, d.extra \
         FROM events d LEFT JOIN events s ON s.run_pk = d.run_pk AND s.seq = d.causal_parent \
         WHERE d.type = 5",
    )
}

/// The `msg` member of an event's `extra` column, the rest left unread.
#[derive(serde::Deserialize)]
struct MessageOnly {
    msg: Option<retrace_core::envelope::MessageRef>,
}

/// The message envelope in a delivery's `extra` column.
fn message(
    run: &str,
    seq: i64,
    extra: Option<&str>,
) -> StoreResult<Option<retrace_core::envelope::MessageRef>> {
    match extra {
        // Plain serde_json: a message envelope holds no numbers to keep exact.
        Some(json) => Ok(serde_json::from_str::<MessageOnly>(json)
            .map_err(|e| {
                StoreError::corrupt(format!("event {seq} of run {run} has a bad extra column: {e}"))
            })?
            .msg),
        None => Ok(None),
    }
}

/// The head of a delivery from a row whose first columns are `seq`, `send` and `extra`.
fn head_from_row(run: &str, r: &rusqlite::Row<'_>) -> rusqlite::Result<StoreResult<DeliveryHead>> {
    let seq: i64 = r.get(0)?;
    let send: Option<i64> = r.get(1)?;
    let extra = r.get_ref(2).and_then(|v| Ok(v.as_str_or_null()?))?;
    Ok(message(run, seq, extra).map(|message| DeliveryHead {
        seq: seq as u64,
        causal_parent: send.map(|s| s as u64),
        message,
    }))
}

impl SqliteStore {
    /// The deliveries to `agent` before `before`, in seq order, from `deliveries` alone.
    pub(crate) fn delivery_heads_impl(
        &self,
        run: &str,
        agent: &str,
        before: u64,
    ) -> StoreResult<Vec<DeliveryHead>> {
        let what = || format!("reading the deliveries to agent {agent} in run {run}");
        self.read(|conn| {
            let pk = run_pk(conn, run)?;
            let before = i64::try_from(before).unwrap_or(i64::MAX);
            let mut select = conn
                .prepare_cached(
                    "SELECT d.seq, d.send, d.extra FROM deliveries d WHERE d.run_pk = ?1 \
                     AND d.agent_pk = (SELECT pk FROM agents WHERE name = ?2) AND d.seq < ?3 ORDER BY d.seq",
                )
                .ctx(what)?;
            let mut rows = select.query(params![pk, agent, before]).ctx(what)?;
            let mut out = Vec::new();
            while let Some(r) = rows.next().ctx(what)? {
                out.push(head_from_row(run, r).ctx(what)??);
            }
            Ok(out)
        })
    }

    /// [`crate::Store::heard_by`]: the deliveries with the request blobs of the events they
    /// delivered, each blob read by its row id (verified against that row's digest); a delivery
    /// whose blob wasn't resolved when committed is answered as
    /// [`SqliteStore::request_blobs_at_impl`] answers.
    pub(crate) fn heard_impl(
        &self,
        run: &str,
        agent: &str,
        before: u64,
    ) -> StoreResult<Vec<(DeliveryHead, Option<Vec<u8>>)>> {
        let what = || format!("reading the deliveries to agent {agent} in run {run}");
        let mut unresolved: Vec<(usize, u64)> = Vec::new();
        let mut out = self.read(|conn| {
            let pk = run_pk(conn, run)?;
            let before = i64::try_from(before).unwrap_or(i64::MAX);
            let mut select = conn
                .prepare_cached(&format!(
                    "SELECT d.seq, d.send, d.extra, d.blob, b.digest, {} FROM deliveries d \
                     LEFT JOIN blobs b ON b.id = d.blob WHERE d.run_pk = ?1 \
                     AND d.agent_pk = (SELECT pk FROM agents WHERE name = ?2) AND d.seq < ?3 ORDER BY d.seq",
                    blobs::ROW_COLUMNS
                ))
                .ctx(what)?;
            let mut rows = select.query(params![pk, agent, before]).ctx(what)?;
            let mut out = Vec::new();
            while let Some(r) = rows.next().ctx(what)? {
                let head = head_from_row(run, r).ctx(what)??;
                let blob_id: Option<i64> = r.get(3).ctx(what)?;
                let bytes = match (head.causal_parent, blob_id) {
                    (None, _) | (_, Some(0)) => None,
                    (Some(send), None) => {
                        unresolved.push((out.len(), send));
                        None
                    }
                    (Some(send), Some(_)) => {
                        match r.get_ref(4).and_then(|v| Ok(v.as_blob_or_null()?)).ctx(what)? {
                            // No such row (a blob an event references is never collected).
                            None => {
                                unresolved.push((out.len(), send));
                                None
                            }
                            Some(digest) => {
                                let digest = Digest::from_slice(digest)
                                    .ok_or_else(|| StoreError::corrupt("a blob row holds a bad digest"))?;
                                let row = (
                                    r.get(5).ctx(what)?,
                                    r.get(6).ctx(what)?,
                                    r.get(7).ctx(what)?,
                                    r.get(8).ctx(what)?,
                                );
                                blobs::from_row(conn, &self.files, &digest, Some(row)).ok()
                            }
                        }
                    }
                };
                out.push((head, bytes));
            }
            Ok(out)
        })?;
        if !unresolved.is_empty() {
            let mut sends: Vec<u64> = unresolved.iter().map(|(_, s)| *s).collect();
            sends.sort_unstable();
            sends.dedup();
            let blobs = self.request_blobs_at_impl(run, &sends)?;
            let by_send: HashMap<u64, Option<Vec<u8>>> = sends.into_iter().zip(blobs).collect();
            for (i, send) in unresolved {
                out[i].1 = by_send.get(&send).cloned().flatten();
            }
        }
        Ok(out)
    }
}
