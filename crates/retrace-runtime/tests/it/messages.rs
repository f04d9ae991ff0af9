//! Messages between agents: deliveries are recorded facts, replay reproduces each agent's
//! delivery order, timeouts replay at once, and stalls and divergences release every waiter.
use std::sync::Arc;
use std::time::{Duration, Instant};

use retrace_core::{DivergenceCode, EventType};
use retrace_runtime::{Outcome, Session, SessionOptions, ToolSpec};
use retrace_store::memory::MemoryStore;
use retrace_store::Store;
use serde_json::json;

fn store() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

/// planner sends `n` notes to reviewer; reviewer reads them all and decides on the first kind.
async fn pipeline(s: &Session, n: usize) -> Vec<String> {
    let planner = s.spawn("planner", move |a| async move {
        for i in 0..n {
            a.send("reviewer", if i % 2 == 0 { "even" } else { "odd" }, &json!({ "i": i }), None).await?;
        }
        Ok(())
    });
    let reviewer = s.spawn("reviewer", move |a| async move {
        let mut heard = Vec::new();
        for _ in 0..n {
            let m = a.recv(Some(Duration::from_secs(5))).await?.expect("a message");
            heard.push(format!("{}:{}", m.kind.unwrap(), m.body["i"]));
        }
        a.decide(if heard[0].starts_with("even") { "approve" } else { "reject" }, None)?;
        Ok(heard)
    });
    planner.await.unwrap().unwrap();
    reviewer.await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_are_events_with_causal_parents_and_lamport_order() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let heard = pipeline(&s, 4).await;
    assert_eq!(heard, ["even:0", "odd:1", "even:2", "odd:3"]);
    s.finish(Outcome::default()).unwrap();
    let events = store.events(&s.run_id(), 1, 100).unwrap();
    for d in events.iter().filter(|e| e.kind == EventType::Deliver) {
        let send = &events[d.causal_parent.unwrap() as usize - 1];
        assert_eq!(send.kind, EventType::Send);
        assert!(send.seq < d.seq, "a delivery comes after its send");
        assert!(d.lamport > send.lamport, "lamport: delivery after send");
        assert_eq!(d.message.as_ref().unwrap().from.as_deref(), Some("planner"));
    }
    let decision = events.iter().find(|e| e.kind == EventType::Decision).unwrap();
    let delivered: Vec<u64> = events.iter().filter(|e| e.kind == EventType::Deliver).map(|e| e.seq).collect();
    assert_eq!(decision.inbound, delivered, "the decision consumed every delivery since its previous step");
    assert_eq!(decision.causal_parent, decision.inbound.last().copied(), "it acts on what it heard last");

    for strict in [false, true] {
        let r = Session::replay(store.clone(), &s.run_id(), SessionOptions { strict, ..Default::default() })
            .unwrap();
        assert_eq!(pipeline(&r, 4).await, heard);
        if strict {
            let n = events.len() as u64;
            assert_eq!(r.replay_trace(), (1..=n).collect::<Vec<_>>(), "strict replay keeps the global order");
        }
        r.finish(Outcome::default()).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_a_fork_hands_the_edited_message_again() {
    use retrace_core::edit::{Content, Edit};
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    pipeline(&s, 3).await;
    s.finish(Outcome::default()).unwrap();
    let events = store.events(&s.run_id(), 1, 100).unwrap();
    let second = events.iter().filter(|e| e.kind == EventType::Send).nth(1).unwrap().seq;
    let blob = store.put_blob(br#"{"i":99}"#, retrace_store::BlobHint::Raw).unwrap();
    let edit = Edit::Message { seq: second, content: Content::Blob(blob) };
    let f =
        Session::fork_new(store.clone(), &s.run_id(), None, vec![edit], SessionOptions::default()).unwrap();
    let heard = pipeline(&f, 3).await;
    assert_eq!(heard, ["even:0", "odd:99", "even:2"], "the reviewer hears the edit");
    f.finish(Outcome::default()).unwrap();

    // SPEC §7: replay of a fork applies its edits again; the program still sends {"i": 1}.
    let r = Session::replay(store.clone(), &f.run_id(), SessionOptions::default()).unwrap();
    assert_eq!(pipeline(&r, 3).await, heard);
    let report = r.finish(Outcome::default()).unwrap();
    assert_eq!(report.status, retrace_core::run::RunStatus::Ok, "{report:?}");

    // So does a fork of the fork, from its start or past its end: the reviewer still hears the
    // edit, every step is the fork's, and its replay agrees.
    let last = store.last_seq(&f.run_id()).unwrap();
    for at in [None, Some(1), Some(last + 1)] {
        let g = Session::fork_new(store.clone(), &f.run_id(), at, vec![], SessionOptions::default()).unwrap();
        assert_eq!(pipeline(&g, 3).await, heard, "--at {at:?}");
        let report = g.finish(Outcome::default()).unwrap();
        assert_eq!(report.status, retrace_core::run::RunStatus::Ok, "--at {at:?}: {report:?}");
        let own = store.events(&g.run_id(), store.run(&g.run_id()).unwrap().fork_at.unwrap(), 100).unwrap();
        assert!(own.iter().all(|e| e.source != retrace_core::Source::Live), "--at {at:?}: {own:?}");
        let r = Session::replay(store.clone(), &g.run_id(), SessionOptions::default()).unwrap();
        assert_eq!(pipeline(&r, 3).await, heard);
        assert_eq!(r.finish(Outcome::default()).unwrap().status, retrace_core::run::RunStatus::Ok);
    }
}

/// `message:SEQ` may name the delivery (fork help: "SEQ: its send or delivery"): the fork then
/// starts at its send by default, and the receiver hears the edit; an explicit `--at` past the
/// send is refused, naming the send, rather than forking without the edit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_edit_naming_the_delivery_edits_its_send() {
    use retrace_core::edit::{Content, Edit};
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    pipeline(&s, 3).await;
    s.finish(Outcome::default()).unwrap();
    let events = store.events(&s.run_id(), 1, 100).unwrap();
    let send = events.iter().filter(|e| e.kind == EventType::Send).nth(1).unwrap().seq;
    let delivery = events.iter().find(|e| e.causal_parent == Some(send) && e.kind == EventType::Deliver);
    let delivery = delivery.unwrap().seq;
    assert!(delivery > send);
    let blob = store.put_blob(br#"{"i":99}"#, retrace_store::BlobHint::Raw).unwrap();
    let edit = Edit::Message { seq: delivery, content: Content::Blob(blob) };
    let f =
        Session::fork_new(store.clone(), &s.run_id(), None, vec![edit.clone()], SessionOptions::default())
            .unwrap();
    assert_eq!(store.run(&f.run_id()).unwrap().fork_at, Some(send), "forked at the send");
    assert_eq!(pipeline(&f, 3).await, ["even:0", "odd:99", "even:2"], "the reviewer hears the edit");
    f.finish(Outcome::default()).unwrap();

    let late =
        Session::fork_new(store.clone(), &s.run_id(), Some(delivery), vec![edit], SessionOptions::default());
    let Err(err) = late else { panic!("an --at past the send is refused") };
    let err = err.to_string();
    assert!(err.contains(&format!("sent at seq {send}, before the fork point --at {delivery}")), "{err}");
}

/// `retrace knew` in a fork (SQLite, whose per-run delivery tables hold only the fork's own
/// rows): a step of the fork's own knew the messages it heard before the fork point too, each
/// with its chain through the source's events; an inherited step knew what it knew in the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn knew_in_a_fork_covers_the_messages_heard_before_the_fork_point() {
    use retrace_core::edit::Edit;
    let dir = tempfile::tempdir().unwrap();
    let sqlite = retrace_store::sqlite::SqliteStore::open(
        &dir.path().join("retrace.db"),
        &dir.path().join("blobs"),
        retrace_store::Durability::Os,
        5_000,
    );
    let store: Arc<dyn Store> = Arc::new(sqlite.unwrap());
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    pipeline(&s, 4).await;
    s.finish(Outcome::default()).unwrap();
    let events = store.events(&s.run_id(), 1, 100).unwrap();
    let deliveries: Vec<u64> =
        events.iter().filter(|e| e.kind == EventType::Deliver).map(|e| e.seq).collect();
    // (One sender's messages arrive in order: a swap of two is no schedule; an edit of the third
    // message makes the fork.)
    let third = deliveries[2];
    let blob = store.put_blob(br#"{"i":99}"#, retrace_store::BlobHint::Raw).unwrap();
    let edit = Edit::Message { seq: third, content: retrace_core::edit::Content::Blob(blob) };
    let f =
        Session::fork_new(store.clone(), &s.run_id(), None, vec![edit], SessionOptions::default()).unwrap();
    assert_eq!(pipeline(&f, 4).await, ["even:0", "odd:1", "even:99", "odd:3"]);
    f.finish(Outcome::default()).unwrap();
    let at = store.run(&f.run_id()).unwrap().fork_at.unwrap();

    let fork_events = store.events(&f.run_id(), at, 100).unwrap();
    let decision = fork_events.iter().find(|e| e.kind == EventType::Decision).unwrap().seq;
    let knew = retrace_store::causal::knew(store.as_ref(), &f.run_id(), decision).unwrap();
    assert_eq!(knew.run, f.run_id());
    let bodies: Vec<_> = knew.heard.iter().map(|h| h.body.as_ref().unwrap()["i"].clone()).collect();
    assert_eq!(bodies, [json!(0), json!(1), json!(99), json!(3)], "inherited deliveries included: {knew:?}");
    assert!(knew.heard.iter().all(|h| h.chain.first().map(|l| l.seq) == h.send_seq), "{knew:?}");

    // The second delivery, inherited (before the fork point), had heard the first. (The event
    // after it is not always the reviewer's: the scheduler may put a send there.)
    let second = deliveries[1];
    let in_source = retrace_store::causal::knew(store.as_ref(), &s.run_id(), second).unwrap();
    assert_eq!(in_source.heard.len(), 1, "{in_source:?}");
    if second < at {
        let in_fork = retrace_store::causal::knew(store.as_ref(), &f.run_id(), second).unwrap();
        assert_eq!((in_fork.run.as_str(), in_fork.heard.len()), (f.run_id().as_str(), in_source.heard.len()));
        assert_eq!(in_fork.heard, in_source.heard);
    }
    // Else the fork point (the edited message's send) came before the second delivery: the
    // planner sent ahead of the reviewer's reads, and the fork ran that delivery itself (the
    // event at that seq may be another one). The fork's decision, above, heard every message.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_timeout_replays_at_once() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let a = s.agent("lonely");
    let started = Instant::now();
    assert!(a.recv(Some(Duration::from_millis(300))).await.unwrap().is_none());
    assert!(started.elapsed() >= Duration::from_millis(300));
    s.finish(Outcome::default()).unwrap();
    let deliver = store.event(&s.run_id(), 1).unwrap();
    assert!(deliver.message.unwrap().timed_out);

    let r = Session::replay(store, &s.run_id(), SessionOptions::default()).unwrap();
    let started = Instant::now();
    assert!(r.agent("lonely").recv(Some(Duration::from_secs(30))).await.unwrap().is_none());
    assert!(started.elapsed() < Duration::from_millis(200), "the recorded outcome decides, not the clock");
    r.finish(Outcome::default()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_send_is_a_stall_declared_at_once_naming_every_waiter() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    pipeline(&s, 2).await;
    s.finish(Outcome::default()).unwrap();

    // The replayed planner forgets to send: the reviewer waits for a send that never comes.
    let r = Session::replay(store, &s.run_id(), SessionOptions::default()).unwrap();
    let started = Instant::now();
    let planner = r.spawn("planner", |_a| async move { Ok(()) });
    let reviewer = r.spawn("reviewer", |a| async move { a.recv(None).await });
    planner.await.unwrap().unwrap();
    let err = reviewer.await.unwrap().unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2), "declared at once, not after the stall timeout");
    let d = err.divergence().unwrap();
    assert_eq!(d.code, DivergenceCode::Stall);
    assert_eq!(d.agent, "reviewer");
    assert!(d.to_string().contains("its send is seq 1"), "{d}");
}

/// SPEC §2: a message body holding NaN or an infinity is refused at record time, naming the
/// step and the path, and nothing is recorded or delivered for it (serde_json alone would have
/// sent and stored `null`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_body_holding_nan_is_refused_naming_the_step() {
    let store: Arc<dyn Store> = Arc::new(retrace_store::sqlite::SqliteStore::temporary().unwrap());
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let planner = s.agent("planner");
    planner.send("reviewer", "score", &json!({"rid": 1}), None).await.unwrap();
    let err = planner
        .send("reviewer", "score", &std::collections::BTreeMap::from([("nan", f64::NAN)]), None)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("send reviewer") && text.contains("\"planner\"") && text.contains("$.nan"),
        "{text}"
    );
    let blocking = planner.clone();
    let err = tokio::task::spawn_blocking(move || {
        blocking.send_blocking("reviewer", "score", &(1, [0.5, f64::NEG_INFINITY]), None)
    })
    .await
    .unwrap()
    .unwrap_err();
    assert!(err.to_string().contains("send reviewer") && err.to_string().contains("$[1][1]"), "{err}");

    // Only the finite message was recorded, and only it reaches the receiver.
    let reviewer = s.agent("reviewer");
    let heard = reviewer.recv(Some(Duration::from_millis(200))).await.unwrap().expect("the finite one");
    assert_eq!(heard.body, json!({"rid": 1}));
    assert!(reviewer.recv(Some(Duration::from_millis(200))).await.unwrap().is_none(), "nothing else");
    s.finish(Outcome::default()).unwrap();
    let sends = store.events(&s.run_id(), 1, 100).unwrap();
    let sends: Vec<u64> = sends.iter().filter(|e| e.kind == EventType::Send).map(|e| e.seq).collect();
    assert_eq!(sends, [1], "one send event: the refused ones left nothing in the log");
}

