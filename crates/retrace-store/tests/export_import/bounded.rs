//! An import holds its blob lines' bytes in memory bounded by `ImportOptions::chunk_bytes`, not
//! by the file: what it stored early is dropped once stored (and read back, verified, when a
//! manifest names it); what waits for the run is spilled to a temporary file past an allowance.
//! Checked through `ImportStats`, which counts the bytes held, not the resident set.
use retrace_core::envelope::{EventType, ModelRef};
use retrace_core::run::RunMode;
use retrace_store::import::{import_reader, ImportOptions, ImportOutcome, ImportStats};
use retrace_store::verify::verify_run;
use retrace_store::{BlobHint, Store};

use super::trace_fixture::{conversation, export, memory, sqlite, Backend, Builder, Fixture};

/// The budget the imports here get: a small file's worth, so that its blobs exceed it tenfold.
const CHUNK: u64 = 256 << 10;

/// Imports `file` with `chunk_bytes`, and what the import held.
fn import_counted(store: &dyn Store, file: &[u8], chunk_bytes: u64) -> (ImportOutcome, ImportStats) {
    let mut stats = ImportStats::default();
    let options = ImportOptions { chunk_bytes, stats: Some(&mut stats), ..ImportOptions::default() };
    let outcome = import_reader(store, file, options).unwrap();
    (outcome, stats)
}

/// `n` events of `kind`, each with its own request and output of about `size` bytes: a model
/// call's request is JSON with no message list, so every store keeps it flat.
fn heavy(run: &str, n: usize, size: usize, kind: EventType) -> Fixture {
    let mut b = Builder::new(run);
    for i in 0..n {
        let pad = |what: &str| format!("{what} {i} {}", "abcdefgh".repeat(size / 8));
        let request = format!(r#"{{"model":"m","prompt":"{}"}}"#, pad("ask")).into_bytes();
        let hint = if kind == EventType::ModelCall { BlobHint::ModelRequest } else { BlobHint::Raw };
        let output = pad("answer").into_bytes();
        b.push("agent", kind, Some("step"), Some((request, hint)), Some(output), |e| {
            if kind == EventType::ModelCall {
                e.model = Some(ModelRef { provider: "openai".into(), name: "m".into(), snapshot: None });
            }
        });
    }
    b.finish(RunMode::Record)
}

/// Bytes of the blob lines of `fixture`.
fn blob_bytes(fixture: &Fixture) -> u64 {
    fixture.blobs.iter().map(|b| b.bytes().len() as u64).sum()
}

/// Exports `fixture` committed to a fresh store of `make`, imports it into another with
/// [`CHUNK`]: the run comes back byte for byte, and what the import held.
fn round_trip(make: fn() -> Backend, fixture: &Fixture, chunk_bytes: u64) -> (Backend, Vec<u8>, ImportStats) {
    let (a, b) = (make(), make());
    fixture.commit(&*a.store);
    let file = export(&*a.store, &fixture.meta.id);
    let (outcome, stats) = import_counted(&*b.store, &file, chunk_bytes);
    assert!(matches!(outcome, ImportOutcome::Imported { .. }), "{outcome:?}");
    assert!(export(&*b.store, &fixture.meta.id) == file, "re-export differs");
    assert_eq!(verify_run(&*b.store, &fixture.meta.id), vec![]);
    (b, file, stats)
}

/// Tool calls' blobs are all stored while the file is read: the import holds the few
/// transactions in flight, never the file, and its commits carry none of their bytes.
#[test]
fn blobs_stored_early_are_dropped_so_an_import_holds_its_chunk_not_its_file() {
    for make in [memory, sqlite] {
        let fixture = heavy("01bounded", 400, 8 << 10, EventType::ToolCall);
        assert!(blob_bytes(&fixture) > 20 * CHUNK);
        let (_, _, stats) = round_trip(make, &fixture, CHUNK);
        // In flight: the transaction being filled, the one handed over, the one being stored
        // (a quarter chunk each), and up to one blob over each.
        assert!(stats.peak_held_bytes <= CHUNK, "{stats:?}");
        assert_eq!((stats.spilled_bytes, stats.peak_batch_bytes), (0, 0), "{stats:?}");
    }
}

/// Model requests wait for the run (they may chain onto its earlier requests): past half a
/// chunk they are spilled, read back verified as their transaction is stored, and the run is
/// the same.
#[test]
fn model_requests_past_their_allowance_are_spilled_and_read_back() {
    for make in [memory, sqlite] {
        let fixture = heavy("01spilled", 200, 8 << 10, EventType::ModelCall);
        let requests = blob_bytes(&fixture) / 2;
        assert!(requests > 5 * CHUNK);
        let (_, _, stats) = round_trip(make, &fixture, CHUNK);
        assert!(stats.spilled_bytes >= requests - CHUNK / 2 - (9 << 10), "{stats:?}");
        assert!(stats.read_back_bytes >= stats.spilled_bytes, "{stats:?}");
        // Also the requests kept (half a chunk) and none cached (a quarter).
        assert!(stats.peak_held_bytes <= 3 * CHUNK / 2, "{stats:?}");
        // A transaction ends after the event that takes it past the budget.
        assert!(stats.peak_batch_bytes <= CHUNK + (9 << 10), "{stats:?}");
    }
}

/// Importing a run the store holds stores nothing early, so its lines are kept for the
/// comparison and spilled past their allowance: still a no-op, in bounded memory.
#[test]
fn re_importing_a_stored_run_holds_bounded_memory() {
    let fixture = heavy("01again", 400, 8 << 10, EventType::ToolCall);
    let (b, file, _) = round_trip(sqlite, &fixture, CHUNK);
    let (outcome, stats) = import_counted(&*b.store, &file, CHUNK);
    assert_eq!(outcome, ImportOutcome::AlreadyPresent { run_id: "01again".into(), raised: None });
    assert!(stats.spilled_bytes > blob_bytes(&fixture) - CHUNK, "{stats:?}");
    assert!(stats.peak_held_bytes <= CHUNK / 2, "{stats:?}");
}

/// A conversation's manifests name messages stored early: with a tiny budget they are read
/// back from the store (verified) to check each manifest and rebuild each request, and the
/// run is the same, on every budget.
#[test]
fn manifests_rebuild_from_blobs_read_back_from_the_store() {
    let fixture = conversation("01chatback", 30);
    for chunk_bytes in [2 << 10, 16 << 10, 32 << 20] {
        let (_, _, stats) = round_trip(sqlite, &fixture, chunk_bytes);
        // Its 100 KB blob goes over any small chunk.
        assert!(stats.peak_held_bytes <= 2 * chunk_bytes + (100 << 10), "{chunk_bytes}: {stats:?}");
    }
}
