//! Export, import and verify: round trips on every backend, conflicts, forks, corrupted files.
#[path = "export_import/bounded.rs"]
mod bounded;
#[path = "export_import/concurrent.rs"]
mod concurrent;
#[path = "export_import/corrupt.rs"]
mod corrupt;
mod trace_fixture;
#[path = "export_import/verify.rs"]
mod verify;

use retrace_core::canonical::canonicalize;
use retrace_core::envelope::EventType;
use retrace_core::run::{Retention, RunMode};
use retrace_core::Event;
use std::sync::atomic::{AtomicU64, Ordering};

use retrace_core::run::RunStatus;
use retrace_store::import::{
    import_reader, ImportError, ImportErrorKind, ImportOptions, ImportOutcome, UNFINISHED_LABEL,
};
use retrace_store::intercept::{Intercepted, Interceptor};
use retrace_store::verify::{verify_run, ProblemKind};
use retrace_store::{Batch, BlobAt, BlobHint, BlobPut, Store, StoreError, StoreResult};
use trace_fixture::{conversation, export, import, lines, memory, sqlite, Backend, Builder};

fn round_trip(make: fn() -> Backend) {
    let (a, b) = (make(), make());
    let fixture = conversation("01run0000000000000000000000", 4);
    fixture.commit(&*a.store);
    let first = export(&*a.store, &fixture.meta.id);
    let outcome = import(&*b.store, &first).unwrap();
    let blobs = lines(&first).len() as u64 - 1 - fixture.events.len() as u64;
    let imported = ImportOutcome::Imported {
        run_id: fixture.meta.id.clone(),
        events: fixture.events.len() as u64,
        blobs,
    };
    assert_eq!(outcome, imported);
    let second = export(&*b.store, &fixture.meta.id);
    assert!(
        first == second,
        "re-export differs:\n{}\n---\n{}",
        String::from_utf8_lossy(&first),
        String::from_utf8_lossy(&second)
    );
    assert_eq!(verify_run(&*b.store, &fixture.meta.id), vec![]);
    assert_eq!(b.store.run(&fixture.meta.id).unwrap(), fixture.meta);
    // A model's reply stored as a manifest (SQLite) comes back as one; in memory it is flat.
    let call = fixture.events.iter().find(|e| e.kind == EventType::ModelCall).unwrap();
    let output = call.output_ref.unwrap();
    let manifest_line = format!("{{\"blob\":\"{output}\",\"manifest\":");
    let as_manifest = String::from_utf8_lossy(&first).contains(&manifest_line);
    assert_eq!(as_manifest, a.dir.is_some(), "SQLite keeps a chat reply as a manifest");
    assert_eq!(as_manifest, a.store.manifest_of(&output).unwrap().is_some());
    assert_eq!(b.store.manifest_of(&output).unwrap().is_some(), as_manifest);
    // Importing the same file again is a no-op.
    let again = import(&*b.store, &first).unwrap();
    assert_eq!(again, ImportOutcome::AlreadyPresent { run_id: fixture.meta.id.clone(), raised: None });
    assert_eq!(export(&*b.store, &fixture.meta.id), first);

    // The same run exported where it was pinned raises the tier here; it is all that changes.
    let mut pinned = fixture.meta.clone();
    pinned.retention = Retention::Pinned;
    a.store.update_run(&pinned).unwrap();
    let pinned_file = export(&*a.store, &fixture.meta.id);
    match import(&*b.store, &pinned_file).unwrap() {
        ImportOutcome::AlreadyPresent { raised: Some(r), .. } => {
            assert_eq!((r.previous, r.retention), (Retention::Routine, Retention::Pinned))
        }
        other => panic!("expected the tier raised: {other:?}"),
    }
    assert_eq!(b.store.run(&fixture.meta.id).unwrap(), pinned);
    assert_eq!(export(&*b.store, &fixture.meta.id), pinned_file);
    // A weaker tier in the file leaves the store's.
    let again = import(&*b.store, &first).unwrap();
    assert_eq!(again, ImportOutcome::AlreadyPresent { run_id: fixture.meta.id.clone(), raised: None });
    assert_eq!(b.store.run(&fixture.meta.id).unwrap().retention, Retention::Pinned);
}