/// An agent whose body panics has exited as surely as one that returned: the waiter on its
/// send is released at once with the stall, not after the stall timeout (30 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_panics_has_exited_and_its_waiters_stall_at_once() {
    let store: Arc<dyn Store> = Arc::new(retrace_store::sqlite::SqliteStore::temporary().unwrap());
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    pipeline(&s, 2).await;
    s.finish(Outcome::default()).unwrap();

    let r = Session::replay(store, &s.run_id(), SessionOptions::default()).unwrap();
    let started = Instant::now();
    let reviewer = r.spawn("reviewer", |a| async move { a.recv(None).await });
    let planner = r.spawn("planner", |_a| async move {
        if true {
            panic!("the planner's body panics before it sends");
        }
        Ok(())
    });
    assert!(planner.await.unwrap_err().is_panic());
    let err = tokio::time::timeout(Duration::from_secs(5), reviewer)
        .await
        .expect("the reviewer is released at once, not after the 30 s stall timeout")
        .unwrap()
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2), "declared at once: {:?}", started.elapsed());
    let d = err.divergence().unwrap_or_else(|| panic!("a stall, not {err}"));
    assert_eq!((d.code, d.agent.as_str()), (DivergenceCode::Stall, "reviewer"));
    assert!(d.to_string().contains("its send is seq 1"), "{d}");
}

