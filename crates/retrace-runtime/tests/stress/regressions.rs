//! Runtime bugs the proofs found, each pinned by its smallest program.
use std::sync::Arc;
use std::time::Duration;

use retrace_runtime::{Outcome, Session, SessionOptions, ToolSpec};
use retrace_store::memory::MemoryStore;
use retrace_store::Store;

use crate::agent_name;

/// Strict replay: a plain keyed step (not a send or a delivery) that releases a seq must wake
/// the agent whose turn is next. It didn't: the waiter slept on, and once the other agent
/// exited, the run was declared a stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_replay_wakes_the_next_turn_after_a_plain_step() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let (first, second) = (s.agent("first"), s.agent("second"));
    first.tool("t", &1, ToolSpec::deterministic("1"), || Ok::<_, String>(1)).unwrap();
    second.tool("t", &2, ToolSpec::deterministic("1"), || Ok::<_, String>(2)).unwrap();
    s.finish(Outcome::default()).unwrap();

    let options =
        SessionOptions { strict: true, stall_timeout: Duration::from_secs(120), ..Default::default() };
    let r = Session::replay(store, &s.run_id(), options).unwrap();
    let second = r.spawn("second", |a| async move {
        a.tool_async("t", &2, ToolSpec::deterministic("1"), || async { Err::<u32, _>("not live") }).await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let first = r.spawn("first", |a| async move {
        a.tool_async("t", &1, ToolSpec::deterministic("1"), || async { Err::<u32, _>("not live") }).await
    });
    assert_eq!(first.await.unwrap().unwrap(), 1);
    let second = tokio::time::timeout(Duration::from_secs(5), second).await.expect("woken, not stalled");
    assert_eq!(second.unwrap().unwrap(), 2);
    assert_eq!(r.replay_trace(), [1, 2]);
    r.finish(Outcome::default()).unwrap();
}

/// Strict replay: the blocking steps (`now_ms`, `random_u64`, `decide`, `tool`, ...) wait for
/// their turn. Called from tokio tasks, they parked the worker threads, so with more waiting
/// agents than workers the agent whose turn it was never ran (and nothing else on the runtime
/// did either) until the stall watchdog fired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_replay_of_blocking_steps_does_not_starve_the_runtime() {
    const AGENTS: usize = 4;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    for i in 0..AGENTS {
        s.agent(&agent_name(i)).now_ms().unwrap();
    }
    s.finish(Outcome::default()).unwrap();

    let options =
        SessionOptions { strict: true, stall_timeout: Duration::from_secs(120), ..Default::default() };
    let r = Session::replay(store, &s.run_id(), options).unwrap();
    // The last turns first: they wait, more of them than there are workers.
    let mut handles: Vec<_> =
        (1..AGENTS).rev().map(|i| r.spawn(&agent_name(i), |a| async move { a.now_ms() })).collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    handles.push(r.spawn(&agent_name(0), |a| async move { a.now_ms() }));
    let all = async {
        for h in handles {
            h.await.unwrap().unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(5), all).await.expect("every turn ran");
    assert_eq!(r.replay_trace(), (1..=AGENTS as u64).collect::<Vec<_>>());
    r.finish(Outcome::default()).unwrap();
}
