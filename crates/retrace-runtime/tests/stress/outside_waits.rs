//! No deadlock in default mode: agents that also wait on each other outside Retrace.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use retrace_core::DivergenceCode;
use retrace_runtime::{Agent, Outcome, RuntimeResult, Session, SessionOptions, ToolSpec};
use retrace_store::memory::MemoryStore;
use retrace_store::Store;
use serde_json::{json, Value};
use tokio::task::JoinSet;

use crate::{agent_name, jitter, mix, panic_again};

/// Replays of the outside-wait programs: each must finish well within this, with no help from
/// the stall watchdog (whose timeout is set far beyond it).
const NO_DEADLOCK_LIMIT: Duration = Duration::from_secs(10);

/// (i) A ring of agents that serialize on one tokio mutex, held across Retrace steps (an async
/// tool, a blocking clock read and a send) and across await points; the token each receives
/// comes through Retrace, outside the lock.
async fn locked_agent(
    a: Agent,
    me: usize,
    ring: usize,
    lock: Arc<tokio::sync::Mutex<u64>>,
    jitter_seed: u64,
    live: Arc<AtomicUsize>,
) -> RuntimeResult<Vec<Value>> {
    let mut rng = StdRng::seed_from_u64(jitter_seed);
    let mut seen = Vec::new();
    for round in 0..6 {
        jitter(&mut rng).await;
        {
            let mut turns = lock.lock().await;
            *turns += 1;
            let turn = *turns;
            jitter(&mut rng).await;
            let live = live.clone();
            let out: u64 = a
                .tool_async(
                    "critical",
                    &json!({ "me": me, "round": round }),
                    ToolSpec::deterministic("1"),
                    || {
                        async move {
                            live.fetch_add(1, Ordering::Relaxed);
                            // The live output depends on who got the lock first; replay returns it.
                            Ok::<_, String>(mix(turn))
                        }
                    },
                )
                .await?;
            let stamp = a.now_ms()?;
            jitter(&mut rng).await;
            let seq = a
                .send(&agent_name((me + 1) % ring), "token", &json!({ "round": round, "out": out }), None)
                .await?;
            seen.push(json!(["critical", out, stamp, seq]));
        }
        let m = a.recv(None).await?.expect("recv(None) never times out");
        seen.push(json!(["recv", m.sender, m.seq, m.body]));
    }
    Ok(seen)
}

async fn run_locked(
    s: &Session,
    jitter_salt: u64,
    live: &Arc<AtomicUsize>,
) -> Vec<RuntimeResult<Vec<Value>>> {
    const RING: usize = 6;
    let lock = Arc::new(tokio::sync::Mutex::new(0));
    let handles: Vec<_> = (0..RING)
        .map(|me| {
            let (lock, live) = (lock.clone(), live.clone());
            let jitter_seed = mix(jitter_salt ^ me as u64);
            s.spawn(&agent_name(me), move |a| locked_agent(a, me, RING, lock, jitter_seed, live))
        })
        .collect();
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await.unwrap_or_else(|e| panic_again(e)));
    }
    results
}

/// (ii) A producer and a consumer joined by a bounded tokio channel of capacity 1 alongside
/// Retrace messages both ways: the consumer needs the channel's item and the message for each
/// step; the producer waits for an acknowledgment through Retrace every fourth item.
async fn producer(
    a: Agent,
    tx: tokio::sync::mpsc::Sender<u64>,
    jitter_seed: u64,
) -> RuntimeResult<Vec<Value>> {
    let mut rng = StdRng::seed_from_u64(jitter_seed);
    let mut seen = Vec::new();
    for i in 0..12u64 {
        jitter(&mut rng).await;
        let v: u64 = a
            .tool_async("make", &json!({ "i": i }), ToolSpec::deterministic("1"), || async move {
                Ok::<_, String>(mix(i ^ rand::random::<u64>()))
            })
            .await?;
        tx.send(v).await.expect("the consumer is alive");
        jitter(&mut rng).await;
        let seq = a.send("consumer", "item", &json!({ "i": i, "v": v }), None).await?;
        seen.push(json!(["made", v, seq]));
        if i % 4 == 3 {
            let ack = a.recv(None).await?.expect("recv(None) never times out");
            seen.push(json!(["ack", ack.seq, ack.body]));
        }
    }
    Ok(seen)
}

async fn consumer(
    a: Agent,
    mut rx: tokio::sync::mpsc::Receiver<u64>,
    jitter_seed: u64,
) -> RuntimeResult<Vec<Value>> {
    let mut rng = StdRng::seed_from_u64(jitter_seed);
    let mut seen = Vec::new();
    for i in 0..12u64 {
        jitter(&mut rng).await;
        let v = rx.recv().await.expect("the producer sends 12 items");
        let mut misses = 0;
        let m = loop {
            let timeout = if misses < 2 { Duration::from_millis(1) } else { Duration::from_secs(10) };
            match a.recv(Some(timeout)).await? {
                Some(m) => break m,
                None => {
                    misses += 1;
                    seen.push(json!(["timeout"]));
                }
            }
        };
        let out: u64 =
            a.tool("use", &json!({ "chan": v, "msg": m.body }), ToolSpec::deterministic("1"), || {
                Ok::<_, String>(mix(v ^ i))
            })?;
        seen.push(json!(["used", v, m.seq, out]));
        if i % 4 == 3 {
            jitter(&mut rng).await;
            a.send("producer", "ack", &json!({ "i": i, "out": out }), None).await?;
        }
    }
    Ok(seen)
}

