//! Packed blobs on [`SqliteStore`]: segments filled across batches, each blob stored once,
//! rows that name their place before the bytes are packed, and manifests met by plain bytes.
use retrace_core::Digest;
use retrace_store::conformance::sample_run;
use retrace_store::sqlite::schema::{KIND_MANIFEST, KIND_PACKED};
use retrace_store::{Batch, BlobHint, BlobPut, BlobStore, Durability, EventStore, INLINE_BLOB_MAX};
use rusqlite::Connection;

use crate::sqlite::{blob_rows, open, put_in_run, store_with_run};

/// Packed blobs put several to a batch (each segment written once per transaction) read back
/// byte for byte after reopening, singly and together, and leave every segment but the last
/// full, with ids one after another.
#[test]
fn packed_blobs_fill_segments_across_batches() {
    let (dir, store, run) = store_with_run("packed");
    let mut blobs = Vec::new();
    // Sizes around and across the 4,048-byte segments, up to just under the file threshold.
    let sizes = [65usize, 4048, 100, 3948, 4049, 9000, 1, 500, INLINE_BLOB_MAX, 777, 12_345];
    for (batch, chunk) in sizes.chunks(3).enumerate() {
        let puts: Vec<BlobPut> = chunk
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let bytes: Vec<u8> = (0..*n).map(|k| (k * 7 + i * 13 + batch) as u8).collect();
                BlobPut::new(bytes, BlobHint::Raw)
            })
            .collect();
        store
            .commit(&Batch {
                run_id: run.id.clone(),
                events: Vec::new(),
                blobs: puts.clone(),
                cache: Vec::new(),
            })
            .unwrap();
        blobs.extend(puts);
    }
    drop(store);
    let store = open(dir.path(), Durability::Os, 5_000);
    for blob in &blobs {
        assert_eq!(
            store.get_blob(&blob.digest()).unwrap(),
            &blob.bytes()[..],
            "blob of {} bytes",
            blob.bytes().len()
        );
    }
    let digests: Vec<Digest> = blobs.iter().map(|b| b.digest()).collect();
    let together = store.get_blobs(&digests).unwrap();
    assert!(together.iter().zip(&blobs).all(|(got, blob)| got[..] == blob.bytes()[..]));
    let conn = Connection::open(dir.path().join("retrace.db")).unwrap();
    let segments: Vec<(i64, i64)> = conn
        .prepare("SELECT id, length(data) FROM segments ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let full = segments.iter().map(|(_, len)| *len).max().unwrap();
    assert!(segments.iter().enumerate().all(|(i, (id, _))| *id == segments[0].0 + i as i64));
    assert!(segments[..segments.len() - 1].iter().all(|(_, len)| *len == full));
    let packed: i64 =
        conn.query_row("SELECT sum(size) FROM blobs WHERE kind = ?1", [KIND_PACKED], |r| r.get(0)).unwrap();
    assert_eq!(segments.iter().map(|(_, len)| len).sum::<i64>(), packed);
}

/// A batch may repeat a blob and carry blobs already stored: what the transaction knows of
/// stored blobs (looked up, or found by an insert that met the digest's row) is kept up to date
/// as it inserts, so each is stored once.
#[test]
fn a_batch_repeating_blobs_and_carrying_stored_ones_stores_each_once() {
    let (dir, store, run) = store_with_run("repeats");
    let old = BlobPut::new(b"stored before the batch, long enough to be packed ".repeat(3), BlobHint::Raw);
    put_in_run(&store, &run.id, &old);
    let new = BlobPut::new(b"new in the batch, long enough to be packed as well ".repeat(3), BlobHint::Raw);
    let tiny = BlobPut::new(&b"tiny"[..], BlobHint::Raw);
    let blobs = vec![new.clone(), old.clone(), tiny.clone(), new.clone(), tiny.clone(), old.clone()];
    store.commit(&Batch { run_id: run.id.clone(), events: Vec::new(), blobs, cache: Vec::new() }).unwrap();
    for blob in [&old, &new, &tiny] {
        assert_eq!(store.get_blob(&blob.digest()).unwrap(), &blob.bytes()[..]);
    }
    let conn = Connection::open(dir.path().join("retrace.db")).unwrap();
    assert_eq!(blob_rows(&conn), 3);
    assert_no_packed_bytes_wasted(&conn);

    // Plain blobs go in row first, the digest's index as the look-up: one already stored
    // (through `put_blobs` too) packs nothing, and the new ones after it pack where their rows say.
    let fresh: Vec<BlobPut> =
        (0..4u8).map(|i| BlobPut::new(vec![b'a' + i; 300 + 1000 * usize::from(i)], BlobHint::Raw)).collect();
    store.put_blobs(&fresh[..1]).unwrap();
    let blobs = vec![fresh[0].clone(), fresh[1].clone(), old.clone(), fresh[2].clone(), fresh[0].clone()];
    store.put_blobs(&blobs).unwrap();
    let batch = vec![new.clone(), fresh[3].clone(), fresh[1].clone(), tiny.clone()];
    store
        .commit(&Batch { run_id: run.id.clone(), events: Vec::new(), blobs: batch, cache: Vec::new() })
        .unwrap();
    for blob in fresh.iter().chain([&old, &new, &tiny]) {
        assert_eq!(store.get_blob(&blob.digest()).unwrap(), &blob.bytes()[..]);
    }
    assert_eq!(blob_rows(&conn), 7);
    assert_no_packed_bytes_wasted(&conn);
}

