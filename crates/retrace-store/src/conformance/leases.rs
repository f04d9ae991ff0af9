//! Leases: one recorder per run, renewed while alive, recovered when dead.
use std::time::Duration;

use retrace_core::run::RunStatus;

use super::{err_kind, sample_run, MakeStore};
use crate::writer::holder_is_alive;
use crate::writer::lease::now_ms;
use crate::{LeaseHolder, StoreErrorKind};

/// A holder on this host whose process is gone (or `None` when liveness is unknown here).
pub fn dead_holder() -> Option<LeaseHolder> {
    let me = LeaseHolder::current();
    let (host, pid, start) = me.parts()?;
    let dead = LeaseHolder(format!("{host}:{pid}:{start}0"));
    (holder_is_alive(&dead) == Some(false)).then_some(dead)
}

/// Acquire, `Busy` naming the holder, renew, release; an expired lease can be taken over.
pub fn leases_acquire_renew_release(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("leased", 1)).unwrap();
    let (me, other) = (LeaseHolder::current(), LeaseHolder("elsewhere:1:1".into()));
    assert_eq!(store.lease_holder("leased").unwrap(), None);
    store.acquire_lease("leased", &me, 10_000).unwrap();
    store.acquire_lease("leased", &me, 10_000).unwrap();
    assert_eq!(store.lease_holder("leased").unwrap(), Some(me.clone()));
    let busy = store.acquire_lease("leased", &other, 10_000).unwrap_err();
    assert_eq!(busy.kind, StoreErrorKind::Busy);
    assert!(busy.message.contains(&me.0) && busy.message.contains("leased"), "{busy}");
    store.renew_lease("leased", &me, 10_000).unwrap();
    assert_eq!(err_kind(store.renew_lease("leased", &other, 10_000)), StoreErrorKind::Conflict);
    store.release_lease("leased", &other).unwrap();
    assert_eq!(store.lease_holder("leased").unwrap(), Some(me.clone()), "only the holder releases");
    store.release_lease("leased", &me).unwrap();
    assert_eq!(store.lease_holder("leased").unwrap(), None);
    assert_eq!(err_kind(store.renew_lease("leased", &me, 10_000)), StoreErrorKind::Conflict);
    store.acquire_lease("leased", &other, 1).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(store.lease_holder("leased").unwrap(), None, "expired");
    store.acquire_lease("leased", &me, 10_000).unwrap();
    assert_eq!(err_kind(store.acquire_lease("nope", &me, 10)), StoreErrorKind::NotFound);
}

/// A dead holder's lease doesn't bind, and `recover_interrupted` marks its running run
/// `interrupted`, as it does a running run with an expired lease or none (once past a grace
/// period); live or finished runs are left alone.
pub fn dead_holder_is_recovered(make: MakeStore<'_>) {
    let store = make();
    let now = now_ms();
    let me = LeaseHolder::current();
    let other_host = LeaseHolder("elsewhere:1:1".into());
    for (id, started) in [
        ("dead", now),
        ("expired", now),
        ("leaseless", 1),
        ("fresh", now),
        ("live", now),
        ("remote", now),
        ("done", 1),
    ] {
        store.create_run(&sample_run(id, started)).unwrap();
    }
    let mut done = store.run("done").unwrap();
    done.status = RunStatus::Ok;
    store.update_run(&done).unwrap();
    store.acquire_lease("expired", &other_host, 1).unwrap();
    store.acquire_lease("live", &me, 60_000).unwrap();
    store.acquire_lease("remote", &other_host, 60_000).unwrap();
    let dead = dead_holder();
    match &dead {
        Some(dead) => {
            store.acquire_lease("dead", dead, 60_000).unwrap();
            assert_eq!(store.lease_holder("dead").unwrap(), None);
            store.acquire_lease("dead", dead, 60_000).unwrap();
        }
        None => store.acquire_lease("dead", &other_host, 1).unwrap(),
    }
    // Another live process of this host whose lease lapsed (a recorder stopped by Ctrl-Z): its
    // run is still its own (QA24 D2).
    let mut stopped = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let suspended = crate::writer::lease::holder_of_process(stopped.id());
    if let Some(holder) = &suspended {
        store.create_run(&sample_run("suspended", now)).unwrap();
        store.acquire_lease("suspended", holder, 1).unwrap();
    }
    std::thread::sleep(Duration::from_millis(5));
    let recovered = store.recover_interrupted().unwrap();
    let mut sorted = recovered.clone();
    sorted.sort();
    assert_eq!(sorted, ["dead", "expired", "leaseless"]);
    for id in ["dead", "expired", "leaseless"] {
        assert_eq!(store.run(id).unwrap().status, RunStatus::Interrupted, "{id}");
    }
    for id in ["fresh", "live", "remote"] {
        assert_eq!(store.run(id).unwrap().status, RunStatus::Running, "{id}");
    }
    if let Some(holder) = &suspended {
        assert_eq!(store.run("suspended").unwrap().status, RunStatus::Running);
        assert_eq!(store.lease_holder("suspended").unwrap().as_ref(), Some(holder));
        let taken = store.acquire_lease("suspended", &LeaseHolder("elsewhere:1:1".into()), 10_000);
        assert_eq!(err_kind(taken), StoreErrorKind::Busy);
        // Once it is gone, the run is recovered.
        stopped.kill().unwrap();
        stopped.wait().unwrap();
        assert_eq!(store.recover_interrupted().unwrap(), ["suspended"]);
    } else {
        let _ = stopped.kill();
        let _ = stopped.wait();
    }
    assert_eq!(store.run("done").unwrap().status, RunStatus::Ok);
    assert!(store.recover_interrupted().unwrap().is_empty());
}

/// A running run with no lease lives as long as its keeper ([`crate::EventStore::keep_run`]),
/// past the grace: a replay holds no lease however long it runs. A dead keeper's run is
/// recovered at once; one whose liveness can't be read here falls back to the grace.
pub fn a_kept_run_lives_with_its_keeper(make: MakeStore<'_>) {
    let store = make();
    let now = now_ms();
    let me = LeaseHolder::current();
    let other_host = LeaseHolder("elsewhere:1:1".into());
    for (id, started) in [("kept", 1), ("dead keeper", now), ("remote old", 1), ("remote fresh", now)] {
        store.create_run(&sample_run(id, started)).unwrap();
    }
    store.keep_run("kept", &me).unwrap();
    store.keep_run("remote old", &other_host).unwrap();
    store.keep_run("remote fresh", &other_host).unwrap();
    let mut expected = vec!["remote old"];
    match dead_holder() {
        Some(dead) => {
            store.keep_run("dead keeper", &dead).unwrap();
            expected.insert(0, "dead keeper");
        }
        None => store.keep_run("dead keeper", &me).unwrap(),
    }
    let mut recovered = store.recover_interrupted().unwrap();
    recovered.sort();
    assert_eq!(recovered, expected);
    for id in ["kept", "remote fresh"] {
        assert_eq!(store.run(id).unwrap().status, RunStatus::Running, "{id}");
    }
    // A kept run that takes a lease and releases it is the keeper's again.
    let writer = LeaseHolder::unique();
    store.acquire_lease("kept", &writer, 60_000).unwrap();
    store.release_lease("kept", &writer).unwrap();
    assert_eq!(store.lease_holder("kept").unwrap(), None);
    assert!(store.recover_interrupted().unwrap().is_empty());
    assert_eq!(err_kind(store.keep_run("nope", &me)), StoreErrorKind::NotFound);
}
