//! [`EventHead`]s from SQLite: the columns a head holds, nothing else decoded.
use retrace_core::EventType;
use rusqlite::{params, Row};

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
                 CROSS JOIN events e ON e.run_pk = ?1 AND e.seq = j.value \
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