/// A stall outside Retrace is declared after the timeout; a recorded agent the replay never
/// heard from is named in the report, its process may not have started (QA29 S3: the report
/// named only the waiting agent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_outside_retrace_is_declared_after_the_timeout() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    pipeline(&s, 1).await;
    s.finish(Outcome::default()).unwrap();
    for started in [true, false] {
        let options = SessionOptions { stall_timeout: Duration::from_millis(300), ..Default::default() };
        let r = Session::replay(store.clone(), &s.run_id(), options).unwrap();
        // The planner is alive but blocked elsewhere, forever as far as Retrace can tell; or
        // it never started.
        let _planner = started.then(|| r.agent("planner"));
        let reviewer = r.spawn("reviewer", |a| async move { a.recv(None).await });
        let err = tokio::time::timeout(Duration::from_secs(5), reviewer).await.unwrap().unwrap().unwrap_err();
        let d = err.divergence().unwrap();
        assert_eq!(d.code, DivergenceCode::Stall);
        assert!(d.to_string().contains("stall-timeout"), "{d}");
        let named = d.to_string().contains("agent \"planner\" never started in this replay");
        assert_eq!(named, !started, "{d}");
    }
}

/// A fork's stall names the message the agent waits for, its sender and where the source run
/// sent and delivered it (QA29 D3: it said only "its next message").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_stall_names_the_message_it_waits_for() {
    use retrace_core::edit::{Content, Edit};
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    pipeline(&s, 1).await;
    s.finish(Outcome::default()).unwrap();
    let events = store.events(&s.run_id(), 1, 100).unwrap();
    let send = events.iter().find(|e| e.kind == EventType::Send).unwrap().seq;
    let deliver = events.iter().find(|e| e.kind == EventType::Deliver).unwrap().seq;
    let blob = store.put_blob(br#"{"i":7}"#, retrace_store::BlobHint::Raw).unwrap();
    let edit = Edit::Message { seq: send, content: Content::Blob(blob) };
    let options = SessionOptions { stall_timeout: Duration::from_millis(300), ..Default::default() };
    let f = Session::fork_new(store.clone(), &s.run_id(), None, vec![edit], options).unwrap();
    // The planner is alive but never sends: blocked outside Retrace, as far as it can tell.
    let _planner = f.agent("planner");
    let reviewer = f.spawn("reviewer", |a| async move { a.recv(None).await });
    let err = tokio::time::timeout(Duration::from_secs(5), reviewer).await.unwrap().unwrap().unwrap_err();
    let d = err.divergence().unwrap_or_else(|| panic!("a stall, not {err}"));
    assert_eq!((d.code, d.agent.as_str()), (DivergenceCode::Stall, "reviewer"));
    let waits = format!("the message from planner sent at source seq {send} (delivered at seq {deliver})");
    assert!(d.to_string().contains(&waits), "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_divergence_releases_every_waiting_agent() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let planner = s.spawn("planner", |a| async move {
        let n: u32 =
            a.tool("count", &json!({"table": "users"}), ToolSpec::deterministic("1"), || Ok::<_, String>(3))?;
        a.send("reviewer", "count", &n, None).await
    });
    let reviewer = s.spawn("reviewer", |a| async move { a.recv(None).await });
    planner.await.unwrap().unwrap();
    reviewer.await.unwrap().unwrap();
    s.finish(Outcome::default()).unwrap();

    let r = Session::replay(store, &s.run_id(), SessionOptions::default()).unwrap();
    let reviewer = r.spawn("reviewer", |a| async move { a.recv(None).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let planner = r.spawn("planner", |a| async move {
        a.tool("count", &json!({"table": "orders"}), ToolSpec::deterministic("1"), || Ok::<u32, String>(3))
    });
    let planner_err = planner.await.unwrap().unwrap_err();
    assert_eq!(planner_err.divergence().unwrap().code, DivergenceCode::StepMismatch);
    let reviewer_err =
        tokio::time::timeout(Duration::from_secs(2), reviewer).await.unwrap().unwrap().unwrap_err();
    assert_eq!(
        reviewer_err.divergence().unwrap(),
        planner_err.divergence().unwrap(),
        "the first divergence, for everyone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unheard_delivery_is_a_step_left() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    pipeline(&s, 2).await;
    s.finish(Outcome::default()).unwrap();
    let r = Session::replay(store, &s.run_id(), SessionOptions::default()).unwrap();
    let planner = r.spawn("planner", |a| async move {
        a.send("reviewer", "even", &json!({ "i": 0 }), None).await?;
        a.send("reviewer", "odd", &json!({ "i": 1 }), None).await
    });
    planner.await.unwrap().unwrap();
    let reviewer = r.agent("reviewer");
    reviewer.recv(None).await.unwrap().unwrap();
    let err = r.finish(Outcome::default()).unwrap_err();
    let d = err.divergence().unwrap();
    assert_eq!(d.code, DivergenceCode::StepsLeft);
    assert_eq!(d.step.as_deref(), Some("deliver from planner"), "{d}");
}

/// One sender's messages arrive in the order it sent them: a swap of two of them is refused,
/// as a schedule that can't happen, naming the sender and both sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_of_one_senders_messages_is_refused() {
    use retrace_core::edit::Edit;
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    pipeline(&s, 2).await;
    s.finish(Outcome::default()).unwrap();
    let events = store.events(&s.run_id(), 1, 100).unwrap();
    let d: Vec<u64> = events.iter().filter(|e| e.kind == EventType::Deliver).map(|e| e.seq).collect();
    let edit: Edit = format!("swap:{},{}", d[0], d[1]).parse().unwrap();
    let Err(err) = Session::fork_new(store.clone(), &s.run_id(), None, vec![edit], SessionOptions::default())
    else {
        panic!("a swap of one sender's messages is refused");
    };
    let said = err.to_string();
    assert!(
        said.contains("both messages are from planner") && said.contains("no schedule hears them"),
        "{said}"
    );
    assert_eq!(store.runs().unwrap().len(), 1, "nothing created");
}

/// Nor can a swap of two senders' messages carry one past another of its sender's (QA29 D1:
/// over b1 b2 a1 a2, swap of b1 and a2 played a2 b2 a1 b1, both senders reversed); a swap of
/// neighbours from two senders is allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_that_would_pass_a_senders_other_message_is_refused() {
    use retrace_core::edit::Edit;
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let (a, b) = (s.agent("a"), s.agent("b"));
    for (who, kind) in [(&b, "b1"), (&b, "b2"), (&a, "a1"), (&a, "a2")] {
        who.send("a", kind, &json!({}), None).await.unwrap();
    }
    for _ in 0..4 {
        a.recv(Some(Duration::from_secs(5))).await.unwrap().unwrap();
    }
    s.finish(Outcome::default()).unwrap();
    let events = store.events(&s.run_id(), 1, 100).unwrap();
    let d: Vec<u64> = events.iter().filter(|e| e.kind == EventType::Deliver).map(|e| e.seq).collect();
    let fork = |x: u64, y: u64| {
        let edit: Edit = format!("swap:{x},{y}").parse().unwrap();
        Session::fork_new(store.clone(), &s.run_id(), None, vec![edit], SessionOptions::default())
    };
    let Err(err) = fork(d[0], d[3]) else { panic!("b1 can't be heard after b2, nor a2 before a1") };
    let said = err.to_string();
    assert!(said.contains(&format!("seq {} delivers another message from", d[1])), "{said}");
    assert!(said.contains("one sender's messages arrive in the order it sent them"), "{said}");
    // The swap it suggests is one that can be made (QA32 D3: it suggested a refused one).
    assert!(said.contains(&format!("(swap:{},{})", d[1], d[2])), "{said}");
    assert!(fork(d[1], d[2]).is_ok(), "b2 and a1 are neighbours from two senders");
}

