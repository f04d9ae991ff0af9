//! Fuzz target: arbitrary bytes as a trace file. Import must return an error or succeed, never
//! panic; a file it accepts must export back to bytes that import again as already present.
#![no_main]

use libfuzzer_sys::fuzz_target;
use retrace_store::export::export_run;
use retrace_store::import::{import_reader, ImportOptions, ImportOutcome};
use retrace_store::memory::MemoryStore;

fuzz_target!(|data: &[u8]| {
    let store = MemoryStore::new();
    let Ok(outcome) = import_reader(&store, data, ImportOptions::default()) else { return };
    let run_id = outcome.run_id().to_owned();
    let mut exported = Vec::new();
    export_run(&store, &run_id, &mut exported, &mut |_| {}).expect("an imported run exports");
    let again = import_reader(&store, &exported[..], ImportOptions::default()).expect("an export imports");
    assert_eq!(again, ImportOutcome::AlreadyPresent { run_id });
});
