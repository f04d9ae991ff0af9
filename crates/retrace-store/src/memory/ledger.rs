//! The replay ledger and the approvals of [`MemoryStore`].
use retrace_core::ledger::LedgerEntry;
use retrace_core::Digest;

use super::MemoryStore;
use crate::ledger::{apply, ApprovalDecision, ApprovalRecord, LedgerStore, ReplayOutcome};
use crate::{StoreError, StoreResult};

impl LedgerStore for MemoryStore {
    fn ledger_record(&self, o: &ReplayOutcome) -> StoreResult<LedgerEntry> {
        let mut inner = self.inner.lock();
        let id = (o.project.clone(), o.agent.clone());
        let in_streak = inner.ledger_traces.get(&(id.clone(), o.trace)).copied();
        let entry = inner.ledger.entry(id.clone()).or_insert_with(|| LedgerEntry {
            project: o.project.clone(),
            agent: o.agent.clone(),
            ..LedgerEntry::default()
        });
        apply(entry, o, in_streak.is_some(), in_streak == Some(true));
        let entry = entry.clone();
        if !o.clean {
            for ((who, _), streak) in inner.ledger_traces.iter_mut() {
                if *who == id {
                    *streak = false;
                }
            }
        }
        inner.ledger_traces.insert((id, o.trace), o.clean);
        Ok(entry)
    }

    fn ledger_entries(&self, project: Option<&str>) -> StoreResult<Vec<LedgerEntry>> {
        let inner = self.inner.lock();
        let mut entries: Vec<LedgerEntry> =
            inner.ledger.values().filter(|e| project.is_none_or(|p| e.project == p)).cloned().collect();
        entries.sort_by(|a, b| (&a.project, &a.agent).cmp(&(&b.project, &b.agent)));
        Ok(entries)
    }

    fn approval_request(&self, record: &ApprovalRecord) -> StoreResult<()> {
        let mut inner = self.inner.lock();
        if inner.approvals.iter().any(|a| a.id == record.id) {
            return Err(StoreError::conflict(format!("approval {} exists", record.id)));
        }
        inner.approvals.push(record.clone());
        Ok(())
    }

    fn approval_decide(&self, id: &str, decision: &ApprovalDecision) -> StoreResult<ApprovalRecord> {
        let mut inner = self.inner.lock();
        let record = inner
            .approvals
            .iter_mut()
            .find(|a| a.id == id)
            .ok_or_else(|| StoreError::not_found(format!("no approval {id}")))?;
        if let Some(done) = &record.decision {
            return Err(StoreError::conflict(format!(
                "approval {id} was already {} by {}",
                if done.approved { "approved" } else { "refused" },
                done.by
            )));
        }
        record.decision = Some(decision.clone());
        Ok(record.clone())
    }

    fn approval(&self, id: &str) -> StoreResult<Option<ApprovalRecord>> {
        Ok(self.inner.lock().approvals.iter().find(|a| a.id == id).cloned())
    }

    fn approval_for(&self, run: &str, agent: &str, key: &Digest) -> StoreResult<Option<ApprovalRecord>> {
        let inner = self.inner.lock();
        Ok(inner.approvals.iter().rev().find(|a| a.run == run && a.agent == agent && a.key == *key).cloned())
    }

    fn approvals_undecided(&self) -> StoreResult<Vec<ApprovalRecord>> {
        let mut held: Vec<ApprovalRecord> =
            self.inner.lock().approvals.iter().filter(|a| a.decision.is_none()).cloned().collect();
        // Stable: requests of the same millisecond stay in the order they were made.
        held.sort_by_key(|a| a.requested_at_ms);
        Ok(held)
    }
}
