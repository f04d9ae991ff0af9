//! Exit codes: 0 ok, 1 divergence or failed check, 2 usage or input error, 128 + signal when
//! the user stopped the command (130 for SIGINT, 143 for SIGTERM, as a shell reports a program
//! a signal ended). A broken pipe is 0 for a listing (`runs | head`), but `verify` and `gate`
//! still exit with their verdict however their report was cut short, and `export` to standard
//! output exits 141 (SIGPIPE's status), silently, as `cat` would: its reader didn't get the
//! trace whole, and `set -o pipefail` should see it.
use std::io::Write;
use std::process::ExitCode;

use retrace_store::{StoreError, StoreErrorKind};

/// An error that already knows its exit code and an optional hint.
#[derive(Debug)]
pub struct Failure {
    /// 1 or 2, or 128 + signal ([`interrupted`]).
    pub code: u8,
    /// The message printed after `error: `.
    pub message: String,
    /// A hint printed under the message.
    pub hint: Option<String>,
    /// The `--json` error's `code`, when the exit code alone doesn't name the failure
    /// (`not_found`, `conflict`, `corrupt`): one name per kind of failure, whatever the command
    /// (QA37 D2: an unknown run was `usage` in `show` and `not_found` in `fork --runs`).
    pub kind: Option<&'static str>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// A failed check or a divergence: exit 1.
pub fn check_failed(message: impl Into<String>) -> anyhow::Error {
    Failure { code: 1, message: message.into(), hint: None, kind: None }.into()
}

/// Bad usage or bad input: exit 2.
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    Failure { code: 2, message: message.into(), hint: None, kind: None }.into()
}

/// Bad usage or bad input with a hint: exit 2.
pub fn usage_hint(message: impl Into<String>, hint: impl Into<String>) -> anyhow::Error {
    Failure { code: 2, message: message.into(), hint: Some(hint.into()), kind: None }.into()
}

/// Something named that isn't there (a run, a seq), with a hint: exit 2, code `not_found`.
pub fn not_found_hint(message: impl Into<String>, hint: impl Into<String>) -> anyhow::Error {
    Failure { code: 2, message: message.into(), hint: Some(hint.into()), kind: Some("not_found") }.into()
}

/// The user stopped the command with `signal` (SIGINT, SIGTERM): exit 128 + signal.
pub fn interrupted(signal: nix::sys::signal::Signal, message: impl Into<String>) -> anyhow::Error {
    Failure { code: 128 + signal as u8, message: message.into(), hint: None, kind: None }.into()
}

/// Output its reader closed before it was written whole: exit 141, the status of a program
/// SIGPIPE ended, with nothing said (the reader chose to stop reading).
#[derive(Debug)]
pub struct CutShort;

impl std::fmt::Display for CutShort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output closed before it was written whole")
    }
}

impl std::error::Error for CutShort {}

/// Ends the process: prints the error chain and picks the exit code. With `json` (the command
/// was given `--json`) and no JSON document printed yet, the error is also one line of JSON on
/// standard output, `{"error": {"code", "message", "hint", "exit_status"}}`, so a script reading
/// standard output gets a document either way.
pub fn finish(result: anyhow::Result<()>, json: bool) -> ExitCode {
    let Err(err) = result else {
        return ExitCode::SUCCESS;
    };
    if err.downcast_ref::<CutShort>().is_some() {
        return ExitCode::from(128 + nix::sys::signal::Signal::SIGPIPE as u8);
    }
    if err.chain().any(broken_pipe) {
        return ExitCode::SUCCESS;
    }
    let (code, hint) = match err.downcast_ref::<Failure>() {
        Some(f) => (f.code, f.hint.clone()),
        None => (code_of(&err), None),
    };
    let hint = hint.or_else(|| damaged_database_hint(&err));
    let said = said(&err);
    let mut report = format!("error: {}\n", said[0]);
    for cause in &said[1..] {
        report.push_str(&format!("  caused by: {cause}\n"));
    }
    if let Some(hint) = hint {
        report.push_str(&format!("hint: {hint}\n"));
    }
    // Standard error may have closed under us (`retrace gate ... 2>&1 | head -1`): the report
    // is dropped rather than panicking (`eprintln!` would, exit 101), and the exit code still
    // says what happened: a check that failed never turns into a success.
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(report.as_bytes()).and_then(|()| stderr.flush());
    if json && !crate::output::was_json_printed() {
        let what = error_code(&err, code);
        let message = said.join(": ");
        let line = serde_json::json!({"error": {"code": what, "message": message, "hint": hint_of(&err), "exit_status": code}});
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    }
    ExitCode::from(code)
}

