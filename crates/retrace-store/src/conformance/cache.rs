//! Caches: get and put, latest put wins, entries committed with their batch, usability by class.
use std::sync::Arc;

use retrace_core::envelope::{ToolClass, Usage};
use retrace_core::{Digest, Event, EventType};

use super::{batch, err_kind, raw, sample_events, sample_run, MakeStore};
use crate::{Batch, BlobHint, CacheEntry, LeaseHolder, RunWriter, StoreErrorKind};

/// A model entry (no class) with usage, for `output`.
fn model_entry(output: Digest, stored_at_ms: u64) -> CacheEntry {
    let usage =
        Usage { input_tokens: 1200, output_tokens: 34, cost_usd: Some(0.1 + 0.2), ..Default::default() };
    let snapshot = Some("gpt-sim-2024-08-06".to_owned());
    CacheEntry { output_ref: output, usage: Some(usage), stored_at_ms, class: None, ttl_s: None, snapshot }
}

/// A tool entry of `class`.
fn tool_entry(output: Digest, class: ToolClass, ttl_s: Option<u64>) -> CacheEntry {
    CacheEntry {
        output_ref: output,
        usage: None,
        stored_at_ms: 1_700_000_000_000,
        class: Some(class),
        ttl_s,
        snapshot: None,
    }
}

/// A missing key is `None`; a put reads back equal (usage, class and TTL included); a later put
/// of the same key replaces it; a side effect is `Invalid`; an entry naming a blob that is not
/// stored is `NotFound`. Neither refused put changes what is stored.
pub fn cache_get_put_overwrite(make: MakeStore<'_>) {
    let store = make();
    let key = Digest::of(b"model key");
    assert_eq!(store.cache_get(&key).unwrap(), None);
    let first = store.put_blob(b"{\"answer\":1}", BlobHint::Raw).unwrap();
    let second = store.put_blob(b"{\"answer\":2}", BlobHint::Raw).unwrap();
    let entry = model_entry(first, 1_700_000_000_000);
    store.cache_put(&key, &entry).unwrap();
    assert_eq!(store.cache_get(&key).unwrap(), Some(entry.clone()));
    let newer = CacheEntry { usage: None, ..model_entry(second, 1_700_000_000_500) };
    store.cache_put(&key, &newer).unwrap();
    assert_eq!(store.cache_get(&key).unwrap(), Some(newer.clone()), "the latest put wins");
    let classes = [
        (ToolClass::Deterministic, None),
        (ToolClass::TimeBound, Some(60)),
        (ToolClass::TimeBound, Some(u64::from(u32::MAX) * 4)),
    ];
    for (i, (class, ttl_s)) in classes.into_iter().enumerate() {
        let tool_key = Digest::of(format!("tool key {i}").as_bytes());
        let entry = tool_entry(first, class, ttl_s);
        store.cache_put(&tool_key, &entry).unwrap();
        assert_eq!(store.cache_get(&tool_key).unwrap(), Some(entry));
    }
    let side_effect = tool_entry(first, ToolClass::SideEffect, None);
    let refused = store.cache_put(&key, &side_effect).unwrap_err();
    assert_eq!(refused.kind, StoreErrorKind::Invalid);
    assert!(
        refused.message.contains("side effect") && refused.message.contains(&key.to_string()),
        "{refused}"
    );
    let missing = Digest::of(b"never stored");
    let dangling = store.cache_put(&key, &model_entry(missing, 1)).unwrap_err();
    assert_eq!(dangling.kind, StoreErrorKind::NotFound);
    assert!(dangling.message.contains(&missing.to_string()), "{dangling}");
    assert_eq!(store.cache_get(&key).unwrap(), Some(newer), "refused puts change nothing");
    assert_eq!(err_kind(store.cache_put(&Digest::of(b"fresh"), &side_effect)), StoreErrorKind::Invalid);
    assert_eq!(store.cache_get(&Digest::of(b"fresh")).unwrap(), None);
}

/// Entries committed in a batch are visible once it commits, the batch's own blobs serving as
/// their outputs, the last of a key winning. A refused batch (seq conflict, side effect, missing
/// blob) stores none of its entries, events or blobs.
pub fn cache_entries_commit_with_their_batch(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("cached", 1)).unwrap();
    let (a, b) = (raw(b"output a"), raw(b"output b"));
    let stored = store.put_blob(b"stored earlier", BlobHint::Raw).unwrap();
    let (k1, k2, k3) = (Digest::of(b"k1"), Digest::of(b"k2"), Digest::of(b"k3"));
    let cache = vec![
        (k1, model_entry(a.digest, 10)),
        (k2, tool_entry(stored, ToolClass::Deterministic, None)),
        (k1, model_entry(b.digest, 20)),
    ];
    let events = sample_events("cached", 1, 2, None);
    let committed =
        Batch { run_id: "cached".into(), events: events.clone(), blobs: vec![a.clone(), b.clone()], cache };
    store.commit(&committed).unwrap();
    assert_eq!(store.cache_get(&k1).unwrap(), Some(model_entry(b.digest, 20)), "the last of a key wins");
    assert_eq!(store.cache_get(&k2).unwrap(), Some(tool_entry(stored, ToolClass::Deterministic, None)));

    let later = sample_events("cached", 3, 1, Some(events[1].hash));
    let c = raw(b"output c");
    let refusals: [(Vec<Event>, CacheEntry, StoreErrorKind); 3] = [
        (events[..1].to_vec(), model_entry(c.digest, 30), StoreErrorKind::Conflict),
        (later.clone(), tool_entry(c.digest, ToolClass::SideEffect, None), StoreErrorKind::Invalid),
        (later.clone(), model_entry(Digest::of(b"nowhere"), 30), StoreErrorKind::NotFound),
    ];
    for (events, entry, kind) in refusals {
        let refused =
            Batch { run_id: "cached".into(), events, blobs: vec![c.clone()], cache: vec![(k3, entry)] };
        let err = store.commit(&refused).unwrap_err();
        assert_eq!(err.kind, kind, "{err}");
        assert_eq!(store.cache_get(&k3).unwrap(), None, "{err}");
        assert!(!store.has_blob(&c.digest).unwrap(), "{err}");
        assert_eq!(store.last_seq("cached").unwrap(), 2, "{err}");
    }
    let cache = vec![(k3, model_entry(c.digest, 40))];
    let blobs_only =
        Batch { run_id: "no-such-run".into(), blobs: vec![c.clone()], cache, ..batch("", vec![]) };
    store.commit(&blobs_only).unwrap();
    assert_eq!(store.cache_get(&k3).unwrap(), Some(model_entry(c.digest, 40)), "entries need no run");
}

