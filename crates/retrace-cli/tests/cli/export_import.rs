//! `export` and `import`: byte-identical round trips, FIFOs and symlinks, standard input, bad files.
use super::*;

#[test]
fn export_then_import_elsewhere_round_trips_byte_for_byte() {
    let home = Home::with(&conversation(RUN, 3));
    let file = home.file("t.jsonl");
    let path = file.to_str().unwrap();
    home.run(&["export", "01clir", "-o", path]).expect(0, &[], &["exported run 01clirun", "13 events"]);
    let exported = std::fs::read(&file).unwrap();
    assert_eq!(home.run(&["export", RUN]).0.stdout, exported, "stdout and -o give the same bytes");
    let dash = home.command(&["export", RUN, "-o", "-"]).current_dir(home.dir.path()).output().unwrap();
    assert_eq!(dash.stdout, exported, "-o - is standard output, as `import -` reads standard input");
    assert!(!home.file("-").exists(), "no file named -");

    let other = Home::new();
    other.run(&["import", path]).expect(0, &[RUN], &["imported run 01clirun", "13 events"]);
    other.run(&["import", path]).expect(0, &[RUN], &["already present"]);
    assert_eq!(other.run(&["export", RUN]).0.stdout, exported);
    // The same events with another outcome in the header is another run.
    let text = String::from_utf8(exported.clone()).unwrap();
    let (header, rest) = text.split_once('\n').unwrap();
    let mut header: serde_json::Value = serde_json::from_str(header).unwrap();
    header["run"]["exit_status"] = 3.into();
    // Made as another export would be, digest and all: not an edit of this file.
    header["run_digest"] = retrace_core::export::run_digest(&header["run"]).unwrap().to_string().into();
    let edited = other.file("edited-header.jsonl");
    std::fs::write(&edited, format!("{header}\n{rest}")).unwrap();
    other.run(&["import", edited.to_str().unwrap()]).expect(
        1,
        &[],
        &["same events but a different exit status", "retrace delete 01"],
    );
    other.run(&["verify", RUN]).expect(0, &["ok:"], &[]);

    // The same id with different events is refused, naming the first differing seq.
    let mut changed = conversation(RUN, 3);
    changed.events[4].latency_ms = Some(5);
    changed.reseal_from(4);
    let third = Home::with(&changed);
    third.run(&["import", path]).expect(
        1,
        &[],
        &["already in the store with different events", "seq 5", "retrace delete 01"],
    );
}

fn corrupt(lines: &mut [String], at: usize, from: &str, to: &str) {
    assert!(lines[at].contains(from), "{}", lines[at]);
    lines[at] = lines[at].replacen(from, to, 1);
}

fn write(dir: &Path, name: &str, lines: &[String]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, trace_fixture::join(lines)).unwrap();
    path.to_str().unwrap().to_owned()
}

/// `-o` into something that is not a regular file writes into it (as `> /dev/null` would)
/// rather than renaming a file over it, and `-o` to a symbolic link replaces the file it names
/// and keeps the link. (A rename over `/dev/null` once replaced the machine's `/dev/null` with
/// a regular file, so this test uses a FIFO of its own.)
#[test]
fn export_writes_into_a_fifo_and_through_a_symlink() {
    use std::os::unix::fs::FileTypeExt;
    let home = Home::with(&conversation(RUN, 3));
    let exported = home.run(&["export", RUN]).0.stdout;
    let fifo = home.file("pipe");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo");
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    home.run(&["export", RUN, "-o", fifo.to_str().unwrap()]).expect(0, &[], &["exported run"]);
    assert_eq!(reader.join().unwrap(), exported, "the FIFO's reader got the whole trace");
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "still a FIFO");
    let leftovers: Vec<_> = std::fs::read_dir(home.dir.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary file left: {leftovers:?}");

    let real = home.file("real.jsonl");
    std::fs::write(&real, b"old contents").unwrap();
    let link = home.file("link.jsonl");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    home.run(&["export", RUN, "-o", link.to_str().unwrap()]).expect(0, &[], &["exported run"]);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays");
    assert_eq!(std::fs::read(&real).unwrap(), exported, "the file it names holds the trace");

    let dir = home.file("a-folder");
    std::fs::create_dir(&dir).unwrap();
    home.run(&["export", RUN, "-o", dir.to_str().unwrap()]).expect(2, &[], &["is a directory"]);
    // A folder that isn't there yet is made, as `gate --junit` makes its report's (QA23 S9).
    let nested = home.file("tests/traces/checkout.jsonl");
    home.run(&["export", RUN, "-o", nested.to_str().unwrap()]).expect(0, &[], &["exported run"]);
    assert_eq!(std::fs::read(&nested).unwrap(), exported);
    // Where a file stands in the folder's way, it says so.
    let blocked = home.file("a-file/x.jsonl");
    std::fs::write(home.file("a-file"), b"").unwrap();
    home.run(&["export", RUN, "-o", blocked.to_str().unwrap()]).expect(
        2,
        &[],
        &["a-file is a file, not a folder"],
    );
    // A full disk names the file it was writing (QA31 D1: only "No space left on device").
    home.run(&["export", RUN, "-o", "/dev/full"]).expect(
        2,
        &[],
        &["writing /dev/full: No space left on device", "nothing was written there"],
    );
}

