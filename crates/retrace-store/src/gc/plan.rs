//! Which runs a collection deletes, and which blobs it must keep whatever references them:
//! pure functions of run metadata (the rules are in [`super`]'s module doc).
use std::collections::{HashMap, HashSet};

use retrace_core::edit::{Content, Edit};
use retrace_core::run::{Retention, RunMeta, RunMode, RunStatus};
use retrace_core::Digest;

use super::GcConfig;

/// Whether `run` keeps itself: it is running, or it is not a replay and its own tier (and age,
/// for `routine`) keeps it.
fn keeps_itself(run: &RunMeta, config: &GcConfig) -> bool {
    if run.status == RunStatus::Running {
        return true;
    }
    match (run.mode, run.retention) {
        (RunMode::Replay, _) => false,
        (_, Retention::Incident | Retention::Pinned) => true,
        (_, Retention::Routine) => {
            config.now_ms.saturating_sub(run.started_at_ms) <= config.routine_max_age_ms
        }
    }
}

/// Whether `run`, while it remains, keeps its source: a fork always (it may inherit events by
/// reference); a replay only while it runs.
fn keeps_source(run: &RunMeta) -> bool {
    run.mode != RunMode::Replay || run.status == RunStatus::Running
}

/// The runs of `runs` a collection under `config` deletes, oldest first.
pub fn plan(runs: &[RunMeta], config: &GcConfig) -> Vec<String> {
    let doomed = runs.iter().filter(|r| !keeps_itself(r, config)).map(|r| r.id.clone()).collect();
    settle(runs, doomed, &HashSet::new())
}

/// Of the runs in `doomed`, those that may go given every run in `runs` (the store's, now),
/// oldest first (in the order of `runs`): repeatedly, a remaining run that keeps its source
/// takes its source out of `doomed`, and a doomed replay whose source remains is spared with
/// it (unless it is in `named`: a replay a user asked to delete), until nothing changes. A
/// replay whose source is not stored goes. Running runs, and runs not in `runs`, never go.
pub fn settle(runs: &[RunMeta], doomed: HashSet<String>, named: &HashSet<String>) -> Vec<String> {
    let by_id: HashMap<&str, &RunMeta> = runs.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut doomed: HashSet<&str> = doomed
        .iter()
        .filter_map(|id| by_id.get(id.as_str()))
        .filter(|r| r.status != RunStatus::Running)
        .map(|r| r.id.as_str())
        .collect();
    loop {
        let mut changed = false;
        for run in runs {
            let Some(source) = run.source_run.as_deref().filter(|s| by_id.contains_key(s)) else {
                continue;
            };
            let gone = doomed.contains(run.id.as_str());
            if !gone && keeps_source(run) && doomed.remove(source) {
                changed = true;
            }
            if gone && run.mode == RunMode::Replay && !doomed.contains(source) && !named.contains(&run.id) {
                doomed.remove(run.id.as_str());
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    runs.iter().filter(|r| doomed.contains(r.id.as_str())).map(|r| r.id.clone()).collect()
}

/// The blobs `run`'s metadata names: the stored contents of its fork edits (`@sha256:…`).
pub fn edit_blobs(run: &RunMeta) -> Vec<Digest> {
    run.edits
        .iter()
        .filter_map(|text| text.parse::<Edit>().ok())
        .filter_map(|edit| match edit.content() {
            Some(Content::Blob(digest)) => Some(*digest),
            _ => None,
        })
        .collect()
}

/// Blobs stored at or after this time are kept: the start of the oldest running run, or
/// `now - blob_grace` if that is earlier.
pub fn blob_cutoff(runs: &[RunMeta], config: &GcConfig) -> u64 {
    let grace = config.now_ms.saturating_sub(config.blob_grace_ms);
    runs.iter().filter(|r| r.status == RunStatus::Running).map(|r| r.started_at_ms).fold(grace, u64::min)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gc::DAY_MS;

    fn run(id: &str, mode: RunMode, days_old: u64, tier: Retention, source: Option<&str>) -> RunMeta {
        let mut meta = RunMeta::new(id, mode, 100 * DAY_MS - days_old * DAY_MS);
        meta.status = RunStatus::Ok;
        meta.retention = tier;
        meta.source_run = source.map(str::to_owned);
        meta.fork_at = source.filter(|_| mode == RunMode::Fork).map(|_| 3);
        meta
    }

    fn planned(runs: &[RunMeta]) -> Vec<String> {
        plan(runs, &GcConfig::new(100 * DAY_MS, 30))
    }

    #[test]
    fn routine_runs_expire_and_other_tiers_stay() {
        use Retention::*;
        let mut running = run("running", RunMode::Record, 90, Routine, None);
        running.status = RunStatus::Running;
        let runs = [
            run("old", RunMode::Record, 31, Routine, None),
            run("young", RunMode::Record, 29, Routine, None),
            run("incident", RunMode::Record, 90, Incident, None),
            run("pinned", RunMode::Record, 90, Pinned, None),
            running,
        ];
        assert_eq!(planned(&runs), ["old"]);
    }

    #[test]
    fn forks_keep_their_sources_and_replays_go_with_theirs() {
        use Retention::*;
        let runs = [
            run("src", RunMode::Record, 90, Routine, None),
            run("fork", RunMode::Fork, 90, Routine, Some("src")),
            run("forkfork", RunMode::Fork, 1, Routine, Some("fork")),
            run("replay", RunMode::Replay, 1, Pinned, Some("src")),
            run("lonely", RunMode::Record, 90, Routine, None),
            run("replay2", RunMode::Replay, 1, Pinned, Some("lonely")),
            run("orphan", RunMode::Replay, 1, Pinned, Some("missing")),
        ];
        // forkfork is young: it keeps fork, which keeps src, which keeps its replay.
        assert_eq!(planned(&runs), ["lonely", "replay2", "orphan"]);
        let mut old = runs.clone();
        old[2] = run("forkfork", RunMode::Fork, 90, Routine, Some("fork"));
        assert_eq!(planned(&old), ["src", "fork", "forkfork", "replay", "lonely", "replay2", "orphan"]);
        old[2].retention = Incident;
        assert_eq!(planned(&old), ["lonely", "replay2", "orphan"], "the incident tier reaches the source");
        old[3].status = RunStatus::Running;
        old[5].status = RunStatus::Running;
        old[2].retention = Routine;
        assert_eq!(planned(&old), ["fork", "forkfork", "orphan"], "running replays keep their sources");
    }

    #[test]
    fn settle_spares_sources_of_runs_created_since_the_plan() {
        let runs = [
            run("src", RunMode::Record, 90, Retention::Routine, None),
            run("new-fork", RunMode::Fork, 0, Retention::Routine, Some("src")),
        ];
        let doomed: HashSet<String> = ["src".to_owned(), "gone".to_owned()].into();
        assert!(settle(&runs, doomed, &HashSet::new()).is_empty());
    }

    #[test]
    fn the_blob_cutoff_is_the_oldest_running_start_or_the_grace() {
        let mut config = GcConfig::new(100 * DAY_MS, 30);
        config.blob_grace_ms = DAY_MS;
        let mut runs = vec![run("a", RunMode::Record, 5, Retention::Routine, None)];
        assert_eq!(blob_cutoff(&runs, &config), 99 * DAY_MS);
        runs[0].status = RunStatus::Running;
        assert_eq!(blob_cutoff(&runs, &config), 95 * DAY_MS);
    }
}
