//! Which traces a gate replays: trace files named on the command line, every `*.jsonl` file
//! found under folders (recursively, hidden folders skipped), and run ids of the real store.
//!
//! **A `*.jsonl` file under a folder is a trace, or an error.** A committed trace that was
//! emptied or cut (a failed `retrace export ... > FILE`, a bad merge, a disk-full write) or never
//! fetched (a Git LFS pointer) must fail the gate, not vanish from it: so the walk keeps every
//! `*.jsonl` file, and one that is not a readable trace becomes that trace's `ERROR` (in the
//! lines, `--json` and `--junit`), saying why ([`check_header`]). Named on the command line
//! (`git diff --name-only | xargs retrace gate`), such a file is the same `ERROR`, so the other
//! traces are still judged and the JUnit file still written (QA12 D9). Files of other extensions
//! under a folder are not looked at.
use std::io::BufRead;
use std::path::{Path, PathBuf};

use retrace_store::Store;

use crate::exit::usage_hint;

/// Where a trace comes from.
#[derive(Clone, Debug)]
pub enum Origin {
    /// An exported trace file.
    File(PathBuf),
    /// A run of the real store (exported to the temporary store first).
    Run(String),
}

/// One trace to replay.
#[derive(Clone, Debug)]
pub struct Trace {
    /// How reports name it: the file's path, or the run's id.
    pub name: String,
    /// Where it comes from.
    pub origin: Origin,
}

/// The recorded runs of the trace files found, by run id: a fork's (or a replay's) trace is
/// replayed with its source's trace imported beside it.
pub fn runs_of(traces: &[Trace]) -> std::collections::HashMap<String, Origin> {
    let mut runs = std::collections::HashMap::new();
    for trace in traces {
        if let Origin::File(path) = &trace.origin {
            if let Some(id) = header_of(path).and_then(|h| h["run"]["id"].as_str().map(str::to_owned)) {
                runs.insert(id, trace.origin.clone());
            }
        }
    }
    runs
}

/// The traces under `paths`, files in path order. `real` opens the real store, only when an
/// argument is neither a file nor a folder.
pub fn find(
    paths: &[String],
    real: impl Fn() -> anyhow::Result<std::sync::Arc<dyn Store>>,
) -> anyhow::Result<Vec<Trace>> {
    let mut traces = Vec::new();
    for arg in paths {
        let path = Path::new(arg);
        if path.is_dir() {
            let mut found = Vec::new();
            walk(path, &mut found)?;
            if found.is_empty() {
                return Err(usage_hint(
                    format!("no trace files (*.jsonl) under {arg}"),
                    "a trace file is a `*.jsonl` file written by `retrace export RUN -o FILE`",
                ));
            }
            found.sort();
            traces.extend(
                found.into_iter().map(|p| Trace { name: p.display().to_string(), origin: Origin::File(p) }),
            );
        } else if path.is_file() {
            traces.push(Trace { name: arg.clone(), origin: Origin::File(path.to_path_buf()) });
        } else {
            let store = real().map_err(|e| {
                usage_hint(
                    format!(
                        "{arg}: no such file or folder, and the store can't be opened to find a run: {e:#}"
                    ),
                    "give trace files, folders of them, or run ids",
                )
            })?;
            let meta = store.find_run(arg).map_err(|e| match e.kind {
                // A run there but unreadable (a damaged record) is said as such, as `show` says it.
                retrace_store::StoreErrorKind::NotFound => usage_hint(
                    format!("{arg}: no such file, folder or run"),
                    "give trace files, folders of them, or run ids (`retrace runs` lists them)",
                ),
                _ => anyhow::Error::new(e)
                    .context(format!("{arg}: not a file or folder, and its run can't be read")),
            })?;
            traces.push(Trace { name: meta.id.clone(), origin: Origin::Run(meta.id) });
        }
    }
    // A file named twice, or named and under a folder named too, is gated once (QA12 S5).
    let mut seen = std::collections::HashSet::new();
    traces.retain(|t| {
        seen.insert(match &t.origin {
            Origin::File(path) => path.canonicalize().unwrap_or_else(|_| path.clone()),
            Origin::Run(id) => PathBuf::from(format!("run:{id}")),
        })
    });
    Ok(traces)
}

/// Every `*.jsonl` file under `dir`, recursively; hidden folders (`.git`, `.retrace`) are
/// skipped. Whether each is a trace is for its replay to say ([`check_header`]).
fn walk(dir: &Path, found: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| usage_hint(format!("cannot read {}: {e}", dir.display()), "check the path"))?;
    for entry in entries {
        let path = entry?.path();
        let hidden = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if path.is_dir() {
            if !hidden {
                walk(&path, found)?;
            }
        } else if path.extension().is_some_and(|e| e == "jsonl") {
            found.push(path);
        }
    }
    Ok(())
}

/// Why a file is not a trace, and what to do about it.
#[derive(Debug)]
pub struct NotATrace {
    /// `empty file`, `line 1 is not JSON: ...`, `a Git LFS pointer, not the trace`...
    pub reason: String,
    /// What to do about it.
    pub hint: &'static str,
}

