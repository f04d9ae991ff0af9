//! Crash safety of recording (SPEC §1 "acknowledged", §7 "Interrupted recordings"): a child
//! process records from several threads into SQLite and is killed with SIGKILL at random moments,
//! many mid-commit. After each kill, opening the store marks the run `interrupted`, the run
//! verifies, its seqs are dense, and every event the child saw acknowledged is stored with the
//! hash it was acknowledged with, at every durability level.
//!
//! The child is this test binary run again with `RETRACE_CRASH_CHILD=1`: [`crash_child`] does
//! nothing otherwise.
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use retrace_core::canonical::canonical_value;
use retrace_core::run::{RunMeta, RunMode, RunStatus};
use retrace_core::{Digest, Event, EventType};
use retrace_runtime::env_sources::new_run_id;
use retrace_runtime::{Session, SessionOptions, ToolSpec};
use retrace_store::verify::verify_run;
use retrace_store::{
    open_store, BlobHint, BlobPut, LeaseHolder, RunWriter, Store, StoreConfig, INLINE_BLOB_MAX,
};
use serde_json::{json, Value};

const CHILD: &str = "RETRACE_CRASH_CHILD";
const RUN: &str = "RETRACE_CRASH_RUN";
const VIA: &str = "RETRACE_CRASH_VIA";
/// What the child prints before each line it means, so the test harness's own output (which
/// may share a line with it) is told apart.
const MARK: &str = "retrace-crash ";
const THREADS: usize = 4;
const LEVELS: &[&str] = &["event", "batch", "os"];
const KILLS_PER_LEVEL: usize = 18;

// ---- The child -----------------------------------------------------------------------------

/// The recording child; a no-op unless the parent test started this binary to kill it.
#[test]
fn crash_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let run = std::env::var(RUN).expect("the parent names the run");
    let store = open_store(&StoreConfig::from_env().unwrap()).unwrap();
    match std::env::var(VIA).as_deref() {
        Ok("writer") => record_through_the_writer(store, &run),
        Ok("session") => record_through_a_session(store, &run),
        other => panic!("{VIA}={other:?}"),
    }
    panic!("the child was never killed");
}

/// Prints one line to stdout in a single write, flushed: it reaches the parent whole or not at all.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    out.write_all(format!("\n{MARK}{line}\n").as_bytes()).unwrap();
    out.flush().unwrap();
}

/// An output blob: now and then one large enough to be a file written before its commit.
fn output(i: u64) -> Vec<u8> {
    let len = if i % 16 == 15 { INLINE_BLOB_MAX + 1024 } else { 64 };
    let mut bytes = vec![0u8; len];
    rand::thread_rng().fill(&mut bytes[..]);
    bytes
}

/// Four threads append tool calls through one [`RunWriter`]; each acknowledged event is printed
/// as `ack <seq> <hash>`.
fn record_through_the_writer(store: Arc<dyn Store>, run: &str) {
    store.create_run(&RunMeta::new(run, RunMode::Record, 0)).unwrap();
    let writer = RunWriter::open(store, run, LeaseHolder::current()).unwrap();
    say("ready");
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let writer = &writer;
            scope.spawn(move || {
                for i in 0..1_000_000u64 {
                    let request =
                        BlobPut::new(canonical_value(&json!({"t": t, "i": i})).unwrap(), BlobHint::Raw);
                    let output = BlobPut::new(output(i), BlobHint::Raw);
                    let mut e = Event::new(run, format!("agent-{t}"), EventType::ToolCall);
                    e.name = Some("work".into());
                    e.lamport = i + 1;
                    e.key = request.digest();
                    e.request_ref = Some(request.digest());
                    e.output_ref = Some(output.digest());
                    e.output_hash = Some(output.digest());
                    let acked = writer.append_sync(e, vec![request, output]).unwrap();
                    say(&format!("ack {} {}", acked.seq, acked.hash));
                }
            });
        }
    });
}

/// Four agents of one [`Session`] (waiting for acknowledgment) call tools, every fifth a side
/// effect; each step that returned is printed as `step <agent> <i> <output digest>`.
fn record_through_a_session(store: Arc<dyn Store>, run: &str) {
    let options =
        SessionOptions { run_id: Some(run.to_owned()), wait_for_ack: true, ..SessionOptions::default() };
    let session = Session::record(store, options).unwrap();
    say("ready");
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let agent = session.agent(&format!("agent-{t}"));
            scope.spawn(move || {
                for i in 0..1_000_000u64 {
                    let spec =
                        if i % 5 == 4 { ToolSpec::side_effect("1") } else { ToolSpec::deterministic("1") };
                    let pad = "x".repeat(if i % 16 == 15 { INLINE_BLOB_MAX } else { 8 });
                    let out: Value = agent
                        .tool("work", &json!({"t": t, "i": i}), spec, || {
                            Ok::<_, String>(json!({"r": rand::random::<u64>(), "pad": pad}))
                        })
                        .unwrap();
                    let digest = Digest::of(&canonical_value(&out).unwrap());
                    say(&format!("step agent-{t} {i} {digest}"));
                }
            });
        }
    });
}

