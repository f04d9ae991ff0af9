//! A full disk (issue 2, "bad input"): recording into a store whose filesystem fills up fails
//! the step that can't be stored with a `disk full` error naming the run and its seqs (or the
//! blob file), fails every later step too, never panics, and damages nothing. Once room is
//! freed the store opens, the run is `failed` (or `interrupted`, where even writing its end
//! found no room), it verifies, its seqs are dense and it holds every step that returned, with
//! its output; a new run records. At every durability level, with outputs both inline and kept
//! as blob files.
//!
//! The filesystem is a 4 MiB tmpfs mounted in a private mount namespace: a shell run under
//! `unshare --user --map-root-user --mount` (no root needed where user namespaces are allowed)
//! mounts it, then runs this test binary twice, [`full_disk_record`] and, once that process has
//! ended, [`full_disk_check`]; the mount goes with the namespace. Both do nothing unless the
//! parent test started them.
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;
use retrace_core::canonical::canonical_value;
use retrace_core::run::RunStatus;
use retrace_core::{Digest, EventType};
use retrace_runtime::env_sources::new_run_id;
use retrace_runtime::{Outcome, Session, SessionOptions, ToolSpec};
use retrace_store::verify::verify_run;
use retrace_store::{open_store, StoreConfig, INLINE_BLOB_MAX};
use serde_json::{json, Value};

const CHILD: &str = "RETRACE_FULL_DISK_CHILD";
const LEVEL: &str = "RETRACE_FULL_DISK_LEVEL";
const LEVELS: &[&str] = &["event", "batch", "os"];
/// Room on the small filesystem.
const TMPFS: &str = "size=4m";
/// Bytes of a file written first and deleted once the disk is full: the room freed.
const FILLER: usize = 1 << 20;

/// An output of about 6 KB that doesn't compress; every eighth one is larger than
/// [`INLINE_BLOB_MAX`], so it is stored as a file written before its commit.
fn output(i: usize) -> Value {
    let len = if i % 8 == 7 { INLINE_BLOB_MAX + 4096 } else { 6 << 10 };
    let mut bytes = vec![0u8; len / 2];
    rand::thread_rng().fill(&mut bytes[..]);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    json!({"i": i, "data": hex})
}

/// The first child, on the tmpfs: records until the disk is full, then frees room and writes
/// down the run and the outputs of the steps that returned (`DIR/returned`).
#[test]
fn full_disk_record() {
    let Some(dir) = std::env::var_os(CHILD) else { return };
    let dir = Path::new(&dir);
    let level = std::env::var(LEVEL).expect("the parent names the level");
    let filler = dir.join("filler");
    std::fs::write(&filler, vec![7u8; FILLER]).unwrap();

    let mut config = StoreConfig::in_home(&dir.join("home"));
    config.durability = level.parse().unwrap();
    let run = new_run_id();
    let store = open_store(&config).unwrap();
    let options =
        SessionOptions { run_id: Some(run.clone()), wait_for_ack: true, ..SessionOptions::default() };
    let session = Session::record(store, options).unwrap();
    let agent = session.agent("agent");
    let mut returned: Vec<Digest> = Vec::new();
    let failure = loop {
        let i = returned.len();
        assert!(i < 10_000, "{level}: 10,000 steps of 6 KB fit in a 4 MiB filesystem");
        let stepped =
            agent.tool("work", &json!({"i": i}), ToolSpec::deterministic("1"), || Ok::<_, String>(output(i)));
        match stepped {
            Ok(out) => returned.push(Digest::of(&canonical_value(&out).unwrap())),
            Err(e) => break e.to_string(),
        }
    };
    println!("\n{level}: {} steps returned, then: {failure}", returned.len());
    assert!(returned.len() >= 20, "{level}: only {} steps fit before the disk was full", returned.len());
    assert!(failure.contains("disk full"), "{level}: the error says the disk is full: {failure}");
    assert!(failure.contains(&run), "{level}: the error names the run: {failure}");
    // Recording fails closed: no later step returns as if stored.
    let later = agent.tool("work", &json!({"i": "later"}), ToolSpec::deterministic("1"), || {
        Ok::<_, String>(json!({"small": true}))
    });
    assert!(later.is_err(), "{level}: a step after the failure returned {later:?}");
    drop(agent);
    // Finishing writes the run's end, `failed`, where the full disk still has room for it, and
    // reports the recording's failure; where it hasn't, that is reported too, not a panic.
    match session.finish(Outcome { exit_status: Some(0) }) {
        Ok(report) => println!("\n{level}: finishing: {:?}", report.status),
        Err(e) => println!("\n{level}: finishing: {e}"),
    }
    drop(session);

    std::fs::remove_file(&filler).unwrap();
    let returned: Vec<String> = returned.iter().map(Digest::to_string).collect();
    std::fs::write(dir.join("returned"), format!("{run}\n{}", returned.join("\n"))).unwrap();
}