/// Swaps that each pass can compose into an order no schedule hears: x1 y1 x2, swap x1 with
/// y1 then y1's place with x2 hears x2 before x1 (QA32 D2: accepted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swaps_that_compose_into_an_impossible_order_are_refused() {
    use retrace_core::edit::Edit;
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let (r, x, y) = (s.agent("r"), s.agent("x"), s.agent("y"));
    x.send("r", "x1", &json!({}), None).await.unwrap();
    y.send("r", "y1", &json!({}), None).await.unwrap();
    x.send("r", "x2", &json!({}), None).await.unwrap();
    for _ in 0..3 {
        r.recv(Some(Duration::from_secs(5))).await.unwrap().unwrap();
    }
    s.finish(Outcome::default()).unwrap();
    let events = store.events(&s.run_id(), 1, 100).unwrap();
    let d: Vec<u64> = events.iter().filter(|e| e.kind == EventType::Deliver).map(|e| e.seq).collect();
    let fork = |swaps: &[(u64, u64)]| {
        let edits: Vec<Edit> = swaps.iter().map(|(a, b)| format!("swap:{a},{b}").parse().unwrap()).collect();
        Session::fork_new(store.clone(), &s.run_id(), None, edits, SessionOptions::default())
    };
    assert!(fork(&[(d[0], d[1])]).is_ok() && fork(&[(d[1], d[2])]).is_ok(), "each alone");
    let Err(err) = fork(&[(d[0], d[1]), (d[1], d[2])]) else { panic!("together they reorder x") };
    let said = err.to_string();
    assert!(said.contains("together they have r hear x's message"), "{said}");
}

