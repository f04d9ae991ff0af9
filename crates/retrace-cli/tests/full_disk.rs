//! `retrace import` onto a full disk (issue 2, "bad input"): a clear `disk full` error naming the
//! file, exit 2, no panic, and nothing left that claims to be the run: the store verifies, and
//! once there is room the same file imports whole and exports to the same bytes.
//!
//! The store is on a 2 MiB tmpfs mounted in a private mount namespace: a shell run under
//! `unshare --user --map-root-user --mount` (no root needed where user namespaces are allowed)
//! mounts it, runs the CLI, grows the tmpfs (`remount,size=64m`) and runs it again. The file
//! imported is written outside, by the test.
#[path = "../../retrace-store/tests/trace_fixture/mod.rs"]
mod trace_fixture;

use std::path::Path;
use std::process::{Command, Stdio};

use retrace_core::run::RunMode;
use retrace_core::EventType;
use retrace_store::{open_store, BlobHint, StoreConfig, INLINE_BLOB_MAX};
use serde_json::json;
use trace_fixture::Builder;

const RUN: &str = "01fu11d15k00000000000000000";

/// Bytes that don't compress, from a small xorshift generator (seeded by `seed`).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// What a run's bytes are.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Tool outputs, 6 KB each, every eighth over [`INLINE_BLOB_MAX`] (a blob file): import
    /// stores them while it still reads the file, before the run exists.
    Tools,
    /// Model requests of 6 KB each: import stores them with the run's events, once the run exists.
    Models,
}

/// A run of 600 steps of `kind`, exported by the CLI into `dir/<kind>.jsonl`.
fn exported(dir: &Path, kind: Kind) -> std::path::PathBuf {
    let mut b = Builder::new(RUN);
    for i in 0..600u64 {
        match kind {
            Kind::Tools => {
                let len = if i % 8 == 7 { INLINE_BLOB_MAX + 4096 } else { 6 << 10 };
                let request = format!(r#"{{"i":{i}}}"#).into_bytes();
                let (request, output) = (Some((request, BlobHint::Raw)), Some(noise(i, len)));
                b.push("agent", EventType::ToolCall, Some("work"), request, output, |_| {});
            }
            Kind::Models => {
                let content: String = noise(i, 3 << 10).iter().map(|b| format!("{b:02x}")).collect();
                let messages = [json!({"role": "user", "content": content})];
                let request = serde_json::to_vec(&json!({"model": "gpt-4o", "messages": messages})).unwrap();
                let output =
                    format!(r#"{{"choices":[{{"message":{{"content":"step {i}"}}}}]}}"#).into_bytes();
                let request = Some((request, BlobHint::ModelRequest));
                b.push("agent", EventType::ModelCall, Some("gpt-4o"), request, Some(output), |_| {});
            }
        }
    }
    let home = dir.join(format!("source-{kind:?}"));
    let store = open_store(&StoreConfig::in_home(&home)).unwrap();
    b.finish(RunMode::Record).commit(&*store);
    drop(store);
    let file = dir.join(format!("{kind:?}.jsonl"));
    let exported = Command::new(env!("CARGO_BIN_EXE_retrace"))
        .args(["export", RUN, "-o"])
        .arg(&file)
        .env("RETRACE_HOME", &home)
        .env_remove("RETRACE_STORE")
        .env_remove("RETRACE_BLOBS")
        .env_remove("RETRACE_URL")
        .output()
        .unwrap();
    assert!(exported.status.success(), "export: {}", String::from_utf8_lossy(&exported.stderr));
    file
}

/// Runs `script` under `sh` in a private user and mount namespace (so it may mount a tmpfs),
/// `$1` being `args[0]`, `$2` the CLI, `$3`... the rest of `args`; its stdout and stderr, once
/// it has succeeded.
fn in_private_mount(script: &str, args: &[&std::ffi::OsStr]) -> (String, String) {
    let ran = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "--", "sh", "-c", script, "sh"])
        .arg(args[0])
        .arg(env!("CARGO_BIN_EXE_retrace"))
        .args(&args[1..])
        .env_remove("RETRACE_STORE")
        .env_remove("RETRACE_BLOBS")
        .env_remove("RETRACE_URL")
        .env_remove("RETRACE_RUN")
        .stdin(Stdio::null())
        .output()
        .expect("running unshare (util-linux) for a private tmpfs");
    let (out, err) = (String::from_utf8_lossy(&ran.stdout), String::from_utf8_lossy(&ran.stderr));
    assert!(ran.status.success(), "the script failed ({}):\nstdout:\n{out}\nstderr:\n{err}", ran.status);
    (out.into_owned(), err.into_owned())
}

