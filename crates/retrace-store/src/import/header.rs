//! The header line of an export: read, checked against the format this build knows, and
//! compared member by member with what parsing kept of it.
use retrace_core::export::{check_format, ExportHeader, FormatError};

use super::read::{json_message, unparsable};
use super::{ImportError, Location};

/// Reads the header line: the header, and the paths of members it holds that no field of
/// [`ExportHeader`] does ([`unknown_members`]).
pub(super) fn read_header(
    line: &[u8],
    complete: bool,
    at: Location,
) -> Result<(ExportHeader, Vec<String>), ImportError> {
    let malformed = |message: String| ImportError::Malformed { at: at.clone(), message };
    // Two ways a trace often reaches us wrapped: say which, rather than only "not JSON".
    if line.starts_with(&[0x1f, 0x8b]) {
        let message = "the file is gzip-compressed: import what `gunzip -c FILE | retrace import -` gives";
        return Err(malformed(message.into()));
    }
    if line.starts_with(b"version https://git-lfs.github.com/spec/") {
        let message =
            "the file is a Git LFS pointer, not the trace: fetch it (`git lfs pull`), then import it";
        return Err(malformed(message.into()));
    }
    if line.starts_with("\u{feff}".as_bytes()) {
        let message =
            "the file starts with a UTF-8 byte-order mark, which no trace has (an editor added it): \
                       remove its first 3 bytes (`tail -c +4 FILE`)";
        return Err(malformed(message.into()));
    }
    let value: serde_json::Value = serde_json::from_slice(line)
        .map_err(|e| unparsable(at.clone(), complete, "the header is not JSON", &e))?;
    // A key written twice would be read as its last (QA40 D4); event lines refuse it too.
    if let Err(e) = retrace_core::json::parse(line) {
        if e.message.contains("duplicate") {
            return Err(malformed(format!("the header holds a {}", e.message)));
        }
    }
    let Some(format) = value.get("format").and_then(|f| f.as_str()) else {
        return Err(malformed("not a retrace trace: the first line has no \"format\"".into()));
    };
    match check_format(format) {
        Ok(()) => {}
        Err(FormatError::UnknownMajor { found }) => return Err(ImportError::UnknownFormat { at, found }),
        Err(e @ FormatError::NotATrace(_)) => return Err(malformed(e.to_string())),
    }
    let header: ExportHeader = serde_json::from_value(value.clone())
        .map_err(|e| malformed(format!("bad header: {}", json_message(&e))))?;
    let mut unknown = Vec::new();
    if let Ok(known) = serde_json::to_value(&header) {
        unknown_members(&value, &known, "", &mut unknown);
    }
    let run = &header.run;
    if run.id.is_empty() || run.id.len() > 200 || run.id.chars().any(char::is_control) {
        return Err(malformed(format!("bad run id {:?}", run.id)));
    }
    // The run record as written, against its digest (QA40 D3: a changed status, exit status or
    // command imported and verified as ok).
    if let Some(said) = header.run_digest {
        let found = value.get("run").and_then(retrace_core::export::run_digest);
        if found != Some(said) {
            let found = found.map_or_else(|| "none".to_owned(), |d| d.to_string());
            let message = format!(
                "the header's run record was changed after it was exported: it hashes to {found}, its \
                 run_digest says {said}"
            );
            return Err(ImportError::Verification { at, seq: None, digest: Some(said), message });
        }
    }
    if let Some(message) = impossible(run) {
        return Err(malformed(format!("the header's run record is impossible: {message}")));
    }
    let agrees = header.holds_tokens == run.holds_tokens
        && header.mask_key_fingerprint == run.mask_key_fingerprint
        && header.masking_rules == run.masking_rules;
    if !agrees {
        let message =
            "the header's holds_tokens, mask_key_fingerprint or masking_rules disagree with its run";
        return Err(malformed(message.into()));
    }
    Ok((header, unknown))
}

/// Why `run` is a record no run could have, if it is one: a replay or fork of no run, a fork
/// with no fork point, a divergence where none is said or none where one is.
pub(crate) fn impossible(run: &retrace_core::run::RunMeta) -> Option<String> {
    use retrace_core::run::{RunMode, RunStatus};
    let mode = run.mode;
    if matches!(mode, RunMode::Replay | RunMode::Fork) && run.source_run.is_none() {
        return Some(format!("a {mode} run with no source_run"));
    }
    if mode == RunMode::Fork && run.fork_at.is_none() {
        return Some("a fork with no fork_at".into());
    }
    if run.status == RunStatus::Diverged && run.divergence.is_none() {
        return Some("status diverged with no divergence".into());
    }
    None
}

/// Appends to `out` the path of each member of `written` that `known` (what parsing kept of
/// it, written back) lacks: parsing dropped it. A mangled key (`"exit_st`tus":0`) would
/// otherwise import as an absent field, changing the run. Members whose value is null are
/// not counted (an absent optional field, written out). Arrays are walked element by element.
fn unknown_members(
    written: &serde_json::Value,
    known: &serde_json::Value,
    path: &str,
    out: &mut Vec<String>,
) {
    use serde_json::Value;
    match (written, known) {
        (Value::Object(written), Value::Object(known)) => {
            for (key, value) in written {
                let at = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                match known.get(key) {
                    Some(kept) => unknown_members(value, kept, &at, out),
                    None if value.is_null() => {}
                    None => out.push(at),
                }
            }
        }
        (Value::Array(written), Value::Array(known)) => {
            for (i, (value, kept)) in written.iter().zip(known).enumerate() {
                unknown_members(value, kept, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Said after a complaint about members this build doesn't know, when a newer minor version
/// of the format wrote the file.
pub(super) fn newer_format(format: &str) -> String {
    match format {
        retrace_core::export::FORMAT => String::new(),
        other => format!(" (the file says {other}: a newer retrace wrote it, import it with that)"),
    }
}
