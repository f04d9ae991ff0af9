//! Export, import and verify: round trips on every backend, conflicts, forks, corrupted files.
#[path = "export_import/bounded.rs"]
mod bounded;
#[path = "export_import/concurrent.rs"]
mod concurrent;
#[path = "export_import/corrupt.rs"]
mod corrupt;
#[path = "export_import/failures.rs"]
mod failures;
mod trace_fixture;
#[path = "export_import/verify.rs"]
mod verify;

use retrace_core::canonical::canonicalize;
use retrace_core::envelope::EventType;
use retrace_core::run::{Retention, RunMode};
use retrace_core::Event;
use std::sync::atomic::{AtomicU64, Ordering};

use retrace_store::import::{import_reader, ImportErrorKind, ImportOptions, ImportOutcome};
use retrace_store::intercept::{Intercepted, Interceptor};
use retrace_store::verify::verify_run;
use retrace_store::{Batch, BlobHint, Store, StoreResult};
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

/// Counts the commits it forwards.
#[derive(Default)]
struct CountCommits(AtomicU64);

impl Interceptor for CountCommits {
    fn commit(&self, inner: &dyn Store, batch: &Batch) -> StoreResult<()> {
        self.0.fetch_add(1, Ordering::SeqCst);
        inner.commit(batch)
    }
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
