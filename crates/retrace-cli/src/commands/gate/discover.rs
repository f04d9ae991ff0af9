//! Which traces a gate replays: trace files named on the command line, `*.jsonl` trace files
//! found under folders (recursively, hidden folders skipped), and run ids of the real store.
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
                    format!("no trace files under {arg}"),
                    "a trace file is a `*.jsonl` file written by `retrace export` (its first line says retrace-trace/1)",
                ));
            }
            found.sort();
            traces.extend(
                found.into_iter().map(|p| Trace { name: p.display().to_string(), origin: Origin::File(p) }),
            );
        } else if path.is_file() {
            if !is_trace(path) {
                return Err(usage_hint(
                    format!("{arg} is not a trace file"),
                    "its first line should be a retrace-trace/1 header: write trace files with `retrace export RUN -o FILE`",
                ));
            }
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
            let meta = store.find_run(arg).map_err(|_| {
                usage_hint(
                    format!("{arg}: no such file, folder or run"),
                    "give trace files, folders of them, or run ids (`retrace runs` lists them)",
                )
            })?;
            traces.push(Trace { name: meta.id.clone(), origin: Origin::Run(meta.id) });
        }
    }
    Ok(traces)
}

/// Trace files under `dir`, recursively; hidden folders (`.git`, `.retrace`) are skipped.
fn walk(dir: &Path, found: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| usage_hint(format!("cannot read {}: {e}", dir.display()), "check the path"))?;
    for entry in entries {
        let path = entry?.path();
        let hidden = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if path.is_dir() && !hidden {
            walk(&path, found)?;
        } else if path.extension().is_some_and(|e| e == "jsonl") && is_trace(&path) {
            found.push(path);
        }
    }
    Ok(())
}

/// Whether `path`'s first line is a `retrace-trace/…` header.
pub fn is_trace(path: &Path) -> bool {
    header_of(path)
        .and_then(|v| v.get("format").and_then(|f| f.as_str()).map(|f| f.starts_with("retrace-trace/")))
        .unwrap_or(false)
}

/// The first line of `path` as JSON.
fn header_of(path: &Path) -> Option<serde_json::Value> {
    let file = std::fs::File::open(path).ok()?;
    let mut first = String::new();
    std::io::BufReader::new(file).read_line(&mut first).ok()?;
    serde_json::from_str(&first).ok()
}