async fn run_channel(s: &Session, jitter_salt: u64) -> Vec<RuntimeResult<Vec<Value>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let c = s.spawn("consumer", move |a| consumer(a, rx, mix(jitter_salt ^ 1)));
    let p = s.spawn("producer", move |a| producer(a, tx, mix(jitter_salt ^ 2)));
    vec![p.await.unwrap_or_else(|e| panic_again(e)), c.await.unwrap_or_else(|e| panic_again(e))]
}

fn all_ok(results: Vec<RuntimeResult<Vec<Value>>>, what: &str) -> Vec<Vec<Value>> {
    results.into_iter().map(|r| r.unwrap_or_else(|e| panic!("{what}: {e}"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_deadlock_a_default_replay() {
    const SEEDS: u64 = 8;
    const REPLAYS: u64 = 16;
    let started = Instant::now();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut set = JoinSet::new();
    for seed in 0..SEEDS {
        let store = store.clone();
        set.spawn(async move {
            let options = || SessionOptions {
                chaos_seed: Some(seed),
                chaos_max_delay: Duration::from_millis(seed % 3),
                ..Default::default()
            };
            // Record both programs.
            let live = Arc::new(AtomicUsize::new(0));
            let s = Session::record(store.clone(), options()).unwrap();
            let locked =
                all_ok(run_locked(&s, seed, &live).await, &format!("seed {seed}: locked ring, record"));
            let locked_run = s.finish(Outcome::default()).unwrap().run_id;
            let s = Session::record(store.clone(), options()).unwrap();
            let channel = all_ok(run_channel(&s, seed).await, &format!("seed {seed}: channel, record"));
            let channel_run = s.finish(Outcome::default()).unwrap().run_id;
            // Replay each many times under other scheduling, default mode.
            for k in 0..REPLAYS {
                let salt = mix(seed * 1_000 + k);
                let replay =
                    || SessionOptions { stall_timeout: Duration::from_secs(120), ..Default::default() };
                let what = format!("seed {seed} replay {k}: locked ring");
                let r = Session::replay(store.clone(), &locked_run, replay()).unwrap();
                let live = Arc::new(AtomicUsize::new(0));
                let results = tokio::time::timeout(NO_DEADLOCK_LIMIT, run_locked(&r, salt, &live))
                    .await
                    .unwrap_or_else(|_| panic!("{what}: deadlocked"));
                assert_eq!(all_ok(results, &what), locked, "{what}: observations");
                assert_eq!(live.load(Ordering::Relaxed), 0, "{what}: nothing live");
                r.finish(Outcome::default()).unwrap_or_else(|e| panic!("{what}: {e}"));

                let what = format!("seed {seed} replay {k}: channel");
                let r = Session::replay(store.clone(), &channel_run, replay()).unwrap();
                let results = tokio::time::timeout(NO_DEADLOCK_LIMIT, run_channel(&r, salt))
                    .await
                    .unwrap_or_else(|_| panic!("{what}: deadlocked"));
                assert_eq!(all_ok(results, &what), channel, "{what}: observations");
                let report = r.finish(Outcome::default()).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(report.live_calls, 0);
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.unwrap_or_else(|e| panic_again(e));
    }
    eprintln!("outside waits: {SEEDS} seeds x 2 programs x {REPLAYS} replays in {:?}", started.elapsed());
}

/// Strict mode is for programs whose agents interact only through Retrace (SPEC §7); on the
/// locked ring it may stall (the lock holder waits for a turn held by an agent blocked on the
/// lock), but it never hangs: it replays or reports a stall within the stall timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_strict_mode_replay_or_stall_but_never_hang() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let s =
        Session::record(store.clone(), SessionOptions { chaos_seed: Some(7), ..Default::default() }).unwrap();
    let locked = all_ok(run_locked(&s, 7, &Arc::new(AtomicUsize::new(0))).await, "record");
    let run = s.finish(Outcome::default()).unwrap().run_id;
    let (mut replayed, mut stalled) = (0, 0);
    for k in 0..6 {
        let options =
            SessionOptions { strict: true, stall_timeout: Duration::from_millis(300), ..Default::default() };
        let r = Session::replay(store.clone(), &run, options).unwrap();
        let results =
            tokio::time::timeout(NO_DEADLOCK_LIMIT, run_locked(&r, mix(k), &Arc::new(AtomicUsize::new(0))))
                .await
                .expect("a strict replay never hangs");
        match r.finish(Outcome::default()) {
            Ok(_) => {
                assert_eq!(all_ok(results, "strict"), locked);
                replayed += 1;
            }
            Err(e) => {
                let d = e.divergence().expect("a divergence").clone();
                assert_eq!(d.code, DivergenceCode::Stall, "{d}");
                for result in results {
                    if let Err(e) = result {
                        assert_eq!(e.divergence(), Some(&d), "every waiter gets the stall");
                    }
                }
                stalled += 1;
            }
        }
    }
    eprintln!("strict locked ring: {replayed} replayed, {stalled} stalled");
}
