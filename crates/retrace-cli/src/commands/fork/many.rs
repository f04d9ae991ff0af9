//! `fork --runs QUERY`: the same edits to every recorded run a query selects, each forked as
//! `fork RUN` forks one, with a summary of which decisions moved.
use super::*;

pub(super) fn fork_many(
    store: &Arc<dyn Store>,
    query: &str,
    edits: &[Edit],
    args: &Args,
    masked: &[String],
) -> anyhow::Result<()> {
    if let Some(e) = edits.iter().find(|e| !e.seqs().is_empty()) {
        let message = format!(
            "--runs applies one edit to many runs: {e} names a seq of one run; use prompt:, model: or param:"
        );
        return Err(usage(as_typed(message, &args.edits, &[edits])));
    }
    let (live, runs): (Vec<RunMeta>, Vec<RunMeta>) =
        select_runs(store, query)?.into_iter().partition(|r| r.status == RunStatus::Running);
    for run in &live {
        eprintln!("retrace: skipping {}: it is still being recorded", run.id);
    }
    if runs.is_empty() {
        return Err(usage(format!("--runs {query}: no finished run matches")));
    }
    let mut results = Vec::new();
    let mut skipped: Vec<(String, String)> = Vec::new();
    let mut moved_runs = 0;
    for (i, run) in runs.iter().enumerate() {
        if let Some(signal) = launcher::signals::received() {
            return Err(interrupted(
                signal,
                format!("fork --runs interrupted ({signal}) after {i} of {} runs", runs.len()),
            ));
        }
        eprintln!("retrace: [{}/{}] forking {}", i + 1, runs.len(), run.id);
        let outcome = match fork_one(store, &run.id, edits, args) {
            Ok(mut outcome) => {
                outcome.warnings.splice(0..0, masked.iter().cloned());
                outcome
            }
            // A run the edits don't fit (or whose fork can't start) is skipped, with why: the
            // others are what the batch is for.
            Err(e) if e.downcast_ref::<Failure>().is_some_and(|f| f.code == 2) => {
                let why = e.to_string();
                eprintln!("retrace: [{}/{}] skipping {}: {why}", i + 1, runs.len(), run.id);
                skipped.push((run.id.clone(), why));
                continue;
            }
            Err(e) => return Err(e),
        };
        // A fork that failed or diverged decided nothing: not a run whose decisions moved (QA22 D5).
        let finished = !matches!(outcome.fork.status, RunStatus::Failed | RunStatus::Diverged);
        if finished && !outcome.diff.decisions.is_empty() {
            moved_runs += 1;
        }
        results.push(outcome);
    }
    if results.is_empty() {
        // With --json the skips are the document (each with why), then the error.
        if args.json {
            print_json_line(&serde_json::json!({
                "forks": [], "runs": 0, "runs_with_moved_decisions": 0,
                "forks_not_finished": 0, "skipped": skipped_json(&skipped),
            }))?;
        }
        return Err(usage(format!(
            "--runs {query}: the edits fit none of the {} runs; each was skipped (above)",
            runs.len()
        )));
    }
    // A fork that failed or diverged decided nothing: its "moved" decisions are not findings.
    let broken: Vec<&Forked> =
        results.iter().filter(|f| matches!(f.fork.status, RunStatus::Failed | RunStatus::Diverged)).collect();
    let outcome = match broken.is_empty() {
        true => Ok(()),
        false => Err(check_failed(format!(
            "{} of {} forks did not finish: {}",
            broken.len(),
            results.len(),
            broken
                .iter()
                .map(|f| format!("{} ({})", f.fork.id, f.fork.status))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    };
    if args.json {
        let list: Vec<_> = results
            .iter()
            .map(|f| {
                // Only a fork that finished moved decisions; one that failed or diverged decided nothing.
                let moved = match f.fork.status {
                    RunStatus::Failed | RunStatus::Diverged => serde_json::json!([]),
                    _ => serde_json::json!(f.diff.decisions),
                };
                serde_json::json!({"source": f.diff.a.id, "fork": f.fork.id, "status": f.fork.status, "decisions": moved, "warnings": f.warnings})
            })
            .collect();
        print_json_line(&serde_json::json!({
            "forks": list, "runs": results.len(), "runs_with_moved_decisions": moved_runs,
            "forks_not_finished": broken.len(), "skipped": skipped_json(&skipped),
        }))?;
        return outcome;
    }
    for f in &results {
        let moved: Vec<String> = f
            .diff
            .decisions
            .iter()
            .map(|m| {
                format!(
                    "{} {}: {} -> {}",
                    m.agent,
                    m.target.as_deref().unwrap_or("-"),
                    m.a.as_deref().unwrap_or("(none)"),
                    m.b.as_deref().unwrap_or("(none)")
                )
            })
            .collect();
        let line = match (&f.fork.status, moved.is_empty()) {
            (RunStatus::Failed | RunStatus::Diverged, _) => {
                format!("{} (exit status {})", f.fork.status, exit_text(&f.fork))
            }
            (_, true) => "no decision moved".to_owned(),
            (_, false) => moved.join("; "),
        };
        eprintln!("{}  fork {}  {}", f.diff.a.id, f.fork.id, line);
        for warning in f.warnings.iter().skip(masked.len()) {
            eprintln!("  warning: {warning}");
        }
    }
    for (run, why) in &skipped {
        eprintln!("{run}  skipped: {why}");
    }
    eprintln!("{moved_runs} of {} runs had decisions move.", results.len());
    outcome
}

/// `--json`'s `skipped`: each skipped run with why.
fn skipped_json(skipped: &[(String, String)]) -> Vec<serde_json::Value> {
    skipped.iter().map(|(run, why)| serde_json::json!({"source": run, "reason": why})).collect()
}

/// The runs a `--runs` query names.
fn select_runs(store: &Arc<dyn Store>, query: &str) -> anyhow::Result<Vec<RunMeta>> {
    let path = Path::new(query);
    if path.exists() {
        let mut files: Vec<_> = if path.is_dir() {
            std::fs::read_dir(path)?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                .collect()
        } else {
            vec![path.to_path_buf()]
        };
        files.sort();
        let mut runs = Vec::new();
        for file in files {
            let reader = std::io::BufReader::new(std::fs::File::open(&file)?);
            let options = retrace_store::import::ImportOptions {
                file_name: Some(file.display().to_string()),
                ..Default::default()
            };
            // A trace not in the store yet is imported, to be forked from there: said, as
            // `retrace import` says it.
            let id = match retrace_store::import::import_reader(store.as_ref(), reader, options)? {
                retrace_store::import::ImportOutcome::Imported { run_id, events, .. } => {
                    eprintln!(
                        "retrace: imported run {run_id} ({}) from {}",
                        count(events, "event"),
                        file.display()
                    );
                    run_id
                }
                retrace_store::import::ImportOutcome::AlreadyPresent { run_id, .. } => run_id,
            };
            runs.push(store.run(&id)?);
        }
        return Ok(runs);
    }
    let matches: Box<dyn Fn(&RunMeta) -> bool> = if query == "all" {
        Box::new(|_| true)
    } else if let Some(text) = query.strip_prefix("name~") {
        Box::new(move |r| r.name.as_deref().is_some_and(|n| n.contains(text)))
    } else if let Some(kv) = query.strip_prefix("label:") {
        let (k, v) =
            kv.split_once('=').ok_or_else(|| usage(format!("--runs {query}: want label:KEY=VALUE")))?;
        Box::new(move |r| r.labels.get(k).is_some_and(|x| x == v))
    } else {
        return Ok(query.split(',').map(|id| store.find_run(id.trim())).collect::<Result<Vec<_>, _>>()?);
    };
    // A query selects recordings: forking every fork (and replay) too would fork the same
    // recordings again and again.
    let (recorded, others): (Vec<RunMeta>, Vec<RunMeta>) =
        store.runs()?.into_iter().filter(|r| matches(r)).partition(|r| r.mode == RunMode::Record);
    if recorded.is_empty() && !others.is_empty() {
        let forks = others.iter().filter(|r| r.mode == RunMode::Fork).count();
        return Err(usage_hint(
            format!(
                "--runs {query}: no recorded run matches ({} and {} do: a query \
                 selects recorded runs only)",
                count(forks, "fork"),
                count(others.len() - forks, "replay")
            ),
            "to fork forks, name them by id: --runs ID1,ID2",
        ));
    }
    Ok(recorded)
}