/// A clap parse error as [`finish`] says errors: with `json`, a JSON line on standard output too.
pub fn usage_error_json(message: &str, json: bool) {
    if json {
        // clap's message up to its usage block, on one line.
        let said: Vec<&str> = message
            .lines()
            .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let first = said.join(" ").trim_start_matches("error: ").to_owned();
        let line =
            serde_json::json!({"error": {"code": "usage", "message": first, "hint": null, "exit_status": 2}});
        println!("{line}");
    }
}

/// The error chain's messages, without a cause its error's message ends with already: an
/// error that quotes its source (`reading blob …: No such file or directory (os error 2)`) would
/// otherwise say it twice.
fn said(err: &anyhow::Error) -> Vec<String> {
    crate::output::unquoted_causes(err.chain().map(ToString::to_string))
}

fn hint_of(err: &anyhow::Error) -> Option<String> {
    err.downcast_ref::<Failure>().and_then(|f| f.hint.clone()).or_else(|| damaged_database_hint(err))
}

/// What to do about a database file SQLite finds damaged (`database disk image is malformed`):
/// every command fails on it the same way, so the error alone doesn't say where to start.
fn damaged_database_hint(err: &anyhow::Error) -> Option<String> {
    let damaged = err.chain().any(|e| {
        let text = e.to_string();
        text.contains("database disk image is malformed") || text.contains("file is not a database")
    });
    damaged.then(|| {
        "the store's database file is damaged: copy its folder first (RETRACE_HOME, default ./.retrace), \
         then `sqlite3 retrace.db .recover | sqlite3 recovered.db` in the copy may save what is \
         readable; `retrace verify --all` names the runs that still read"
            .to_owned()
    })
}

/// A stable name for what failed: the store's error kind when one is in the chain (`not_found`,
/// `conflict`, `corrupt`, `busy`...), `divergence`, else by exit code: `failed` (1), `usage` (2),
/// `interrupted` (128 + signal).
fn error_code(err: &anyhow::Error, code: u8) -> String {
    if err.chain().any(|e| e.downcast_ref::<retrace_core::Divergence>().is_some()) {
        return "divergence".into();
    }
    if let Some(kind) = err.chain().find_map(|e| e.downcast_ref::<Failure>()).and_then(|f| f.kind) {
        return kind.into();
    }
    if let Some(e) = err.chain().find_map(|e| e.downcast_ref::<StoreError>()) {
        return store_code(e.kind);
    }
    match code {
        1 => "failed".into(),
        2 => "usage".into(),
        _ => "interrupted".into(),
    }
}

/// A store error kind as a `--json` code: `not_found`, `conflict`, `corrupt`...; an invalid
/// argument (an ambiguous run prefix) is a usage error, as every command says it.
pub(crate) fn store_code(kind: StoreErrorKind) -> String {
    match kind {
        StoreErrorKind::Invalid => "usage".into(),
        kind => kind.as_str().replace([' ', '-', '/'], "_"),
    }
}

fn code_of(err: &anyhow::Error) -> u8 {
    if err.chain().any(|e| e.downcast_ref::<retrace_core::Divergence>().is_some()) {
        return 1;
    }
    match err.chain().find_map(|e| e.downcast_ref::<StoreError>()).map(|e| e.kind) {
        Some(StoreErrorKind::Corrupt) => 1,
        _ => 2,
    }
}

/// Whether `e` is a write to a closed pipe (`retrace runs --json | head -c 20`), as an I/O error
/// or inside a JSON encoder's.
fn broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    let pipe = Some(std::io::ErrorKind::BrokenPipe);
    e.downcast_ref::<std::io::Error>().map(std::io::Error::kind) == pipe
        || e.downcast_ref::<serde_json::Error>().and_then(serde_json::Error::io_error_kind) == pipe
}

/// Makes a closed standard output end the process quietly, as `head` expects of the command
/// before it (`retrace demo | head -1`).
///
/// Rust ignores SIGPIPE, so a write to a closed pipe fails: a returned error is mapped to exit
/// 0 by [`finish`], and `println!`'s panic is caught here and ends the process with status 0,
/// with nothing printed. Other panics keep the default report.
pub fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info.payload_as_str().unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}