// ---- The parent ----------------------------------------------------------------------------

/// What one child said before it died.
#[derive(Debug, Default)]
struct Said {
    ready: bool,
    /// `(seq, hash)` of each acknowledged event (writer).
    acks: Vec<(u64, Digest)>,
    /// `(agent, i, output digest)` of each step that returned (session).
    steps: Vec<(String, usize, Digest)>,
}

impl Said {
    fn hear(&mut self, line: &str) {
        let Some((_, said)) = line.split_once(MARK) else { return };
        let words: Vec<&str> = said.split(' ').collect();
        match words[..] {
            ["ready"] => self.ready = true,
            ["ack", seq, hash] => self.acks.push((seq.parse().unwrap(), hash.parse().unwrap())),
            ["step", agent, i, digest] => {
                self.steps.push((agent.to_owned(), i.parse().unwrap(), digest.parse().unwrap()))
            }
            _ => panic!("the child said {said:?}"),
        }
    }
}

/// Starts a child recording `run` through `via`, kills it 5–120 ms after it started recording,
/// and returns what it said.
fn record_and_kill(home: &Path, level: &str, run: &str, via: &str) -> Said {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env(RUN, run)
        .env(VIA, via)
        .env("RETRACE_HOME", home)
        .env("RETRACE_DURABILITY", level)
        .env_remove("RETRACE_STORE")
        .env_remove("RETRACE_BLOBS")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (lines, heard) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut said = Said::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !said.ready {
        let left = deadline.saturating_duration_since(Instant::now());
        match heard.recv_timeout(left) {
            Ok(line) => said.hear(&line),
            Err(e) => {
                let _ = child.kill();
                panic!("the child never started recording ({e}); status {:?}", child.wait());
            }
        }
    }
    std::thread::sleep(Duration::from_millis(rand::thread_rng().gen_range(5..=120)));
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(status.code().is_none(), "the child ended by itself: {status}");
    reader.join().unwrap();
    heard.try_iter().for_each(|line| said.hear(&line));
    said
}

/// Reopens the store and checks what the killed child left.
fn check(config: &StoreConfig, run: &str, said: &Said) {
    let store = open_store(config).unwrap();
    let meta = store.run(run).unwrap();
    assert_eq!(meta.status, RunStatus::Interrupted, "run {run}");
    let problems = verify_run(store.as_ref(), run);
    assert!(problems.is_empty(), "run {run}: {problems:#?}");
    let events = store.events(run, 1, 10_000_000).unwrap();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "run {run}: seqs are dense");
    }
    for &(seq, hash) in &said.acks {
        let stored = events.get(seq as usize - 1).map(|e| e.hash);
        assert_eq!(stored, Some(hash), "run {run}: acknowledged seq {seq}");
    }
    for (agent, i, digest) in &said.steps {
        let calls: Vec<&Event> =
            events.iter().filter(|e| &e.agent_id == agent && e.kind == EventType::ToolCall).collect();
        let stored = calls.get(*i).and_then(|e| e.output_ref);
        assert_eq!(stored, Some(*digest), "run {run}: step {i} of {agent} returned");
        let request = store.get_blob(&calls[*i].request_ref.unwrap()).unwrap();
        let t: usize = agent["agent-".len()..].parse().unwrap();
        let expected = canonical_value(&json!({"t": t, "i": i})).unwrap();
        assert_eq!(request, expected, "run {run}: step {i} of {agent}");
    }
}

#[test]
fn acknowledged_events_survive_sigkill_at_every_durability_level() {
    let started = Instant::now();
    let mut acked = 0;
    for level in LEVELS {
        let home = tempfile::tempdir().unwrap();
        let mut config = StoreConfig::in_home(home.path());
        config.durability = level.parse().unwrap();
        for kill in 0..KILLS_PER_LEVEL {
            let via = if kill % 2 == 0 { "writer" } else { "session" };
            let run = new_run_id();
            let said = record_and_kill(home.path(), level, &run, via);
            check(&config, &run, &said);
            // Under `event`, the child synced acknowledgments in its run's ack log; reopening
            // the store recovered it (the database already held every record: SIGKILL keeps
            // the page cache) and deleted it.
            let logs = home.path().join("retrace.db-acklog");
            assert_eq!(logs.exists(), *level == "event", "{level}: ack log folder");
            if logs.exists() {
                assert_eq!(std::fs::read_dir(&logs).unwrap().count(), 0, "{level}: an ack log is left");
            }
            acked += said.acks.len() + said.steps.len();
        }
    }
    let kills = LEVELS.len() * KILLS_PER_LEVEL;
    assert!(acked >= kills, "only {acked} acknowledged steps over {kills} kills");
    eprintln!("{kills} kills, {acked} acknowledged steps checked, {:?}", started.elapsed());
}
