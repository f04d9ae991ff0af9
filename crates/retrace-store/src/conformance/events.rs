//! Events: dense commits, atomicity, paging and exact round trips.
use retrace_core::run::RunMode;

use super::{batch, err_kind, full_event, raw, sample_events, sample_run, MakeStore};
use crate::{Batch, Store, StoreErrorKind};
use retrace_core::Digest;

/// A batch must continue the run densely: a gap or a repeat is a `Conflict` naming the run.
pub fn commit_requires_dense_seqs(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("dense", 1)).unwrap();
    let events = sample_events("dense", 1, 6, None);
    store.commit(&batch("dense", events[..3].to_vec())).unwrap();
    let gap = store.commit(&batch("dense", events[4..].to_vec())).unwrap_err();
    assert_eq!(gap.kind, StoreErrorKind::Conflict);
    assert!(gap.message.contains("dense") && gap.message.contains('5'), "{gap}");
    let repeat = store.commit(&batch("dense", events[2..4].to_vec())).unwrap_err();
    assert_eq!(repeat.kind, StoreErrorKind::Conflict);
    assert!(repeat.message.contains('3'), "{repeat}");
    let holes = vec![events[3].clone(), events[5].clone()];
    assert_eq!(err_kind(store.commit(&batch("dense", holes))), StoreErrorKind::Conflict);
    assert_eq!(store.last_seq("dense").unwrap(), 3);
    store.commit(&batch("dense", events[3..].to_vec())).unwrap();
    assert_eq!(store.last_seq("dense").unwrap(), 6);
    store.commit(&batch("dense", Vec::new())).unwrap();
    let from_zero = sample_events("fresh", 0, 1, None);
    store.create_run(&sample_run("fresh", 1)).unwrap();
    assert_eq!(err_kind(store.commit(&batch("fresh", from_zero))), StoreErrorKind::Conflict);
}

/// A refused batch stores none of its events or blobs.
pub fn failed_commit_stores_nothing(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("atomic", 1)).unwrap();
    let mut events = sample_events("atomic", 1, 4, None);
    events.remove(2);
    let blob = raw(b"only in the failed batch");
    let big = raw(&vec![b'x'; crate::INLINE_BLOB_MAX + 10]);
    let failed =
        Batch { run_id: "atomic".into(), events, blobs: vec![blob.clone(), big.clone()], cache: Vec::new() };
    assert_eq!(err_kind(store.commit(&failed)), StoreErrorKind::Conflict);
    assert_eq!(store.last_seq("atomic").unwrap(), 0);
    assert!(store.events("atomic", 1, 10).unwrap().is_empty());
    assert!(!store.has_blob(&blob.digest).unwrap());
    assert!(!store.has_blob(&big.digest).unwrap());
    assert!(store.agent_seqs("atomic", "a1").unwrap().is_empty());
}

/// Committing events to a run that doesn't exist is `NotFound`.
pub fn commit_to_unknown_run_is_not_found(make: MakeStore<'_>) {
    let store = make();
    let events = sample_events("ghost", 1, 1, None);
    assert_eq!(err_kind(store.commit(&batch("ghost", events))), StoreErrorKind::NotFound);
    assert_eq!(err_kind(store.last_seq("ghost")), StoreErrorKind::NotFound);
    assert_eq!(err_kind(store.events("ghost", 1, 1)), StoreErrorKind::NotFound);
}

/// `events` pages in seq order; `event`, `last_seq` and `agent_seqs` agree with it.
pub fn events_paging_and_lookup(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("paging", 1)).unwrap();
    store.create_run(&sample_run("other", 2)).unwrap();
    assert_eq!(store.last_seq("paging").unwrap(), 0);
    let events = sample_events("paging", 1, 25, None);
    for chunk in events.chunks(7) {
        store.commit(&batch("paging", chunk.to_vec())).unwrap();
    }
    store.commit(&batch("other", sample_events("other", 1, 3, None))).unwrap();
    assert_eq!(store.last_seq("paging").unwrap(), 25);
    let mut read = Vec::new();
    let mut from = 1;
    loop {
        let page = store.events("paging", from, 10).unwrap();
        if page.is_empty() {
            break;
        }
        from = page[page.len() - 1].seq + 1;
        read.extend(page);
    }
    assert_eq!(read, events);
    assert_eq!(store.events("paging", 24, 100).unwrap(), events[23..].to_vec());
    assert!(store.events("paging", 26, 100).unwrap().is_empty());
    assert_eq!(store.event("paging", 13).unwrap(), events[12]);
    let missing = store.event("paging", 26).unwrap_err();
    assert_eq!(missing.kind, StoreErrorKind::NotFound);
    assert!(missing.message.contains("paging") && missing.message.contains("26"), "{missing}");
    let a1: Vec<u64> = (1..=25).filter(|s| s % 3 == 1).collect();
    assert_eq!(store.agent_seqs("paging", "a1").unwrap(), a1);
    assert!(store.agent_seqs("paging", "nobody").unwrap().is_empty());
    assert_eq!(store.agent_seqs("other", "a1").unwrap(), vec![1]);
}

