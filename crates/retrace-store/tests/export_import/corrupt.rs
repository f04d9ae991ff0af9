//! Corrupted trace files: each is refused with the right kind, line and exit code, storing no run.
use retrace_core::Digest;
use retrace_store::import::{import_reader, ImportError, ImportErrorKind, ImportOptions};
use retrace_store::memory::MemoryStore;
use retrace_store::EventStore;

use super::trace_fixture::{conversation, export, join, lines, memory, Fixture};

/// A good export of a 3-turn conversation (13 events) and its lines.
fn good() -> Vec<String> {
    let a = memory();
    conversation("01corrupt", 3).commit(&*a.store);
    lines(&export(&*a.store, "01corrupt"))
}

/// Imports `bytes` into an empty store; it must fail and store no run.
fn refused(bytes: &[u8]) -> ImportError {
    let store = MemoryStore::new();
    let opts = ImportOptions { file_name: Some("t.jsonl".into()), ..ImportOptions::default() };
    let err = import_reader(&store, bytes, opts).unwrap_err();
    assert!(store.runs().unwrap().is_empty(), "a refused import stored something: {err}");
    err
}

fn check(err: &ImportError, kind: ImportErrorKind, code: u8, needles: &[&str]) {
    assert_eq!((err.kind(), err.exit_code()), (kind, code), "{err}");
    for needle in needles {
        assert!(err.to_string().contains(needle), "{err:?} lacks {needle:?}");
    }
}

fn header(lines: &[String]) -> serde_json::Value {
    serde_json::from_str(&lines[0]).unwrap()
}

/// `h` with its `run_digest` made again for its run record as it now stands: an edit that
/// gets past the digest, for the checks behind it.
fn resealed(mut h: serde_json::Value) -> serde_json::Value {
    let digest = retrace_core::export::run_digest(&h["run"]).unwrap();
    h["run_digest"] = digest.to_string().into();
    h
}

/// The header's run record is covered by `run_digest` (QA40 D3: a changed status, exit status,
/// mode or command imported with exit 0 and verified ok); a file written before it existed,
/// with none, is read as before. A record no run could have is refused even so.
#[test]
fn a_changed_run_record_is_refused_by_its_digest() {
    let lines = good();
    let h = header(&lines);
    assert!(h["run_digest"].as_str().is_some_and(|d| d.starts_with("sha256:")), "{h}");
    for (path, value) in [
        ("exit_status", serde_json::json!(7)),
        ("status", serde_json::json!("failed")),
        ("mode", serde_json::json!("replay")),
        ("name", serde_json::json!("renamed")),
    ] {
        let mut changed = h.clone();
        changed["run"][path] = value;
        let mut edited = lines.clone();
        edited[0] = changed.to_string();
        let err = refused(&join(&edited));
        check(&err, ImportErrorKind::Verification, 1, &["t.jsonl:1", "run record was changed", "run_digest"]);
    }
    let mut unsealed = h.clone();
    unsealed.as_object_mut().unwrap().remove("run_digest");
    let mut older = lines.clone();
    older[0] = unsealed.to_string();
    let store = MemoryStore::new();
    let opts = ImportOptions { file_name: Some("t.jsonl".into()), ..ImportOptions::default() };
    import_reader(&store, join(&older).as_slice(), opts).expect("a file with no run_digest imports");

    for (path, value, says) in [
        ("mode", serde_json::json!("replay"), "a replay run with no source_run"),
        ("status", serde_json::json!("diverged"), "status diverged with no divergence"),
    ] {
        let mut changed = h.clone();
        changed["run"][path] = value;
        let mut edited = lines.clone();
        edited[0] = resealed(changed).to_string();
        check(&refused(&join(&edited)), ImportErrorKind::Malformed, 2, &["t.jsonl:1", "impossible", says]);
    }
}

/// A key written twice in the header is refused, as in an event line (QA40 D4: the last one
/// won).
#[test]
fn a_header_key_written_twice_is_refused() {
    let lines = good();
    let mut twice = lines.clone();
    twice[0] = lines[0].replacen("{", "{\"format\":\"retrace-trace/2\",", 1);
    check(&refused(&join(&twice)), ImportErrorKind::Malformed, 2, &["t.jsonl:1", "duplicate key", "format"]);
}