/// The second child, after the first ended (its lease holder is dead, as when a program that
/// met a full disk exits): opens the store, checks the run the first one left, then records a
/// new run in the room freed.
#[test]
fn full_disk_check() {
    let Some(dir) = std::env::var_os(CHILD) else { return };
    let level = std::env::var(LEVEL).expect("the parent names the level");
    let written = std::fs::read_to_string(Path::new(&dir).join("returned")).unwrap();
    let mut lines = written.lines();
    let run = lines.next().unwrap().to_owned();
    let returned: Vec<Digest> = lines.map(|d| d.parse().unwrap()).collect();
    let mut config = StoreConfig::in_home(&Path::new(&dir).join("home"));
    config.durability = level.parse().unwrap();
    let store = open_store(&config).unwrap();
    assert_eq!(store.lease_holder(&run).unwrap(), None, "{level}: run {run} is held");
    // The run ended `failed` if finishing found room to write that. Otherwise the recorder let
    // go of its lease if that small write found room, and the run is interrupted once the grace
    // a run without a live lease gets (for a recorder that hasn't taken it yet) has passed
    // since it started, as when a recorder dies.
    let began = Instant::now();
    while store.run(&run).unwrap().status == RunStatus::Running && began.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(250));
        store.recover_interrupted().unwrap();
    }
    let status = store.run(&run).unwrap().status;
    assert!(matches!(status, RunStatus::Failed | RunStatus::Interrupted), "{level}: run {run} is {status:?}");
    let problems = verify_run(store.as_ref(), &run);
    assert!(problems.is_empty(), "{level}: run {run}: {problems:#?}");
    let events = store.events(&run, 1, 1_000_000).unwrap();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "{level}: seqs are dense");
    }
    let calls: Vec<_> = events.iter().filter(|e| e.kind == EventType::ToolCall).collect();
    assert!(
        calls.len() >= returned.len(),
        "{level}: {} calls stored, {} returned",
        calls.len(),
        returned.len()
    );
    for (i, digest) in returned.iter().enumerate() {
        assert_eq!(calls[i].output_ref, Some(*digest), "{level}: step {i} returned");
        let bytes = store.get_blob(digest).unwrap();
        assert_eq!(Digest::of(&bytes), *digest, "{level}: step {i}'s output reads back");
    }

    // The freed room takes a new run.
    let again = new_run_id();
    let options =
        SessionOptions { run_id: Some(again.clone()), wait_for_ack: true, ..SessionOptions::default() };
    let session = Session::record(store.clone(), options).unwrap();
    let agent = session.agent("agent");
    for i in 0..5 {
        agent
            .tool("small", &json!({"i": i}), ToolSpec::deterministic("1"), || Ok::<_, String>(json!(i)))
            .unwrap();
    }
    drop(agent);
    session.finish(Outcome { exit_status: Some(0) }).unwrap();
    assert_eq!(store.run(&again).unwrap().status, RunStatus::Ok, "{level}: the new run");
    assert!(verify_run(store.as_ref(), &again).is_empty(), "{level}: the new run verifies");
    println!(
        "\n{level}: checked: run {status:?}, the {} steps that returned are among the {} stored",
        returned.len(),
        calls.len()
    );
}

#[test]
fn a_full_disk_fails_the_step_and_damages_nothing_at_every_durability_level() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    // The levels run at once: each waits out the grace of a run without a lease.
    let children: Vec<_> = LEVELS
        .iter()
        .map(|level| {
            let dir = tempfile::tempdir().unwrap();
            let exe = std::env::current_exe().unwrap();
            let script = r#"mount -t tmpfs -o "$0" tmpfs "$1" && "$2" full_disk_record --exact --nocapture --test-threads=1 && "$2" full_disk_check --exact --nocapture --test-threads=1"#;
            let child = Command::new("unshare")
                .args(["--user", "--map-root-user", "--mount", "--", "sh", "-c", script, TMPFS])
                .arg(dir.path())
                .arg(&exe)
                .env(CHILD, dir.path())
                .env(LEVEL, level)
                .env_remove("RETRACE_HOME")
                .env_remove("RETRACE_STORE")
                .env_remove("RETRACE_BLOBS")
                .env_remove("RETRACE_DURABILITY")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("running unshare (util-linux) for a private tmpfs");
            (level, dir, child)
        })
        .collect();
    for (level, _dir, child) in children {
        let child = child.wait_with_output().unwrap();
        let said =
            format!("{}{}", String::from_utf8_lossy(&child.stdout), String::from_utf8_lossy(&child.stderr));
        assert!(child.status.success(), "{level}: the child failed ({}):\n{said}", child.status);
        assert!(said.contains(&format!("{level}: checked")), "{level}: the child didn't run:\n{said}");
        said.lines().filter(|l| l.starts_with(&format!("{level}: "))).for_each(|l| eprintln!("{l}"));
    }
}