/// An event reads back equal to what was written, every optional field included, so its hash
/// still verifies; so does a minimal one and an inherited one (another run's id).
pub fn event_round_trips_exactly(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("exact", 1)).unwrap();
    let first = sample_events("exact", 1, 1, None).remove(0);
    let mut inherited = sample_events("source-run", 2, 1, Some(first.hash)).remove(0);
    inherited.output_ref = Some(retrace_core::Digest::of(b"same"));
    inherited.output_hash = inherited.output_ref;
    inherited.seal(Some(first.hash)).unwrap();
    let full = full_event("exact", 3, Some(inherited.hash));
    let mut bare = retrace_core::Event::new("exact", "", retrace_core::EventType::Deliver);
    bare.seq = 4;
    bare.seal(Some(full.hash)).unwrap();
    let written = vec![first, inherited, full, bare];
    store.commit(&batch("exact", written.clone())).unwrap();
    let read = store.events("exact", 1, 10).unwrap();
    assert_eq!(read, written);
    for e in &read {
        assert_eq!(e.compute_hash().unwrap(), e.hash, "seq {} hash verifies", e.seq);
    }
    assert_eq!(store.agent_seqs("exact", "").unwrap(), vec![4]);
}

/// A fork that inherits its source's events by reference numbers its own from `fork_at`.
pub fn fork_starts_at_fork_point(make: MakeStore<'_>) {
    let store = make();
    let mut fork = sample_run("fork-run", 1);
    fork.mode = RunMode::Fork;
    fork.source_run = Some("src".into());
    fork.fork_at = Some(5);
    store.create_run(&fork).unwrap();
    let own = sample_events("fork-run", 5, 2, None);
    assert_eq!(err_kind(store.commit(&batch("fork-run", own[1..].to_vec()))), StoreErrorKind::Conflict);
    store.commit(&batch("fork-run", own)).unwrap();
    assert_eq!(store.last_seq("fork-run").unwrap(), 6);
    let mut copied = sample_run("fork-copy", 1);
    copied.fork_at = Some(5);
    store.create_run(&copied).unwrap();
    store.commit(&batch("fork-copy", sample_events("fork-copy", 1, 6, None))).unwrap();
    assert_eq!(store.last_seq("fork-copy").unwrap(), 6);
}

/// `deliveries_to` lists an agent's deliveries before a seq; `events_at` and `heads_at` fetch
/// seqs in the order asked, `NotFound` naming a missing one.
pub fn deliveries_and_events_at(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("msgs", 1)).unwrap();
    let mut prev = None;
    let mut events = Vec::new();
    for seq in 1..=12u64 {
        let kind =
            if seq % 3 == 0 { retrace_core::EventType::Deliver } else { retrace_core::EventType::Send };
        let mut e = retrace_core::Event::new("msgs", if seq % 2 == 0 { "rx" } else { "tx" }, kind);
        e.seq = seq;
        e.causal_parent = (kind == retrace_core::EventType::Deliver).then(|| seq - 1);
        e.seal(prev).unwrap();
        prev = Some(e.hash);
        events.push(e);
    }
    store.commit(&batch("msgs", events.clone())).unwrap();
    let seqs = |es: Vec<retrace_core::Event>| es.into_iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(store.deliveries_to("msgs", "rx", 12).unwrap()), [6]);
    assert_eq!(seqs(store.deliveries_to("msgs", "rx", 13).unwrap()), [6, 12]);
    assert_eq!(seqs(store.deliveries_to("msgs", "tx", 100).unwrap()), [3, 9]);
    assert!(store.deliveries_to("msgs", "nobody", 100).unwrap().is_empty());
    assert_eq!(store.deliveries_to("msgs", "rx", 13).unwrap()[1], events[11]);
    let picked = store.events_at("msgs", &[9, 2, 9, 12]).unwrap();
    assert_eq!(picked, vec![events[8].clone(), events[1].clone(), events[8].clone(), events[11].clone()]);
    let heads: Vec<crate::EventHead> = picked.iter().map(Into::into).collect();
    assert_eq!(store.heads_at("msgs", &[9, 2, 9, 12]).unwrap(), heads);
    assert_eq!(err_kind(store.heads_at("msgs", &[3, 40])), StoreErrorKind::NotFound);
    assert!(store.events_at("msgs", &[]).unwrap().is_empty());
    let missing = store.events_at("msgs", &[3, 40]).unwrap_err();
    assert_eq!(missing.kind, StoreErrorKind::NotFound);
    assert!(missing.message.contains("40"), "{missing}");
    assert_eq!(err_kind(store.events_at("ghost", &[1])), StoreErrorKind::NotFound);
}

