//! `retrace gate --accept`: re-record a diverging trace against live services, write the new
//! trace beside the old one as `NAME.accepted.jsonl` (never over anything), and show what
//! changed, as `retrace diff` shows it: as text, and as the `accepted` list of `--json`.
use std::path::{Path, PathBuf};

use retrace_store::diff::{diff_runs, DiffOptions, RunDiff};
use retrace_store::export::export_run;
use retrace_store::import::{import_reader, ImportOptions};
use retrace_store::{open_store, StoreConfig};
use serde_json::json;

use super::discover::Origin;
use super::job::{trace_bytes, Outcome, Settings};
use crate::commands::{diff, export, record};
use crate::exit::{usage_hint, Failure};
use crate::launcher;

/// The upstreams a re-recording calls (else the trace's recorded ones).
#[derive(Clone, Debug, Default)]
pub struct Upstreams {
    /// OpenAI-compatible upstream.
    pub openai: Option<String>,
    /// Anthropic-compatible upstream.
    pub anthropic: Option<String>,
}

/// A trace re-recorded (into [`Report::file`]).
#[derive(Debug)]
pub struct Accepted {
    /// The new run's id.
    pub run_id: String,
    /// The program's exit status in the re-recording.
    pub exit_status: i32,
    /// `retrace diff OLD NEW`.
    pub diff: RunDiff,
}

/// Where the accepted trace of `outcome` goes: `NAME.accepted.jsonl` beside a file, or
/// `RUN.accepted.jsonl` in the current folder for a run id.
pub fn destination(outcome: &Outcome) -> PathBuf {
    match &outcome.trace.origin {
        Origin::File(path) => {
            let stem = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let stem = stem.strip_suffix(".jsonl").unwrap_or(&stem).to_owned();
            path.with_file_name(format!("{stem}.accepted.jsonl"))
        }
        Origin::Run(id) => PathBuf::from(format!("{id}.accepted.jsonl")),
    }
}

/// What `--accept` did with one diverging trace.
#[derive(Debug)]
pub struct Report {
    /// The trace, as the gate names it.
    pub trace: String,
    /// Where its re-recording goes ([`destination`]).
    pub file: PathBuf,
    /// The re-recording, or why there is none.
    pub result: Result<Accepted, Refusal>,
}

/// Why a trace was not accepted (nothing was written).
#[derive(Debug)]
pub struct Refusal {
    /// What went wrong.
    pub message: String,
    /// What to do about it.
    pub hint: Option<String>,
}

impl Report {
    /// `accepted NAME -> FILE (...)` and the diff, or `not accepted NAME: why`, for people.
    pub fn text(&self) -> String {
        let name = &self.trace;
        match &self.result {
            Ok(a) => {
                // A trace given by its run id has no file to replace (QA12 D6).
                let then = match std::path::Path::new(name).is_file() {
                    true => format!("move it over {name}"),
                    false => {
                        "commit it where the trace belongs (the new run is in this store too)".to_owned()
                    }
                };
                format!(
                    "\naccepted {name} -> {} (run {}, exit status {}); review, then {then}:\n{}",
                    self.file.display(),
                    a.run_id,
                    a.exit_status,
                    diff::render(&a.diff).lines().map(|l| format!("  {l}\n")).collect::<String>()
                )
            }
            Err(refusal) => {
                let mut text = format!("\nnot accepted {name}: {}\n", refusal.message);
                if let Some(hint) = &refusal.hint {
                    text.push_str(&format!("  hint: {hint}\n"));
                }
                text
            }
        }
    }

    /// The report's entry in `gate --json`'s `accepted` list.
    pub fn json(&self) -> serde_json::Value {
        let (status, accepted, error) = match &self.result {
            Ok(a) => ("accepted", Some(a), None),
            Err(r) => ("not_accepted", None, Some(json!({"message": r.message, "hint": r.hint}))),
        };
        json!({
            "trace": self.trace,
            "file": self.file.display().to_string(),
            "status": status,
            "run": accepted.map(|a| &a.run_id),
            "exit_status": accepted.map(|a| a.exit_status),
            "diff": accepted.map(|a| &a.diff),
            "error": error,
        })
    }
}

/// Re-records the trace of `outcome` (a divergence) and writes it beside the old one;
/// `announce` is called just before the program starts against live services (never when the
/// destination exists, which is refused first).
pub fn accept(
    outcome: &Outcome,
    settings: &Settings,
    upstreams: &Upstreams,
    announce: impl FnOnce(),
) -> Report {
    let file = destination(outcome);
    let result = rerecord(outcome, settings, upstreams, &file, announce).map_err(|e| {
        match e.downcast_ref::<Failure>() {
            Some(f) => Refusal { message: f.message.clone(), hint: f.hint.clone() },
            None => Refusal { message: format!("{e:#}"), hint: None },
        }
    });
    Report { trace: outcome.trace.name.clone(), file, result }
}

