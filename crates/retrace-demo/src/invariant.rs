//! The demo's invariant, checked over the log: a backfill that reads `users.name` must not be
//! approved in a run where that column was renamed.
use retrace_core::{Event, EventType};
use retrace_store::{Store, StoreResult};

use crate::trio::TARGET;

/// Where a run broke the invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The reviewer's approval.
    pub approval_seq: u64,
    /// The schema agent's "column renamed" send.
    pub rename_seq: u64,
}

/// Checks `run`: the approval of the backfill in a run that also renamed its column.
pub fn check(store: &dyn Store, run: &str) -> StoreResult<Option<Violation>> {
    let events = all_events(store, run)?;
    let approval = events.iter().find(|e| {
        e.kind == EventType::Decision
            && e.decision
                .as_ref()
                .is_some_and(|d| d.action == "approve" && d.target.as_deref() == Some(TARGET))
    });
    let rename = events.iter().find(|e| {
        e.kind == EventType::Send
            && e.message.as_ref().and_then(|m| m.kind.as_deref()) == Some("column_renamed")
    });
    Ok(match (approval, rename) {
        (Some(a), Some(r)) => Some(Violation { approval_seq: a.seq, rename_seq: r.seq }),
        _ => None,
    })
}

fn all_events(store: &dyn Store, run: &str) -> StoreResult<Vec<Event>> {
    let mut out = Vec::new();
    loop {
        let page = store.events(run, out.len() as u64 + 1, 1024)?;
        let done = page.len() < 1024;
        out.extend(page);
        if done {
            return Ok(out);
        }
    }
}
