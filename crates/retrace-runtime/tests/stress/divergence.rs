//! A divergence in a multi-agent replay: reported at the first divergent step, and every other
//! agent is released with it.
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use retrace_core::{DivergenceCode, EventType};
use retrace_runtime::{Outcome, RuntimeResult, Session, SessionOptions, ToolSpec};
use retrace_store::memory::MemoryStore;
use retrace_store::Store;
use serde_json::json;

use crate::program::{record_stress, run_stress, Plan, Tamper};
use crate::{agent_name, all_events, jitter, mix, panic_again};

const WORKERS: usize = 15;

/// Releasing waiters after a divergence must not wait for the stall watchdog.
const RELEASE_LIMIT: Duration = Duration::from_secs(5);

/// Which step of the hub program a replay changes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Change {
    None,
    /// This worker's `prep` arguments.
    Worker(usize),
    /// The hub's `fold` arguments at this fold.
    Hub(usize),
}

/// Fan-in then fan-out: fifteen workers each prepare a job and send it to the hub, then wait
/// for its reply; the hub folds the jobs in the order it hears them and replies to everyone.
async fn run_hub(s: &Session, jitter_salt: u64, change: Change) -> Vec<(String, RuntimeResult<u64>)> {
    let hub = s.spawn("hub", move |a| async move {
        let mut rng = StdRng::seed_from_u64(mix(jitter_salt));
        let mut acc = 0u64;
        for i in 0..WORKERS {
            jitter(&mut rng).await;
            let m = a.recv(None).await?.expect("recv(None) never times out");
            let p = m.body["p"].as_u64().expect("p");
            let i = if change == Change::Hub(i) { i + 100 } else { i };
            let args = json!({ "i": i, "from": m.sender, "p": p, "acc": acc });
            acc = a
                .tool_async("fold", &args, ToolSpec::deterministic("1"), || async move {
                    Ok::<_, String>(mix(acc ^ p))
                })
                .await?;
        }
        for w in 0..WORKERS {
            jitter(&mut rng).await;
            a.send(&format!("w{w:02}"), "reply", &json!({ "acc": acc }), None).await?;
        }
        a.decide("merged", None)?;
        Ok(acc)
    });
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            s.spawn(&format!("w{w:02}"), move |a| async move {
                let mut rng = StdRng::seed_from_u64(mix(jitter_salt ^ (w as u64 + 1)));
                jitter(&mut rng).await;
                let x = if change == Change::Worker(w) { w * 10 + 1 } else { w * 10 };
                let p: u64 = a
                    .tool_async(
                        "prep",
                        &json!({ "w": w, "x": x }),
                        ToolSpec::deterministic("1"),
                        || async move { Ok::<_, String>(mix(w as u64)) },
                    )
                    .await?;
                jitter(&mut rng).await;
                a.send("hub", "job", &json!({ "p": p }), None).await?;
                let reply = a.recv(None).await?.expect("recv(None) never times out");
                let acc = reply.body["acc"].as_u64().expect("acc");
                a.tool("finish", &json!({ "w": w, "acc": acc }), ToolSpec::deterministic("1"), || {
                    Ok::<_, String>(acc)
                })
            })
        })
        .collect();
    let mut results = vec![("hub".to_owned(), hub.await.unwrap_or_else(|e| panic_again(e)))];
    for (w, h) in workers.into_iter().enumerate() {
        results.push((format!("w{w:02}"), h.await.unwrap_or_else(|e| panic_again(e))));
    }
    results
}

