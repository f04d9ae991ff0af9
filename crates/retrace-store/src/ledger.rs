//! The replay ledger and the approvals table (issue 8; SPEC §4 `retrace approve`, `agents`,
//! `ledger export`).
//!
//! - The ledger: per (project, agent), how its traces replayed under `retrace gate`
//!   ([`retrace_core::ledger::LedgerEntry`]). [`LedgerStore::ledger_record`] adds one replay
//!   atomically: a trace file counts once per content hash in `traces_replayed`; a clean replay
//!   extends the clean streak (and, for a hash new to the streak, `distinct_traces`); a
//!   divergence resets both and becomes the last divergence.
//! - Approvals: a side effect held by the autonomy policy is a pending [`ApprovalRecord`];
//!   `retrace approve` decides it once ([`LedgerStore::approval_decide`]); the process holding
//!   the run's lease reads the decision and appends the `approval` event (one sequencer per run).
use retrace_core::ledger::LedgerEntry;
use retrace_core::Digest;
use serde::{Deserialize, Serialize};

use crate::StoreResult;

/// One agent's outcome in one replayed trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayOutcome {
    /// The project.
    pub project: String,
    /// The agent.
    pub agent: String,
    /// The trace file's content hash.
    pub trace: Digest,
    /// Whether every step of this agent (and the ending) matched.
    pub clean: bool,
    /// Where it diverged, when it did.
    pub seq: Option<u64>,
    /// The divergence in words, when it did.
    pub detail: Option<String>,
    /// Unix milliseconds of the replay.
    pub at_ms: u64,
}

/// A person's answer to a held side effect.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalDecision {
    /// Released (`true`) or refused.
    pub approved: bool,
    /// Who decided (the OS user on the command line).
    pub by: String,
    /// Why.
    pub reason: String,
    /// Unix milliseconds of the decision.
    pub at_ms: u64,
}

/// A held side effect and, once given, its decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    /// The id `retrace approve` names.
    pub id: String,
    /// The run.
    pub run: String,
    /// The agent.
    pub agent: String,
    /// The tool.
    pub tool: String,
    /// The step's key: a call asked again with the same key finds its approval.
    pub key: Digest,
    /// The agent's rung when it was held, and why.
    pub rung: String,
    /// Why it was held (the rung's reason and the bar).
    pub why: String,
    /// Unix milliseconds of the hold.
    pub requested_at_ms: u64,
    /// The decision, once given.
    pub decision: Option<ApprovalDecision>,
}

/// The ledger and the approvals of a store.
pub trait LedgerStore: Send + Sync {
    /// Adds one agent's replay of one trace, atomically; returns the updated entry.
    fn ledger_record(&self, outcome: &ReplayOutcome) -> StoreResult<LedgerEntry>;
    /// The entries of `project` (every project when `None`), by project then agent.
    fn ledger_entries(&self, project: Option<&str>) -> StoreResult<Vec<LedgerEntry>>;
    /// Stores a pending approval; `Conflict` when the id exists.
    fn approval_request(&self, record: &ApprovalRecord) -> StoreResult<()>;
    /// Decides a pending approval once; `NotFound` for an unknown id, `Conflict` when it was
    /// decided already. Returns the decided record.
    fn approval_decide(&self, id: &str, decision: &ApprovalDecision) -> StoreResult<ApprovalRecord>;
    /// One approval by id.
    fn approval(&self, id: &str) -> StoreResult<Option<ApprovalRecord>>;
    /// The latest approval of (`run`, `agent`, step `key`), if any.
    fn approval_for(&self, run: &str, agent: &str, key: &Digest) -> StoreResult<Option<ApprovalRecord>>;
    /// Every approval not decided yet, oldest request first (a run that has ended may still hold
    /// one: its call timed out or its program gave up on it).
    fn approvals_undecided(&self) -> StoreResult<Vec<ApprovalRecord>>;
}

/// How `entry` changes with `outcome`, given whether the trace was replayed before by this
/// agent (`seen`) and whether it already counts in the current clean streak (`in_streak`).
/// The one rule both backends apply.
pub fn apply(entry: &mut LedgerEntry, outcome: &ReplayOutcome, seen: bool, in_streak: bool) {
    entry.replays += 1;
    if !seen {
        entry.traces_replayed += 1;
    }
    if outcome.clean {
        entry.clean_streak += 1;
        if !in_streak {
            entry.distinct_traces += 1;
        }
    } else {
        entry.clean_streak = 0;
        entry.distinct_traces = 0;
        entry.last_divergence = Some(retrace_core::ledger::LastDivergence {
            at_ms: outcome.at_ms,
            trace: outcome.trace.to_string(),
            seq: outcome.seq,
            detail: outcome.detail.clone().unwrap_or_else(|| "diverged".into()),
        });
    }
}