#[test]
fn round_trip_is_byte_identical_in_memory() {
    round_trip(memory);
}

#[test]
fn round_trip_is_byte_identical_in_sqlite() {
    round_trip(sqlite);
}

/// Many pages of events and many chunks of blobs (the export reads them on one thread and
/// encodes them on another); params with floats and big integers (decoded exactly) and with
/// small integers (decoded fast) come back the same.
fn many_pages(make: fn() -> Backend) {
    let mut b = Builder::new("01pages");
    for i in 0..(retrace_store::export::PAGE as u64 * 2 + 300) {
        let query = format!(r#"{{"q":{i}}}"#).into_bytes();
        let output =
            if i % 5 == 0 { vec![0xff, i as u8, (i >> 8) as u8] } else { format!("row {i}").into_bytes() };
        b.push(
            "agent",
            EventType::ToolCall,
            Some("sql.query"),
            Some((query, BlobHint::Raw)),
            Some(output),
            |e| {
                e.latency_ms = Some(i % 7);
                let value = match i % 4 {
                    0 => serde_json::json!(i as f64 + 0.25),
                    1 => serde_json::json!(12_345_678_901_234_567_890u64 - i),
                    2 => serde_json::json!({"n": -(i as i64), "s": "1.5e3 -0"}),
                    _ => serde_json::json!(1e300),
                };
                e.params = Some([("p".to_owned(), value)].into_iter().collect());
            },
        );
    }
    let fixture = b.finish(RunMode::Record);
    let (a, c) = (make(), make());
    fixture.commit(&*a.store);
    assert_eq!(a.store.events("01pages", 1, usize::MAX).unwrap(), fixture.events);
    let first = export(&*a.store, "01pages");
    let lines = lines(&first);
    assert_eq!(lines.len(), 1 + 3 * fixture.events.len(), "a header, the events, two blobs each");
    for (event, line) in fixture.events.iter().zip(&lines[1..]) {
        assert_eq!(line.as_bytes(), event.canonical().unwrap());
    }
    let imported = import(&*c.store, &first).unwrap();
    assert!(
        matches!(imported, ImportOutcome::Imported { events, .. } if events == fixture.events.len() as u64)
    );
    assert!(export(&*c.store, "01pages") == first, "re-export differs");
}

/// Floats whose shortest decimal form takes 16-17 digits (`0.1 + k/3`), the kind a parser
/// that isn't correctly rounded reads back one bit off, which import would then see as a hash
/// mismatch.
fn floats_round_trip(make: fn() -> Backend) {
    let mut b = Builder::new("01floats");
    for k in 0..500u32 {
        b.push("agent", EventType::ToolCall, Some("t"), None, Some(b"ok".to_vec()), |e| {
            let x = 0.1 + f64::from(k) / 3.0;
            let values = serde_json::json!([x, -x, x * 1e-300, x * 1e300, f64::from(k).sqrt()]);
            e.params = Some([("x".to_owned(), values)].into_iter().collect());
        });
    }
    let fixture = b.finish(RunMode::Record);
    let (a, c) = (make(), make());
    fixture.commit(&*a.store);
    let first = export(&*a.store, "01floats");
    let imported = import(&*c.store, &first).expect("every float reads back exactly");
    assert!(matches!(imported, ImportOutcome::Imported { events: 500, .. }));
    assert!(export(&*c.store, "01floats") == first, "re-export differs");
}

#[test]
fn floats_round_trip_exactly_in_memory() {
    floats_round_trip(memory);
}

#[test]
fn floats_round_trip_exactly_in_sqlite() {
    floats_round_trip(sqlite);
}

#[test]
fn many_pages_round_trip_byte_identical_in_memory() {
    many_pages(memory);
}

#[test]
fn many_pages_round_trip_byte_identical_in_sqlite() {
    many_pages(sqlite);
}

#[test]
fn export_layout_is_header_events_then_blobs_all_canonical() {
    let a = memory();
    let fixture = conversation("01layout", 2);
    fixture.commit(&*a.store);
    let file = export(&*a.store, "01layout");
    let lines = lines(&file);
    let header: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(header["format"], "retrace-trace/1");
    assert_eq!(header["events"], fixture.events.len());
    assert_eq!(header["blobs"].as_u64().unwrap() as usize, lines.len() - 1 - fixture.events.len());
    assert_eq!(header["run"]["id"], "01layout");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(
            canonicalize(line.as_bytes()).unwrap(),
            line.as_bytes(),
            "line {} is not canonical",
            i + 1
        );
    }
    for (event, line) in fixture.events.iter().zip(&lines[1..]) {
        assert_eq!(line.as_bytes(), event.canonical().unwrap());
    }
    let blob_lines = &lines[1 + fixture.events.len()..];
    assert!(blob_lines.iter().all(|l| l.contains("\"blob\":\"sha256:")));
    assert!(blob_lines.iter().any(|l| l.starts_with("{\"base64\":")), "binary output exported as base64");
    // Blobs in order of first reference: the first event's request comes first.
    let first_request = fixture.events[0].request_ref.unwrap().to_string();
    assert!(blob_lines[0].contains(&first_request));
}