#[test]
fn truncated_files() {
    let lines = good();
    let err = refused(&join(&lines[..lines.len() - 1]));
    check(&err, ImportErrorKind::Truncated, 2, &["t.jsonl:", "truncated", "blobs"]);
    let err = refused(&join(&lines[..5]));
    check(
        &err,
        ImportErrorKind::Truncated,
        2,
        &["t.jsonl:5", "the header announces 13 events, the file holds 4"],
    );
    let whole = join(&lines);
    let err = refused(&whole[..whole.len() - 20]);
    check(&err, ImportErrorKind::Truncated, 2, &["ends inside line"]);
    check(&refused(b""), ImportErrorKind::Truncated, 2, &["empty"]);
}

#[test]
fn a_flipped_byte_in_an_event_names_its_seq() {
    let mut lines = good();
    assert!(lines[4].contains("\"agent_id\":\"reviewer\""));
    lines[4] = lines[4].replace("\"agent_id\":\"reviewer\"", "\"agent_id\":\"reviewes\"");
    let err = refused(&join(&lines));
    check(&err, ImportErrorKind::Verification, 1, &["t.jsonl:5", "hash mismatch at seq 4"]);
    assert!(matches!(err, ImportError::Verification { seq: Some(4), .. }));
}

#[test]
fn a_blob_that_does_not_match_its_digest_names_the_digest() {
    let mut lines = good();
    let at = lines.iter().position(|l| l.contains("select 1")).unwrap();
    let digest: Digest = serde_json::from_str::<serde_json::Value>(&lines[at]).unwrap()["blob"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    lines[at] = lines[at].replace("select 1", "select 2");
    let err = refused(&join(&lines));
    check(
        &err,
        ImportErrorKind::Verification,
        1,
        &[&format!("t.jsonl:{}", at + 1), &format!("digest mismatch for blob {digest}")],
    );
    assert!(matches!(err, ImportError::Verification { digest: Some(d), .. } if d == digest));
}

/// A reader that gives its bytes, then fails.
struct FailsAfter<'a>(&'a [u8]);

