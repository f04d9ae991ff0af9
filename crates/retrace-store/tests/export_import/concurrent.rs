//! Imports racing each other: several stores opened on one SQLite file (as processes would be,
//! each with its own write connection) import at once, released together by a barrier.
use std::path::Path;
use std::sync::Barrier;

use retrace_store::import::{import_reader, ImportError, ImportOptions, ImportOutcome, UNFINISHED_LABEL};
use retrace_store::verify::verify_run;
use retrace_store::{open_store, StoreConfig};

use super::trace_fixture::{conversation, export, sqlite};

/// Rounds of each race: without the recheck, most rounds of the same file failed.
const ROUNDS: usize = 12;

/// Imports each of `files` into the store at `home` at once, each on a thread with a store of
/// its own, committing `chunk_events` events a transaction (small, so the imports interleave).
fn import_at_once(
    home: &Path,
    files: &[&[u8]],
    chunk_events: usize,
) -> Vec<Result<ImportOutcome, ImportError>> {
    let stores: Vec<_> = files.iter().map(|_| open_store(&StoreConfig::in_home(home)).unwrap()).collect();
    let start = Barrier::new(files.len());
    std::thread::scope(|scope| {
        let threads: Vec<_> = stores
            .iter()
            .zip(files)
            .map(|(store, file)| {
                let start = &start;
                scope.spawn(move || {
                    start.wait();
                    let options = ImportOptions { chunk_events, ..ImportOptions::default() };
                    import_reader(&**store, *file, options)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

#[test]
fn the_same_file_imported_at_once_is_stored_once_and_no_import_fails() {
    let fixture = conversation("01race00000000000000000000", 4);
    let source = sqlite();
    fixture.commit(&*source.store);
    let file = export(&*source.store, &fixture.meta.id);
    for chunk_events in [1, 3, 4096] {
        for round in 0..ROUNDS {
            let home = tempfile::tempdir().unwrap();
            let outcomes = import_at_once(home.path(), &[&file, &file, &file], chunk_events);
            let context = format!("chunks of {chunk_events}, round {round}: {outcomes:?}");
            // Every import succeeds; at least one stored events, and the rest say what they did.
            assert!(outcomes.iter().all(Result::is_ok), "{context}");
            assert!(outcomes.iter().any(|o| matches!(o, Ok(ImportOutcome::Imported { .. }))), "{context}");
            let store = open_store(&StoreConfig::in_home(home.path())).unwrap();
            assert_eq!(export(&*store, &fixture.meta.id), file, "{context}");
            assert_eq!(verify_run(&*store, &fixture.meta.id), vec![], "{context}");
            let meta = store.run(&fixture.meta.id).unwrap();
            assert!(!meta.labels.contains_key(UNFINISHED_LABEL), "{context}");
        }
    }
}

#[test]
fn a_different_run_imported_at_the_same_time_is_still_a_conflict() {
    let fixture = conversation("01race00000000000000000001", 4);
    let mut changed = conversation(&fixture.meta.id, 4);
    changed.events[4].latency_ms = Some(5);
    changed.reseal_from(4);
    let (a, b) = (sqlite(), sqlite());
    fixture.commit(&*a.store);
    changed.commit(&*b.store);
    let (first, second) = (export(&*a.store, &fixture.meta.id), export(&*b.store, &fixture.meta.id));
    for round in 0..ROUNDS {
        let home = tempfile::tempdir().unwrap();
        let outcomes = import_at_once(home.path(), &[&first, &second], 1);
        let context = format!("round {round}: {outcomes:?}");
        // One file wins; the other conflicts at seq 5, where they part, whoever got there first.
        let won: Vec<_> = outcomes.iter().filter(|o| o.is_ok()).collect();
        assert_eq!(won.len(), 1, "{context}");
        let lost = outcomes.iter().find_map(|o| o.as_ref().err()).unwrap();
        assert!(matches!(lost, ImportError::Conflict { seq: 5, .. }), "{context}");
        assert_eq!(lost.exit_code(), 1, "{context}");
        let winner = if outcomes[0].is_ok() { &first } else { &second };
        let store = open_store(&StoreConfig::in_home(home.path())).unwrap();
        assert_eq!(&export(&*store, &fixture.meta.id), winner, "{context}");
    }
}