#[test]
fn import_refuses_bad_files_with_the_right_code_and_line() {
    let source = Home::with(&conversation(RUN, 3));
    let lines = trace_fixture::lines(&source.run(&["export", RUN]).0.stdout);
    let home = Home::new();
    let dir = home.dir.path();

    let mut flipped = lines.clone();
    corrupt(&mut flipped, 4, "\"reviewer\"", "\"reviewes\"");
    let path = write(dir, "flipped.jsonl", &flipped);
    home.run(&["import", &path]).expect(1, &[], &["flipped.jsonl:5", "hash mismatch at seq 4"]);

    let mut newer = lines.clone();
    corrupt(&mut newer, 0, "retrace-trace/1", "retrace-trace/2");
    home.run(&["import", &write(dir, "newer.jsonl", &newer)]).expect(
        2,
        &[],
        &["newer.jsonl:1", "unsupported trace format"],
    );

    let path = write(dir, "text.jsonl", &["not json".to_owned()]);
    home.run(&["import", &path]).expect(2, &[], &["text.jsonl:1", "not JSON"]);

    let path = write(dir, "short.jsonl", &lines[..lines.len() - 2]);
    home.run(&["import", &path]).expect(2, &[], &["short.jsonl", "truncated"]);

    home.run(&["import", "/nonexistent/trace.jsonl"]).expect(
        2,
        &[],
        &["cannot open /nonexistent/trace.jsonl"],
    );
    home.run(&["runs"]).expect(0, &[], &["no runs yet"]);
}