/// Checks that `first`, a file's first line (with its `\n` unless the file ends there), is a
/// JSON object whose `format` says `retrace-trace/…`: or says why the file is not a trace. The
/// version and the rest of the header are the import's to check.
pub fn check_header(first: &[u8]) -> Result<serde_json::Value, NotATrace> {
    const EXPORT: &str = "write trace files with `retrace export RUN -o FILE`, and keep other JSON Lines \
                          files out of the folders you gate";
    let not = |reason: String, hint| Err(NotATrace { reason, hint });
    if first.is_empty() {
        return not("empty file".into(), "export the run again: `retrace export RUN -o FILE`");
    }
    if first.starts_with(b"version https://git-lfs.github.com/spec/") {
        return not(
            "a Git LFS pointer, not the trace".into(),
            "fetch it: `git lfs pull` (in CI, check out with LFS enabled)",
        );
    }
    // As import says it (QA40 D5: "not JSON", and a hint to keep other files out).
    if first.starts_with("\u{feff}".as_bytes()) {
        return not(
            "it starts with a UTF-8 byte-order mark, which no trace has (an editor added it)".into(),
            "remove its first 3 bytes (`tail -c +4 FILE > FIXED`), or export the run again",
        );
    }
    if first.starts_with(&[0x1f, 0x8b]) {
        return not(
            "it is gzip-compressed".into(),
            "gate what `gunzip -c FILE` gives: write it to a .jsonl file",
        );
    }
    let ended = first.ends_with(b"\n");
    let line = first.strip_suffix(b"\n").unwrap_or(first);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return not("line 1 is empty (a trace's first line is its header)".into(), EXPORT);
    }
    let value: serde_json::Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(e) if e.is_eof() && !ended => {
            return not(
                format!("cut inside its header line (the file ends after {} bytes)", first.len()),
                "export the run again: `retrace export RUN -o FILE`",
            )
        }
        Err(e) => return not(format!("line 1 is not JSON: {e}"), EXPORT),
    };
    match value.get("format") {
        None => not("its first line has no \"format\" (a trace's says \"retrace-trace/1\")".into(), EXPORT),
        Some(serde_json::Value::String(f)) if f.starts_with("retrace-trace/") => Ok(value),
        Some(serde_json::Value::String(f)) => {
            not(format!("its header says format {f:?}, not retrace-trace/1"), EXPORT)
        }
        Some(f) => not(format!("its header's format is {f}, not \"retrace-trace/1\""), EXPORT),
    }
}

/// The first line of `path`, with its `\n` unless the file ends there.
fn first_line(path: &Path) -> Result<Vec<u8>, NotATrace> {
    let file = std::fs::File::open(path)
        .map_err(|e| NotATrace { reason: format!("cannot read it: {e}"), hint: "check the path" })?;
    let mut first = Vec::new();
    std::io::BufReader::new(file)
        .read_until(b'\n', &mut first)
        .map_err(|e| NotATrace { reason: format!("cannot read it: {e}"), hint: "check the path" })?;
    Ok(first)
}

/// The first line of `path` as a trace header, if it is one.
fn header_of(path: &Path) -> Option<serde_json::Value> {
    check_header(&first_line(path).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn why_a_first_line_is_not_a_trace() {
        let cases: &[(&str, &str)] = &[
            ("", "empty file"),
            ("\n", "line 1 is empty (a trace's first line is its header)"),
            ("  \r\n", "line 1 is empty (a trace's first line is its header)"),
            ("{\"format\":\"retrace-tr", "cut inside its header line (the file ends after 21 bytes)"),
            ("hello\n", "line 1 is not JSON: expected value at line 1 column 1"),
            ("{\"format\":\n", "line 1 is not JSON: EOF while parsing a value at line 1 column 10"),
            (
                "{\"not\": \"a trace\"}\n",
                "its first line has no \"format\" (a trace's says \"retrace-trace/1\")",
            ),
            ("[1]\n", "its first line has no \"format\" (a trace's says \"retrace-trace/1\")"),
            ("{\"format\":\"foo/1\"}\n", "its header says format \"foo/1\", not retrace-trace/1"),
            ("{\"format\":1}\n", "its header's format is 1, not \"retrace-trace/1\""),
            (
                "\u{feff}{\"format\":\"retrace-trace/1\"}\n",
                "it starts with a UTF-8 byte-order mark, which no trace has (an editor added it)",
            ),
            ("version https://git-lfs.github.com/spec/v1\n", "a Git LFS pointer, not the trace"),
        ];
        for (first, reason) in cases {
            let got = check_header(first.as_bytes()).map(|_| ()).map_err(|e| e.reason);
            assert_eq!(got, Err(reason.to_string()), "{first:?}");
        }
        // The version and the rest of the header are the import's to check.
        for first in ["{\"format\":\"retrace-trace/1\"}\n", "{\"format\":\"retrace-trace/2\"}\r\n"] {
            assert!(check_header(first.as_bytes()).is_ok(), "{first:?}");
        }
    }
}
