//! What a collection deletes is gone from the database file, not only from its tables (QA14
//! D3): a deleted run's output packed into a segment beside a kept run's is zeroed there, the
//! deleted rows are zeroed in their pages, and the WAL no longer holds the old pages; every kept
//! blob still reads back whole.
use std::path::Path;

use retrace_core::run::{RunMeta, RunStatus};
use retrace_core::{Digest, Event, EventType};
use retrace_store::conformance::sample_run;
use retrace_store::gc::{GcRequest, GcStore};
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Batch, BlobHint, BlobPut, BlobStore, Durability, EventStore};

/// A finished run `id` of one event whose output is `output` (packed: over a row's 256 bytes).
fn record(store: &SqliteStore, id: &str, output: &[u8]) -> Digest {
    let mut run: RunMeta = sample_run(id, 1);
    store.create_run(&run).unwrap();
    let blob = BlobPut::new(output.to_vec(), BlobHint::Raw);
    let digest = Digest::of(output);
    let mut e = Event::new(id, "agent", EventType::ToolCall);
    (e.seq, e.lamport, e.name, e.key) = (1, 1, Some("search".into()), Digest::of(id.as_bytes()));
    (e.output_ref, e.output_hash) = (Some(digest), Some(digest));
    e.seal(None).unwrap();
    store.commit(&Batch { run_id: id.into(), events: vec![e], blobs: vec![blob], cache: vec![] }).unwrap();
    run.status = RunStatus::Ok;
    store.update_run(&run).unwrap();
    digest
}

/// Whether `needle` is anywhere in the database file or its WAL.
fn on_disk(dir: &Path, needle: &[u8]) -> bool {
    ["retrace.db", "retrace.db-wal"].iter().any(|name| {
        std::fs::read(dir.join(name))
            .map(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
            .unwrap_or(false)
    })
}

#[test]
fn a_deleted_runs_output_is_gone_from_the_file_while_the_kept_one_beside_it_reads_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        SqliteStore::open(&dir.path().join("retrace.db"), &dir.path().join("blobs"), Durability::Os, 5_000)
            .unwrap();
    let secret = format!("{{\"plan\": \"DELETED-RUN-SECRET\", \"pad\": \"{}\"}}", "x".repeat(600));
    let kept = format!("{{\"plan\": \"KEPT-RUN-ANSWER\", \"pad\": \"{}\"}}", "y".repeat(600));
    record(&store, "gone", secret.as_bytes());
    // Small enough to stay in its row: deleted rows are zeroed in their pages.
    record(&store, "gone-small", b"{\"plan\": \"DELETED-ROW-SECRET\"}");
    let kept_digest = record(&store, "kept", kept.as_bytes());
    store.checkpoint().unwrap();
    for secret in [&b"DELETED-RUN-SECRET"[..], b"DELETED-ROW-SECRET"] {
        assert!(on_disk(dir.path(), secret), "the output is stored before");
    }

    let gone = vec!["gone".to_owned(), "gone-small".to_owned()];
    let request =
        GcRequest { runs: gone.clone(), named: gone.clone(), blob_cutoff_ms: u64::MAX, dry_run: false };
    let report = store.collect_garbage(&request).unwrap();
    assert_eq!((report.runs_deleted, report.blobs_deleted), (gone, 2));
    for secret in [&b"DELETED-RUN-SECRET"[..], b"DELETED-ROW-SECRET"] {
        assert!(!on_disk(dir.path(), secret), "a deleted run's output stays in the file");
    }
    assert_eq!(store.get_blob(&kept_digest).unwrap(), kept.as_bytes(), "the kept output reads whole");
    assert!(on_disk(dir.path(), b"KEPT-RUN-ANSWER"));

    // A second collection finds nothing more to scrub and keeps the kept blob whole too.
    store.collect_garbage(&GcRequest { runs: vec![], ..request }).unwrap();
    assert_eq!(store.get_blob(&kept_digest).unwrap(), kept.as_bytes());
    drop(store);
    let reopened =
        SqliteStore::open(&dir.path().join("retrace.db"), &dir.path().join("blobs"), Durability::Os, 5_000)
            .unwrap();
    assert_eq!(reopened.get_blob(&kept_digest).unwrap(), kept.as_bytes());
    assert!(reopened.run("gone").is_err());
}
