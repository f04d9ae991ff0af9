//! The replay ledger and the approvals in SQLite (tables `ledger`, `ledger_traces`,
//! `approvals`, see [`super::schema`]).
use retrace_core::ledger::{LastDivergence, LedgerEntry};
use retrace_core::Digest;
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::SqliteStore;
use crate::error::ResultExt;
use crate::ledger::{apply, ApprovalDecision, ApprovalRecord, LedgerStore, ReplayOutcome};
use crate::{StoreError, StoreResult};

const LEDGER_COLUMNS: &str =
    "project, agent, replays, traces_replayed, clean_streak, distinct_traces, last_divergence";
const APPROVAL_COLUMNS: &str = "id, run, agent, tool, key, rung, why, requested_at, decision";

fn entry_from_row(row: &Row<'_>) -> rusqlite::Result<StoreResult<LedgerEntry>> {
    let last: Option<String> = row.get(6)?;
    let last_divergence = match last.map(|t| serde_json::from_str::<LastDivergence>(&t)).transpose() {
        Ok(l) => l,
        Err(e) => return Ok(Err(StoreError::corrupt(format!("a ledger row's last divergence: {e}")))),
    };
    Ok(Ok(LedgerEntry {
        project: row.get(0)?,
        agent: row.get(1)?,
        replays: row.get::<_, i64>(2)? as u64,
        traces_replayed: row.get::<_, i64>(3)? as u64,
        clean_streak: row.get::<_, i64>(4)? as u64,
        distinct_traces: row.get::<_, i64>(5)? as u64,
        last_divergence,
    }))
}

fn approval_from_row(row: &Row<'_>) -> rusqlite::Result<StoreResult<ApprovalRecord>> {
    let id: String = row.get(0)?;
    let key: Vec<u8> = row.get(4)?;
    let decision: Option<String> = row.get(8)?;
    let Some(key) = Digest::from_slice(&key) else {
        return Ok(Err(StoreError::corrupt(format!("approval {id} has a bad key"))));
    };
    let decision = match decision.map(|t| serde_json::from_str::<ApprovalDecision>(&t)).transpose() {
        Ok(d) => d,
        Err(e) => return Ok(Err(StoreError::corrupt(format!("approval {id}'s decision: {e}")))),
    };
    Ok(Ok(ApprovalRecord {
        run: row.get(1)?,
        agent: row.get(2)?,
        tool: row.get(3)?,
        key,
        rung: row.get(5)?,
        why: row.get(6)?,
        requested_at_ms: row.get::<_, i64>(7)? as u64,
        decision,
        id,
    }))
}

fn one_entry(conn: &Connection, project: &str, agent: &str) -> StoreResult<Option<LedgerEntry>> {
    conn.prepare_cached(&format!("SELECT {LEDGER_COLUMNS} FROM ledger WHERE project = ?1 AND agent = ?2"))
        .and_then(|mut s| s.query_row(params![project, agent], entry_from_row).optional())
        .ctx(|| format!("reading the ledger of {project}/{agent}"))?
        .transpose()
}

fn one_approval(conn: &Connection, id: &str) -> StoreResult<Option<ApprovalRecord>> {
    conn.prepare_cached(&format!("SELECT {APPROVAL_COLUMNS} FROM approvals WHERE id = ?1"))
        .and_then(|mut s| s.query_row([id], approval_from_row).optional())
        .ctx(|| format!("reading approval {id}"))?
        .transpose()
}

impl LedgerStore for SqliteStore {
    fn ledger_record(&self, o: &ReplayOutcome) -> StoreResult<LedgerEntry> {
        let what = format!("adding a replay of {} to the ledger of {}/{}", o.trace, o.project, o.agent);
        self.write(&what, |tx| {
            let mut entry = one_entry(tx, &o.project, &o.agent)?.unwrap_or_else(|| LedgerEntry {
                project: o.project.clone(),
                agent: o.agent.clone(),
                ..LedgerEntry::default()
            });
            let in_streak: Option<i64> = tx
                .prepare_cached(
                    "SELECT in_streak FROM ledger_traces WHERE project = ?1 AND agent = ?2 AND trace = ?3",
                )
                .and_then(|mut s| s.query_row(params![o.project, o.agent, o.trace.as_bytes()], |r| r.get(0)).optional())
                .ctx(|| what.clone())?;
            apply(&mut entry, o, in_streak.is_some(), in_streak == Some(1));
            if o.clean {
                tx.execute(
                    "INSERT INTO ledger_traces (project, agent, trace, in_streak) VALUES (?1, ?2, ?3, 1) \
                     ON CONFLICT (project, agent, trace) DO UPDATE SET in_streak = 1",
                    params![o.project, o.agent, o.trace.as_bytes()],
                )
                .ctx(|| what.clone())?;
            } else {
                tx.execute(
                    "UPDATE ledger_traces SET in_streak = 0 WHERE project = ?1 AND agent = ?2",
                    params![o.project, o.agent],
                )
                .ctx(|| what.clone())?;
                tx.execute(
                    "INSERT OR IGNORE INTO ledger_traces (project, agent, trace, in_streak) VALUES (?1, ?2, ?3, 0)",
                    params![o.project, o.agent, o.trace.as_bytes()],
                )
                .ctx(|| what.clone())?;
            }
            let last = entry.last_divergence.as_ref().map(|d| serde_json::to_string(d).expect("serializes"));
            tx.execute(
                &format!(
                    "INSERT OR REPLACE INTO ledger ({LEDGER_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
                ),
                params![
                    entry.project,
                    entry.agent,
                    entry.replays as i64,
                    entry.traces_replayed as i64,
                    entry.clean_streak as i64,
                    entry.distinct_traces as i64,
                    last
                ],
            )
            .ctx(|| what.clone())?;
            Ok(entry)
        })
    }

