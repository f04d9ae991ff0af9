//! Deleting named runs now, whatever their tier (`retrace delete`): the same atomic collection
//! as `retrace gc` ([`GcStore::collect_garbage`](crate::gc::GcStore)), asked for these runs and
//! their replays instead of the expired ones.
//!
//! A named run is refused, and nothing is deleted, while something still needs it: it is
//! running, a fork that is not named too inherits its early events, or a replay of it is running.
//! Replay runs of a deleted run go with it (they store only their outcome). Blobs go as in `gc`:
//! those no remaining run references, except the ones stored since the oldest running recording
//! began or within the grace period, which a later `retrace gc` frees.
use std::collections::HashSet;

use retrace_core::run::{RunMeta, RunMode, RunStatus};

use super::{blob_cutoff, GcConfig, GcReport, GcRequest};
use crate::StoreError;

/// Why named runs were not deleted.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    /// A run still recording (or replaying) is never deleted.
    #[error("run {run} is still running")]
    Running {
        /// The run.
        run: String,
    },
    /// A remaining run needs the named one.
    #[error("run {run} is needed by {by_mode} run {by}, which is not being deleted: {why}")]
    Needed {
        /// The named run.
        run: String,
        /// The run that needs it.
        by: String,
        /// `fork` or `replay`.
        by_mode: &'static str,
        /// How it needs it.
        why: &'static str,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Deletes `named` (runs as found by the caller, by id or prefix) and their replays, then
/// sweeps the blobs nothing references any more, in one transaction; a dry run reports what
/// would go. `config` gives the time and the blob grace period (its routine age is not used).
/// `damaged` are ids of runs whose stored record can't be read ([`crate::UnreadableRun`]):
/// they go too, with their replays, unless a fork of them remains.
pub fn delete(
    store: &dyn crate::Store,
    named: &[RunMeta],
    damaged: &[String],
    config: &GcConfig,
) -> Result<GcReport, DeleteError> {
    let (runs, _unreadable) = store.runs_and_unreadable()?;
    let names: HashSet<&str> =
        named.iter().map(|r| r.id.as_str()).chain(damaged.iter().map(String::as_str)).collect();
    // The store's view now, not the caller's (the run may have changed since it was found).
    let now: Vec<&RunMeta> = runs.iter().filter(|r| names.contains(r.id.as_str())).collect();
    if let Some(run) = now.iter().find(|r| r.status == RunStatus::Running) {
        return Err(DeleteError::Running { run: run.id.clone() });
    }
    let mut doomed: HashSet<String> =
        now.iter().map(|r| r.id.clone()).chain(damaged.iter().cloned()).collect();
    for run in &runs {
        let Some(source) = run.source_run.as_deref().filter(|s| names.contains(s)) else { continue };
        if names.contains(run.id.as_str()) {
            continue;
        }
        match (run.mode, run.status) {
            (RunMode::Replay, RunStatus::Running) => {
                return Err(DeleteError::Needed {
                    run: source.into(),
                    by: run.id.clone(),
                    by_mode: "replay",
                    why: "it is reading the run's events now",
                })
            }
            (RunMode::Replay, _) => {
                doomed.insert(run.id.clone());
            }
            _ => {
                return Err(DeleteError::Needed {
                    run: source.into(),
                    by: run.id.clone(),
                    by_mode: "fork",
                    why: "a fork inherits its source's events before its fork point",
                })
            }
        }
    }
    let request = GcRequest {
        runs: runs
            .iter()
            .filter(|r| doomed.contains(&r.id))
            .map(|r| r.id.clone())
            .chain(damaged.iter().cloned())
            .collect(),
        named: now.iter().filter(|r| r.mode == RunMode::Replay).map(|r| r.id.clone()).collect(),
        blob_cutoff_ms: blob_cutoff(&runs, config),
        dry_run: config.dry_run,
    };
    Ok(store.collect_garbage(&request)?)
}

#[cfg(test)]
mod tests {
    use retrace_core::run::Retention;

    use super::*;
    use crate::memory::MemoryStore;
    use crate::EventStore;

    fn stored(store: &MemoryStore, id: &str, mode: RunMode, source: Option<&str>) -> RunMeta {
        let mut meta = RunMeta::new(id, mode, 1);
        meta.status = RunStatus::Ok;
        meta.retention = Retention::Pinned;
        meta.source_run = source.map(str::to_owned);
        meta.fork_at = source.filter(|_| mode == RunMode::Fork).map(|_| 2);
        store.create_run(&meta).unwrap();
        meta
    }

    fn ids(store: &MemoryStore) -> Vec<String> {
        store.runs().unwrap().into_iter().map(|r| r.id).collect()
    }

    #[test]
    fn a_pinned_run_goes_with_its_replays_and_what_needs_it_refuses() {
        let store = MemoryStore::new();
        let config = GcConfig::new(10, 30);
        let src = stored(&store, "src", RunMode::Record, None);
        stored(&store, "replay", RunMode::Replay, Some("src"));
        let fork = stored(&store, "fork", RunMode::Fork, Some("src"));
        let other = stored(&store, "other", RunMode::Record, None);

        let refused = delete(&store, std::slice::from_ref(&src), &[], &config).unwrap_err();
        assert!(
            matches!(&refused, DeleteError::Needed { by, by_mode: "fork", .. } if by == "fork"),
            "{refused}"
        );
        assert_eq!(ids(&store).len(), 4, "nothing went");

        let dry =
            delete(&store, &[src.clone(), fork.clone()], &[], &GcConfig { dry_run: true, ..config }).unwrap();
        assert_eq!(dry.runs_deleted, ["src", "replay", "fork"]);
        assert_eq!(ids(&store).len(), 4, "a dry run changes nothing");

        let done = delete(&store, &[fork, src], &[], &config).unwrap();
        assert_eq!(done.runs_deleted, ["src", "replay", "fork"], "the replay goes with its source");
        assert_eq!(ids(&store), ["other"]);

        let mut running = other.clone();
        running.status = RunStatus::Running;
        store.update_run(&running).unwrap();
        let refused = delete(&store, &[other], &[], &config).unwrap_err();
        assert!(matches!(refused, DeleteError::Running { .. }), "the store's status counts: {refused}");
    }

    #[test]
    fn a_running_replay_keeps_its_source() {
        let store = MemoryStore::new();
        let src = stored(&store, "src", RunMode::Record, None);
        let mut replay = stored(&store, "replay", RunMode::Replay, Some("src"));
        replay.status = RunStatus::Running;
        store.update_run(&replay).unwrap();
        let refused = delete(&store, &[src], &[], &GcConfig::new(10, 30)).unwrap_err();
        assert!(matches!(&refused, DeleteError::Needed { by_mode: "replay", .. }), "{refused}");
        assert_eq!(ids(&store).len(), 2);
    }

    /// A replay goes with its source, and a collection spares it while its source remains; one
    /// named on its own goes (it was "deleted 0 runs").
    #[test]
    fn a_named_replay_goes_and_its_source_stays() {
        let store = MemoryStore::new();
        stored(&store, "src", RunMode::Record, None);
        let first = stored(&store, "replay", RunMode::Replay, Some("src"));
        stored(&store, "again", RunMode::Replay, Some("src"));
        let done = delete(&store, &[first], &[], &GcConfig::new(10, 30)).unwrap();
        assert_eq!(done.runs_deleted, ["replay"]);
        assert_eq!(ids(&store), ["src", "again"]);
    }
}