impl std::io::Read for FailsAfter<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.0.is_empty() {
            return Err(std::io::Error::other("the disk went away"));
        }
        let n = self.0.len().min(buf.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

/// Lines are read ahead of the checks; a read error is still reported at the line it cut, and
/// only once every line before it has verified.
#[test]
fn a_read_error_names_its_line_after_the_lines_before_it() {
    let lines = good();
    let failing = |lines: &[String]| {
        let file = join(lines);
        let cut = join(&lines[..6]).len();
        let store = MemoryStore::new();
        let opts = ImportOptions { file_name: Some("t.jsonl".into()), ..ImportOptions::default() };
        let err = import_reader(&store, std::io::BufReader::new(FailsAfter(&file[..cut])), opts).unwrap_err();
        assert!(store.runs().unwrap().is_empty(), "a refused import stored something: {err}");
        err
    };
    check(&failing(&lines), ImportErrorKind::Io, 2, &["t.jsonl:7", "cannot read"]);
    let mut tampered = lines.clone();
    tampered[4] = tampered[4].replace("\"agent_id\":\"reviewer\"", "\"agent_id\":\"reviewes\"");
    check(&failing(&tampered), ImportErrorKind::Verification, 1, &["t.jsonl:5", "hash mismatch at seq 4"]);
}

#[test]
fn out_of_order_and_duplicated_seqs() {
    let mut lines = good();
    lines.swap(3, 4);
    check(
        &refused(&join(&lines)),
        ImportErrorKind::Verification,
        1,
        &["t.jsonl:4", "expected seq 3, found seq 4"],
    );
    let mut lines = good();
    lines[4] = lines[3].clone();
    check(&refused(&join(&lines)), ImportErrorKind::Verification, 1, &["t.jsonl:5", "seq 3 is repeated"]);
}

#[test]
fn a_broken_chain_names_the_seq() {
    let mut lines = good();
    let mut event: retrace_core::Event = serde_json::from_str(&lines[6]).unwrap();
    event.seal(Some(Digest::of(b"elsewhere"))).unwrap();
    lines[6] = String::from_utf8(event.canonical().unwrap()).unwrap();
    check(&refused(&join(&lines)), ImportErrorKind::Verification, 1, &["t.jsonl:7", "chain broken at seq 6"]);
}

#[test]
fn unknown_format_and_not_a_trace() {
    let lines = good();
    let mut newer = lines.clone();
    newer[0] = newer[0].replace("retrace-trace/1", "retrace-trace/2");
    let err = refused(&join(&newer));
    check(&err, ImportErrorKind::UnknownFormat, 2, &["t.jsonl:1", "retrace-trace/2"]);
    let mut minor = lines.clone();
    minor[0] = minor[0].replace("retrace-trace/1", "retrace-trace/1.4");
    assert!(import_reader(&MemoryStore::new(), &join(&minor)[..], ImportOptions::default()).is_ok());
    check(
        &refused(b"{\"format\":\"vcr/1\"}\n"),
        ImportErrorKind::Malformed,
        2,
        &["t.jsonl:1", "not a retrace trace"],
    );
    check(
        &refused(b"{\"events\":[]}\n"),
        ImportErrorKind::Malformed,
        2,
        &["t.jsonl:1", "not a retrace trace"],
    );
}

#[test]
fn not_json_names_the_line() {
    check(&refused(b"hello\n"), ImportErrorKind::Malformed, 2, &["t.jsonl:1", "not JSON"]);
    // A trace gzipped, or saved with a byte-order mark, is named as such.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &join(&good())).unwrap();
    check(
        &refused(&gz.finish().unwrap()),
        ImportErrorKind::Malformed,
        2,
        &["t.jsonl:1", "gzip-compressed", "gunzip -c"],
    );
    let bom = [&b"\xef\xbb\xbf"[..], &join(&good())].concat();
    check(&refused(&bom), ImportErrorKind::Malformed, 2, &["t.jsonl:1", "byte-order mark"]);
    // A trace committed with Git LFS and never fetched (QA12 S4), as `gate` says it.
    let lfs = b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 12345\n";
    check(&refused(lfs), ImportErrorKind::Malformed, 2, &["t.jsonl:1", "Git LFS pointer", "git lfs pull"]);
    let mut lines = good();
    lines[2] = "{\"seq\": 2,".into();
    check(&refused(&join(&lines)), ImportErrorKind::Malformed, 2, &["t.jsonl:3", "not a valid event"]);
    let mut lines = good();
    let last = lines.len() - 1;
    lines[last] = "[1, 2, 3]".into();
    check(
        &refused(&join(&lines)),
        ImportErrorKind::Malformed,
        2,
        &[&format!("t.jsonl:{}", last + 1), "not a valid blob line"],
    );
}

#[test]
fn header_counts_must_match_the_lines() {
    let lines = good();
    let mut extra = lines.clone();
    extra.push("{\"junk\":true}".into());
    check(&refused(&join(&extra)), ImportErrorKind::Malformed, 2, &["unexpected line after the last blob"]);
    // Blank lines at the end (`echo >> trace.jsonl`, an editor) hold nothing: the file imports.
    let blank = [join(&lines), b"\n  \r\n\n".to_vec()].concat();
    assert!(import_reader(&MemoryStore::new(), &blank[..], ImportOptions::default()).is_ok());
    let after_blank = [join(&lines), b"\n{\"junk\":true}\n".to_vec()].concat();
    check(&refused(&after_blank), ImportErrorKind::Malformed, 2, &["unexpected line after the last blob"]);
    let mut fewer_events = lines.clone();
    let mut h = header(&lines);
    h["events"] = 12.into();
    fewer_events[0] = h.to_string();
    check(
        &refused(&join(&fewer_events)),
        ImportErrorKind::Malformed,
        2,
        &["t.jsonl:14", "found an event line"],
    );
    let mut more_events = lines.clone();
    h["events"] = 14.into();
    more_events[0] = h.to_string();
    check(&refused(&join(&more_events)), ImportErrorKind::Malformed, 2, &["t.jsonl:15", "found a blob line"]);
}

#[test]
fn missing_duplicated_and_stray_blobs() {
    let lines = good();
    let events = 13;
    let mut h = header(&lines);
    let blobs = h["blobs"].as_u64().unwrap();
    // Drop the first blob: the first event's request.
    let mut missing: Vec<String> =
        lines.iter().enumerate().filter(|(i, _)| *i != 1 + events).map(|(_, l)| l.clone()).collect();
    h["blobs"] = (blobs - 1).into();
    missing[0] = h.to_string();
    check(
        &refused(&join(&missing)),
        ImportErrorKind::Verification,
        1,
        &["t.jsonl:2", "seq 1 references blob"],
    );
    let mut twice = lines.clone();
    twice.insert(2 + events, lines[1 + events].clone());
    h["blobs"] = (blobs + 1).into();
    twice[0] = h.to_string();
    check(&refused(&join(&twice)), ImportErrorKind::Malformed, 2, &["appears twice (first on line 15)"]);
    let mut stray = lines.clone();
    stray.push(format!("{{\"blob\":\"{}\",\"text\":\"nobody\"}}", Digest::of(b"nobody")));
    stray[0] = h.to_string();
    check(&refused(&join(&stray)), ImportErrorKind::Verification, 1, &["referenced by no event"]);
    let mut both = lines.clone();
    let last = both.len() - 1;
    both[last] = both[last].replacen("{", "{\"text\":\"x\",", 1);
    check(
        &refused(&join(&both)),
        ImportErrorKind::Malformed,
        2,
        &["exactly one of text, base64 or manifest"],
    );
}

#[test]
fn a_wrong_head_is_refused() {
    let mut lines = good();
    let mut h = header(&lines);
    h["run"]["head"] = Digest::of(b"other").to_string().into();
    lines[0] = resealed(h).to_string();
    check(&refused(&join(&lines)), ImportErrorKind::Verification, 1, &["t.jsonl:1", "head"]);
}

#[test]
fn absurd_header_counts_are_truncation_not_exhaustion() {
    let mut lines = good();
    let mut h = header(&lines);
    h["events"] = u64::MAX.into();
    h["blobs"] = u64::MAX.into();
    lines.truncate(1);
    lines[0] = h.to_string();
    let err = refused(&join(&lines));
    check(&err, ImportErrorKind::Truncated, 2, &["t.jsonl:1", "the file holds 0"]);

    // The largest count with the lines still there: the blob after the last event is named
    // (1 + u64::MAX used to wrap, so every line was taken for a blob, and import panicked).
    for events in [u64::MAX, u64::MAX - 1, 1 << 63] {
        let mut lines = good();
        let mut h = header(&lines);
        h["events"] = events.into();
        lines[0] = h.to_string();
        let err = refused(&join(&lines));
        check(&err, ImportErrorKind::Malformed, 2, &["t.jsonl:15", "expected event 14", "found a blob line"]);
    }
}

#[test]
fn progress_reports_bytes_read() {
    let file = join(&good());
    let mut seen = Vec::new();
    let mut progress = |bytes: u64| seen.push(bytes);
    let opts = ImportOptions { progress: Some(&mut progress), ..ImportOptions::default() };
    import_reader(&MemoryStore::new(), &file[..], opts).unwrap();
    assert_eq!(seen.last().copied(), Some(file.len() as u64));
    assert!(seen.windows(2).all(|w| w[0] < w[1]));
}

/// Imports `bytes` with `forced`: the outcome and each failure it forgave.
fn forced(store: &MemoryStore, bytes: &[u8]) -> (Result<String, ImportError>, Vec<String>) {
    let mut forgiven = Vec::new();
    let mut report = |e: &ImportError| forgiven.push(e.to_string());
    let opts = ImportOptions { forced: Some(&mut report), ..ImportOptions::default() };
    let outcome = import_reader(store, bytes, opts).map(|o| o.run_id().to_owned());
    (outcome, forgiven)
}

#[test]
fn forced_imports_store_what_verify_then_names_but_never_what_the_store_cannot_hold() {
    let mut lines = good();
    lines[4] = lines[4].replace("\"agent_id\":\"reviewer\"", "\"agent_id\":\"reviewes\"");
    let store = MemoryStore::new();
    let (outcome, forgiven) = forced(&store, &join(&lines));
    assert_eq!(outcome.unwrap(), "01corrupt");
    // The renamed agent also breaks seq 4's inbound link: import says so, as verify does.
    assert_eq!(forgiven.len(), 2, "{forgiven:?}");
    assert!(forgiven[0].starts_with("line 5: hash mismatch at seq 4"), "{forgiven:?}");
    assert!(forgiven[1].contains("seq 4: inbound 3 is not an earlier deliver to reviewes"), "{forgiven:?}");
    let problems = retrace_store::verify::verify_run(&store, "01corrupt");
    // The renamed agent also breaks seq 4's inbound link; everything found is at seq 4.
    assert!(problems.iter().all(|p| p.seq == Some(4)), "{problems:?}");
    assert!(problems[0].to_string().starts_with("run 01corrupt seq 4: hash mismatch"), "{problems:?}");

    let mut lines = good();
    lines.swap(3, 4);
    let store = MemoryStore::new();
    let (outcome, _) = forced(&store, &join(&lines));
    assert!(matches!(outcome, Err(ImportError::Order { seq: 4, .. })), "{outcome:?}");
    assert!(store.runs().unwrap().is_empty(), "out-of-order seqs are never stored");
}

/// A run stored by a forced import of an edited file is not the genuine file's run, nor the
/// other way round, though each event says the same hash: its content must give that hash on
/// both sides. The same edited file forced in twice is the same run.
#[test]
fn an_edited_event_that_kept_its_hash_is_not_the_same_run_whichever_side_holds_it() {
    let genuine = join(&good());
    let mut lines = good();
    lines[4] = lines[4].replace("\"agent_id\":\"reviewer\"", "\"agent_id\":\"reviewes\"");
    let edited = join(&lines);
    let conflict_at_4 = |outcome: Result<String, ImportError>, needle: &str| {
        let err = outcome.unwrap_err();
        check(&err, ImportErrorKind::Conflict, 1, &["seq 4", needle]);
    };

    let store = MemoryStore::new();
    forced(&store, &edited).0.unwrap();
    let opts = ImportOptions::default();
    conflict_at_4(
        import_reader(&store, &genuine[..], opts).map(|o| o.run_id().to_owned()),
        "stored event's content",
    );
    let (again, _) = forced(&store, &edited);
    assert_eq!(again.unwrap(), "01corrupt", "the same forced file again is the same run");

    let store = MemoryStore::new();
    import_reader(&store, &genuine[..], ImportOptions::default()).unwrap();
    conflict_at_4(forced(&store, &edited).0, "file's event content");
}

/// A header whose final decisions are not the run's decision events (the header is covered by
/// no hash) is refused; forced in, `verify` names it.
#[test]
fn final_decisions_that_are_not_the_decision_events_are_refused_and_verify_names_them() {
    let mut lines = good();
    let mut first = header(&lines);
    assert_eq!(first["run"]["decisions"][0]["action"], "approve", "the fixture decides");
    first["run"]["decisions"][0]["action"] = "reject".into();
    lines[0] = serde_json::to_string(&resealed(first)).unwrap();
    let err = refused(&join(&lines));
    check(
        &err,
        ImportErrorKind::Verification,
        1,
        &[
            "t.jsonl:1",
            "final decisions of agent reviewer are [reject step:backfill]",
            "say [approve step:backfill]",
        ],
    );

    let store = MemoryStore::new();
    let (outcome, forgiven) = forced(&store, &join(&lines));
    assert_eq!(outcome.unwrap(), "01corrupt");
    assert_eq!(forgiven.len(), 1, "{forgiven:?}");
    let problems = retrace_store::verify::verify_run(&store, "01corrupt");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].kind, retrace_store::verify::ProblemKind::Decisions);
    assert!(problems[0].message.contains("decision events say [approve step:backfill]"), "{problems:?}");
}

