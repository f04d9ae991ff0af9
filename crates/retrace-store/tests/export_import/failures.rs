//! Imports that fail part way: a file refused after its blobs began to be stored early, a store
//! that fails while blobs are stored early or while events are stored, and the unfinished
//! import each leaves, which importing the file again completes.
use std::sync::atomic::{AtomicU64, Ordering};

use retrace_core::envelope::EventType;
use retrace_core::run::{RunMode, RunStatus};
use retrace_store::import::{
    import_reader, ImportError, ImportErrorKind, ImportOptions, ImportOutcome, UNFINISHED_LABEL,
};
use retrace_store::intercept::{Intercepted, Interceptor};
use retrace_store::verify::{verify_run, ProblemKind};
use retrace_store::{Batch, BlobAt, BlobHint, BlobPut, Store, StoreError, StoreResult};

use super::trace_fixture::{self, export, import, lines, memory, sqlite, Builder};

/// Tool calls enough for an import to store a chunk of blobs early, while it reads the rest of
/// the file: two blob lines per event, past one early chunk (16,384 blobs).
const EARLY_EVENTS: u64 = 8_400;

/// A run of `n` tool calls whose outputs end with `tail`: two blob lines per event, so from
/// [`EARLY_EVENTS`] on an import stores blobs while it reads the rest of the file.
fn tool_calls(run: &str, n: u64, tail: &str) -> trace_fixture::Fixture {
    let mut b = Builder::new(run);
    for i in 0..n {
        let query = format!(r#"{{"q":{i}}}"#).into_bytes();
        let output = format!("row {i} of a result long enough to be packed with its neighbours {tail}");
        b.push(
            "agent",
            EventType::ToolCall,
            Some("sql.query"),
            Some((query, BlobHint::Raw)),
            Some(output.into_bytes()),
            |_| {},
        );
    }
    b.finish(RunMode::Record)
}

/// A file refused at its last blob line, after the import began storing its blobs, stores no
/// run (the blobs it stored are referenced by nothing); once mended it imports, and its events
/// say where their blobs are, as after recording. A different run under a stored id is refused
/// before any of its blobs is stored.
#[test]
fn a_file_refused_after_blobs_were_stored_leaves_no_run_and_imports_once_mended() {
    let (a, b) = (sqlite(), sqlite());
    let fixture = tool_calls("01early", EARLY_EVENTS, "");
    fixture.commit(&*a.store);
    let good = export(&*a.store, "01early");
    let mut bad = lines(&good);
    let last = bad.len() - 1;
    bad[last] = bad[last].replace("row ", "rew ");
    let err = import(&*b.store, &trace_fixture::join(&bad)).unwrap_err();
    assert_eq!((err.kind(), err.exit_code()), (ImportErrorKind::Verification, 1), "{err}");
    assert!(err.to_string().contains("digest mismatch"), "{err}");
    assert!(b.store.runs().unwrap().is_empty(), "a refused file stored its run");
    let first = fixture.events[0].request_ref.unwrap();
    assert!(b.store.has_blob(&first).unwrap(), "blobs read before the failure were stored early");

    let outcome = import(&*b.store, &good).unwrap();
    let (events, blobs) = (EARLY_EVENTS, 2 * EARLY_EVENTS);
    assert!(
        matches!(outcome, ImportOutcome::Imported { events: e, blobs: b, .. } if (e, b) == (events, blobs)),
        "{outcome:?}"
    );
    assert!(export(&*b.store, "01early") == good, "re-export differs");
    assert_eq!(verify_run(&*b.store, "01early"), vec![]);
    let located = b.store.events_located("01early", 1, usize::MAX).unwrap();
    assert!(
        located.iter().all(|l| l.request_at.is_some() && l.output_at.is_some()),
        "every event has its blobs' places"
    );

    let other = tool_calls("01early", EARLY_EVENTS, "and more");
    let c = sqlite();
    other.commit(&*c.store);
    let err = import(&*b.store, &export(&*c.store, "01early")).unwrap_err();
    assert_eq!(err.kind(), ImportErrorKind::Conflict, "{err}");
    let unseen = other.events[0].output_ref.unwrap();
    assert!(!b.store.has_blob(&unseen).unwrap(), "a refused run's blobs were stored");
}

/// When the store fails while an import stores blobs early, the import reports the store's
/// error, stores no run, and returns (no thread is left waiting).
#[test]
fn a_store_that_fails_while_blobs_are_stored_early_fails_the_import() {
    for make in [memory, sqlite] {
        let a = make();
        let fixture = tool_calls("01flaky", EARLY_EVENTS, "");
        fixture.commit(&*a.store);
        let file = export(&*a.store, "01flaky");
        let b = make();
        let flaky = retrace_store::conformance::Flaky::new(b.store.clone());
        flaky.fail_commits(true);
        let err = import(&flaky, &file).unwrap_err();
        assert_eq!(err.kind(), ImportErrorKind::Store, "{err}");
        let cause = std::error::Error::source(&err).map(|e| e.to_string()).unwrap_or_default();
        assert!(cause.contains("injected failure"), "{err}: {cause}");
        assert!(b.store.runs().unwrap().is_empty());
        flaky.fail_commits(false);
        assert!(matches!(import(&flaky, &file).unwrap(), ImportOutcome::Imported { .. }));
        assert!(export(&*b.store, "01flaky") == file);

        // Failing after a first early transaction, the error says what that one left behind.
        let c = make();
        let failing = Intercepted::wrap(c.store.clone(), FailPutBlobsAfter(AtomicU64::new(1)));
        let err = import(&failing, &file).unwrap_err();
        assert_eq!(err.kind(), ImportErrorKind::Store, "{err}");
        let cause = std::error::Error::source(&err).map(|e| e.to_string()).unwrap_or_default();
        assert!(cause.contains("this import had stored 16384 of the file's blobs"), "{cause}");
        assert!(cause.contains("importing the file again reuses them"), "{cause}");
        assert!(c.store.runs().unwrap().is_empty());
    }
}

/// Fails every `put_blobs` after the first this many.
struct FailPutBlobsAfter(AtomicU64);

impl Interceptor for FailPutBlobsAfter {
    fn put_blobs(&self, inner: &dyn Store, blobs: &[BlobPut]) -> StoreResult<Vec<Option<BlobAt>>> {
        if self.0.fetch_sub(1, Ordering::SeqCst) == 0 {
            self.0.store(0, Ordering::SeqCst);
            return Err(StoreError::full("injected: disk full"));
        }
        inner.put_blobs(blobs)
    }
}

/// When the store fails as the run's events are stored (after its blobs went in early, as when
/// the disk fills up then), the import reports the store's error and the run it leaves says it
/// is an unfinished import: `running`, no head, the [`UNFINISHED_LABEL`] label; it verifies as
/// far as it goes. Importing the same file again stores the rest, and the run is the file's.
#[test]
fn an_import_that_fails_while_events_are_stored_leaves_a_run_marked_unfinished_and_completes() {
    for make in [memory, sqlite] {
        let a = make();
        let fixture = tool_calls("01fails", EARLY_EVENTS, "");
        fixture.commit(&*a.store);
        let file = export(&*a.store, "01fails");
        let b = make();
        let failing = Intercepted::wrap(b.store.clone(), FailEventCommits::default());
        // The first chunk of events goes in, the second fails.
        failing.hooks().0.store(1, Ordering::SeqCst);
        let err = import_chunked(&failing, &file, 100).unwrap_err();
        assert_eq!(err.kind(), ImportErrorKind::Store, "{err}");
        assert!(err.to_string().contains("01fails"), "{err}");
        let left = b.store.run("01fails").unwrap();
        assert_eq!(left.status, RunStatus::Running);
        assert_eq!(left.head, None);
        assert_eq!(left.labels.get(UNFINISHED_LABEL).map(String::as_str), Some("stored in part"));
        assert_eq!(b.store.last_seq("01fails").unwrap(), 100);
        // Still `running`: an import under way, not a problem yet.
        assert!(verify_run(&*b.store, "01fails").is_empty());
        // Once it is known to have stopped, verify says the store lacks the run's end.
        let mut stopped = left.clone();
        stopped.status = RunStatus::Interrupted;
        b.store.update_run(&stopped).unwrap();
        let problems = verify_run(&*b.store, "01fails");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].kind, ProblemKind::Unfinished);
        assert!(problems[0].message.contains("holds the first 100 events"), "{problems:?}");

        failing.hooks().0.store(u64::MAX, Ordering::SeqCst);
        let imported = import_chunked(&failing, &file, 64).unwrap();
        assert!(
            matches!(imported, ImportOutcome::Imported { events, .. } if events == EARLY_EVENTS),
            "{imported:?}"
        );
        let done = b.store.run("01fails").unwrap();
        assert_eq!(done, fixture.meta, "the run is the file's");
        assert!(verify_run(&*b.store, "01fails").is_empty());
        assert!(export(&*b.store, "01fails") == file);
        assert!(matches!(import(&failing, &file).unwrap(), ImportOutcome::AlreadyPresent { .. }));
    }
}