#[test]
fn sqlite_exports_chained_manifests_after_what_they_name() {
    let a = sqlite();
    let fixture = conversation("01manifest", 3);
    fixture.commit(&*a.store);
    let lines = lines(&export(&*a.store, "01manifest"));
    let manifests: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].contains("\"manifest\":")).collect();
    assert!(!manifests.is_empty(), "model requests are stored as manifests in sqlite");
    for &i in &manifests {
        let line: serde_json::Value = serde_json::from_str(&lines[i]).unwrap();
        let manifest = &line["manifest"];
        for name in [&manifest["skeleton"], &manifest["base"]]
            .into_iter()
            .chain(manifest["elements"].as_array().unwrap())
        {
            let Some(name) = name.as_str() else { continue };
            let at = lines.iter().position(|l| l.contains(&format!("\"blob\":\"{name}\""))).unwrap();
            assert!(at < i, "blob {name} (line {}) comes after its manifest (line {})", at + 1, i + 1);
        }
    }
}

/// A long conversation's requests, held in the file as chained manifests, are rebuilt only as
/// they are stored, a transaction's worth of bytes at a time: with a small `chunk_bytes` the
/// import commits in many transactions, and stores the same run as one that commits at once.
#[test]
fn a_conversation_imports_in_transactions_bounded_by_its_rebuilt_requests_bytes() {
    let a = sqlite();
    let fixture = conversation("01longchat", 40);
    fixture.commit(&*a.store);
    let file = export(&*a.store, "01longchat");
    assert!(String::from_utf8_lossy(&file).contains("\"manifest\":"), "requests travel as manifests");
    let largest_request = fixture
        .events
        .iter()
        .filter_map(|e| e.request_ref)
        .map(|d| a.store.get_blob(&d).unwrap().len())
        .max()
        .unwrap();
    let mut commits = Vec::new();
    for budget in [32 << 20, largest_request as u64] {
        let b = sqlite();
        let counted = Intercepted::wrap(b.store.clone(), CountCommits::default());
        let options = ImportOptions { chunk_bytes: budget, ..ImportOptions::default() };
        let outcome = import_reader(&counted, &file[..], options).unwrap();
        assert!(matches!(outcome, ImportOutcome::Imported { events: 161, .. }), "{outcome:?}");
        assert_eq!(export(&*b.store, "01longchat"), file, "budget {budget}: re-export differs");
        // Checked page by page, each page reported (progress on a long run): 161 in all.
        let mut pages = Vec::new();
        let problems =
            retrace_store::verify::verify_run_reporting(&*b.store, "01longchat", &mut |n| pages.push(n));
        assert_eq!(problems, vec![]);
        assert_eq!(pages.iter().sum::<u64>(), 161, "{pages:?}");
        commits.push(counted.hooks().0.load(Ordering::SeqCst));
    }
    assert_eq!(commits[0], 1, "161 events and under 32 MB: one transaction");
    // Each transaction ends after the request that takes it to the largest request's size.
    assert!(commits[1] >= 10, "a budget of one request's bytes cuts the import: {commits:?}");
}