/// `summaries` pages like `events` and equals the summary of each event, every field included
/// (usage costs to the exact double, the source, origin and decision from the optional fields).
pub fn summaries_match_events(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("summed", 1)).unwrap();
    let mut written = sample_events("summed", 1, 3, None);
    let mut odd_cost = full_event("summed", 4, Some(written[2].hash));
    odd_cost.usage = Some(retrace_core::envelope::Usage {
        input_tokens: u64::MAX,
        output_tokens: 0,
        cost_usd: Some(0.1 + 0.2),
        ..Default::default()
    });
    odd_cost.output_hash = odd_cost.output_ref;
    odd_cost.seal(Some(written[2].hash)).unwrap();
    let full = full_event("summed", 5, Some(odd_cost.hash));
    written.extend([odd_cost, full]);
    store.commit(&batch("summed", written.clone())).unwrap();
    let expected: Vec<crate::EventSummary> = written.into_iter().map(Into::into).collect();
    assert_eq!(store.summaries("summed", 1, 100).unwrap(), expected);
    assert_eq!(store.summaries("summed", 4, 1).unwrap(), expected[3..4].to_vec());
    assert!(store.summaries("summed", 6, 10).unwrap().is_empty());
    assert_eq!(err_kind(store.summaries("ghost", 1, 1)), StoreErrorKind::NotFound);
}

/// `request_blobs_at` answers what `request_refs_at` and `get_blob` answer, for requests stored
/// in every way (in the row, packed, a file, a manifest over an earlier request), a request
/// whose blob isn't stored and an event with none, asked in any order and more than once.
pub fn request_blobs_match_blob_reads(make: MakeStore<'_>) {
    use crate::{BlobHint, BlobPut};
    use retrace_core::EventType;
    let store = make();
    store.create_run(&sample_run("bodies", 1)).unwrap();
    let mut seed = 5;
    let turns: Vec<String> = (0..4)
        .map(|i| format!("{{\"role\":\"user\",\"content\":\"{}\"}}", super::text(&mut seed, 40 + i * 30)))
        .collect();
    let chat = |n: usize| format!("{{\"model\":\"m\",\"messages\":[{}]}}", turns[..n].join(",")).into_bytes();
    let requests: Vec<(EventType, Option<BlobPut>)> = vec![
        (EventType::Send, Some(BlobPut::new(b"{\"body\":1}".to_vec(), BlobHint::Raw))),
        (EventType::Send, Some(BlobPut::new(super::text(&mut seed, 300).into_bytes(), BlobHint::Raw))),
        (EventType::ModelCall, Some(BlobPut::new(chat(1), BlobHint::ModelRequest))),
        (
            EventType::ToolCall,
            Some(BlobPut::new(
                super::text(&mut seed, crate::INLINE_BLOB_MAX + 10).into_bytes(),
                BlobHint::Raw,
            )),
        ),
        (EventType::ModelCall, Some(BlobPut::new(chat(3), BlobHint::ModelRequest))),
        (EventType::ModelCall, Some(BlobPut::new(chat(4), BlobHint::ModelRequest))),
        (EventType::Send, None),
        (EventType::Send, Some(BlobPut::new(b"never stored".to_vec(), BlobHint::Raw))),
    ];
    let mut prev = None;
    for (i, (kind, request)) in requests.iter().enumerate() {
        let mut e = retrace_core::Event::new("bodies", "agent", *kind);
        e.seq = i as u64 + 1;
        e.key = Digest::of(e.seq.to_string().as_bytes());
        e.request_ref = request.as_ref().map(|b| b.digest);
        e.seal(prev).unwrap();
        prev = Some(e.hash);
        let blobs = request.iter().filter(|b| b.bytes.as_ref() != b"never stored").cloned().collect();
        store.commit(&Batch { run_id: "bodies".into(), events: vec![e], blobs, cache: Vec::new() }).unwrap();
    }
    let seqs = [8, 2, 6, 1, 2, 7, 3, 5, 4];
    let expected: Vec<Option<Vec<u8>>> = store
        .request_refs_at("bodies", &seqs)
        .unwrap()
        .iter()
        .map(|r| r.and_then(|d| store.get_blob(&d).ok()))
        .collect();
    assert_eq!(store.request_blobs_at("bodies", &seqs).unwrap(), expected);
    let stored: Vec<Option<Vec<u8>>> = seqs
        .iter()
        .map(|s| {
            requests[*s as usize - 1].1.as_ref().map(|b| b.bytes.to_vec()).filter(|b| b != b"never stored")
        })
        .collect();
    assert_eq!(expected, stored, "every stored request comes back, byte for byte");
    assert!(store.request_blobs_at("bodies", &[]).unwrap().is_empty());
    assert_eq!(err_kind(store.request_blobs_at("bodies", &[1, 9])), StoreErrorKind::NotFound);
    assert_eq!(err_kind(store.request_blobs_at("ghost", &[1])), StoreErrorKind::NotFound);
}

