//! Exit codes: 0 ok, 1 divergence or failed check, 2 usage or input error; a broken pipe is 0.
use std::process::ExitCode;

use retrace_store::{StoreError, StoreErrorKind};

/// An error that already knows its exit code and an optional hint.
#[derive(Debug)]
pub struct Failure {
    /// 1 or 2.
    pub code: u8,
    /// The message printed after `error: `.
    pub message: String,
    /// A hint printed under the message.
    pub hint: Option<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// A failed check or a divergence: exit 1.
pub fn check_failed(message: impl Into<String>) -> anyhow::Error {
    Failure { code: 1, message: message.into(), hint: None }.into()
}

/// Bad usage or bad input: exit 2.
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    Failure { code: 2, message: message.into(), hint: None }.into()
}

/// Bad usage or bad input with a hint: exit 2.
pub fn usage_hint(message: impl Into<String>, hint: impl Into<String>) -> anyhow::Error {
    Failure { code: 2, message: message.into(), hint: Some(hint.into()) }.into()
}

/// Ends the process: prints the error chain and picks the exit code.
pub fn finish(result: anyhow::Result<()>) -> ExitCode {
    let Err(err) = result else {
        return ExitCode::SUCCESS;
    };
    if err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    }) {
        return ExitCode::SUCCESS;
    }
    let (code, hint) = match err.downcast_ref::<Failure>() {
        Some(f) => (f.code, f.hint.clone()),
        None => (code_of(&err), None),
    };
    eprintln!("error: {err}");
    for cause in err.chain().skip(1) {
        eprintln!("  caused by: {cause}");
    }
    if let Some(hint) = hint {
        eprintln!("hint: {hint}");
    }
    ExitCode::from(code)
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

/// Restores the default SIGPIPE behaviour so `retrace runs | head` ends quietly.
pub fn reset_sigpipe() {
    // Rust ignores SIGPIPE by default; writes then fail with BrokenPipe, which `finish` maps to 0.
}
