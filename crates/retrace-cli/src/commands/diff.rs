//! `retrace diff RUN_A RUN_B`: two trajectories compared step by step (SPEC §4).
use std::io::{BufWriter, Write};

use retrace_store::diff::{diff_runs, AlignedBy, DiffOptions, LoneStep, RunDiff, RunSide, Tokens, Which};

use crate::commands::readable_store_from_env;
use crate::output::count;
use crate::output::{edits_line, fit, table, utc_time};

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace diff 01j5c3 01j5d8\n  \
         retrace diff 01j5c3 01j5d8 --limit 100\n  \
         retrace diff 01j5c3 01j5d8 --json | jq '.decisions'"
    };
}

/// The widest a step label gets; longer ones are cut with `…`.
const MAX_LABEL: usize = 40;

/// Compare two runs step by step.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Compare two runs step by step: how many steps are the same, changed (asked differently \
or answered differently: their requests or their outputs differ, by hash) or only in one run; the changed steps with a short line diff of their outputs; \
the decisions that moved; and the tokens and cost of each run.\n\n\
When one run is a fork of the other, steps are aligned by the fork's origin_seq (the source \
step each fork step was matched or paired with); the events before the fork point are \
inherited, so the same. Any other two runs are paired as a fork pairs steps, with the older \
run as source: per agent, identical keys in recorded order, then each leftover step with the \
earliest leftover step of the same type and name; deliveries pair per agent in order.\n\n\
Cost counts a run's own events that ran live (recorded and cached steps cost nothing); a fork \
also shows what it saved: the source's live usage on the steps it served from the recording or \
the cache.\n\n\
A replay run stores only its outcome: one that ended ok reproduced its source step for step, so \
its steps are its source's (served from the recording, at no cost); one that didn't has no steps \
to compare, only the decisions it stored. A note says which.\n\n\
Differences are not errors: the exit status is 0 whatever differs.",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// The first run: its id or a unique prefix of it (at least 4 characters).
    pub run_a: String,
    /// The second run.
    pub run_b: String,
    /// List at most N changed steps, and N steps only in each run (the counts cover all).
    /// Default: 20 (each output diff cut at 40 lines), or every one with --json, each diff whole.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Print the comparison as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let store = readable_store_from_env()?;
    let a = crate::commands::runs::find(&*store, &args.run_a)?;
    let b = crate::commands::runs::find(&*store, &args.run_b)?;
    // A script reading --json gets every step and each whole diff, unless it asks for fewer.
    let options = match (args.limit, args.json) {
        (None, true) => DiffOptions { limit: usize::MAX, max_diff_lines: usize::MAX },
        (limit, _) => {
            DiffOptions { limit: limit.unwrap_or(DiffOptions::default().limit), ..DiffOptions::default() }
        }
    };
    let diff = diff_runs(&*store, &a.id, &b.id, &options)?;
    // Rendered whole, then written: a closed pipe is then an `io::Error`, which exits 0.
    let text = match args.json {
        true => serde_json::to_string_pretty(&diff)? + "\n",
        false => render(&diff),
    };
    let mut out = BufWriter::new(std::io::stdout().lock());
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The whole human report.
pub(crate) fn render(d: &RunDiff) -> String {
    let mut out = String::new();
    for (name, side) in [("A", &d.a), ("B", &d.b)] {
        out.push_str(&run_line(name, side));
    }
    let (source, other) = match d.alignment.source {
        Which::A => ("A", "B"),
        Which::B => ("B", "A"),
    };
    match (d.alignment.by, d.alignment.fork_at) {
        (AlignedBy::OriginSeq, Some(at)) => out.push_str(&format!(
            "aligned by origin_seq: {other} is a fork of {source} at seq {at} (seqs before it are inherited)\n"
        )),
        _ => out.push_str(&format!(
            "aligned by key, then by type and name, with {source} (the older run) as source\n"
        )),
    }
    for note in &d.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    let c = d.counts;
    out.push_str(&format!(
        "\nsteps: {} same, {} changed, {} only in A, {} only in B\n",
        c.same, c.changed, c.only_in_a, c.only_in_b
    ));
    changed_section(d, &mut out);
    lone_section("only in A", "SEQ A", &d.only_in_a, c.only_in_a, &mut out);
    lone_section("only in B", "SEQ B", &d.only_in_b, c.only_in_b, &mut out);
    decisions_section(d, &mut out);
    cost_section(d, &mut out);
    out
}

/// `A  01j5…  record  ok  started … UTC  9 events  fork of 01j4… at seq 5`.
fn run_line(name: &str, side: &RunSide) -> String {
    let mut line = format!(
        "{name}  {}  {}  {}  started {} UTC  {}",
        side.id,
        side.mode,
        side.status,
        utc_time(side.started_at_ms),
        count(side.events, "event")
    );
    if let Some(title) = &side.name {
        line.push_str(&format!("  {title:?}"));
    }
    match (&side.source_run, side.fork_at) {
        (Some(source), Some(at)) => line.push_str(&format!("  fork of {source} at seq {at}")),
        (Some(source), None) => line.push_str(&format!("  from {source}")),
        _ => {}
    }
    if !side.edits.is_empty() {
        line.push_str(&format!("  edits: {}", edits_line(&side.edits)));
    }
    line.push('\n');
    line
}

/// `(showing 20 of 512; --limit N shows more)` when the list was cut.
fn cut_note(shown: usize, total: u64) -> String {
    if (shown as u64) < total {
        format!("  (showing {shown} of {total}; --limit N shows more)\n")
    } else {
        String::new()
    }
}