/// [`crate::EventStore::events_located`] gives the events [`crate::EventStore::events`] gives,
/// and the hints it hands out read the same bytes as digests alone: tiny, packed and file
/// blobs, manifests, a blob an earlier batch stored, an event without blobs. A hint is never
/// trusted: hints moved to other blobs, or pointing nowhere, still read each digest's own
/// bytes, and a blob that isn't stored is `NotFound` whatever its hint.
pub fn located_reads_match_blob_reads(make: MakeStore<'_>) {
    use crate::{BlobAt, BlobHint, BlobPut, BlobRef};
    use retrace_core::EventType;
    let store = make();
    store.create_run(&sample_run("located", 1)).unwrap();
    let mut seed = 9;
    let mut text = |n: usize| super::text(&mut seed, n).into_bytes();
    let chat = |n: usize| {
        format!(
            "{{\"model\":\"m\",\"messages\":[{}]}}",
            vec!["{\"role\":\"user\",\"content\":\"hi there\"}"; n].join(",")
        )
        .into_bytes()
    };
    let early = BlobPut::new(text(700), BlobHint::Raw);
    let steps: Vec<(EventType, Option<BlobPut>, Option<BlobPut>, bool)> = vec![
        (
            EventType::ToolCall,
            Some(BlobPut::new(b"tiny".to_vec(), BlobHint::Raw)),
            Some(BlobPut::new(text(1000), BlobHint::Raw)),
            true,
        ),
        (
            EventType::ModelCall,
            Some(BlobPut::new(chat(2), BlobHint::ModelRequest)),
            Some(early.clone()),
            true,
        ),
        (
            EventType::ModelCall,
            Some(BlobPut::new(chat(3), BlobHint::ModelRequest)),
            Some(BlobPut::new(text(crate::INLINE_BLOB_MAX + 1), BlobHint::Raw)),
            true,
        ),
        (EventType::Send, None, None, true),
        // Stored by step 2 and not carried again.
        (EventType::ToolCall, Some(early.clone()), Some(BlobPut::new(text(64), BlobHint::Raw)), false),
    ];
    let mut prev = None;
    for (i, (kind, request, output, carried)) in steps.iter().enumerate() {
        let mut e = retrace_core::Event::new("located", "agent", *kind);
        e.seq = i as u64 + 1;
        e.key = Digest::of(e.seq.to_string().as_bytes());
        e.request_ref = request.as_ref().map(|b| b.digest);
        e.output_ref = output.as_ref().map(|b| b.digest);
        e.seal(prev).unwrap();
        prev = Some(e.hash);
        let blobs: Vec<BlobPut> = match carried {
            true => request.iter().chain(output).cloned().collect(),
            false => output.iter().cloned().collect(),
        };
        store.commit(&Batch { run_id: "located".into(), events: vec![e], blobs, cache: Vec::new() }).unwrap();
    }
    let located = store.events_located("located", 1, 100).unwrap();
    let events: Vec<retrace_core::Event> = located.iter().map(|l| l.event.clone()).collect();
    assert_eq!(events, store.events("located", 1, 100).unwrap());
    assert_eq!(store.events_located("located", 3, 1).unwrap()[0].event.seq, 3);
    let refs: Vec<BlobRef> = located.iter().flat_map(|l| l.blob_refs()).collect();
    let digests: Vec<Digest> = refs.iter().map(|(d, _)| *d).collect();
    assert_eq!(digests.len(), 8);
    let bytes = store.get_blobs(&digests).unwrap();
    assert_eq!(store.get_blobs_unverified(&refs).unwrap(), bytes, "with their own hints");
    let mut moved: Vec<BlobRef> = refs.clone();
    let hints: Vec<Option<BlobAt>> = refs.iter().map(|(_, at)| *at).collect();
    for (i, blob) in moved.iter_mut().enumerate() {
        blob.1 = hints[(i + 1) % hints.len()];
    }
    assert_eq!(store.get_blobs_unverified(&moved).unwrap(), bytes, "with each other's hints");
    for nowhere in [0, -1, i64::MAX] {
        let lost: Vec<BlobRef> = digests.iter().map(|d| (*d, Some(BlobAt::new(nowhere)))).collect();
        assert_eq!(store.get_blobs_unverified(&lost).unwrap(), bytes, "with hints to {nowhere}");
    }
    let missing = Digest::of(b"never stored");
    let hint = hints.iter().flatten().next().copied().or(Some(BlobAt::new(1)));
    let err = store.get_blobs_unverified(&[refs[0], (missing, hint)]).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::NotFound);
    assert!(err.message.contains(&missing.to_string()), "{err}");
    assert_eq!(err_kind(store.events_located("ghost", 1, 10)), StoreErrorKind::NotFound);
}