#[test]
fn different_run_under_the_same_id_is_refused_naming_the_seq() {
    for make in [memory, sqlite] {
        let (a, b) = (make(), make());
        let original = conversation("01conflict", 3);
        original.commit(&*b.store);
        let mut changed = conversation("01conflict", 3);
        changed.events[4].latency_ms = Some(99);
        changed.reseal_from(4);
        changed.commit(&*a.store);
        let err = import(&*b.store, &export(&*a.store, "01conflict")).unwrap_err();
        assert_eq!((err.kind(), err.exit_code()), (ImportErrorKind::Conflict, 1));
        assert!(err.to_string().contains("first difference at seq 5"), "{err}");
        // A longer run under the same id differs at the first seq the store lacks.
        let longer = conversation("01conflict", 4);
        let c = make();
        longer.commit(&*c.store);
        let err = import(&*b.store, &export(&*c.store, "01conflict")).unwrap_err();
        assert!(err.to_string().contains(&format!("seq {}", original.events.len())), "{err}");
    }
}

/// A source run of 10 events and a fork of it at seq 6 with 3 events of its own.
fn fork_pair(source_latency: Option<u64>) -> (trace_fixture::Fixture, trace_fixture::Fixture) {
    let mut source = Builder::new("01source");
    for i in 0..10 {
        source.push(
            if i % 2 == 0 { "a" } else { "b" },
            EventType::ToolCall,
            Some("t"),
            None,
            Some(vec![b'0' + i]),
            |e| {
                e.latency_ms = source_latency;
            },
        );
    }
    let source = source.finish(RunMode::Record);
    let mut fork = Builder::new("01fork");
    for e in &source.events[..5] {
        fork.push(&e.agent_id.clone(), e.kind, e.name.as_deref(), None, None, |_| {});
    }
    for i in 0..3 {
        fork.push("a", EventType::ToolCall, Some("t"), None, Some(vec![b'x', i]), |_| {});
    }
    let mut fork = fork.finish(RunMode::Fork);
    for (inherited, original) in fork.events.iter_mut().zip(&source.events) {
        *inherited = original.clone();
    }
    let tail: Vec<&mut Event> = fork.events.iter_mut().skip(5).collect();
    for e in tail {
        e.run_id = "01fork".into();
    }
    fork.reseal_from(5);
    fork.meta.source_run = Some("01source".into());
    fork.meta.fork_at = Some(6);
    (source, fork)
}