/// Replays `run` with `change` and checks the divergence: named at `agent` and the recorded seq
/// `seq` of the step that was expected, the same for every agent, for the session and in the
/// stored run.
async fn diverge_and_release(
    store: &Arc<dyn Store>,
    run: &str,
    salt: u64,
    change: Change,
    agent: &str,
    seq: u64,
) {
    let what = format!("{change:?} (salt {salt})");
    // The stall watchdog can't be what releases anyone here.
    let options = SessionOptions { stall_timeout: Duration::from_secs(120), ..Default::default() };
    let r = Session::replay(store.clone(), run, options).unwrap();
    let results = tokio::time::timeout(RELEASE_LIMIT, run_hub(&r, salt, change))
        .await
        .unwrap_or_else(|_| panic!("{what}: agents were not released within {RELEASE_LIMIT:?}"));
    let d = r.divergence().unwrap_or_else(|| panic!("{what}: no divergence"));
    assert_eq!(d.code, DivergenceCode::StepMismatch, "{what}: {d}");
    assert_eq!(d.agent, agent, "{what}: {d}");
    assert_eq!(d.seq, Some(seq), "{what}: the recorded seq of the expected step: {d}");
    assert!(d.path.is_some() && d.expected.is_some() && d.expected != d.got, "{what}: {d}");
    for (name, result) in results {
        let e = result.expect_err(&format!("{what}: {name} must be released with the divergence"));
        assert_eq!(e.divergence(), Some(&d), "{what}: {name} gets the first divergence");
    }
    let e = r.finish(Outcome::default()).expect_err("the replay diverged");
    assert_eq!(e.divergence(), Some(&d), "{what}: finish reports it");
    let stored = store.run(&r.run_id()).unwrap();
    assert_eq!(stored.status.as_str(), "diverged");
    assert_eq!(stored.divergence, Some(d.to_json()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_divergence_is_reported_at_its_step_and_releases_every_agent() {
    let started = Instant::now();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut cases = 0;
    for seed in 0..4u64 {
        let options = SessionOptions {
            chaos_seed: Some(seed),
            chaos_max_delay: Duration::from_millis(2),
            ..Default::default()
        };
        let s = Session::record(store.clone(), options).unwrap();
        let recorded: Vec<u64> =
            run_hub(&s, seed, Change::None).await.into_iter().map(|(_, r)| r.unwrap()).collect();
        let run = s.finish(Outcome::default()).unwrap().run_id;
        let events = all_events(store.as_ref(), &run);
        let seq_of = |agent: &str, name: &str, nth: usize| {
            events
                .iter()
                .filter(|e| {
                    e.agent_id == agent && e.kind == EventType::ToolCall && e.name.as_deref() == Some(name)
                })
                .nth(nth)
                .unwrap()
                .seq
        };
        // An unchanged replay is fine, and hears the same.
        let r = Session::replay(store.clone(), &run, SessionOptions::default()).unwrap();
        let again: Vec<u64> =
            run_hub(&r, mix(seed), Change::None).await.into_iter().map(|(_, r)| r.unwrap()).collect();
        assert_eq!(again, recorded);
        r.finish(Outcome::default()).unwrap();
        // A worker that changes its first step: the hub waits in recv for its job, every other
        // worker waits in recv for the hub's reply.
        for w in [0, 7, 14, seed as usize % WORKERS] {
            let name = format!("w{w:02}");
            diverge_and_release(
                &store,
                &run,
                mix(seed ^ w as u64),
                Change::Worker(w),
                &name,
                seq_of(&name, "prep", 0),
            )
            .await;
            cases += 1;
        }
        // The hub changes a fold: every worker waits in recv for the reply.
        for i in [0, 5, WORKERS - 1] {
            diverge_and_release(
                &store,
                &run,
                mix(seed + i as u64),
                Change::Hub(i),
                "hub",
                seq_of("hub", "fold", i),
            )
            .await;
            cases += 1;
        }
    }
    eprintln!("divergence: {cases} diverged replays of 16 agents in {:?}", started.elapsed());
}

/// The same on the stress program: one agent's tool arguments change at its second digest.
/// The divergence names it and the recorded seq of that digest; every agent that depended on
/// what it would have sent afterwards is released with the same divergence; the others either
/// finished as recorded or got the same divergence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_divergence_in_the_stress_program_releases_everyone_downstream() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    for seed in 0..24u64 {
        let plan = Arc::new(Plan::new(seed, 16, 2, 3));
        let rec = record_stress(&store, &plan, seed, true).await;
        let agent = (0..plan.agents)
            .map(|i| (i + seed as usize) % plan.agents)
            .find(|&i| plan.expected[i] >= 2)
            .unwrap();
        let name = agent_name(agent);
        let digest = rec
            .events
            .iter()
            .filter(|e| {
                e.agent_id == name && e.kind == EventType::ToolCall && e.name.as_deref() == Some("digest")
            })
            .nth(1)
            .unwrap()
            .seq;
        // Who heard something `agent` sent after that step, directly: they can't have finished.
        let downstream: Vec<String> = rec
            .events
            .iter()
            .filter(|e| e.kind == EventType::Deliver)
            .filter(|e| {
                let send = e.causal_parent.map(|s| &rec.events[s as usize - 1]);
                send.is_some_and(|s| s.agent_id == name && s.seq > digest)
            })
            .map(|e| e.agent_id.clone())
            .collect();
        let what = format!("seed {seed}: {name} changes its second digest (seq {digest})");
        let options = SessionOptions { stall_timeout: Duration::from_secs(120), ..Default::default() };
        let r = Session::replay(store.clone(), &rec.run, options).unwrap();
        let live = Arc::new(AtomicUsize::new(0));
        let tamper = Some(Tamper { agent, digest: 1 });
        let results = tokio::time::timeout(RELEASE_LIMIT, run_stress(&r, &plan, mix(!seed), &live, tamper))
            .await
            .unwrap_or_else(|_| panic!("{what}: agents were not released"));
        let d = r.divergence().unwrap_or_else(|| panic!("{what}: no divergence"));
        assert_eq!(
            (d.code, d.agent.as_str(), d.seq),
            (DivergenceCode::StepMismatch, name.as_str(), Some(digest)),
            "{what}: {d}"
        );
        assert_eq!(d.path.as_deref(), Some("$.got"), "{what}: {d}");
        for (me, result) in results.into_iter().enumerate() {
            match result {
                Ok(seen) => {
                    assert!(
                        !downstream.contains(&agent_name(me)) && me != agent,
                        "{what}: a{me:02} can't have finished"
                    );
                    assert_eq!(seen, rec.seen[me], "{what}: a{me:02} finished as recorded");
                }
                Err(e) => assert_eq!(e.divergence(), Some(&d), "{what}: a{me:02} gets the first divergence"),
            }
        }
        assert_eq!(r.finish(Outcome::default()).unwrap_err().divergence(), Some(&d));
    }
}