/// A run of `n` events whose causal parents reach back 1..=300 seqs (so chains cross the
/// 256-seq blocks SQLite packs heads into), every 5th a deliver with a message, every 7th with
/// no parent, names and agents varied; committed in batches of 1..=9 events, as a recording
/// commits them. The first seq is `first` (a fork's first own seq).
fn causal_run(store: &dyn Store, run: &str, first: u64, n: u64) -> Vec<retrace_core::Event> {
    use retrace_core::envelope::MessageRef;
    use retrace_core::EventType;
    let mut events: Vec<retrace_core::Event> = Vec::new();
    let mut prev = None;
    for seq in first..first + n {
        let kind = if seq % 5 == 0 {
            EventType::Deliver
        } else {
            [EventType::Send, EventType::ToolCall][seq as usize % 2]
        };
        let mut e = retrace_core::Event::new(run, format!("agent-{}", seq % 4), kind);
        e.seq = seq;
        e.name = (seq % 3 != 0).then(|| format!("name-{}", seq % 6));
        e.causal_parent =
            (seq % 7 != 0).then(|| seq.saturating_sub(1 + (seq * 37) % 300)).filter(|p| *p >= 1);
        e.key = Digest::of(seq.to_string().as_bytes());
        e.request_ref = (kind == EventType::Send).then(|| Digest::of(format!("request {seq}").as_bytes()));
        e.message = (kind == EventType::Deliver).then(|| MessageRef {
            from: Some(format!("agent-{}", seq % 3)),
            to: Some(format!("agent-{}", seq % 4)),
            kind: (seq % 2 == 0).then(|| "note".to_owned()),
            timed_out: false,
        });
        e.seal(prev).unwrap();
        prev = Some(e.hash);
        events.push(e);
    }
    let mut at = 0;
    while at < events.len() {
        let end = (at + 1 + at % 9).min(events.len());
        store.commit(&batch(run, events[at..end].to_vec())).unwrap();
        at = end;
    }
    events
}

