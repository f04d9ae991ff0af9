//! Fuzz target: arbitrary bytes as a trace file, imported into the embedded SQLite store and into
//! the in-memory store. Both backends must agree: the same outcome (or the same kind of error),
//! and for a file they accept, the same content: the memory store keeps blobs flat where SQLite
//! may keep manifests, so SQLite's export is read back into a fresh memory store, whose export
//! must be the memory store's byte for byte. The SQLite export must import again as already
//! present, and into a second SQLite store it must export the same bytes once more.
//! This reaches what the memory-only target can't: packed segments, row-id hints, manifests kept
//! as SQLite rows.
#![no_main]

use libfuzzer_sys::fuzz_target;
use retrace_store::export::export_run;
use retrace_store::import::{import_reader, ImportOptions, ImportOutcome};
use retrace_store::memory::MemoryStore;
use retrace_store::sqlite::SqliteStore;
use retrace_store::Store;

fn export(store: &dyn Store, run_id: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    export_run(store, run_id, &mut bytes, &mut |_| {}).expect("an imported run exports");
    bytes
}

fuzz_target!(|data: &[u8]| {
    let memory = MemoryStore::new();
    let sqlite = SqliteStore::temporary().expect("a temporary SQLite store");
    let in_memory = import_reader(&memory, data, ImportOptions::default());
    let in_sqlite = import_reader(&sqlite, data, ImportOptions::default());
    let outcome = match (in_memory, in_sqlite) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b, "both backends import the same run");
            a
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.kind(), b.kind(), "both backends refuse alike: {a} / {b}");
            return;
        }
        (a, b) => panic!("the backends disagree: memory {a:?}, sqlite {b:?}"),
    };
    let run_id = outcome.run_id().to_owned();
    let exported = export(&sqlite, &run_id);
    let flat = MemoryStore::new();
    import_reader(&flat, &exported[..], ImportOptions::default()).expect("an export imports");
    assert_eq!(export(&flat, &run_id), export(&memory, &run_id), "both backends hold the same run");
    let again = import_reader(&sqlite, &exported[..], ImportOptions::default()).expect("an export imports");
    assert_eq!(again, ImportOutcome::AlreadyPresent { run_id: run_id.clone() });
    let second = SqliteStore::temporary().expect("a temporary SQLite store");
    import_reader(&second, &exported[..], ImportOptions::default()).expect("an export imports");
    assert_eq!(export(&second, &run_id), exported, "export -> import -> export gives the same bytes");
});
