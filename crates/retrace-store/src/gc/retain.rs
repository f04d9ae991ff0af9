//! Setting a run's retention tier (SPEC §4 `retrace retain`): what the command line and the
//! daemon's `POST /api/runs/{run}/retain` both call, so the two can't disagree.
use retrace_core::run::{Retention, RunMeta, RunMode};

use crate::{EventStore, StoreError};

/// What [`retain`] changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retained {
    /// The run's id.
    pub run: String,
    /// Its tier now.
    pub retention: Retention,
    /// Its tier before.
    pub previous: Retention,
}

/// Why a tier was not set.
#[derive(Debug, thiserror::Error)]
pub enum RetainError {
    /// Replay runs have no tier of their own: they go with their source.
    #[error("run {run} is a replay: replay runs keep no tier of their own and go with their source")]
    Replay {
        /// The replay run.
        run: String,
        /// Its source, the run to retain instead (when it names one).
        source_run: Option<String>,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Sets `meta`'s tier to `tier` and stores it. `meta` is the run as found by its caller (by id
/// or prefix, each front end reporting an unknown run its own way). A replay run is refused.
pub fn retain<S: EventStore + ?Sized>(
    store: &S,
    mut meta: RunMeta,
    tier: Retention,
) -> Result<Retained, RetainError> {
    if meta.mode == RunMode::Replay {
        return Err(RetainError::Replay { run: meta.id, source_run: meta.source_run });
    }
    let previous = meta.retention;
    meta.retention = tier;
    store.update_run(&meta)?;
    // A run still recording keeps it too: its recorder stores the tier it reads back when the
    // run ends (`retrace_runtime`'s `finish::with_stored_tier`).
    Ok(Retained { run: meta.id, retention: tier, previous })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;
    use retrace_core::run::RunStatus;

    #[test]
    fn a_tier_is_stored_and_a_replay_is_refused() {
        let store = MemoryStore::new();
        let mut source = RunMeta::new("01sourcerun000000000000000", RunMode::Record, 1);
        source.status = RunStatus::Ok;
        store.create_run(&source).unwrap();
        let mut replay = RunMeta::new("01replayrun000000000000000", RunMode::Replay, 2);
        replay.source_run = Some(source.id.clone());
        store.create_run(&replay).unwrap();

        let done = retain(&store, source.clone(), Retention::Incident).unwrap();
        assert_eq!((done.previous, done.retention), (Retention::Routine, Retention::Incident));
        assert_eq!(store.run(&source.id).unwrap().retention, Retention::Incident);

        let refused = retain(&store, replay.clone(), Retention::Pinned).unwrap_err();
        assert!(
            matches!(&refused, RetainError::Replay { source_run: Some(s), .. } if *s == source.id),
            "{refused}"
        );
        assert_eq!(store.run(&replay.id).unwrap().retention, Retention::Routine);
        assert!(retain(&store, replay, Retention::Pinned).is_err());
    }
}
