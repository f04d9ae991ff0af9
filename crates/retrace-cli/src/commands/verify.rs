//! `retrace verify`: check stored runs (hash chain, blob digests, seq and Lamport invariants).
use std::io::Write;

use retrace_store::export::RunEvents;
use retrace_store::verify::{verify_run_reporting, Problem, ProblemKind};

use crate::commands::readable_store_from_env;
use crate::exit;
use crate::output::count;
use crate::output::{print_json, Progress};

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace verify 01j5c3\n  \
         retrace verify --all\n  \
         retrace verify --all --json | jq '.problems[] | .message'"
    };
}

/// Verify one run, or every run.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Check stored runs: every event's hash and its link to the previous one, seqs \
1, 2, 3... without gaps, every referenced blob present and matching its digest, each agent's \
Lamport clock increasing, every delivery after its send, causal parents and inbound deliveries \
that name earlier events, and the run's recorded head.\n\n\
With --all, every run in the store is checked, oldest first, with progress on a terminal. \
Prints each problem on its own line, naming the run and the seq or blob digest, and exits 1 if \
there is any; exits 0 when all is sound.",
        "\n\n",
        examples!()
    )
)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["run", "all"])))]
pub struct Args {
    /// The run: its id or a unique prefix of it (at least 4 characters).
    pub run: Option<String>,
    /// Verify every run in the store.
    #[arg(long)]
    pub all: bool,
    /// Print JSON: `{"ok", "runs", "events", "problems": [{run, seq, digest, kind, message}]}`.
    #[arg(long)]
    pub json: bool,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let store = readable_store_from_env()?;
    let (runs, unreadable): (Vec<String>, _) = match &args.run {
        Some(run) => (vec![crate::commands::runs::find(&*store, run)?.id], Vec::new()),
        None => {
            // A run whose record can't be read is a problem; the others are still checked.
            let (runs, unreadable) = store.runs_and_unreadable()?;
            (runs.into_iter().map(|meta| meta.id).collect(), unreadable)
        }
    };
    // Progress by events, so one long run shows it moving too.
    let events: u64 =
        runs.iter().map(|run| RunEvents::new(&*store, run).map_or(0, |pages| pages.count())).sum();
    let mut progress = Progress::new("verifying events", events);
    let mut problems: Vec<Problem> = unreadable.iter().map(retrace_store::verify::unreadable_run).collect();
    for run in &runs {
        problems.extend(verify_run_reporting(&*store, run, &mut |n| progress.add(n)));
    }
    progress.finish();
    // A run that `gc` or `delete` removed while this read it (its events or blobs gone midway)
    // is not damage: its problems are dropped, and it is said (QA21 D7).
    let gone: Vec<String> = match args.all {
        true => {
            let still: std::collections::HashSet<String> = match store.runs_and_unreadable() {
                Ok((now, unreadable)) => {
                    now.into_iter().map(|m| m.id).chain(unreadable.into_iter().map(|u| u.id)).collect()
                }
                Err(_) => runs.iter().cloned().collect(),
            };
            runs.iter().filter(|r| !still.contains(*r)).cloned().collect()
        }
        false => Vec::new(),
    };
    if !gone.is_empty() {
        drop_deleted(&mut problems, &gone);
        let were = if gone.len() == 1 { "was" } else { "were" };
        eprintln!(
            "retrace: {} {were} deleted while being verified (a gc or delete at the same time): not judged",
            count(gone.len(), "run")
        );
    }
    let printed = print(&args, &runs, unreadable.len(), events, &problems);
    // Files this user may not read (another user's store): an access problem, not damage.
    let denied = |p: &Problem| p.kind == ProblemKind::Unreadable && p.message.contains("Permission denied");
    if !problems.is_empty() && problems.iter().all(denied) {
        return Err(exit::usage_hint(
            format!(
                "verification could not read {}: permission denied, which says nothing of the data",
                count(problems.len(), "item")
            ),
            "run it as the user the store's files belong to, or give this user read access to them",
        ));
    }
    match problems.len() {
        // A report cut short (`verify --all | head -1`) still fails a check that failed.
        0 => printed,
        1 => Err(exit::check_failed("verification found 1 problem")),
        n => Err(exit::check_failed(format!("verification found {n} problems"))),
    }
}

/// Prints the verdict: each problem, or that all is well.
fn print(
    args: &Args,
    runs: &[String],
    unreadable: usize,
    events: u64,
    problems: &[Problem],
) -> anyhow::Result<()> {
    if args.json {
        let value = serde_json::json!({
            "ok": problems.is_empty(),
            "runs": runs.len() + unreadable,
            "events": events,
            "problems": problems,
        });
        print_json(&value)?;
    } else {
        let mut out = std::io::stdout().lock();
        for problem in problems {
            writeln!(out, "{problem}")?;
        }
        if problems.is_empty() {
            let what = match &args.run {
                Some(_) => format!("run {}", runs[0]),
                None => count(runs.len(), "run"),
            };
            writeln!(
                out,
                "ok: {what}, {}: hash chain, blobs, seqs, clocks and decisions verified",
                count(events, "event")
            )?;
        }
    }
    Ok(())
}

/// Drops the problems of the runs in `gone`: deleted while they were verified.
fn drop_deleted(problems: &mut Vec<Problem>, gone: &[String]) {
    problems.retain(|p| !gone.contains(&p.run));
}

#[cfg(test)]
mod tests {
    use retrace_store::verify::{Problem, ProblemKind};

    /// What a run deleted mid-check "lacks" is not damage; the other runs' problems stay.
    #[test]
    fn the_problems_of_runs_deleted_while_verified_are_dropped() {
        let problem = |run: &str| Problem {
            run: run.into(),
            seq: Some(1),
            digest: None,
            kind: ProblemKind::BlobMissing,
            message: "no blob".into(),
        };
        let mut problems = vec![problem("gone"), problem("kept"), problem("gone")];
        super::drop_deleted(&mut problems, &["gone".to_owned()]);
        assert_eq!(problems, vec![problem("kept")]);
    }
}