/// `usable_at` at explicit times: model outputs and deterministic tools always; a time-bound
/// tool from its store time to the end of its TTL inclusive (never without a TTL); a side
/// effect never. Entries read back from the store answer the same.
pub fn cache_usable_at_by_class(make: MakeStore<'_>) {
    let store = make();
    let output = store.put_blob(b"out", BlobHint::Raw).unwrap();
    let at = 1_700_000_000_000u64;
    let timed = |ttl_s| CacheEntry { stored_at_ms: at, ..tool_entry(output, ToolClass::TimeBound, ttl_s) };
    let side_effect = CacheEntry { stored_at_ms: at, ..tool_entry(output, ToolClass::SideEffect, None) };
    let cases: Vec<(CacheEntry, Vec<(u64, bool)>)> = vec![
        (model_entry(output, at), vec![(0, true), (at, true), (u64::MAX, true)]),
        (tool_entry(output, ToolClass::Deterministic, None), vec![(0, true), (u64::MAX, true)]),
        (timed(Some(60)), vec![(at - 1, false), (at, true), (at + 60_000, true), (at + 60_001, false)]),
        (timed(Some(0)), vec![(at, true), (at + 1, false)]),
        (timed(None), vec![(at, false), (at + 1, false)]),
        (timed(Some(u64::MAX)), vec![(at, true), (u64::MAX, true)]),
        (side_effect, vec![(at - 1, false), (at, false), (at + 1, false)]),
    ];
    for (i, (entry, times)) in cases.into_iter().enumerate() {
        let read = if entry.class == Some(ToolClass::SideEffect) {
            entry.clone()
        } else {
            let key = Digest::of(format!("usable {i}").as_bytes());
            store.cache_put(&key, &entry).unwrap();
            store.cache_get(&key).unwrap().expect("the entry was stored")
        };
        for (now, usable) in times {
            assert_eq!(entry.usable_at(now), usable, "case {i} {entry:?} at {now}");
            assert_eq!(read.usable_at(now), usable, "case {i} read back, at {now}");
        }
    }
}

/// `append_cached` commits the entry with its event; a side effect's entry or one that names
/// another output than its event's is `Invalid` and takes no seq.
pub fn writer_append_cached(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("writer-cache", 1)).unwrap();
    let writer = RunWriter::open(Arc::clone(&store), "writer-cache", LeaseHolder::current()).unwrap();
    let step = |i: u64, output: Digest| {
        let mut e = Event::new("writer-cache", "planner", EventType::ModelCall);
        e.name = Some("/v1/chat/completions".into());
        e.key = Digest::of(format!("request {i}").as_bytes());
        e.output_ref = Some(output);
        e
    };
    let out = raw(b"{\"choices\":[]}");
    let first = step(1, out.digest);
    let key = first.key;
    let entry = model_entry(out.digest, 5);
    let ticket = writer.append_cached(first, vec![out.clone()], Some((key, entry.clone()))).unwrap();
    let acked = ticket.wait().unwrap();
    assert_eq!(store.cache_get(&key).unwrap(), Some(entry), "visible once acknowledged");
    assert_eq!(store.event("writer-cache", acked.seq).unwrap(), acked);

    let other = raw(b"another output");
    let mismatch =
        writer.append_cached(step(2, out.digest), vec![], Some((key, model_entry(other.digest, 6))));
    let mismatch = mismatch.unwrap_err();
    assert_eq!(mismatch.kind, StoreErrorKind::Invalid);
    assert!(mismatch.message.contains("writer-cache") && mismatch.message.contains("output"), "{mismatch}");
    let side_effect = tool_entry(out.digest, ToolClass::SideEffect, None);
    let refused = writer.append_cached(step(3, out.digest), vec![], Some((Digest::of(b"k"), side_effect)));
    assert_eq!(err_kind(refused), StoreErrorKind::Invalid);
    assert_eq!(writer.head().0, 1, "refused appends take no seq");
    writer.append_sync(step(4, out.digest), vec![]).unwrap();
    writer.close().unwrap();
    assert_eq!(store.last_seq("writer-cache").unwrap(), 2);
    assert_eq!(store.cache_get(&Digest::of(b"k")).unwrap(), None);
}