    fn ledger_entries(&self, project: Option<&str>) -> StoreResult<Vec<LedgerEntry>> {
        self.read(|conn| {
            conn.prepare_cached(&format!(
                "SELECT {LEDGER_COLUMNS} FROM ledger WHERE ?1 IS NULL OR project = ?1 ORDER BY project, agent"
            ))
            .and_then(|mut s| s.query_map([project], entry_from_row)?.collect())
            .ctx(|| "reading the ledger")
            .and_then(|rows: Vec<StoreResult<LedgerEntry>>| rows.into_iter().collect())
        })
    }

    fn approval_request(&self, r: &ApprovalRecord) -> StoreResult<()> {
        let what = format!("holding {} of {} in run {} for approval", r.tool, r.agent, r.run);
        self.write(&what, |tx| {
            if one_approval(tx, &r.id)?.is_some() {
                return Err(StoreError::conflict(format!("approval {} exists", r.id)));
            }
            let decision = r.decision.as_ref().map(|d| serde_json::to_string(d).expect("serializes"));
            tx.execute(
                &format!(
                    "INSERT INTO approvals ({APPROVAL_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
                ),
                params![
                    r.id,
                    r.run,
                    r.agent,
                    r.tool,
                    r.key.as_bytes(),
                    r.rung,
                    r.why,
                    r.requested_at_ms as i64,
                    decision
                ],
            )
            .ctx(|| what.clone())?;
            Ok(())
        })
    }

    fn approval_decide(&self, id: &str, d: &ApprovalDecision) -> StoreResult<ApprovalRecord> {
        let what = format!("deciding approval {id}");
        self.write(&what, |tx| {
            let mut record =
                one_approval(tx, id)?.ok_or_else(|| StoreError::not_found(format!("no approval {id}")))?;
            if let Some(done) = &record.decision {
                return Err(StoreError::conflict(format!(
                    "approval {id} was already {} by {}",
                    if done.approved { "approved" } else { "refused" },
                    done.by
                )));
            }
            tx.execute(
                "UPDATE approvals SET decision = ?2 WHERE id = ?1",
                params![id, serde_json::to_string(d).expect("serializes")],
            )
            .ctx(|| what.clone())?;
            record.decision = Some(d.clone());
            Ok(record)
        })
    }

    fn approval(&self, id: &str) -> StoreResult<Option<ApprovalRecord>> {
        self.read(|conn| one_approval(conn, id))
    }

    fn approval_for(&self, run: &str, agent: &str, key: &Digest) -> StoreResult<Option<ApprovalRecord>> {
        self.read(|conn| {
            conn.prepare_cached(&format!(
                "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE run = ?1 AND agent = ?2 AND key = ?3 \
                 ORDER BY requested_at DESC, rowid DESC LIMIT 1"
            ))
            .and_then(|mut s| s.query_row(params![run, agent, key.as_bytes()], approval_from_row).optional())
            .ctx(|| format!("reading the approvals of {agent} in run {run}"))?
            .transpose()
        })
    }

    fn approvals_undecided(&self) -> StoreResult<Vec<ApprovalRecord>> {
        self.read(|conn| {
            conn.prepare_cached(&format!(
                "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE decision IS NULL ORDER BY requested_at, rowid"
            ))
            .and_then(|mut s| s.query_map([], approval_from_row)?.collect::<Result<Vec<_>, _>>())
            .ctx(|| "reading the approvals not decided yet")?
            .into_iter()
            .collect()
        })
    }
}