fn changed_section(d: &RunDiff, out: &mut String) {
    if d.changed.is_empty() {
        return;
    }
    out.push_str(&format!("\nchanged ({}):\n", d.counts.changed));
    let digest = |d: &Option<retrace_core::Digest>| d.map_or("-".to_owned(), |d| d.short());
    let rows: Vec<Vec<String>> = d
        .changed
        .iter()
        .map(|c| {
            let label = match c.label_a == c.label_b {
                true => c.label_a.clone(),
                false => format!("{} / {}", c.label_a, c.label_b),
            };
            vec![
                c.seq_a.to_string(),
                c.seq_b.to_string(),
                c.agent.clone(),
                fit(&label, MAX_LABEL),
                digest(&c.output_a),
                digest(&c.output_b),
            ]
        })
        .collect();
    let text = table(&["SEQ A", "SEQ B", "AGENT", "STEP", "OUTPUT A", "OUTPUT B"], &rows);
    let mut lines = text.lines();
    if let Some(header) = lines.next() {
        out.push_str(&format!("  {header}\n"));
    }
    for (line, c) in lines.zip(&d.changed) {
        out.push_str(&format!("  {line}\n"));
        // What was asked differently first, then what came back differently.
        for diff_line in c.request_diff.iter().chain(&c.diff).flat_map(|text| text.lines()) {
            out.push_str(&format!("      {diff_line}\n"));
        }
    }
    out.push_str(&cut_note(d.changed.len(), d.counts.changed));
}

fn lone_section(title: &str, seq: &str, steps: &[LoneStep], total: u64, out: &mut String) {
    if steps.is_empty() {
        return;
    }
    out.push_str(&format!("\n{title} ({total}):\n"));
    let rows: Vec<Vec<String>> =
        steps.iter().map(|s| vec![s.seq.to_string(), s.agent.clone(), fit(&s.label, MAX_LABEL)]).collect();
    for line in table(&[seq, "AGENT", "STEP"], &rows).lines() {
        out.push_str(&format!("  {line}\n"));
    }
    out.push_str(&cut_note(steps.len(), total));
}

fn decisions_section(d: &RunDiff, out: &mut String) {
    if d.decisions.is_empty() {
        out.push_str("\ndecisions: none moved\n");
        return;
    }
    out.push_str(&format!("\ndecisions that moved ({}):\n", d.decisions.len()));
    let absent = |action: &Option<String>| action.clone().unwrap_or_else(|| "(none)".to_owned());
    let rows: Vec<Vec<String>> = d
        .decisions
        .iter()
        .map(|m| {
            vec![m.agent.clone(), m.target.clone().unwrap_or_else(|| "-".into()), absent(&m.a), absent(&m.b)]
        })
        .collect();
    for line in table(&["AGENT", "TARGET", "A", "B"], &rows).lines() {
        out.push_str(&format!("  {line}\n"));
    }
}

fn cost_section(d: &RunDiff, out: &mut String) {
    out.push_str(
        "\ntokens and cost (each run's own steps that ran live; recorded and cached steps cost nothing):\n",
    );
    // The prompt-cache columns only where a provider reported its cache at all.
    let sides = [&d.a, &d.b];
    let counted =
        sides.iter().flat_map(|s| [Some(&s.live), s.saved.as_ref(), s.inherited.as_ref()]).flatten();
    let cached = counted.clone().any(|t| t.cache_read_tokens > 0);
    let written = counted.clone().any(|t| t.cache_write_tokens > 0);
    let row = |name: String, t: &Tokens| {
        let steps = match t.steps_without_usage {
            0 => t.steps.to_string(),
            n => format!("{} ({n} without usage)", t.steps),
        };
        let mut row = vec![name, steps, t.input_tokens.to_string()];
        if cached {
            row.push(t.cache_read_tokens.to_string());
        }
        if written {
            row.push(t.cache_write_tokens.to_string());
        }
        row.extend([t.output_tokens.to_string(), dollars(t.cost_usd)]);
        row
    };
    let mut rows = vec![row("A live".into(), &d.a.live), row("B live".into(), &d.b.live)];
    let mut notes = Vec::new();
    for (name, source, side) in [("A", "B", &d.a), ("B", "A", &d.b)] {
        let (Some(saved), Some(inherited)) = (&side.saved, &side.inherited) else { continue };
        rows.push(row(format!("{name} saved"), saved));
        rows.push(row(format!("{name} inherited"), inherited));
        let at = side.fork_at.unwrap_or(1);
        notes.push(format!(
            "{name} saved: {source}'s live usage on the steps {name} served from the recording or the cache\n\
             {name} inherited: {source}'s live usage on the events before seq {at}, which {name} inherits"
        ));
    }
    let mut header = vec!["", "STEPS", "INPUT TOKENS"];
    if cached {
        header.push("OF THEM CACHE READ");
        notes.push("OF THEM CACHE READ: input tokens the provider's prompt cache served, priced at its cache-read rate".into());
    }
    if written {
        header.push("OF THEM CACHE WRITTEN");
        notes.push("OF THEM CACHE WRITTEN: input tokens written to the provider's prompt cache, priced at its cache-write rate".into());
    }
    header.extend(["OUTPUT TOKENS", "COST"]);
    for line in table(&header, &rows).lines() {
        out.push_str(&format!("  {line}\n"));
    }
    for line in notes.iter().flat_map(|n| n.lines()) {
        out.push_str(&format!("  {line}\n"));
    }
}

/// `$1.2345`, or six decimals under a cent so that small runs don't read as free.
fn dollars(cost: Option<f64>) -> String {
    match cost {
        None => "-".to_owned(),
        Some(c) if c.abs() < 0.01 => format!("${c:.6}"),
        Some(c) => format!("${c:.4}"),
    }
}