#[test]
fn import_reads_standard_input() {
    let source = Home::with(&conversation(RUN, 1));
    let bytes = source.run(&["export", RUN]).0.stdout;
    let home = Home::new();
    let mut child = home
        .command(&["import", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &bytes).unwrap();
    let out = Ran(child.wait_with_output().unwrap());
    out.expect(0, &[RUN], &["from <stdin>"]);
}

/// `retrace export RUN | head -c 10`: quiet, but not a success (the reader didn't get the
/// trace whole): 141, SIGPIPE's status, as `cat` would end, so `set -o pipefail` sees it.
#[test]
fn a_closed_pipe_ends_export_quietly_as_cut_short() {
    let home = Home::with(&conversation(RUN, 3)); // holds a 100 KB blob: more than a pipe buffers
    let mut child =
        home.command(&["export", RUN]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut head = [0u8; 10];
    child.stdout.take().unwrap().read_exact(&mut head).unwrap();
    let out = Ran(child.wait_with_output().unwrap());
    assert_eq!(out.0.status.code(), Some(141), "{}", out.stderr());
    assert_eq!(out.stderr(), "");
}

impl Home {
    /// Marks [`RUN`] as an unfinished import, with `status` if given.
    fn mark_unfinished(&self, status: Option<retrace_core::run::RunStatus>) {
        let store = retrace_store::open_store(&retrace_store::StoreConfig::in_home(self.dir.path())).unwrap();
        let mut meta = store.run(RUN).unwrap();
        meta.labels.insert(retrace_store::import::UNFINISHED_LABEL.into(), "stored in part".into());
        meta.status = status.unwrap_or(meta.status);
        store.update_run(&meta).unwrap();
    }
}

/// An unfinished import is refused by `export` (exit 2, saying how to finish it): its file
/// would carry the mark to every store it reaches, where importing it again could never store
/// the rest (QA7 D3).
#[test]
fn an_unfinished_import_is_not_exported() {
    let home = Home::with(&conversation(RUN, 3));
    home.mark_unfinished(None);
    let refused = home.run(&["export", RUN, "-o", home.file("t.jsonl").to_str().unwrap()]);
    refused.expect(2, &[], &["is an unfinished import", "13 of its events", "import its trace file again"]);
    assert!(!home.file("t.jsonl").exists(), "no file written");
}

/// An import that stopped part way (its process killed: the run is `interrupted`) is named by
/// `verify` (exit 1), and `replay`, `fork` and `gate` refuse it up front with the way to finish
/// it: replaying it would blame its end on a recorder that never stopped (QA9 D9).
#[test]
fn a_stopped_import_is_named_by_verify_and_refused_by_replay() {
    let home = Home::with(&conversation(RUN, 3));
    home.mark_unfinished(Some(retrace_core::run::RunStatus::Interrupted));
    home.run(&["verify", RUN]).expect(1, &["an unfinished import", "the first 13 events"], &[]);
    let hint = "import its trace file again (`retrace import FILE` stores the rest), then";
    for verb in ["replay", "fork"] {
        let said = home.run(&[verb, RUN, "--", "true"]);
        said.expect(2, &[], &["is an unfinished import", "the first 13 of its events", hint]);
    }
}

/// A conflict with a run still being recorded here doesn't suggest deleting it, which `delete`
/// refuses: it says to wait for the recording to finish (QA7 S3).
#[test]
fn a_conflict_with_a_run_still_recording_says_to_wait_for_it() {
    let source = Home::with(&conversation(RUN, 3));
    let file = source.file("t.jsonl");
    source.run(&["export", RUN, "-o", file.to_str().unwrap()]).expect(0, &[], &[]);
    let home = Home::with(&conversation(RUN, 2));
    {
        let store = retrace_store::open_store(&retrace_store::StoreConfig::in_home(home.dir.path())).unwrap();
        let mut meta = store.run(RUN).unwrap();
        meta.status = retrace_core::run::RunStatus::Running;
        store.update_run(&meta).unwrap();
        // Kept by this (live) process, as a launcher keeps the run it records.
        store.keep_run(RUN, &retrace_store::LeaseHolder::current()).unwrap();
    }
    let refused = home.run(&["import", file.to_str().unwrap()]);
    refused.expect(1, &[], &["is still being recorded here; once it has finished, `retrace delete"]);
}

/// `export -o FILE` stopped by SIGINT or SIGTERM part way leaves neither FILE nor the hidden
/// temporary file it was writing beside it, and ends as the signal would have (QA9 D10).
#[test]
fn an_export_stopped_by_a_signal_leaves_no_temporary_file() {
    use std::os::unix::process::ExitStatusExt;
    // One step whose output is large enough that writing it takes a while.
    let mut b = Builder::new(RUN);
    let big = "a line of a large tool output\n".repeat(2 << 20).into_bytes();
    b.push("agent", retrace_core::EventType::ToolCall, Some("dump"), None, Some(big), |_| {});
    let home = Home::with(&b.finish(retrace_core::run::RunMode::Record));
    let mut judged = 0;
    for signal in [nix::sys::signal::Signal::SIGINT, nix::sys::signal::Signal::SIGTERM] {
        let out = home.file("big.jsonl");
        let mut child = home.command(&["export", RUN, "-o", out.to_str().unwrap()]).spawn().unwrap();
        let temp = home.file(&format!(".big.jsonl.{}.tmp", child.id()));
        let began = std::time::Instant::now();
        while !temp.exists() && began.elapsed() < std::time::Duration::from_secs(20) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(temp.exists(), "the export writes a temporary file first");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
        let status = child.wait().unwrap();
        if status.success() {
            // It finished before the signal arrived: nothing to judge this time.
            assert!(!temp.exists());
            std::fs::remove_file(&out).unwrap();
            continue;
        }
        assert_eq!(status.signal(), Some(signal as i32), "{status:?}");
        assert!(!temp.exists(), "{} left behind after {signal}", temp.display());
        assert!(!out.exists(), "no partial file");
        judged += 1;
    }
    assert!(judged > 0, "every export finished before its signal");
}

/// A fork and a source that disagree on what the fork inherits are refused either way round,
/// saying which run is the file's and which the store's, with the way out (QA9 D7).
#[test]
fn a_fork_and_a_different_recording_of_its_source_are_refused_saying_which_is_which() {
    const SRC: &str = "01inheritsource00000000000";
    const FORK: &str = "01inheritfork0000000000000";
    let source = conversation(SRC, 2);
    let home = Home::with(&source);
    {
        let store = retrace_store::open_store(&retrace_store::StoreConfig::in_home(home.dir.path())).unwrap();
        trace_fixture::fork_of(&source, FORK, 4).commit(&*store);
    }
    let fork_file = home.file("f.jsonl");
    home.run(&["export", FORK, "-o", fork_file.to_str().unwrap()]).expect(0, &[], &[]);
    let mut other = conversation(SRC, 2);
    other.events[1].latency_ms = Some(7);
    other.reseal_from(1);
    let elsewhere = Home::with(&other);
    let said = elsewhere.run(&["import", fork_file.to_str().unwrap()]);
    said.expect(
        1,
        &[],
        &[
            &format!("the fork {FORK} in the file inherits its first events from run {SRC}, which this store holds with different events: first difference at seq 2"),
            "hint: the fork was made from another recording of",
        ],
    );

    let other_file = elsewhere.file("s.jsonl");
    elsewhere.run(&["export", SRC, "-o", other_file.to_str().unwrap()]).expect(0, &[], &[]);
    let forks_only = Home::new();
    forks_only.run(&["import", fork_file.to_str().unwrap()]).expect(0, &[FORK], &[]);
    let said = forks_only.run(&["import", other_file.to_str().unwrap()]);
    said.expect(
        1,
        &[],
        &[
            &format!("run {SRC} in the file differs from the events the fork {FORK}, stored here, inherits from it"),
            &format!("retrace delete {FORK} && retrace import"),
        ],
    );
}

/// `export -o FILE --json` and `import --json` say what they did as JSON, for CI scripts
/// (QA9 S2); `export --json` without -o is refused, its standard output being the trace.
#[test]
fn export_and_import_say_what_they_did_as_json() {
    let home = Home::with(&conversation(RUN, 3));
    let file = home.file("t.jsonl");
    let path = file.to_str().unwrap();
    let exported = home.run(&["export", RUN, "-o", path, "--json"]).expect(0, &[], &[]).json();
    let size = std::fs::metadata(&file).unwrap().len();
    assert_eq!(
        exported,
        serde_json::json!({"run": RUN, "file": path, "events": 13, "blobs": exported["blobs"], "bytes": size})
    );
    assert!(exported["blobs"].as_u64().unwrap() > 0);
    home.run(&["export", RUN, "--json"]).expect(2, &[], &["--json needs -o FILE"]);

    let other = Home::new();
    let imported = other.run(&["import", path, "--json"]).expect(0, &[], &[]).json();
    assert_eq!(imported["run"], RUN);
    assert_eq!((imported["imported"].clone(), imported["events"].clone()), (true.into(), 13.into()));
    assert_eq!(imported["blobs"], exported["blobs"]);
    assert_eq!(imported["forced_checks"], 0);
    let again = other.run(&["import", path, "--json"]).expect(0, &[], &[]).json();
    assert_eq!((again["imported"].clone(), again["events"].clone()), (false.into(), 0.into()));
}
