//! The vault and the audit log of [`MemoryStore`].
use super::MemoryStore;
use crate::vault::{AuditEntry, AuditRecord, VaultEntry, VaultStore};
use crate::writer::lease::now_ms;
use crate::StoreResult;

impl VaultStore for MemoryStore {
    fn vault_put(
        &self,
        run: Option<&str>,
        sealed: &[(String, retrace_core::vault::Sealed)],
    ) -> StoreResult<usize> {
        let mut inner = self.inner.lock();
        let now = now_ms();
        let mut new = 0;
        for (token, sealed) in sealed {
            if let Some(run) = run {
                inner.vault_refs.entry(token.clone()).or_default().insert(run.to_owned());
            }
            inner.vault.entry(token.clone()).or_insert_with(|| {
                new += 1;
                VaultEntry { sealed: sealed.clone(), created_at_ms: now }
            });
        }
        Ok(new)
    }

    fn vault_get(&self, token: &str) -> StoreResult<Option<VaultEntry>> {
        Ok(self.inner.lock().vault.get(token).cloned())
    }

    fn audit_append(&self, entry: &AuditEntry) -> StoreResult<u64> {
        let mut inner = self.inner.lock();
        let id = inner.audit.len() as u64 + 1;
        inner.audit.push(AuditRecord { id, entry: entry.clone() });
        Ok(id)
    }

    fn audit_list(&self, subject: Option<&str>) -> StoreResult<Vec<AuditRecord>> {
        let inner = self.inner.lock();
        Ok(inner.audit.iter().filter(|r| subject.is_none_or(|s| r.entry.subject == s)).cloned().collect())
    }
}
