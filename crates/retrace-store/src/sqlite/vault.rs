//! The vault and the audit log in SQLite (tables `vault` and `audit`, see [`super::schema`]).
use retrace_core::vault::{Sealed, NONCE_BYTES};
use rusqlite::{params, OptionalExtension, Row};

use super::SqliteStore;
use crate::error::ResultExt;
use crate::vault::{AuditAction, AuditEntry, AuditRecord, VaultEntry, VaultStore};
use crate::writer::lease::now_ms;
use crate::{StoreError, StoreResult};

const AUDIT_COLUMNS: &str = "id, at, who, role, action, subject, reason, outcome";

fn audit_from_row(row: &Row<'_>) -> rusqlite::Result<StoreResult<AuditRecord>> {
    let id: i64 = row.get(0)?;
    let action: String = row.get(4)?;
    let Some(action) = AuditAction::parse(&action) else {
        return Ok(Err(StoreError::corrupt(format!("audit entry {id} has an unknown action {action:?}"))));
    };
    let entry = AuditEntry {
        at_ms: row.get::<_, i64>(1)? as u64,
        who: row.get(2)?,
        role: row.get(3)?,
        action,
        subject: row.get(5)?,
        reason: row.get(6)?,
        outcome: row.get(7)?,
    };
    Ok(Ok(AuditRecord { id: id as u64, entry }))
}

impl VaultStore for SqliteStore {
    fn vault_put(&self, run: Option<&str>, sealed: &[(String, Sealed)]) -> StoreResult<usize> {
        if sealed.is_empty() {
            return Ok(0);
        }
        let what = format!("storing {} vault entries", sealed.len());
        self.write(&what, |tx| {
            let mut insert = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO vault (token, nonce, ciphertext, created_at) VALUES (?1, ?2, ?3, ?4)",
                )
                .ctx(|| what.clone())?;
            let mut held = tx
                .prepare_cached("INSERT OR IGNORE INTO vault_refs (run, token) VALUES (?1, ?2)")
                .ctx(|| what.clone())?;
            let now = now_ms() as i64;
            let mut new = 0;
            for (token, s) in sealed {
                new += insert.execute(params![token, &s.nonce[..], s.ciphertext, now]).ctx(|| what.clone())?;
                if let Some(run) = run {
                    held.execute(params![run, token]).ctx(|| what.clone())?;
                }
            }
            Ok(new)
        })
    }

    fn vault_get(&self, token: &str) -> StoreResult<Option<VaultEntry>> {
        let row: Option<(Vec<u8>, Vec<u8>, i64)> = self.read(|conn| {
            conn.prepare_cached("SELECT nonce, ciphertext, created_at FROM vault WHERE token = ?1")
                .and_then(|mut s| s.query_row([token], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).optional())
                .ctx(|| format!("reading the vault entry of {token}"))
        })?;
        let Some((nonce, ciphertext, created)) = row else { return Ok(None) };
        let nonce: [u8; NONCE_BYTES] = nonce
            .try_into()
            .map_err(|_| StoreError::corrupt(format!("the vault entry of {token} has a bad nonce")))?;
        Ok(Some(VaultEntry { sealed: Sealed { nonce, ciphertext }, created_at_ms: created as u64 }))
    }

    fn audit_append(&self, e: &AuditEntry) -> StoreResult<u64> {
        let what = format!("appending a {} audit entry for {}", e.action, e.subject);
        self.write(&what, |tx| {
            tx.prepare_cached(
                "INSERT INTO audit (at, who, role, action, subject, reason, outcome) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .and_then(|mut s| {
                s.insert(params![
                    e.at_ms as i64,
                    e.who,
                    e.role,
                    e.action.as_str(),
                    e.subject,
                    e.reason,
                    e.outcome
                ])
            })
            .ctx(|| what.clone())
            .map(|id| id as u64)
        })
    }

    fn audit_list(&self, subject: Option<&str>) -> StoreResult<Vec<AuditRecord>> {
        self.read(|conn| {
            let sql = match subject {
                Some(_) => format!("SELECT {AUDIT_COLUMNS} FROM audit WHERE subject = ?1 ORDER BY id"),
                None => format!("SELECT {AUDIT_COLUMNS} FROM audit WHERE ?1 IS NULL ORDER BY id"),
            };
            conn.prepare_cached(&sql)
                .and_then(|mut s| s.query_map([subject], audit_from_row)?.collect())
                .ctx(|| "reading the audit log")
                .and_then(|rows: Vec<StoreResult<AuditRecord>>| rows.into_iter().collect())
        })
    }
}