/// A file whose header carries the unfinished-import mark (exported from an unfinished import
/// by a build whose `export` didn't refuse one) imports whole without it: a store that holds
/// every event of the file has nothing left to store, and must not say it has (QA7 D3).
#[test]
fn a_file_marked_as_an_unfinished_import_imports_whole_without_the_mark() {
    for make in [memory, sqlite] {
        let a = make();
        let fixture = tool_calls("01marked", 20, "");
        fixture.commit(&*a.store);
        let mut marked = a.store.run("01marked").unwrap();
        marked.labels.insert(UNFINISHED_LABEL.to_owned(), "stored in part".to_owned());
        a.store.update_run(&marked).unwrap();
        let file = export(&*a.store, "01marked");
        let b = make();
        assert!(matches!(import(&*b.store, &file).unwrap(), ImportOutcome::Imported { .. }));
        assert_eq!(b.store.run("01marked").unwrap(), fixture.meta, "the run is the file's, unmarked");
        let again = import(&*b.store, &file).unwrap();
        assert!(matches!(again, ImportOutcome::AlreadyPresent { .. }), "a no-op the second time: {again:?}");
    }
}

/// Lets this many more event commits through, then fails each one (`StoreErrorKind::Full`).
#[derive(Default)]
struct FailEventCommits(AtomicU64);

impl Interceptor for FailEventCommits {
    fn commit(&self, inner: &dyn Store, batch: &Batch) -> StoreResult<()> {
        let left = self.0.load(Ordering::SeqCst);
        if left == 0 {
            return Err(StoreError::full("injected: disk full"));
        }
        self.0.store(left.saturating_sub(1), Ordering::SeqCst);
        inner.commit(batch)
    }
}

/// Imports `file` into `store` in chunks of `chunk` events.
fn import_chunked(store: &dyn Store, file: &[u8], chunk: usize) -> Result<ImportOutcome, ImportError> {
    let options = ImportOptions { chunk_events: chunk, ..ImportOptions::default() };
    import_reader(store, file, options)
}