/// A swap of two recv timeouts trades nothing: refused rather than a fork equal to its source
/// (QA29 S1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_of_two_timeouts_is_refused() {
    use retrace_core::edit::Edit;
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let a = s.agent("poller");
    for _ in 0..2 {
        assert!(a.recv(Some(Duration::from_millis(10))).await.unwrap().is_none());
    }
    s.finish(Outcome::default()).unwrap();
    let edit: Edit = "swap:1,2".parse().unwrap();
    let Err(err) = Session::fork_new(store.clone(), &s.run_id(), None, vec![edit], SessionOptions::default())
    else {
        panic!("a swap of two timeouts is refused");
    };
    assert!(err.to_string().contains("both are recv timeouts"), "{err}");
}

/// A message to no agent (an empty name) could never be received; an empty env name or
/// action says nothing: each is refused before anything is recorded (QA10 D5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_names_are_refused_before_anything_is_recorded() {
    let store = store();
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let a = s.agent("planner");
    let sent = a.send("", "message", &json!({}), None).await.unwrap_err();
    assert!(sent.to_string().contains("send: the recipient's name is empty"), "{sent}");
    let env = a.env("").unwrap_err();
    assert!(env.to_string().contains("env: an environment variable's name is empty"), "{env}");
    let decided = a.decide("", None).unwrap_err();
    assert!(decided.to_string().contains("decide: a decision's action is empty"), "{decided}");
    s.finish(Outcome::default()).unwrap();
    assert!(store.events(&s.run_id(), 1, 10).unwrap().is_empty(), "nothing recorded");
}