#[test]
fn a_fork_exports_its_inherited_events_and_imports_before_or_after_its_source() {
    for make in [memory, sqlite] {
        let a = make();
        let (source, fork) = fork_pair(None);
        source.commit(&*a.store);
        // Recorded forks store only their own events, from the fork point on.
        a.store.create_run(&fork.meta).unwrap();
        let own = fork.events[5..].to_vec();
        let blobs = fork.blobs.clone();
        a.store.commit(&Batch { run_id: "01fork".into(), events: own, blobs, cache: Vec::new() }).unwrap();
        assert_eq!(verify_run(&*a.store, "01fork"), vec![]);
        let file = export(&*a.store, "01fork");
        let lines = lines(&file);
        assert!(lines[1].contains("\"run_id\":\"01source\"") && lines[6].contains("\"run_id\":\"01fork\""));
        assert_eq!(lines.len(), 1 + 8 + 8);

        let b = make();
        assert!(matches!(import(&*b.store, &file).unwrap(), ImportOutcome::Imported { events: 8, .. }));
        assert_eq!(export(&*b.store, "01fork"), file);
        assert_eq!(verify_run(&*b.store, "01fork"), vec![]);
        // The source after its fork is no conflict.
        let source_file = export(&*a.store, "01source");
        assert!(matches!(import(&*b.store, &source_file).unwrap(), ImportOutcome::Imported { .. }));

        // A store whose source differs refuses the fork, naming the first differing seq.
        let c = make();
        let (other_source, _) = fork_pair(Some(7));
        other_source.commit(&*c.store);
        let err = import(&*c.store, &file).unwrap_err();
        assert_eq!((err.kind(), err.exit_code()), (ImportErrorKind::Conflict, 1));
        let text = err.to_string();
        assert!(
            text.starts_with("the fork 01fork in the file inherits its first events from run 01source, which this store holds with different events: first difference at seq 1"),
            "{text}"
        );
        assert!(c.store.run("01fork").is_err(), "nothing stored");

        // The other way round: a store holding the fork refuses a source that differs from
        // what the fork inherits, naming the seq and the fork; nothing of it is stored.
        let d = make();
        import(&*d.store, &file).unwrap();
        let other_file = export(&*c.store, "01source");
        let err = import(&*d.store, &other_file).unwrap_err();
        assert_eq!((err.kind(), err.exit_code()), (ImportErrorKind::Conflict, 1));
        let text = err.to_string();
        assert!(
            text.starts_with("run 01source in the file differs from the events the fork 01fork, stored here, inherits from it: first difference at seq 1"),
            "{text}"
        );
        assert!(d.store.run("01source").is_err(), "nothing stored");
        // A source that differs only after the fork point is no conflict.
        let (mut later, _) = fork_pair(None);
        later.events[7].latency_ms = Some(5);
        later.reseal_from(7);
        let e = make();
        later.commit(&*e.store);
        import(&*d.store, &export(&*e.store, "01source")).unwrap();
        assert_eq!(verify_run(&*d.store, "01fork"), vec![]);
    }
}