/// `chain_heads`, `delivery_heads_to` and `request_refs_at` answer what following
/// [`crate::EventStore::heads_at`] level by level, `deliveries_to` and `events_at` answer,
/// in a run and in a fork (whose chains reaching below its fork point are `NotFound`).
pub fn causal_reads_match_events(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("causal", 1)).unwrap();
    let events = causal_run(store.as_ref(), "causal", 1, 700);
    for (starts, depth) in
        [(vec![700], 256), (vec![699, 650, 400, 3], 256), (vec![700, 512, 257, 256], 3), (vec![1], 1)]
    {
        let mut expected = crate::Chains::default();
        crate::head::chain_heads_by_level(store.as_ref(), "causal", &starts, depth, &mut expected).unwrap();
        let got = store.chain_heads("causal", &starts, depth).unwrap();
        assert_eq!(got.heads(), expected.heads(), "chains of {starts:?}, {depth} deep");
        assert!(!got.is_empty());
    }
    assert!(store.chain_heads("causal", &[], 5).unwrap().is_empty());
    assert_eq!(err_kind(store.chain_heads("causal", &[701], 5)), StoreErrorKind::NotFound);
    for (agent, before) in [("agent-1", 701), ("agent-2", 300), ("agent-0", 1), ("nobody", 700)] {
        let whole: Vec<crate::DeliveryHead> =
            store.deliveries_to("causal", agent, before).unwrap().iter().map(Into::into).collect();
        assert_eq!(
            store.delivery_heads_to("causal", agent, before).unwrap(),
            whole,
            "{agent} before {before}"
        );
    }
    let seqs = [12, 7, 12, 700, 1];
    let refs: Vec<Option<Digest>> = seqs.iter().map(|s| events[*s as usize - 1].request_ref).collect();
    assert_eq!(store.request_refs_at("causal", &seqs).unwrap(), refs);
    assert!(refs.iter().any(Option::is_some) && refs.iter().any(Option::is_none));
    assert_eq!(err_kind(store.request_refs_at("causal", &[3, 900])), StoreErrorKind::NotFound);

    let mut fork = sample_run("causal-fork", 2);
    fork.fork_at = Some(300);
    store.create_run(&fork).unwrap();
    causal_run(store.as_ref(), "causal-fork", 300, 300);
    let (mut answered, mut below) = (0, 0);
    for start in 300..600 {
        let mut expected = crate::Chains::default();
        let level =
            crate::head::chain_heads_by_level(store.as_ref(), "causal-fork", &[start], 256, &mut expected);
        match (store.chain_heads("causal-fork", &[start], 256), level) {
            (Ok(got), Ok(())) => {
                assert_eq!(got.heads(), expected.heads(), "fork chain of {start}");
                answered += 1;
            }
            (Err(got), Err(want)) => {
                assert_eq!((got.kind, want.kind), (StoreErrorKind::NotFound, StoreErrorKind::NotFound));
                below += 1;
            }
            (got, want) => {
                panic!("fork chain of {start}: {:?} but level by level {want:?}", got.map(|c| c.len()))
            }
        }
    }
    assert!(answered > 10 && below > 10, "{answered} chains answered, {below} reach below the fork");
}

/// `heard_by` answers what `delivery_heads_to` and `request_blobs_at` of the delivered events
/// answer: for sends whose request is stored in the same batch or an earlier one, not stored,
/// stored only after the delivery was committed, or absent, and for a delivery of no event.
pub fn heard_by_matches_its_parts(make: MakeStore<'_>) {
    use crate::{BlobHint, BlobPut};
    use retrace_core::envelope::MessageRef;
    use retrace_core::EventType;
    let store = make();
    store.create_run(&sample_run("heard", 1)).unwrap();
    let late = BlobPut::new(b"{\"body\":\"stored late\"}".to_vec(), BlobHint::Raw);
    let bodies: Vec<BlobPut> = (0..3)
        .map(|i| BlobPut::new(format!("{{\"body\":{{\"n\":{i}}}}}").into_bytes(), BlobHint::Raw))
        .collect();
    // (type, agent, parent, request); batches split after seqs 2, 5 and 8.
    let plan: Vec<(EventType, &str, Option<u64>, Option<Digest>)> = vec![
        (EventType::Send, "a", None, Some(bodies[0].digest)),
        (EventType::Deliver, "hub", Some(1), None),
        (EventType::Send, "b", Some(2), Some(bodies[1].digest)),
        (EventType::Send, "a", None, Some(Digest::of(b"never stored"))),
        (EventType::Deliver, "hub", Some(4), None),
        (EventType::Deliver, "hub", Some(3), None),
        (EventType::Deliver, "hub", None, None),
        (EventType::Deliver, "hub", Some(6), None),
        (EventType::Send, "b", None, Some(late.digest)),
        (EventType::Deliver, "hub", Some(9), None),
        (EventType::Deliver, "b", Some(1), None),
        (EventType::Send, "a", Some(11), Some(bodies[2].digest)),
        (EventType::Deliver, "hub", Some(12), None),
    ];
    let mut prev = None;
    let mut events = Vec::new();
    for (i, (kind, agent, parent, request)) in plan.iter().enumerate() {
        let mut e = retrace_core::Event::new("heard", *agent, *kind);
        e.seq = i as u64 + 1;
        e.key = Digest::of(e.seq.to_string().as_bytes());
        e.causal_parent = *parent;
        e.request_ref = *request;
        e.message = (*kind == EventType::Deliver).then(|| MessageRef {
            from: Some("a".into()),
            to: Some((*agent).into()),
            kind: Some("note".into()),
            timed_out: false,
        });
        e.seal(prev).unwrap();
        prev = Some(e.hash);
        events.push(e);
    }
    let blobs_of = |seqs: std::ops::Range<usize>| -> Vec<BlobPut> {
        bodies
            .iter()
            .filter(|b| events[seqs.clone()].iter().any(|e| e.request_ref == Some(b.digest)))
            .cloned()
            .collect()
    };
    for range in [0..2, 2..5, 5..8, 8..13] {
        let batch = Batch {
            run_id: "heard".into(),
            events: events[range.clone()].to_vec(),
            blobs: blobs_of(range),
            cache: Vec::new(),
        };
        store.commit(&batch).unwrap();
    }
    store.put_blob(&late.bytes, BlobHint::Raw).unwrap();
    for (agent, before) in [("hub", 14), ("hub", 6), ("b", 14), ("a", 14), ("nobody", 14)] {
        let heads = store.delivery_heads_to("heard", agent, before).unwrap();
        let expected: Vec<(crate::DeliveryHead, Option<Vec<u8>>)> = heads
            .into_iter()
            .map(|d| {
                let blob = d
                    .causal_parent
                    .and_then(|s| store.request_blobs_at("heard", &[s]).unwrap().pop().flatten());
                (d, blob)
            })
            .collect();
        assert_eq!(store.heard_by("heard", agent, before).unwrap(), expected, "{agent} before {before}");
    }
    let heard = store.heard_by("heard", "hub", 14).unwrap();
    let found = heard.iter().filter(|(_, b)| b.is_some()).count();
    assert_eq!((heard.len(), found), (7, 4), "the bodies of sends 1, 3, 9 (stored late) and 12");
    assert_eq!(err_kind(store.heard_by("ghost", "hub", 14)), StoreErrorKind::NotFound);
}