/// `recv_blocking` on a current-thread runtime (`#[tokio::main(flavor = "current_thread")]`)
/// blocks that runtime's only thread, timer included: it waits on a thread of its own, so its
/// timeout fires (QA18 D3: it hung for good), and a message another thread sends arrives.
#[test]
fn recv_blocking_on_a_current_thread_runtime_times_out_and_hears_other_threads() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let s = Session::record(store(), SessionOptions::default()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (a, b) = (s.agent("a"), s.agent("b"));
        let heard = rt.block_on(async {
            let timed_out = b.recv_blocking(Some(Duration::from_millis(200))).unwrap();
            let sender = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                a.send_blocking("b", "ping", &json!({"n": 1}), None).unwrap()
            });
            let message = b.recv_blocking(Some(Duration::from_secs(10))).unwrap();
            (timed_out.is_none(), message.map(|m| m.seq) == Some(sender.join().unwrap()))
        });
        done_tx.send(heard).unwrap();
    });
    let heard = done_rx.recv_timeout(Duration::from_secs(30)).expect("recv_blocking returned");
    assert_eq!(heard, (true, true));
}

/// A recorded output the store can't serve (its blob file damaged) fails the replay at once:
/// the agent waiting on the damaged step's agent is released, not after --stall-timeout, and
/// the run ends `failed` with no divergence, as a replay that can't read its recording does
/// (QA36 D1: a 30 s stall, reported as the replay's divergence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_output_fails_the_replay_and_releases_the_waiters_at_once() {
    let (store, dir) = super::replay::sqlite_store();
    let big = "y".repeat(70_000);
    let program = |s: &Session| {
        let big = big.clone();
        let sender = s.spawn("alpha", move |a| async move {
            let out: String = a
                .tool_async("big", &json!({}), ToolSpec::deterministic("1"), || async move {
                    Ok::<_, String>(big)
                })
                .await?;
            a.send("beta", "note", &json!({ "len": out.len() }), None).await
        });
        let waiter = s.spawn("beta", |b| async move { b.recv(None).await });
        (sender, waiter)
    };
    let s = Session::record(store.clone(), SessionOptions::default()).unwrap();
    let (sender, waiter) = program(&s);
    sender.await.unwrap().unwrap();
    waiter.await.unwrap().unwrap();
    s.finish(Outcome::default()).unwrap();

    let files: Vec<_> = walk(&dir.path().join("blobs"));
    assert!(!files.is_empty(), "the 70 KB output is a blob file");
    for f in files {
        let mut bytes = std::fs::read(&f).unwrap();
        bytes[100] ^= 1;
        std::fs::write(&f, bytes).unwrap();
    }
    let r = Session::replay(store.clone(), &s.run_id(), SessionOptions::default()).unwrap();
    let started = Instant::now();
    let (sender, waiter) = program(&r);
    assert!(sender.await.unwrap().is_err(), "the damaged output is not served");
    let released = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("released at once");
    assert!(released.unwrap().is_err());
    assert!(started.elapsed() < Duration::from_secs(5));
    let err = r.finish(Outcome::default()).unwrap_err();
    assert!(err.divergence().is_none(), "a failure, not a divergence: {err}");
    let meta = store.run(&r.run_id()).unwrap();
    assert_eq!(meta.status, retrace_core::run::RunStatus::Failed);
    assert_eq!(meta.divergence, None, "nothing was judged");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