/// A member no event has, added to an event line, is refused naming it: parsing would drop it
/// and the hash doesn't cover it, so it would pass unseen and vanish from the re-export. A line
/// out of canonical form with only known members still imports.
#[test]
fn an_event_line_with_a_member_no_event_has_is_refused_naming_it() {
    let mut lines = good();
    assert!(lines[1].contains("\"seq\":1"), "{}", lines[1]);
    lines[1] = lines[1].replacen('{', "{\"future_field\":1,", 1);
    let err = refused(&join(&lines));
    check(&err, ImportErrorKind::Verification, 1, &["t.jsonl:2", "seq 1 holds members", "(future_field)"]);
    assert!(matches!(err, ImportError::Verification { seq: Some(1), .. }), "{err:?}");
    assert!(!err.to_string().contains("newer retrace"), "{err}");

    // A newer minor version of the format is read, and one of its members this build doesn't
    // know says who wrote it.
    let mut first = header(&lines);
    first["format"] = "retrace-trace/1.7".into();
    lines[0] = serde_json::to_string(&first).unwrap();
    let err = refused(&join(&lines));
    check(
        &err,
        ImportErrorKind::Verification,
        1,
        &["(future_field)", "the file says retrace-trace/1.7: a newer retrace wrote it"],
    );

    let mut lines = good();
    let spaced = lines[2].replacen('{', "{ ", 1).replacen(',', ", ", 3);
    assert_ne!(spaced, lines[2]);
    lines[2] = spaced;
    let store = MemoryStore::new();
    import_reader(&store, join(&lines).as_slice(), ImportOptions::default()).expect("known members import");
}

