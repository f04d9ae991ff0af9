//! `--help`, `runs`, `show`, `verify`, `demo`, argument errors, a closed stdout, an older store.
use super::*;

#[test]
fn every_command_teaches_with_help() {
    let home = Home::new();
    let commands = [
        "demo", "record", "replay", "fork", "diff", "resolve", "runs", "knew", "show", "verify", "serve",
        "simulate", "export", "import", "retain", "gc", "delete", "vault", "gate", "ledger", "approve",
        "agents",
    ];
    for command in commands {
        // `-h` shows the examples; `--help` the whole account before them.
        let short = home.run(&[command, "-h"]);
        short.expect(0, &["Usage: retrace", "Examples:\n  "], &[]);
        let long = home.run(&[command, "--help"]);
        long.expect(0, &["Usage: retrace", "Examples:\n  "], &[]);
        assert!(
            long.stdout().len() > short.stdout().len() + 200,
            "`retrace {command} --help` explains no more than -h"
        );
    }
    // The edits a fork takes are listed where `--edit` points.
    let fork = home.run(&["fork", "--help"]);
    fork.expect(
        0,
        &["swap:A,B", "tool-output:SEQ=@FILE", "model:AGENT=NAME[@SNAP]", "each explained under --help"],
        &[],
    );
    home.run(&["show"]).expect(2, &[], &["RUN"]);
    home.run(&["verify"]).expect(2, &[], &["--all"]);
}

/// `retrace -h` and `--help` teach before any command is chosen: what Retrace does, where to
/// start, the exit codes scripts rely on and the environment a store and a CI need.
#[test]
fn the_top_level_help_says_what_retrace_does_the_exit_codes_and_the_environment() {
    let home = Home::new();
    for flag in ["-h", "--help"] {
        home.run(&[flag]).expect(
            0,
            &[
                "replay them exactly",
                "Start with `retrace demo`",
                "Exit codes:\n  0  ok\n  1  a divergence",
                "  2  usage, input or store error",
                "RETRACE_HOME",
                "RETRACE_STORE",
                "RETRACE_BLOBS",
                "RETRACE_DURABILITY",
                "RETRACE_MASK_KEY",
                "RETRACE_VAULT_KEY",
                "Commands:",
            ],
            &[],
        );
    }
    let long = home.run(&["--help"]);
    long.expect(0, &["`retrace record -- CMD` runs a program"], &[]);
    assert!(!long.stdout().contains("The `retrace` command line."), "{}", long.stdout());
}

#[test]
fn runs_lists_a_table_or_json() {
    let empty = Home::new();
    // Reading creates nothing: a mistyped RETRACE_HOME is said on stderr, and no runs listed
    // (QA9 D8: not a usage error a script must tell from a real one).
    empty.run(&["runs"]).expect(0, &[], &["no store at", "retrace.db", "nothing has been recorded there"]);
    assert!(!empty.file("retrace.db").exists());
    let made = Ran(empty.command(&["runs"]).env("RETRACE_HOME", empty.file("sub")).output().unwrap());
    made.expect(0, &[], &["no store at"]);
    assert!(!empty.file("sub").exists(), "`runs` made the folder of a store it then found empty");
    std::fs::write(empty.file("a-file"), "x").unwrap();
    let file = Ran(empty.command(&["runs"]).env("RETRACE_HOME", empty.file("a-file")).output().unwrap());
    file.expect(2, &[], &["a-file is a file", "RETRACE_HOME names a folder"]);
    // A store that exists and holds nothing.
    empty.run(&["record", "--", "true"]).expect(0, &[], &[]);
    let home = Home::with(&conversation(RUN, 2));
    home.run(&["runs"]).expect(
        0,
        &["ID", "STATUS", RUN, "fixture", "record", "ok", "2023-11-14 22:13:20"],
        &[],
    );
    let json: serde_json::Value = serde_json::from_str(&home.run(&["runs", "--json"]).stdout()).unwrap();
    assert_eq!((json[0]["id"].as_str(), json[0]["events"].as_u64()), (Some(RUN), Some(9)));
}