fn rerecord(
    outcome: &Outcome,
    settings: &Settings,
    upstreams: &Upstreams,
    file: &Path,
    announce: impl FnOnce(),
) -> anyhow::Result<Accepted> {
    if file.exists() {
        return Err(usage_hint(
            format!("{} already exists; nothing was re-recorded", file.display()),
            "review it and move it over the old trace, or delete it, then run the gate again",
        ));
    }
    announce();
    let temp = tempfile::Builder::new().prefix("retrace-accept-").tempdir()?;
    let store = open_store(&StoreConfig::in_home(temp.path()))?;
    let bytes = trace_bytes(&outcome.trace, settings)?;
    let old = import_reader(&*store, &bytes[..], ImportOptions::default())
        .map_err(|e| crate::output::failure(2, &e))?
        .run_id()
        .to_owned();
    let source = launcher::source_run(&*store, &old)?;
    let (argv, cwd) = launcher::command_for(&source, &settings.command)?;
    let recorded_upstream = |provider: &str| source.upstreams.get(provider).cloned();
    let plan = record::Plan {
        store: store.clone(),
        name: source.name.clone(),
        labels: Default::default(),
        chaos: source.chaos_seed,
        argv,
        cwd,
        upstream_openai: upstreams.openai.clone().or_else(|| recorded_upstream("openai")),
        upstream_anthropic: upstreams.anthropic.clone().or_else(|| recorded_upstream("anthropic")),
        upstream_timeout: 600.0,
        max_body: source.max_body.map_or(32 << 20, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        mask: settings.mask.clone(),
        store_env: vec![
            ("RETRACE_HOME".into(), temp.path().to_string_lossy().into_owned()),
            ("PATH".into(), settings.path.clone()),
        ],
        remove_env: ["RETRACE_STORE", "RETRACE_BLOBS", "RETRACE_URL", "RETRACE_TOKEN"]
            .map(String::from)
            .to_vec(),
        output: Some(temp.path().join("program-output.log")),
    };
    let log = temp.path().join("program-output.log");
    let recorded = record::execute(plan, |_, _| {})?;
    let expected_status = source.exit_status.unwrap_or(0);
    // Another status is a re-recording that failed (no API key, an upstream down), unless it is
    // 0: a program fixed to succeed, which is what the trace is being re-recorded for (QA12 D10).
    if recorded.exit_status != expected_status && recorded.exit_status != 0 {
        let tail = super::job::masked_tail(&log, 8, &source, settings);
        let tail: String = tail.iter().map(|l| format!("\n  | {l}")).collect();
        return Err(usage_hint(
            format!(
                "the re-recording exited with status {} where the trace recorded {expected_status}; \
                 nothing was written. The program's last output:{tail}",
                recorded.exit_status
            ),
            "check the program, its API keys and the upstreams (--upstream-openai, --upstream-anthropic)",
        ));
    }
    let unreached = unreached_calls(&*store, &recorded.id)?;
    if !unreached.is_empty() {
        let seqs: Vec<String> = unreached.iter().map(|(seq, _)| seq.to_string()).collect();
        return Err(usage_hint(
            format!(
                "{} of the re-recording never got an answer from the upstream (seq {}): the \
                 proxy answered {} itself; nothing was written",
                crate::output::count(unreached.len(), "model call"),
                seqs.join(", "),
                unreached[0].1
            ),
            "check the upstreams (--upstream-openai, --upstream-anthropic) and the API keys, then run the \
             gate again",
        ));
    }
    let written =
        export::write_new_atomically(file, |out| export_run(&*store, &recorded.id, out, &mut |_| {}))?;
    written.map_err(|e| crate::output::failure(e.exit_code(), &e))?;
    let options = DiffOptions { limit: 20, max_diff_lines: 12 };
    let diff = diff_runs(&*store, &old, &recorded.id, &options)?;
    Ok(Accepted { run_id: recorded.id, exit_status: recorded.exit_status, diff })
}

/// The model calls of `run` that the proxy answered itself (`x-retrace-proxy: error`: it could
/// not reach the upstream, or got no answer in time), with the first line of its answer: a
/// re-recording holding one is not what the program does against the real service.
fn unreached_calls(store: &dyn retrace_store::Store, run: &str) -> anyhow::Result<Vec<(u64, String)>> {
    use retrace_server::proxy::document::Recorded;
    let mut unreached = Vec::new();
    let mut next = 1;
    loop {
        let page = store.events(run, next, 1024)?;
        let Some(last) = page.last().map(|e| e.seq) else { break };
        for event in page.iter().filter(|e| e.kind == retrace_core::EventType::ModelCall) {
            let Some(output) = event.output_ref else { continue };
            let Ok(doc) = Recorded::decode(&store.get_blob(&output)?) else { continue };
            let by_proxy =
                doc.headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("x-retrace-proxy") && v == "error");
            if by_proxy {
                unreached.push((event.seq, format!("{}", doc.status)));
            }
        }
        next = last + 1;
    }
    Ok(unreached)
}