/// An import checks what `verify` checks of each event's clock and causal links, so it never
/// stores a run `verify` then rejects: a resealed file (the chain is unkeyed, anyone can redo
/// it) with a clock that goes back or a parent that points forward is refused, naming the seq,
/// and stored only when forced, where `verify` names the same seq.
#[test]
fn an_import_checks_clocks_and_causal_links_as_verify_does() {
    type Edit = fn(&mut Fixture);
    let cases: [(Edit, u64, &str); 4] = [
        (|f| f.events[5].lamport = 1, 6, "lamport 1 of agent planner does not increase"),
        (|f| f.events[3].causal_parent = Some(9), 4, "causal_parent 9 is not an earlier event"),
        (|f| f.events[2].causal_parent = Some(1), 3, "not a send"),
        (|f| f.events[3].inbound = vec![2], 4, "inbound 2 is not an earlier deliver to reviewer"),
    ];
    for (edit, seq, needle) in cases {
        let a = memory();
        let mut fixture = conversation("01corrupt", 3);
        edit(&mut fixture);
        fixture.reseal_from(1);
        fixture.commit(&*a.store);
        let file = export(&*a.store, "01corrupt");
        let err = refused(&file);
        check(&err, ImportErrorKind::Verification, 1, &[&format!("seq {seq}: "), needle, "t.jsonl:"]);

        let store = MemoryStore::new();
        let (outcome, forgiven) = forced(&store, &file);
        assert_eq!(outcome.unwrap(), "01corrupt");
        assert_eq!(forgiven.len(), 1, "{forgiven:?}");
        let problems = retrace_store::verify::verify_run(&store, "01corrupt");
        assert!(problems.iter().any(|p| p.seq == Some(seq) && p.message.contains(needle)), "{problems:?}");
    }
}

