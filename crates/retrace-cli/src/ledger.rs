//! The replay ledger's hook (issue 8, item 4: not built yet).
//!
//! `retrace gate` calls [`record_outcome`] once per trace it replayed, with the *real* store
//! (`RETRACE_HOME` / `RETRACE_STORE`, never the trace's temporary store), the project, the
//! trace's content hash and how each of its agents fared. The ledger will add to its rows keyed
//! by (project, agent id) there: traces replayed (each content hash counted once), clean streak,
//! last divergence. Until then this function does nothing; it is the one place the ledger plugs
//! into, so the gate's flow does not change when it lands.
use std::path::Path;

use retrace_core::Digest;
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
}

/// Adds one replayed trace to the ledger in the real store. Does nothing yet (issue 8, item 4).
pub fn record_outcome(
    _real_store: &StoreConfig,
    _project: &str,
    _trace_digest: &Digest,
    _agents: &[AgentOutcome],
) -> anyhow::Result<()> {
    Ok(())
}

/// The project a gate runs for: the name of the git top-level folder above `dir` (or of `dir`
/// outside git). `[project] name` in `retrace.toml` will override it when the ledger lands.
pub fn project(dir: &Path) -> String {
    let top = crate::launcher::git_toplevel(dir).unwrap_or_else(|| dir.to_path_buf());
    top.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "project".into())
}
