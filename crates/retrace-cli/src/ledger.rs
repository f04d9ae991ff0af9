//! The replay ledger's hook (issue 8, item 4).
//!
//! `retrace gate` calls [`record_outcome`] once per trace it replayed, with the *real* store
//! (`RETRACE_HOME` / `RETRACE_STORE`, never the trace's temporary store), the project, the
//! recording the trace holds (its run id and the hash its event chain ends at, not the file's
//! bytes) and how each of its agents fared. Each agent's row keyed by (project,
//! agent id) is updated there ([`retrace_store::LedgerStore::ledger_record`]): traces replayed
//! (each recording counted once), clean streak, distinct traces, last divergence.
use std::path::Path;

use retrace_core::Digest;
use retrace_store::ledger::ReplayOutcome;
use retrace_store::StoreConfig;

/// How one agent fared in one replayed trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentOutcome {
    /// The agent's id.
    pub agent: String,
    /// True when the replay matched every step (and the ending) of this agent.
    pub clean: bool,
    /// The divergence code and seq when this agent diverged, e.g. `step_mismatch at seq 7`.
    pub divergence: Option<String>,
    /// The seq this agent diverged at, when known.
    pub seq: Option<u64>,
}

/// Adds one replayed trace to the ledger in the real store, one row per agent.
pub fn record_outcome(
    real_store: &StoreConfig,
    project: &str,
    trace_digest: &Digest,
    agents: &[AgentOutcome],
) -> anyhow::Result<()> {
    if agents.is_empty() {
        return Ok(());
    }
    let store = crate::commands::open(real_store)?;
    let at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default();
    for a in agents {
        store.ledger_record(&ReplayOutcome {
            project: project.into(),
            agent: a.agent.clone(),
            trace: *trace_digest,
            clean: a.clean,
            seq: a.seq,
            detail: match (&a.divergence, a.clean) {
                (Some(d), _) => Some(d.clone()),
                (None, false) => Some("the trace diverged at another agent".into()),
                (None, true) => None,
            },
            at_ms,
        })?;
    }
    Ok(())
}

/// The project a gate runs for: `[project] name` in `dir/retrace.toml`, else the name of the
/// git top-level folder above `dir` (or of `dir` outside git).
pub fn project(dir: &Path) -> String {
    retrace_runtime::autonomy::project(dir)
}