#[test]
fn show_gives_few_lanes_room_for_long_labels() {
    const TOOL: &str = "warehouse.inventory.reconcile_backordered_items_v2";
    let run = |agents: &[&str]| {
        let mut b = Builder::new(RUN);
        for agent in agents {
            b.push(agent, retrace_core::EventType::ToolCall, Some(TOOL), None, Some(b"{}".to_vec()), |_| {});
        }
        Home::with(&b.finish(retrace_core::run::RunMode::Record))
    };
    let one = run(&["clerk"]).run(&["show", RUN]).expect(0, &[], &[]).stdout();
    assert!(one.contains(&format!("tool_call {TOOL}")), "one lane shows the whole name:\n{one}");
    let four =
        run(&["a", "b", "c", "d"]).run(&["show", RUN]).expect(0, &["tool_call warehouse"], &[]).stdout();
    assert!(!four.contains(TOOL) && four.contains('…'), "four lanes are cut to fit:\n{four}");
}

#[test]
fn show_draws_lanes_and_one_event() {
    let home = Home::with(&conversation(RUN, 2));
    let timeline =
        home.run(&["show", "01clirun"]).expect(0, &["SEQ", "LAMPORT", "planner", "reviewer"], &[]).stdout();
    let rows: Vec<&str> = timeline.lines().skip(2).collect();
    assert_eq!(rows.len(), 9, "{timeline}");
    assert!(rows[0].contains("model_call gpt-4o") && rows[2].contains("deliver <- planner #2"), "{timeline}");
    // The reviewer's lane is to the right of the planner's.
    assert!(rows[2].find("deliver").unwrap() > rows[0].find("model_call").unwrap(), "{timeline}");
    let lane = home.run(&["show", RUN, "--agent", "reviewer"]).expect(0, &["decision approve"], &[]).stdout();
    assert!(!lane.contains("model_call"), "{lane}");
    home.run(&["show", RUN, "--seq", "1"]).expect(
        0,
        &["seq 1: model_call gpt-4o", "request (sha256:", "JSON):", "\"messages\": [", "output ("],
        &[],
    );
    home.run(&["show", RUN, "--seq", "4"]).expect(0, &["binary, base64", "/wD+AA=="], &[]);
    let json: serde_json::Value =
        serde_json::from_str(&home.run(&["show", RUN, "--seq", "1", "--json"]).stdout()).unwrap();
    assert_eq!(json["request"]["json"]["model"], "gpt-4o");
    let all: serde_json::Value = serde_json::from_str(&home.run(&["show", RUN, "--json"]).stdout()).unwrap();
    assert_eq!(all["events"].as_array().unwrap().len(), 9);
    home.run(&["show", RUN, "--seq", "99"]).expect(2, &[], &["has 9 events; there is no seq 99"]);
    home.run(&["show", RUN, "--agent", "nobody"]).expect(
        2,
        &[],
        &["no agent \"nobody\" (agents: planner, reviewer)"],
    );
    home.run(&["show", "zzzz"]).expect(2, &[], &["error: no run", "hint: list the runs"]);
}

#[test]
fn verify_passes_a_sound_run_and_names_a_tampered_event() {
    let home = Home::with(&conversation(RUN, 2));
    home.run(&["verify", RUN]).expect(0, &["ok: run 01clirun", "9 events"], &[]);
    home.run(&["verify", "--all"]).expect(0, &["ok: 1 run"], &[]);
    let mut tampered = conversation("01tampered", 2);
    tampered.events[6].latency_ms = Some(1);
    let store = open_store(&StoreConfig::in_home(home.dir.path())).unwrap();
    tampered.commit(&*store);
    drop(store);
    home.run(&["verify", "01tampered"]).expect(
        1,
        &["run 01tampered seq 7: hash mismatch"],
        &["verification found 1 problem"],
    );
    home.run(&["verify", "--all"]).expect(1, &["run 01tampered seq 7"], &[]);
    let json: serde_json::Value =
        serde_json::from_str(&home.run(&["verify", "--all", "--json"]).stdout()).unwrap();
    assert_eq!((json["ok"].as_bool(), json["problems"][0]["kind"].as_str()), (Some(false), Some("hash")));
}