/// Imports `kind`'s file onto a full disk, then again with room, all in one mount namespace;
/// what the script printed.
fn import_onto_a_full_disk(kind: Kind) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = exported(dir.path(), kind);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let script = r#"
        mount -t tmpfs -o size=2m tmpfs "$1" || exit 90
        export RETRACE_HOME="$1/home"
        echo "== import on a full disk"; "$2" import "$3"; echo "== exit $?"
        echo "== runs"; "$2" runs --json; echo "== exit $?"
        echo "== verify"; "$2" verify --all; echo "== exit $?"
        mount -o remount,size=64m tmpfs "$1" || exit 91
        echo "== import with room"; "$2" import "$3"; echo "== exit $?"
        echo "== verify"; "$2" verify --all; echo "== exit $?"
        echo "== export"; "$2" export "$4" -o "$1/again.jsonl"; echo "== exit $?"
        cmp "$3" "$1/again.jsonl" && echo "== same bytes"
    "#;
    let (out, err) = in_private_mount(script, &[mnt.as_os_str(), file.as_os_str(), RUN.as_ref()]);
    let said = format!("stdout:\n{out}\nstderr:\n{err}");
    // What each step printed on stdout, by the `== ` line before it.
    let step = |name: &str| -> String {
        let from =
            out.find(&format!("== {name}\n")).unwrap_or_else(|| panic!("{kind:?}: no {name}:\n{said}"));
        let rest = &out[from + name.len() + 4..];
        rest[..rest.find("== exit").unwrap_or(rest.len())].to_owned()
    };
    let exit = |name: &str| -> String {
        let from = out.find(&format!("== {name}\n")).unwrap();
        let rest = &out[from..];
        let at = rest.find("== exit ").unwrap() + "== exit ".len();
        rest[at..].lines().next().unwrap().to_owned()
    };
    assert_eq!(exit("import on a full disk"), "2", "{kind:?}: exit 2 on a full disk:\n{said}");
    assert!(err.contains("error: storing run") && err.contains("disk full"), "{kind:?}:\n{said}");
    // Nothing claims to be the run: no run at all, or one marked as an unfinished import.
    let runs = step("runs");
    assert!(runs.trim() == "[]" || runs.contains("retrace.unfinished_import"), "{kind:?}: {runs}\n{said}");
    assert_eq!(exit("runs"), "0");
    // What the full disk left verifies, but for a run it left unfinished, which verify names.
    let unfinished = runs.contains("retrace.unfinished_import");
    let verified = if unfinished { "1" } else { "0" };
    assert_eq!(exit("verify"), verified, "{kind:?}: what the full disk left verifies:\n{said}");
    if unfinished {
        assert!(step("verify").contains("an unfinished import"), "{kind:?}:\n{said}");
    }
    assert_eq!(exit("import with room"), "0", "{kind:?}:\n{said}");
    assert!(step("import with room").contains(RUN), "{kind:?}:\n{said}");
    assert!(out.contains("ok: 1 run, 600 events"), "{kind:?}:\n{said}");
    assert_eq!(exit("export"), "0", "{kind:?}:\n{said}");
    assert!(out.contains("== same bytes"), "{kind:?}: the run exports to the file's bytes:\n{said}");
    said
}

#[test]
fn import_onto_a_full_disk_says_so_exits_2_and_leaves_no_partial_run() {
    for kind in [Kind::Tools, Kind::Models] {
        import_onto_a_full_disk(kind);
    }
}

/// A disk filled after the store was made: opening it for writing fails in SQLite as a bare
/// "disk I/O error" (no room for the WAL index). The commands that only read open it read-only
/// as it is, saying why, so its runs can still be listed, checked and exported elsewhere; one
/// that writes says the disk is full; once there is room again the store reads as it was.
#[test]
fn a_store_on_a_disk_that_filled_up_says_the_disk_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let script = r#"
        mount -t tmpfs -o size=2m tmpfs "$1" || exit 90
        export RETRACE_HOME="$1/home"
        "$2" record -- true >/dev/null 2>&1 || exit 92
        # A command that closes the store cleanly removes its WAL index: the next must make one.
        "$2" runs >/dev/null || exit 93
        dd if=/dev/zero of="$1/fill" bs=1k 2>/dev/null
        echo "== runs"; "$2" runs; echo "== exit $?"
        run=$("$2" runs --json 2>/dev/null | grep -o '"id": "[^"]*"' | head -1 | cut -d'"' -f4)
        echo "== verify"; "$2" verify --all; echo "== exit $?"
        echo "== export"; "$2" export "$run" -o "$3/moved.jsonl"; echo "== exit $?"
        echo "== record"; "$2" record -- true; echo "== exit $?"
        rm "$1/fill"
        echo "== runs with room"; "$2" runs --json; echo "== exit $?"
    "#;
    let (out, err) = in_private_mount(script, &[mnt.as_os_str(), dir.path().as_os_str()]);
    let said = format!("stdout:\n{out}\nstderr:\n{err}");
    // The commands that only read still read it, saying why it is read-only (QA9 D5)...
    assert!(out.contains("== runs\n") && out.contains(" ok "), "{said}");
    assert!(err.contains("reading the store read-only, as it was left (its disk is full"), "{said}");
    assert!(out.contains("== verify\nok: 1 run"), "{said}");
    assert!(out.contains("== export\n== exit 0"), "{said}");
    assert!(dir.path().join("moved.jsonl").is_file(), "the run moved off the full disk: {said}");
    // ...and a command that writes says the disk is full.
    assert!(out.contains("== record\n== exit 2"), "{said}");
    assert!(err.contains("is full; make room there"), "{said}");
    assert!(out.contains("== runs with room\n") && out.contains("\"status\": \"ok\""), "{said}");
}