/// A header member this build doesn't know (a key mangled by one flipped bit) would import as
/// an absent field and change the run: it is refused, naming its path, and dropped only when
/// forced. A null one (an absent optional field, written out) is no loss.
#[test]
fn a_header_member_no_header_has_is_refused_naming_it() {
    let mut lines = good();
    let mut h = header(&lines);
    let run = h["run"].as_object_mut().unwrap();
    let name = run.remove("name").unwrap_or(serde_json::json!("a name"));
    run.insert("nane".into(), name);
    run.insert("gone".into(), serde_json::Value::Null);
    h["masking_rules"].as_object_mut().unwrap().insert("extra".into(), serde_json::json!(1));
    let h = resealed(h);
    lines[0] = String::from_utf8(retrace_core::canonical::canonical_value(&h).unwrap()).unwrap();
    let err = refused(&join(&lines));
    check(&err, ImportErrorKind::Verification, 1, &["t.jsonl:1", "run.nane", "masking_rules.extra"]);
    assert!(!err.to_string().contains("run.gone"), "{err}");

    let store = MemoryStore::new();
    let (outcome, forgiven) = forced(&store, &join(&lines));
    assert_eq!(outcome.unwrap(), "01corrupt");
    assert_eq!(forgiven.len(), 1, "{forgiven:?}");
}

/// A first line far longer than any header is refused once it passes the cap, without being
/// held whole (a 300 MB line took 876 MB of memory to fail; QA9 S9).
#[test]
fn a_first_line_longer_than_any_header_is_refused_at_the_cap() {
    let mut file = b"{\"format\":\"retrace-trace/1\",\"pad\":\"".to_vec();
    file.resize(17 << 20, b'x');
    let err = refused(&file);
    check(&err, ImportErrorKind::Malformed, 2, &["t.jsonl:1", "longer than 16 MiB", "not a trace file"]);
}