#[test]
fn a_fork_of_a_fork_reads_through_both_sources() {
    let a = memory();
    let (source, fork) = fork_pair(None);
    source.commit(&*a.store);
    a.store.create_run(&fork.meta).unwrap();
    let own = fork.events[5..].to_vec();
    a.store
        .commit(&Batch { run_id: "01fork".into(), events: own, blobs: fork.blobs.clone(), cache: Vec::new() })
        .unwrap();
    // A fork of 01fork at seq 8: inherits 1..5 from 01source and 6..7 from 01fork.
    let mut second = fork.events[..7].to_vec();
    let mut tail = Builder::new("01fork2");
    for _ in 0..2 {
        tail.push("b", EventType::ToolCall, Some("t"), None, Some(b"y".to_vec()), |_| {});
    }
    let mut meta = tail.finish(RunMode::Fork);
    let (own, blobs) = (meta.events.clone(), meta.blobs.clone());
    second.extend(own);
    let mut prev = second[6].hash;
    for (i, e) in second.iter_mut().enumerate().skip(7) {
        e.seq = i as u64 + 1;
        e.lamport = 10 + i as u64;
        e.seal(Some(prev)).unwrap();
        prev = e.hash;
    }
    meta.meta.source_run = Some("01fork".into());
    meta.meta.fork_at = Some(8);
    meta.meta.head = Some(prev);
    a.store.create_run(&meta.meta).unwrap();
    a.store
        .commit(&Batch { run_id: "01fork2".into(), events: second[7..].to_vec(), blobs, cache: Vec::new() })
        .unwrap();
    assert_eq!(verify_run(&*a.store, "01fork2"), vec![]);
    let file = export(&*a.store, "01fork2");
    let runs: Vec<String> = lines(&file)[1..10]
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["run_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(runs, [["01source"; 5].as_slice(), &["01fork"; 2], &["01fork2"; 2]].concat());
    let b = memory();
    import(&*b.store, &file).unwrap();
    assert_eq!(export(&*b.store, "01fork2"), file);
}

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

/// Counts the commits it forwards.
#[derive(Default)]
struct CountCommits(AtomicU64);

impl Interceptor for CountCommits {
    fn commit(&self, inner: &dyn Store, batch: &Batch) -> StoreResult<()> {
        self.0.fetch_add(1, Ordering::SeqCst);
        inner.commit(batch)
    }
}

/// Imports `file` into `store` in chunks of `chunk` events.
fn import_chunked(store: &dyn Store, file: &[u8], chunk: usize) -> Result<ImportOutcome, ImportError> {
    let options = ImportOptions { chunk_events: chunk, ..ImportOptions::default() };
    import_reader(store, file, options)
}

/// A fork's `message:` edit names a blob no event references: the export carries it, the
/// import stores it, and `verify` reports a fork whose edit blob is missing. A file exported
/// before exports carried it imports where the store holds the blob, and is refused, naming
/// the edit, where it doesn't.
#[test]
fn a_fork_s_edit_blob_travels_with_its_export() {
    for make in [memory, sqlite] {
        let a = make();
        let (source, mut fork) = fork_pair(None);
        source.commit(&*a.store);
        let body = a.store.put_blob(br#"{"draft":"odd!"}"#, BlobHint::Raw).unwrap();
        fork.meta.edits = vec![format!("message:7=@{body}")];
        a.store.create_run(&fork.meta).unwrap();
        let own = fork.events[5..].to_vec();
        a.store
            .commit(&Batch {
                run_id: "01fork".into(),
                events: own,
                blobs: fork.blobs.clone(),
                cache: Vec::new(),
            })
            .unwrap();
        assert_eq!(verify_run(&*a.store, "01fork"), vec![]);
        let file = export(&*a.store, "01fork");
        let text = String::from_utf8_lossy(&file).into_owned();
        assert!(text.contains(&format!("{{\"blob\":\"{body}\"")), "the edit's blob is a line of the file");

        let b = make();
        import(&*b.store, &file).unwrap();
        assert_eq!(b.store.get_blob(&body).unwrap(), br#"{"draft":"odd!"}"#);
        assert_eq!(verify_run(&*b.store, "01fork"), vec![]);
        assert_eq!(export(&*b.store, "01fork"), file, "export, import, export: the same bytes");

        // The file as exports wrote it before: without the blob line (and one blob fewer).
        let mut old = lines(&file);
        old.retain(|l| !l.starts_with(&format!("{{\"blob\":\"{body}\"")));
        let blobs = old.len() as u64 - 1 - 8;
        let mut header: serde_json::Value = serde_json::from_str(&old[0]).unwrap();
        header["blobs"] = blobs.into();
        old[0] = String::from_utf8(canonicalize(header.to_string().as_bytes()).unwrap()).unwrap();
        let old = trace_fixture::join(&old);
        let c = make();
        let err = import(&*c.store, &old).unwrap_err();
        let said = err.to_string();
        assert!(
            said.contains(&format!(
                "the fork's edit message:7=@{body} references blob {body}, which is not in the file"
            )),
            "{said}"
        );
        assert!(c.store.run("01fork").is_err(), "nothing stored");
        c.store.put_blob(br#"{"draft":"odd!"}"#, BlobHint::Raw).unwrap();
        import(&*c.store, &old).unwrap();
        assert_eq!(verify_run(&*c.store, "01fork"), vec![], "the store held the blob already");

        // A store that lost it: verify names the edit and the digest.
        let d = make();
        import(&*d.store, &export(&*a.store, "01source")).unwrap();
        let mut meta = fork.meta.clone();
        meta.id = "01fork2".into();
        meta.edits = vec![format!("message:7=@{}", retrace_core::Digest::of(b"gone"))];
        meta.head = None;
        d.store.create_run(&meta).unwrap();
        let problems = verify_run(&*d.store, "01fork2");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].kind, retrace_store::verify::ProblemKind::BlobMissing);
        assert!(problems[0].message.contains("named by the fork's edit message:7=@sha256:"), "{problems:?}");
    }
}