/// [`crate::EventStore::put_blobs`] stores blobs without a run and says where, in order; a
/// commit that carries them again with [`crate::BlobPut::stored_at`] stores nothing twice and,
/// where the backend said where a blob is, its events say the same. A place is only a hint:
/// one moved to another blob, one pointing nowhere, and one for a blob that was never stored
/// still leave every blob stored once, each digest reading its own bytes.
pub fn put_blobs_then_commit_where_they_are(make: MakeStore<'_>) {
    use crate::{BlobAt, BlobHint, BlobPut};
    let store = make();
    let mut seed = 21;
    let mut text = |n: usize| super::text(&mut seed, n).into_bytes();
    let puts = vec![
        BlobPut::new(b"tiny".to_vec(), BlobHint::Raw),
        BlobPut::new(text(1500), BlobHint::Raw),
        BlobPut::new(text(crate::INLINE_BLOB_MAX + 7), BlobHint::Raw),
        BlobPut::new(text(900), BlobHint::Raw),
        BlobPut::new(text(3000), BlobHint::Raw),
    ];
    assert!(store.put_blobs(&[]).unwrap().is_empty());
    let places = store.put_blobs(&puts).unwrap();
    assert_eq!(places.len(), puts.len());
    // Again, with a blob that was stored already in the middle: nothing is stored twice.
    let fresh = BlobPut::new(text(500), BlobHint::Raw);
    let again = store.put_blobs(&[puts[1].clone(), fresh.clone(), puts[0].clone()]).unwrap();
    assert_eq!((again[0], again[2]), (places[1], places[0]), "a stored blob is where it was");
    for put in puts.iter().chain([&fresh]) {
        assert_eq!(store.get_blob(&put.digest()).unwrap(), put.bytes().to_vec());
    }
    let never = BlobPut::new(text(700), BlobHint::Raw);
    let hinted = |i: usize| match places[i] {
        Some(at) => puts[i].clone().stored_at(at),
        None => puts[i].clone(),
    };
    let carried: Vec<Vec<BlobPut>> = vec![
        vec![hinted(0), hinted(1)],
        // Hints moved to the other blob, and pointing nowhere.
        vec![
            puts[2].clone().stored_at(places[3].unwrap_or(BlobAt::new(2))),
            puts[3].clone().stored_at(BlobAt::new(-1)),
        ],
        // A hint for a blob never stored, and one to a row far past the end.
        vec![
            never.clone().stored_at(places[4].unwrap_or(BlobAt::new(1))),
            puts[4].clone().stored_at(BlobAt::new(i64::MAX)),
        ],
        // Two blobs said to be at one row, where only the second is.
        vec![
            fresh.clone().stored_at(places[3].unwrap_or(BlobAt::new(3))),
            puts[3].clone().stored_at(places[3].unwrap_or(BlobAt::new(3))),
        ],
    ];
    store.create_run(&sample_run("placed", 1)).unwrap();
    let mut prev = None;
    for (i, blobs) in carried.iter().enumerate() {
        let mut e = retrace_core::Event::new("placed", "agent", retrace_core::EventType::ToolCall);
        e.seq = i as u64 + 1;
        e.key = Digest::of(e.seq.to_string().as_bytes());
        e.request_ref = Some(blobs[0].digest());
        e.output_ref = Some(blobs[1].digest());
        e.seal(prev).unwrap();
        prev = Some(e.hash);
        store
            .commit(&Batch {
                run_id: "placed".into(),
                events: vec![e],
                blobs: blobs.clone(),
                cache: Vec::new(),
            })
            .unwrap();
    }
    let located = store.events_located("placed", 1, 10).unwrap();
    assert_eq!(located.len(), 4);
    if let (Some(request), Some(output)) = (places[0], places[1]) {
        assert_eq!((located[0].request_at, located[0].output_at), (Some(request), Some(output)));
    }
    if let (Some(fresh_at), Some(shared)) = (again[1], places[3]) {
        assert_eq!((located[3].request_at, located[3].output_at), (Some(fresh_at), Some(shared)));
    }
    for (event, blobs) in located.iter().zip(&carried) {
        let refs: Vec<_> = event.blob_refs().collect();
        let bytes: Vec<Vec<u8>> = blobs.iter().map(|b| b.bytes().to_vec()).collect();
        assert_eq!(store.get_blobs_unverified(&refs).unwrap(), bytes, "seq {}", event.event.seq);
        assert_eq!(store.get_blobs(&refs.iter().map(|r| r.0).collect::<Vec<_>>()).unwrap(), bytes);
    }
    assert_eq!(store.get_blob(&never.digest()).unwrap(), never.bytes().to_vec(), "stored despite its hint");
}