/// Every byte in `segments` belongs to a packed blob: nothing was packed for a blob whose row
/// was already there.
fn assert_no_packed_bytes_wasted(conn: &Connection) {
    let segments: i64 =
        conn.query_row("SELECT coalesce(sum(length(data)), 0) FROM segments", [], |r| r.get(0)).unwrap();
    let packed: i64 = conn
        .query_row("SELECT coalesce(sum(size), 0) FROM blobs WHERE kind = ?1", [KIND_PACKED], |r| r.get(0))
        .unwrap();
    assert_eq!(segments, packed, "bytes in segments vs bytes of packed blobs");
}

/// A plain blob's row names where its bytes will be packed before they are: right when the last
/// segment is exactly full (the next blob starts the next segment), when a blob already stored
/// comes first in the transaction (it packs nothing and moves nothing), and when it comes alone.
#[test]
fn packed_rows_name_their_place_at_a_full_segment_and_after_a_stored_blob() {
    // The segment size, from a probe store of the same kind.
    let probe_dir = tempfile::tempdir().unwrap();
    let probe = open(probe_dir.path(), Durability::Os, 5_000);
    probe.put_blobs(&[BlobPut::new(vec![7u8; 3 * 4096], BlobHint::Raw)]).unwrap();
    let segment: usize = Connection::open(probe_dir.path().join("retrace.db"))
        .unwrap()
        .query_row("SELECT max(length(data)) FROM segments", [], |r| r.get::<_, i64>(0))
        .unwrap()
        .try_into()
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Durability::Os, 5_000);
    let conn = Connection::open(dir.path().join("retrace.db")).unwrap();
    let place = |blob: &BlobPut| -> (i64, i64) {
        conn.query_row("SELECT id, data FROM blobs WHERE digest = ?1", [blob.digest().as_bytes()], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap()
    };
    let half = segment / 2;
    let x = BlobPut::new(vec![b'x'; half], BlobHint::Raw);
    let y = BlobPut::new(vec![b'y'; segment - half], BlobHint::Raw);
    store.put_blobs(&[x.clone(), y.clone()]).unwrap();
    let tail: i64 =
        conn.query_row("SELECT length(data) FROM segments WHERE id = 1", [], |r| r.get(0)).unwrap();
    assert_eq!(tail as usize, segment, "the first segment is exactly full");

    // A stored blob first, then new ones: the first new one starts segment 2.
    // (300 bytes: packed, being over what stays in its row.)
    let z = BlobPut::new(vec![b'z'; 300], BlobHint::Raw);
    let w = BlobPut::new(vec![b'w'; segment], BlobHint::Raw);
    let at = store.put_blobs(&[x.clone(), z.clone(), y.clone(), w.clone()]).unwrap();
    assert_eq!(place(&z).1, 2 << 16, "z starts the second segment");
    assert_eq!(place(&w).1, 2 << 16 | 300, "w follows z and runs into the third segment");
    let ids: Vec<Option<i64>> = [&x, &z, &y, &w].iter().map(|b| Some(place(b).0)).collect();
    assert_eq!(at.iter().map(|a| a.map(|a| a.get())).collect::<Vec<_>>(), ids);

    // Alone (a batch of one is never looked up first): the stored row, nothing packed.
    let at = store.put_blobs(std::slice::from_ref(&y)).unwrap();
    assert_eq!(at[0].map(|a| a.get()), Some(place(&y).0));
    let run = sample_run("alone", 1);
    store.create_run(&run).unwrap();
    put_in_run(&store, &run.id, &w);
    for blob in [&x, &y, &z, &w] {
        assert_eq!(store.get_blob(&blob.digest()).unwrap(), &blob.bytes()[..]);
    }
    assert_eq!(blob_rows(&conn), 4);
    assert_no_packed_bytes_wasted(&conn);
}

/// Plain bytes whose digest is stored as a manifest (a model response kept as its skeleton and
/// message) get the manifest's row: nothing is packed for them, and they read back whole.
#[test]
fn plain_bytes_already_stored_as_a_manifest_get_its_row() {
    let (dir, store, run) = store_with_run("manifest");
    let response = br#"{"id":"chatcmpl-1","object":"chat.completion","model":"sim","choices":[{"index":0,"message":{"role":"assistant","content":"The backfill is safe once the default is in place; ship it after the column lands."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":18}}"#;
    put_in_run(&store, &run.id, &BlobPut::new(&response[..], BlobHint::ModelResponse));
    let conn = Connection::open(dir.path().join("retrace.db")).unwrap();
    let digest = Digest::of(response);
    let (id, kind): (i64, i64) = conn
        .query_row("SELECT id, kind FROM blobs WHERE digest = ?1", [digest.as_bytes()], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(kind, KIND_MANIFEST, "the response is kept as a manifest");
    let rows = blob_rows(&conn);

    let plain = BlobPut::new(&response[..], BlobHint::Raw);
    let at = store.put_blobs(&[plain.clone(), BlobPut::new(vec![b'n'; 300], BlobHint::Raw)]).unwrap();
    assert_eq!(at[0].map(|a| a.get()), Some(id));
    put_in_run(&store, &run.id, &plain);
    assert_eq!(store.get_blob(&digest).unwrap(), &response[..]);
    let after = blob_rows(&conn);
    assert_eq!(after, rows + 1, "only the new plain blob added a row");
    assert_no_packed_bytes_wasted(&conn);
}