#[test]
fn a_closed_stdout_ends_printing_commands_quietly() {
    let home = Home::with(&conversation(RUN, 3));
    // The reading end is closed before the command writes: its first write fails, whether
    // through a returned error (the listings) or `println!` (the demo's story, a record's id).
    for args in [
        &["runs", "--json"][..],
        &["runs"],
        &["show", RUN],
        &["demo", "--runs", "1"],
        &["record", "--", "true"],
    ] {
        let mut child = home.command(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let out = Ran(child.wait_with_output().unwrap());
        out.expect(0, &[], &[]);
        if !matches!(args[0], "record" | "demo") {
            assert_eq!(out.stderr(), "", "{args:?}");
        }
    }
    // But a verdict stays a verdict, and a trace its reader didn't get whole is no success:
    // `verify` of a damaged store exits 1, `export` to the closed pipe 141 (as `cat` would).
    let mut tampered = conversation("01tampered", 2);
    tampered.events[6].latency_ms = Some(1);
    tampered.commit(&*open_store(&StoreConfig::in_home(home.dir.path())).unwrap());
    for (args, code) in
        [(&["verify", "--all"][..], 1), (&["verify", "--all", "--json"], 1), (&["export", RUN], 141)]
    {
        let mut child = home.command(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let out = Ran(child.wait_with_output().unwrap());
        assert_eq!(out.0.status.code(), Some(code), "{args:?}: {}", out.stderr());
        if code == 141 {
            assert_eq!(out.stderr(), "", "{args:?}");
        }
    }
}

#[test]
fn demo_run_counts_start_at_one_and_json_follows_a_demo_s_name() {
    let home = Home::new();
    for args in [&["demo", "--runs", "0"][..], &["demo", "single", "--runs", "0"]] {
        home.run(args).expect(2, &[], &["invalid value '0' for '--runs <RUNS>': want at least 1 run"]);
    }
    // Refused before anything ran: not even a store was made. No store lists no runs, and
    // says why on stderr; `verify --all` refuses to pass a check of nothing.
    home.run(&["runs"]).expect(0, &[], &["nothing has been recorded there"]);
    let listed = home.run(&["runs", "--json"]);
    listed.expect(0, &[], &["nothing has been recorded there"]);
    assert_eq!(listed.stdout().trim(), "[]");
    assert!(!home.dir.path().join("retrace.db").exists(), "listing made no store");
    home.run(&["verify", "--all"]).expect(2, &[], &["nothing has been recorded there"]);
    let single = home.run(&["demo", "single", "--runs", "1", "--replays", "1", "--json"]);
    single.expect(0, &[], &[]);
    let report: serde_json::Value = serde_json::from_str(&single.stdout()).unwrap();
    assert_eq!(report["runs"].as_array().map(Vec::len), Some(1), "{report}");
    assert_eq!(report["runs"][0]["live_calls_replayed"], 0, "{report}");
}

#[test]
fn bad_arguments_are_named_before_anything_runs() {
    let home = Home::with(&conversation(RUN, 1));
    home.run(&["record", "--upstream-openai", "notaurl", "--", "true"]).expect(
        2,
        &[],
        &["\"notaurl\"", "--upstream-openai", "not an http:// or https:// URL"],
    );
    home.run(&["retain", RUN, "forever"]).expect(2, &[], &["(want one of: routine, incident, pinned)"]);
    // A folder that can't be made (a file stands in the way; /proc refuses even root).
    home.run(&["export", RUN, "-o", "/proc/self/x/y.jsonl"]).expect(
        2,
        &[],
        &["cannot write /proc/self/x/y.jsonl: cannot make its folder /proc/self/x"],
    );
    assert_eq!(runs_of(&home).len(), 1, "no run was created for a bad upstream");
}

#[test]
fn a_timeout_flag_takes_seconds_up_to_a_year_and_an_upstream_more_than_none() {
    let home = Home::new();
    for value in ["1e308", "--upstream-timeout=-1", "soon"] {
        let args = match value.starts_with("--") {
            true => vec!["record", value, "--", "true"],
            false => vec!["record", "--upstream-timeout", value, "--", "true"],
        };
        home.run(&args).expect(2, &[], &[value.trim_start_matches("--upstream-timeout="), "seconds"]);
    }
    home.run(&["serve", "--stall-timeout", "NaN"]).expect(2, &[], &["NaN", "seconds"]);
    // An upstream given no time fails every call: refused, not silently made a millisecond.
    for command in ["record", "serve"] {
        let args = match command {
            "record" => vec![command, "--upstream-timeout", "0", "--", "true"],
            _ => vec![command, "--upstream-timeout", "0"],
        };
        home.run(&args).expect(2, &[], &["0 would time out every call", "0.001"]);
    }
    home.run(&["record", "--upstream-timeout", "0.5", "--", "true"]).expect(0, &[], &[]);
}

#[test]
fn opening_an_older_store_says_it_upgraded_it_once() {
    let home = Home::with(&conversation(RUN, 2));
    home.run(&["runs"]).expect(0, &[RUN], &[]);
    assert!(!home.run(&["runs"]).stderr().contains("upgraded"), "a current store is not upgraded");
    // Version 1 is version 2 without the cache table.
    rusqlite::Connection::open(home.file("retrace.db"))
        .unwrap()
        .execute_batch("DROP TABLE cache; PRAGMA user_version = 1;")
        .unwrap();
    let version = retrace_store::sqlite::schema::SCHEMA_VERSION.to_string();
    let notice = format!("from schema version 1 to {version}");
    home.run(&["runs"]).expect(
        0,
        &[RUN],
        &["upgraded the store", "retrace.db", &notice, "older than this one"],
    );
    let again = home.run(&["runs", "--json"]);
    again.expect(0, &[RUN], &[]);
    assert_eq!(again.stderr(), "", "the upgrade is said once");
}

/// A store whose folder can't be written (a read-only mount, a CI artifact): the commands that
/// only read it read it as it is, with a note; the ones that write say plainly that the folder
/// is not writable and what to do, not SQLite's "unable to open database file". Made read-only
/// with `chattr +i`, which holds even for root; skipped where the file system or the user can't
/// set it.
/// A database file that can't be written in a folder that can: a command that writes names the
/// file (QA31 D2: SQLite's bare "attempt to write a readonly database"). Skipped as above.
#[test]
fn a_database_file_that_cant_be_written_is_named() {
    let home = Home::with(&conversation(RUN, 2));
    let db = home.file("retrace.db");
    let set = Command::new("chattr").arg("+i").arg(&db).stderr(Stdio::null()).status();
    if !set.is_ok_and(|s| s.success()) {
        eprintln!("skipped: chattr +i is not available here");
        return;
    }
    let ran = home.run(&["record", "--", "true"]);
    let _ = Command::new("chattr").arg("-i").arg(&db).status();
    ran.expect(2, &[], &["the store can't be written", &format!("{} is not writable", db.display())]);
}

#[test]
fn a_store_in_a_folder_that_cant_be_written_is_read_as_it_is() {
    struct Immutable<'a>(&'a Path);
    impl Drop for Immutable<'_> {
        fn drop(&mut self) {
            let _ = Command::new("chattr").arg("-i").arg(self.0).status();
        }
    }
    let home = Home::with(&conversation(RUN, 2));
    let out = tempfile::tempdir().unwrap();
    let trace = out.path().join("trace.jsonl");
    home.run(&["export", RUN, "-o", trace.to_str().unwrap()]).expect(0, &[], &[]);
    let set = Command::new("chattr").arg("+i").arg(home.dir.path()).stderr(Stdio::null()).status();
    if !set.is_ok_and(|s| s.success()) {
        eprintln!("skipped: chattr +i is not available here");
        return;
    }
    let _undo = Immutable(home.dir.path());
    if std::fs::write(home.file("probe"), "x").is_ok() {
        eprintln!("skipped: chattr +i did not make the folder read-only");
        return;
    }
    let note = "reading the store read-only, as it was left";
    let exported = out.path().join("again.jsonl");
    let export = ["export", RUN, "-o", exported.to_str().unwrap()];
    let read = [
        &["runs"][..],
        &["show", RUN],
        &["verify", "--all"],
        &["diff", RUN, RUN],
        &["vault", "audit"],
        &export,
    ];
    for args in read {
        let ran = home.run(args);
        ran.expect(0, &[], &[note, "is not writable"]);
    }
    assert_eq!(std::fs::read(&exported).unwrap(), std::fs::read(&trace).unwrap(), "the same bytes");
    for args in [&["replay", RUN][..], &["delete", RUN], &["import", trace.to_str().unwrap()]] {
        home.run(args).expect(2, &[], &["is not writable", "RETRACE_HOME", "read it as it is"]);
    }
    // A dry run writes and rolls back: it works on a private copy, and says what it would do.
    let copy = "the dry run works on a private copy";
    home.run(&["delete", RUN, "--dry-run"]).expect(0, &[&format!("would delete run {RUN}")], &[copy]);
    home.run(&["gc", "--dry-run", "--older-than", "0"]).expect(
        0,
        &[&format!("would delete run {RUN}")],
        &[copy],
    );
    home.run(&["runs"]).expect(0, &[RUN], &[note]);
    serve_read_only(&home, &trace);
}