/// A blob stored through [`crate::EventStore::put_blobs`] and carried again without its bytes
/// (`BlobPut::stored`, what an import commits for its early blobs; see
/// [`crate::BlobPut::carries_bytes`]) is confirmed, with its place or without, and reads its
/// own bytes; one that was never stored fails the whole batch (`NotFound`) and stores nothing,
/// not even an empty blob under its digest.
pub fn blobs_carried_without_bytes_are_confirmed_or_refused(make: MakeStore<'_>) {
    use crate::{BlobHint, BlobPut};
    let store = make();
    let mut seed = 33;
    let mut text = |n: usize| super::text(&mut seed, n).into_bytes();
    let puts = [text(40), text(1200), text(crate::INLINE_BLOB_MAX + 3)]
        .map(|bytes| BlobPut::new(bytes, BlobHint::Raw));
    let places = store.put_blobs(&puts).unwrap();
    let never = BlobPut::new(text(600), BlobHint::Raw);
    let carried = |put: &BlobPut, at| BlobPut::stored(put.digest(), at, BlobHint::Raw);
    store.create_run(&sample_run("confirmed", 1)).unwrap();
    let event = |seq: u64, prev, request: &BlobPut, output: &BlobPut| {
        let mut e = retrace_core::Event::new("confirmed", "agent", retrace_core::EventType::ToolCall);
        e.seq = seq;
        e.key = Digest::of(seq.to_string().as_bytes());
        e.request_ref = Some(request.digest());
        e.output_ref = Some(output.digest());
        e.seal(prev).unwrap();
        e
    };
    let first = event(1, None, &puts[0], &puts[1]);
    let blobs = vec![carried(&puts[0], places[0]), carried(&puts[1], None), carried(&puts[2], places[2])];
    assert!(blobs.iter().all(|b| !b.carries_bytes() && b.bytes().is_empty()));
    let batch = |events, blobs| Batch { run_id: "confirmed".into(), events, blobs, cache: Vec::new() };
    store.commit(&batch(vec![first.clone()], blobs)).unwrap();
    for put in &puts {
        assert_eq!(store.get_blob(&put.digest()).unwrap(), put.bytes().to_vec());
    }
    let second = event(2, Some(first.hash), &puts[2], &never);
    let refused =
        store.commit(&batch(vec![second], vec![carried(&never, places[1]), carried(&puts[2], None)]));
    assert_eq!(err_kind(refused), StoreErrorKind::NotFound);
    assert_eq!(store.last_seq("confirmed").unwrap(), 1, "a refused batch stored its event");
    assert_eq!(err_kind(store.get_blob(&never.digest())), StoreErrorKind::NotFound);
}
