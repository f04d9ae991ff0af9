//! A run retained while it records keeps its tier: the recorder's copy of the run, taken when
//! it started, doesn't undo `retrace retain` when the run finishes or its recorder lets go.
use retrace_core::run::{Retention, RunStatus};
use retrace_runtime::{Outcome, Session, SessionOptions, ToolSpec};
use retrace_store::gc::retain;
use retrace_store::{open_store, StoreConfig};
use serde_json::json;

#[test]
fn a_tier_set_while_recording_survives_the_end_of_the_run() {
    let home = tempfile::tempdir().unwrap();
    let store = open_store(&StoreConfig::in_home(home.path())).unwrap();
    for (tier, finished) in [(Retention::Pinned, true), (Retention::Incident, false)] {
        let session = Session::record(store.clone(), SessionOptions::default()).unwrap();
        let agent = session.agent("a");
        let one = || Ok::<_, String>(1);
        agent.tool("count", &json!({"i": 0}), ToolSpec::deterministic("1"), one).unwrap();
        let run = session.run_id();
        let retained = retain(store.as_ref(), store.run(&run).unwrap(), tier).unwrap();
        assert_eq!(retained.retention, tier);
        agent.tool("count", &json!({"i": 1}), ToolSpec::deterministic("1"), one).unwrap();
        let status = match finished {
            true => {
                session.finish(Outcome { exit_status: Some(0) }).unwrap();
                RunStatus::Ok
            }
            // A session dropped unfinished (the program returned early) marks its run.
            false => {
                drop(agent);
                drop(session);
                RunStatus::Interrupted
            }
        };
        let meta = store.run(&run).unwrap();
        assert_eq!(meta.status, status);
        assert_eq!(meta.retention, tier, "the tier set while {run} recorded is kept");
    }
}
