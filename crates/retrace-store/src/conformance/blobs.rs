//! Blobs: small and large, verified reads, and model requests stored as chained manifests.
use std::collections::HashMap;

use retrace_core::{Digest, Event, EventType};

use super::{err_kind, raw, sample_run, text, MakeStore};
use crate::{manifest, Batch, BlobHint, BlobPut, Store, StoreErrorKind, INLINE_BLOB_MAX};

/// Blobs of every size come back byte for byte, alone or in a batch; missing ones are `NotFound`.
pub fn blobs_small_and_large(make: MakeStore<'_>) {
    let store = make();
    let mut seed = 7;
    let sizes = [0, 1, 100, INLINE_BLOB_MAX, INLINE_BLOB_MAX + 1, 300 * 1024];
    for size in sizes {
        let bytes = text(&mut seed, size).into_bytes();
        let digest = store.put_blob(&bytes, BlobHint::Raw).unwrap();
        assert_eq!(digest, Digest::of(&bytes));
        assert!(store.has_blob(&digest).unwrap());
        assert_eq!(store.get_blob(&digest).unwrap(), bytes, "{size} bytes");
        assert_eq!(store.put_blob(&bytes, BlobHint::Raw).unwrap(), digest, "idempotent");
        assert_eq!(store.manifest_of(&digest).unwrap(), None);
    }
    store.create_run(&sample_run("blobs", 1)).unwrap();
    let binary: Vec<u8> = (0..=255u8).cycle().take(INLINE_BLOB_MAX * 2).collect();
    let puts = vec![
        raw(b"in a batch"),
        raw(&binary),
        raw(&binary[..5000]),
        raw(&binary[1..100]),
        raw(b"in a batch"),
    ];
    store
        .commit(&Batch { run_id: "blobs".into(), events: Vec::new(), blobs: puts.clone(), cache: Vec::new() })
        .unwrap();
    for put in &puts {
        assert_eq!(store.get_blob(&put.digest).unwrap(), put.bytes.to_vec());
    }
    let missing = Digest::of(b"never stored");
    let err = store.get_blob(&missing).unwrap_err();
    assert_eq!(err.kind, StoreErrorKind::NotFound);
    assert!(err.message.contains(&missing.to_string()), "{err}");
    assert!(!store.has_blob(&missing).unwrap());
}

/// A 200-turn conversation whose requests carry the whole history: every request rebuilds
/// byte for byte, and any manifest the store hands out rebuilds through [`manifest::rebuild`].
pub fn model_request_manifests(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("chat", 1)).unwrap();
    let mut seed = 42;
    let mut history: Vec<String> = Vec::new();
    let mut requests = Vec::new();
    for turn in 1..=200u64 {
        let user = message(&mut seed, "user", 10 + (turn as usize * 7) % 120);
        history.push(user);
        let request = format!("{{\"model\":\"m\",\"messages\":[{}],\"stream\":false}}", history.join(","));
        let output = message(&mut seed, "assistant", 10 + (turn as usize * 13) % 80);
        let (request, output) =
            (BlobPut::new(request.into_bytes(), BlobHint::ModelRequest), raw(output.as_bytes()));
        let mut e = Event::new("chat", "agent", EventType::ModelCall);
        e.seq = turn;
        (e.request_ref, e.output_ref) = (Some(request.digest), Some(output.digest));
        e.seal(None).unwrap();
        let blobs = vec![request.clone(), output.clone(), request.clone()];
        store.commit(&Batch { run_id: "chat".into(), events: vec![e], blobs, cache: Vec::new() }).unwrap();
        history.push(String::from_utf8(output.bytes.to_vec()).unwrap());
        requests.push(request);
    }
    for (i, request) in requests.iter().enumerate() {
        assert_eq!(store.get_blob(&request.digest).unwrap(), request.bytes.to_vec(), "turn {}", i + 1);
    }
    for request in [&requests[0], &requests[1], &requests[199]] {
        check_portable_manifest(store.as_ref(), &request.digest, &request.bytes);
    }
}

/// Requests of every shape (pretty-printed, `input`, flat, empty, not JSON, huge elements)
/// come back byte for byte, in batches and through `put_blob`.
pub fn request_shapes_round_trip(make: MakeStore<'_>) {
    let store = make();
    store.create_run(&sample_run("shapes", 1)).unwrap();
    let mut seed = 9;
    let huge = message(&mut seed, "user", INLINE_BLOB_MAX + 100);
    let shapes: Vec<String> = vec![
        "{\n  \"model\": \"m\",\n  \"messages\": [\n    {\"role\": \"user\"}\n  ]\n}".into(),
        "{\n  \"model\": \"m\",\n  \"messages\": [\n    {\"role\": \"user\"},\n    {\"role\": \"assistant\"}\n  ]\n}".into(),
        r#"{"model":"m","input":[{"type":"message","content":"a"}],"tools":[]}"#.into(),
        r#"{"model":"m","input":[{"type":"message","content":"a"}, "b"],"tools":[]}"#.into(),
        r#"{"model":"m","input":"just text"}"#.into(),
        r#"{"model":"m","messages":[]}"#.into(),
        r#"{"model":"m","messages":[ ]}"#.into(),
        "not json at all, [1,2]".into(),
        r#"{"messages":[{"a":"\"],["}],"x":{"messages":[1]}}"#.into(),
        format!("{{\"messages\":[{huge}]}}"),
        format!("{{\"messages\":[{huge},{{\"role\":\"user\"}}]}}"),
        format!("{{\"system\":\"{}\",\"messages\":[1,2]}}", "s".repeat(INLINE_BLOB_MAX + 5)),
        String::new(),
    ];
    for (i, shape) in shapes.iter().enumerate() {
        let put = BlobPut::new(shape.clone().into_bytes(), BlobHint::ModelRequest);
        store
            .commit(&Batch {
                run_id: "shapes".into(),
                events: Vec::new(),
                blobs: vec![put.clone()],
                cache: Vec::new(),
            })
            .unwrap();
        assert_eq!(store.get_blob(&put.digest).unwrap(), shape.as_bytes(), "shape {i}");
        check_portable_manifest(store.as_ref(), &put.digest, shape.as_bytes());
        let alone = format!("{shape} ");
        let digest = store.put_blob(alone.as_bytes(), BlobHint::ModelRequest).unwrap();
        assert_eq!(store.get_blob(&digest).unwrap(), alone.as_bytes(), "shape {i} put alone");
    }
}

/// A chat message as JSON.
fn message(seed: &mut u64, role: &str, len: usize) -> String {
    serde_json::json!({"role": role, "content": text(seed, len)}).to_string()
}

/// If the store hands out a manifest for `digest`, it names stored blobs and rebuilds `bytes`.
fn check_portable_manifest(store: &dyn Store, digest: &Digest, bytes: &[u8]) {
    let Some(top) = store.manifest_of(digest).unwrap() else {
        return;
    };
    let mut fetched: HashMap<Digest, Vec<u8>> = HashMap::new();
    for name in manifest::references(&top).unwrap() {
        assert!(store.has_blob(&name).unwrap(), "{digest} names {name}");
        fetched.insert(name, store.get_blob(&name).unwrap());
    }
    let rebuilt = manifest::rebuild(&top, &|d: &Digest| fetched.get(d).map(Vec::as_slice)).unwrap();
    assert_eq!(rebuilt, bytes, "manifest of {digest} rebuilds");
    assert_eq!(err_kind(manifest::rebuild(&top, &|_: &Digest| None)), StoreErrorKind::NotFound);
}
