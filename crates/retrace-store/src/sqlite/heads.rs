//! [`EventHead`]s, request refs and request blobs from SQLite: the columns each holds,
//! nothing else decoded.
use retrace_core::{Digest, EventType};
use rusqlite::{params, Row};

use super::blobs;
use super::runs::run_pk;
use super::SqliteStore;
use crate::error::ResultExt;
use crate::{EventHead, StoreError, StoreResult};

fn head_from_row(run: &str, row: &Row<'_>) -> rusqlite::Result<StoreResult<EventHead>> {
    let seq = row.get::<_, i64>(0)? as u64;
    let code: i64 = row.get(1)?;
    let agent_id: String = row.get(2)?;
    let causal_parent = row.get::<_, Option<i64>>(3)?.map(|p| p as u64);
    let name: Option<String> = row.get(4)?;
    let Some(kind) = u8::try_from(code).ok().and_then(EventType::from_code) else {
        return Ok(Err(StoreError::corrupt(format!("event {seq} of run {run} has a bad type column"))));
    };
    Ok(Ok(EventHead { seq, agent_id, kind, name, causal_parent }))
}

impl SqliteStore {
    /// One query for any number of seqs (a JSON array read by `json_each`). `CROSS JOIN` keeps
    /// `json_each` the outer loop: left to itself, the planner may scan the whole run and
    /// re-parse the list for every row.
    pub(crate) fn heads_at_impl(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<EventHead>> {
        let list = serde_json::to_string(seqs).unwrap_or_else(|_| "[]".to_string());
        let found: Vec<EventHead> = self.read(|conn| {
            let pk = run_pk(conn, run)?;
            conn.prepare_cached(
                "SELECT e.seq, e.type, a.name, e.causal_parent, e.name FROM json_each(?2) j \
                 CROSS JOIN events e ON e.id = (?1 << 32) + j.value AND j.value < 4294967296 \
                 JOIN agents a ON a.pk = e.agent_pk ORDER BY j.key",
            )
            .and_then(|mut s| s.query_map(params![pk, list], |r| head_from_row(run, r))?.collect())
            .ctx(|| format!("reading {} event heads of run {run}", seqs.len()))
            .and_then(|rows: Vec<StoreResult<EventHead>>| rows.into_iter().collect())
        })?;
        if found.len() != seqs.len() {
            let have: std::collections::HashSet<u64> = found.iter().map(|h| h.seq).collect();
            let missing = seqs.iter().find(|s| !have.contains(s)).copied().unwrap_or_default();
            return Err(StoreError::not_found(format!("run {run} has no event {missing}")));
        }
        Ok(found)
    }
}

impl SqliteStore {
    /// One query for any number of seqs, as [`SqliteStore::heads_at_impl`].
    pub(crate) fn request_refs_at_impl(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<Option<Digest>>> {
        let list = serde_json::to_string(seqs).unwrap_or_else(|_| "[]".to_string());
        let found: Vec<(i64, Option<Vec<u8>>)> = self.read(|conn| {
            let pk = run_pk(conn, run)?;
            conn.prepare_cached(
                "SELECT e.seq, e.request_ref FROM json_each(?2) j \
                 CROSS JOIN events e ON e.id = (?1 << 32) + j.value AND j.value < 4294967296 ORDER BY j.key",
            )
            .and_then(|mut s| s.query_map(params![pk, list], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
            .ctx(|| format!("reading {} request refs of run {run}", seqs.len()))
        })?;
        if found.len() != seqs.len() {
            let have: std::collections::HashSet<u64> = found.iter().map(|(s, _)| *s as u64).collect();
            let missing = seqs.iter().find(|s| !have.contains(s)).copied().unwrap_or_default();
            return Err(StoreError::not_found(format!("run {run} has no event {missing}")));
        }
        found
            .into_iter()
            .map(|(seq, digest)| match digest {
                Some(bytes) => Digest::from_slice(&bytes).map(Some).ok_or_else(|| {
                    StoreError::corrupt(format!("event {seq} of run {run} has a bad request_ref"))
                }),
                None => Ok(None),
            })
            .collect()
    }
}

impl SqliteStore {
    /// One query for any number of seqs, as [`SqliteStore::heads_at_impl`]: each event's
    /// request ref and its blob's row (the packed bytes with it), read in the order asked; each
    /// blob verified as [`blobs::get`] does.
    pub(crate) fn request_blobs_at_impl(&self, run: &str, seqs: &[u64]) -> StoreResult<Vec<Option<Vec<u8>>>> {
        let list = serde_json::to_string(seqs).unwrap_or_else(|_| "[]".to_string());
        let what = || format!("reading {} request blobs of run {run}", seqs.len());
        self.read(|conn| {
            let pk = run_pk(conn, run)?;
            let mut select = conn
                .prepare_cached(&format!(
                    "SELECT j.key, e.request_ref, {} FROM json_each(?2) j \
                     CROSS JOIN events e ON e.id = (?1 << 32) + j.value AND j.value < 4294967296 \
                     LEFT JOIN blobs b ON b.id = coalesce((SELECT h.id FROM blobs h \
                     WHERE h.id = e.request_blob AND h.digest = e.request_ref), {})",
                    blobs::ROW_COLUMNS,
                    super::tail::id_of("e.request_ref")
                ))
                .ctx(what)?;
            let mut rows = select.query(params![pk, list]).ctx(what)?;
            // None: the event wasn't found.
            let mut found: Vec<Option<Option<Vec<u8>>>> = vec![None; seqs.len()];
            while let Some(r) = rows.next().ctx(what)? {
                let index: usize = r.get(0).ctx(what)?;
                let Some(slot) = found.get_mut(index) else { continue };
                let Some(digest) = r.get_ref(1).and_then(|v| Ok(v.as_blob_or_null()?)).ctx(what)? else {
                    *slot = Some(None);
                    continue;
                };
                let digest = Digest::from_slice(digest).ok_or_else(|| {
                    StoreError::corrupt(format!("event {} of run {run} has a bad request_ref", seqs[index]))
                })?;
                let row = match r.get::<_, Option<i64>>(2).ctx(what)? {
                    Some(kind) => Some((kind, r.get(3).ctx(what)?, r.get(4).ctx(what)?, r.get(5).ctx(what)?)),
                    None => None,
                };
                *slot = Some(blobs::from_row(conn, &self.files, &digest, row).ok());
            }
            seqs.iter()
                .zip(found)
                .map(|(seq, blob)| {
                    blob.ok_or_else(|| StoreError::not_found(format!("run {run} has no event {seq}")))
                })
                .collect()
        })
    }
}