/// `serve` over the read-only store of [`a_store_in_a_folder_that_cant_be_written_is_read_as_it_is`]
/// (no mask key in it): its runs are listed and exported byte for byte, and a new recording is
/// refused saying why.
fn serve_read_only(home: &Home, trace: &Path) {
    struct Daemon(std::process::Child);
    impl Drop for Daemon {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = home
        .command(&["serve", "--addr", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let _daemon = Daemon(child);
    let mut said = String::new();
    while !said.contains("no tokens") {
        let mut line = String::new();
        let read = std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
        assert!(read > 0, "serve ended before serving: {said}");
        said.push_str(&line);
    }
    for needle in
        ["reading the store read-only", "serving on", "recording, replays and admin changes are refused"]
    {
        assert!(said.contains(needle), "{needle:?} in {said}");
    }
    let (status, runs) = http(port, "GET", "/api/runs", "");
    assert_eq!(status, 200, "{runs}");
    assert!(runs.contains(RUN), "{runs}");
    let (status, exported) = http(port, "GET", &format!("/api/runs/{RUN}/export"), "");
    assert_eq!((status, exported.into_bytes()), (200, std::fs::read(trace).unwrap()), "the same bytes");
    let (status, refused) = http(port, "POST", "/api/runs", r#"{"name":"new"}"#);
    assert!(status == 409 && refused.contains(r#""code":"read_only""#), "{status} {refused}");
    assert!(refused.contains("is open read-only"), "{refused}");
}

/// One HTTP/1.1 request over a fresh loopback connection: the status and the body.
fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("a whole response");
    let head = String::from_utf8_lossy(&answer[..split]).to_ascii_lowercase();
    let body = &answer[split + 4..];
    let status = head[9..12].parse().unwrap();
    let body = if head.contains("transfer-encoding: chunked") { unchunk(body) } else { body.to_vec() };
    (status, String::from_utf8(body).unwrap())
}

/// The body of a chunked HTTP/1.1 response.
fn unchunk(mut rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let end = rest.windows(2).position(|w| w == b"\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..end]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&rest[end + 2..end + 2 + size]);
        rest = &rest[end + 4 + size..];
    }
}

/// An agent id with a newline and an escape sequence (the recorded program chose it) is shown on
/// one line, escaped, by every text view: `show --seq`, `knew` and `show --agent`'s error, as by
/// the timeline. Raw, it would split records and could drive the reader's terminal.
#[test]
fn an_agent_id_with_control_characters_is_shown_escaped_everywhere() {
    use retrace_core::envelope::MessageRef;
    use retrace_core::run::RunMode;
    use retrace_core::EventType;
    let evil = "evil\n\u{1b}[31mred";
    let mut b = Builder::new(RUN);
    let send = b.push(
        evil,
        EventType::Send,
        Some("reviewer"),
        Some((b"{}".to_vec(), retrace_store::BlobHint::Raw)),
        None,
        |e| {
            e.message = Some(MessageRef {
                from: Some(evil.into()),
                to: Some("reviewer".into()),
                kind: None,
                timed_out: false,
            });
        },
    );
    let deliver = b.deliver("reviewer", send);
    let acted = b.push("reviewer", EventType::ToolCall, Some("t"), None, None, |e| e.inbound = vec![deliver]);
    let home = Home::with(&b.finish(RunMode::Record));
    let shown = r"evil\n\u{1b}[31mred";
    let outputs = [
        home.run(&["show", RUN, "--seq", &send.to_string()]),
        home.run(&["knew", RUN, &acted.to_string()]),
        home.run(&["show", RUN, "--agent", "nobody"]),
        home.run(&["show", RUN]),
    ];
    for ran in outputs {
        let all = format!("{}{}", ran.stdout(), ran.stderr());
        assert!(all.contains(shown), "escaped: {all}");
        assert!(!all.contains('\u{1b}') && !all.contains("evil\n"), "raw: {all:?}");
    }
}

#[test]
fn an_empty_name_or_label_key_is_refused_before_a_store_is_made() {
    let home = Home::new();
    home.run(&["record", "--name", "", "--", "true"]).expect(2, &[], &["the run's name is empty"]);
    home.run(&["record", "--name", "  ", "--", "true"]).expect(2, &[], &["the run's name is empty"]);
    home.run(&["record", "--label", "=data", "--", "true"]).expect(2, &[], &["a label's key is empty"]);
    let made: Vec<_> = std::fs::read_dir(home.dir.path()).unwrap().collect();
    assert!(made.is_empty(), "nothing was created: {made:?}");
    // A label's value may be empty.
    home.run(&["record", "--name", "n", "--label", "team=", "--", "true"]).expect(0, &[], &[]);
    assert_eq!(runs_of(&home).len(), 1);
}

/// `show --seq` prints the first 64 KiB of a large request or output and says what is left and
/// how to see it all (`--full`, or `--json`); recorded text can't drive the terminal.
#[test]
fn show_seq_cuts_a_large_output_and_full_prints_it_whole() {
    use retrace_core::run::RunMode;
    use retrace_core::EventType;
    let text = format!("\u{1b}[2J{}", "é".repeat(100_000));
    let mut b = Builder::new(RUN);
    let seq = b.push("a", EventType::ToolCall, Some("t"), None, Some(text.clone().into_bytes()), |_| {});
    let home = Home::with(&b.finish(RunMode::Record));
    let shown = home.run(&["show", RUN, "--seq", &seq.to_string()]);
    shown.expect(0, &["200004 bytes, text", "more bytes", &format!("--seq {seq} --full")], &[]);
    let out = shown.stdout();
    assert!(out.len() < 70 << 10, "cut: {} bytes", out.len());
    assert!(!out.contains('\u{1b}') && out.contains(r"\u{1b}[2J"), "escaped");
    let full = home.run(&["show", RUN, "--seq", &seq.to_string(), "--full"]);
    full.expect(0, &[], &[]);
    assert!(full.stdout().contains(&"é".repeat(100_000)) && !full.stdout().contains("more bytes"));
    let json = home.run(&["show", RUN, "--seq", &seq.to_string(), "--json"]);
    assert_eq!(json.json()["output"]["text"], text.as_str(), "--json holds it whole");
    home.run(&["show", RUN, "--full"]).expect(2, &[], &["--seq"]);
}

/// Large blobs recorded under `RETRACE_BLOBS` and read without it: the error says where they
/// most likely are, not only that the store looks damaged.
#[test]
fn a_blob_folder_left_behind_by_retrace_blobs_is_named_as_such() {
    use retrace_core::run::RunMode;
    use retrace_core::EventType;
    let home = Home::new();
    let elsewhere = tempfile::tempdir().unwrap();
    let mut b = Builder::new(RUN);
    b.push("a", EventType::ToolCall, Some("t"), None, Some(vec![b'x'; 100 << 10]), |_| {});
    let config =
        StoreConfig { blobs_dir: elsewhere.path().to_owned(), ..StoreConfig::in_home(home.dir.path()) };
    b.finish(RunMode::Record).commit(&*open_store(&config).unwrap());
    let hint =
        "holds no large blobs: if they were recorded with RETRACE_BLOBS set to another folder, set it again";
    home.run(&["verify", RUN]).expect(1, &[hint], &["verification found 1 problem"]);
    let url = format!("file://{}", elsewhere.path().display());
    let ran = Ran(home.command(&["verify", RUN]).env("RETRACE_BLOBS", &url).output().unwrap());
    ran.expect(0, &[], &[]);
}

/// A command that only reads doesn't wait for the write lock another process holds (a long
/// import, a `gc`): opening the store takes it only when a run's recorder died.
#[test]
fn reading_commands_run_while_another_process_holds_the_write_lock() {
    let home = Home::with(&conversation(RUN, 2));
    let db = home.dir.path().join("retrace.db");
    let writer = rusqlite::Connection::open(&db).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    for args in [&["runs"][..], &["show", RUN], &["verify", "--all"], &["export", RUN, "-o", "-"]] {
        home.run(args).expect(0, &[], &[]);
    }
    writer.execute_batch("COMMIT").unwrap();
}

/// `runs` filters by name, mode, status and label, and `--last N` keeps the N most recent of
/// those, still oldest first (QA7 S2: a store of thousands of runs listed whole).
#[test]
fn runs_filters_by_name_mode_status_and_label_and_keeps_the_last_n() {
    let home = Home::new();
    let record = |name: &str, label: &str, exit: &str| {
        home.run(&["record", "--name", name, "--label", label, "--", "sh", "-c", &format!("exit {exit}")])
    };
    record("nightly", "team=data", "0");
    record("nightly", "team=web", "3");
    record("adhoc", "team=data", "0");
    let nightly_ok = runs_of(&home)[0].0.clone();
    home.run(&["replay", &nightly_ok]).expect(0, &[], &[]);
    let listed = |args: &[&str]| -> Vec<(String, String, String)> {
        let mut argv = vec!["runs", "--json"];
        argv.extend_from_slice(args);
        let out = home.run(&argv);
        out.expect(0, &[], &[]);
        let runs: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
        let field = |r: &serde_json::Value, k: &str| r[k].as_str().unwrap_or_default().to_owned();
        runs.as_array()
            .unwrap()
            .iter()
            .map(|r| (field(r, "name"), field(r, "mode"), field(r, "status")))
            .collect()
    };
    let run = |name: &str, mode: &str, status: &str| (name.to_owned(), mode.to_owned(), status.to_owned());
    assert_eq!(
        listed(&["--name", "nightly", "--mode", "record"]),
        [run("nightly", "record", "ok"), run("nightly", "record", "failed")]
    );
    assert_eq!(listed(&["--status", "failed"]), [run("nightly", "record", "failed")]);
    assert_eq!(
        listed(&["--label", "team=data", "--mode", "record"]),
        [run("nightly", "record", "ok"), run("adhoc", "record", "ok")]
    );
    assert_eq!(listed(&["--last", "2"]), [run("adhoc", "record", "ok"), run("nightly", "replay", "ok")]);
    assert_eq!(listed(&["--name", "nope"]), []);
    home.run(&["runs", "--name", "nope"]).expect(0, &[], &["no runs match"]);
    home.run(&["runs", "--status", "done"]).expect(2, &[], &["unknown status \"done\""]);
    home.run(&["runs", "--label", "team"]).expect(2, &[], &["is not KEY=VALUE"]);
}

/// With --json, a command that fails says so on standard output too, as one JSON line (the
/// text still goes to standard error); a command that printed its document first adds nothing.
#[test]
fn errors_are_json_on_standard_output_with_json() {
    let home = Home::with(&trace_fixture::conversation(RUN, 1));
    let check = |args: &[&str], code: &str| {
        let ran = home.run(args);
        let stdout = ran.stdout();
        let line: serde_json::Value =
            serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout:?}"));
        assert_eq!(line["error"]["code"], code, "{args:?}: {line}");
        assert_eq!(line["error"]["exit_status"].as_i64(), ran.0.status.code().map(i64::from), "{line}");
        assert!(!ran.stderr().is_empty(), "the text is on standard error still");
        line
    };
    // One code per kind of failure, whatever the command (QA37 D2): an unknown run or seq is
    // `not_found` everywhere.
    let unknown = check(&["diff", RUN, "nosuch", "--json"], "not_found");
    assert!(unknown["error"]["message"].as_str().unwrap().contains("no run matches nosuch"), "{unknown}");
    assert!(unknown["error"]["hint"].is_string(), "{unknown}");
    check(&["show", "nosuch", "--json"], "not_found");
    check(&["fork", "--runs", "nosuch", "--json"], "not_found");
    check(&["show", RUN, "--seq", "999", "--json"], "not_found");
    check(&["knew", RUN, "999", "--json"], "not_found");
    let clap = check(&["diff", "--json"], "usage");
    assert!(clap["error"]["message"].as_str().unwrap().contains("<RUN_A>"), "{clap}");
    // Without --json, standard output stays empty.
    assert_eq!(home.run(&["diff", RUN, "nosuch"]).stdout(), "");
}

/// `show` of a run with no events says why, instead of an empty table: a replay stores only
/// its outcome (QA9 S10).
#[test]
fn show_of_a_run_with_no_events_says_why() {
    let home = Home::with(&conversation(RUN, 1));
    {
        let store = open_store(&StoreConfig::in_home(home.dir.path())).unwrap();
        let mut replay = retrace_core::run::RunMeta::new(
            "01emptyreplay0000000000000",
            retrace_core::run::RunMode::Replay,
            1,
        );
        replay.source_run = Some(RUN.into());
        replay.status = retrace_core::run::RunStatus::Ok;
        store.create_run(&replay).unwrap();
    }
    let said = home.run(&["show", "01emptyreplay"]).expect(0, &["0 events"], &[]).stdout();
    assert!(
        said.contains(&format!("(no events: a replay stores only its outcome; `retrace show {RUN}`")),
        "{said}"
    );
    assert!(!said.contains("SEQ"), "{said}");
    // Its export says what it holds; replaying one whose source this store lacks says so.
    let file = home.file("r.jsonl");
    home.run(&["export", "01emptyreplay", "-o", file.to_str().unwrap()]).expect(
        0,
        &[],
        &["is a replay: it holds only its outcome"],
    );
    let other = Home::new();
    other.run(&["import", file.to_str().unwrap()]).expect(0, &[], &[]);
    other.run(&["replay", "01emptyreplay"]).expect(
        2,
        &[],
        &[&format!("is a replay of run {RUN}, which is not in this store"), "import its trace too"],
    );
}

/// Usage errors say what is wrong with the argument given (QA37): a negative number is a bad
/// value, not clap's "use -- -1", which would run `-1` as the program; `approve --json` asks
/// for what approve needs, not for arguments that conflict; `gate` with no store to find a run
/// in says so, and makes none.
#[test]
fn usage_errors_name_the_argument_and_make_nothing() {
    let home = Home::new();
    home.run(&["record", "--chaos", "-1", "--", "true"]).expect(2, &[], &["invalid value '-1' for '--chaos"]);
    home.run(&["replay", "01abc", "--stall-timeout", "-5"]).expect(2, &[], &["-5 is not between 0"]);
    home.run(&["gate", "x.jsonl", "--timeout", "-1"]).expect(2, &[], &["-1 is not between 0"]);
    let said = home.run(&["record", "--chaos", "-1", "--", "true"]);
    assert!(!said.stderr().contains("use '-- -1'"), "{}", said.stderr());
    let approve = home.run(&["approve", "--json"]);
    approve.expect(2, &[], &["--reason <TEXT>"]);
    assert!(!approve.stderr().contains("--pending"), "{}", approve.stderr());
    home.run(&["gate", "01notarun"]).expect(2, &[], &["01notarun: no such file or folder", "no store at"]);
    assert!(!home.file("retrace.db").exists(), "gate made no store");
}
