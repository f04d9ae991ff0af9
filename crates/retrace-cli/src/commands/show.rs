//! `retrace show`: a run's timeline as one lane per agent, or one event with its request and output.
mod event;

use std::io::{BufWriter, Write};

use retrace_core::envelope::{EventType, Source};
use retrace_core::label;
use retrace_core::run::RunMeta;
use retrace_core::Event;
use retrace_store::export::RunEvents;
use retrace_store::Store;

use crate::commands::readable_store_from_env;
use crate::exit;
use crate::output::{fit, one_line, pad, print_json, utc_time, width};

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace show 01j5c3\n  \
         retrace show 01j5c3 --agent reviewer\n  \
         retrace show 01j5c3 --seq 7\n  \
         retrace show 01j5c3 --seq 7 --json | jq .output"
    };
}

/// The widest a lane gets when there are many; longer labels are cut with `…`.
const MAX_LANE: usize = 32;

/// The width all lanes together may take before they are cut to [`MAX_LANE`]: one or two lanes
/// show long labels (a tool's full name, a long model snapshot) whole.
const ALL_LANES: usize = 96;

/// The widest each of `lanes` lanes gets.
fn max_lane(lanes: usize) -> usize {
    (ALL_LANES / lanes.max(1)).max(MAX_LANE)
}

/// Show a run's timeline, or one event.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Show a run's timeline: one row per event in seq order (the order steps completed), \
one column (lane) per agent. Each row gives the seq, the agent's Lamport clock, the first hex digits \
of the step's key, and the event's label (`model_call gpt-4o`, `tool_call sql.query`, \
`deliver <- #4` for a delivery of the message sent at seq 4) in its agent's lane. A model call \
whose response named no pinned snapshot is marked `(alias only)`: the provider may serve another \
model under that name tomorrow. A fork's step answered from the cache is marked `[cache]`, a side \
effect it ran as a dry run `[dry run]`, a step that failed `[error]`. A proxied call is marked \
`[HTTP 429]` when the upstream answered with an error status, `[cut short]` when it broke off a \
stream, and `[client left]` when the client gave up before the answer (replay holds that answer \
back as long as the upstream took).\n\n\
With --seq, show one event: every field, then its request and output blobs, pretty-printed when \
they are JSON and as text otherwise; each is cut after its first 64 KiB, saying how much more \
there is, unless --full is given (--json always holds them whole).",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// The run: its id or a unique prefix of it (at least 4 characters).
    pub run: String,
    /// Only this agent's events.
    #[arg(long, value_name = "AGENT")]
    pub agent: Option<String>,
    /// One event, with its request and output.
    #[arg(long, value_name = "N", conflicts_with = "agent")]
    pub seq: Option<u64>,
    /// Print JSON: the run and its events, or the event with its blobs.
    #[arg(long)]
    pub json: bool,
    /// With --seq: print the request and output whole, however large (else each stops after
    /// 64 KiB).
    #[arg(long, requires = "seq")]
    pub full: bool,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let store = readable_store_from_env()?;
    let meta = crate::commands::runs::find(&*store, &args.run)?;
    if let Some(seq) = args.seq {
        return event::show(&*store, &meta, seq, args.json, args.full);
    }
    let (mut agents, marks) = agents(&*store, &meta)?;
    let mut lanes: Vec<Lane> = match &args.agent {
        None => agents,
        Some(name) => match agents.iter().position(|lane| &lane.agent == name) {
            Some(at) => vec![agents.swap_remove(at)],
            None => {
                let known: Vec<_> = agents.iter().map(|l| crate::output::one_line(&l.agent)).collect();
                let message = format!("run {} has no agent {name:?} (agents: {})", meta.id, known.join(", "));
                return Err(exit::usage(message));
            }
        },
    };
    let widest = max_lane(lanes.len());
    for lane in &mut lanes {
        lane.width = lane.width.min(widest);
    }
    if args.json {
        let mut events = Vec::new();
        for_each_event(&*store, &meta.id, |e| {
            if args.agent.as_ref().is_none_or(|a| a == &e.agent_id) {
                events.push(serde_json::to_value(e)?);
            }
            Ok(())
        })?;
        let value = serde_json::json!({ "run": meta, "events": events });
        return print_json(&value);
    }
    timeline(&*store, &meta, &lanes, &marks)
}

/// One agent's column.
struct Lane {
    agent: String,
    width: usize,
}

/// What went wrong in proxied calls, by seq ([`http_outcome`]).
type Marks = std::collections::HashMap<u64, String>;

/// The agents in order of their first event, each with the width its lane's longest cell needs,
/// and the proxied calls' marks.
fn agents(store: &dyn Store, meta: &RunMeta) -> anyhow::Result<(Vec<Lane>, Marks)> {
    let mut lanes: Vec<Lane> = Vec::new();
    let mut marks = Marks::new();
    for_each_event(store, &meta.id, |e| {
        let mut text = cell(e);
        let mut mark = http_outcome(store, e).unwrap_or_default();
        if edit_of(meta, e).is_some() {
            mark.push_str(" [edited]");
        }
        if !mark.is_empty() {
            text.push_str(&mark);
            marks.insert(e.seq, mark);
        }
        let cell_width = width(&one_line(&text));
        match lanes.iter_mut().find(|lane| lane.agent == e.agent_id) {
            Some(lane) => lane.width = lane.width.max(cell_width),
            None => {
                let width = cell_width.max(width(&one_line(&e.agent_id)));
                lanes.push(Lane { agent: e.agent_id.clone(), width });
            }
        }
        Ok(())
    })?;
    Ok((lanes, marks))
}

/// Calls `f` on every event of `run` in seq order (a fork's inherited ones included), a page at a time.
fn for_each_event(
    store: &dyn Store,
    run: &str,
    mut f: impl FnMut(&Event) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut pages = RunEvents::new(store, run)?;
    while let Some(page) = pages.next_page()? {
        for event in &page {
            f(event)?;
        }
    }
    Ok(())
}

fn timeline(store: &dyn Store, meta: &RunMeta, lanes: &[Lane], marks: &Marks) -> anyhow::Result<()> {
    let count = RunEvents::new(store, &meta.id)?.count();
    let mut out = BufWriter::new(std::io::stdout().lock());
    let name = meta.name.as_deref().map(|n| format!(" {n:?}")).unwrap_or_default();
    writeln!(
        out,
        "run {}{name}  {} {}  {}  started {} UTC",
        meta.id,
        meta.mode,
        meta.status,
        crate::output::count(count, "event"),
        utc_time(meta.started_at_ms)
    )?;
    if let Some(source) = &meta.source_run {
        let at = meta.fork_at.map(|at| format!(" at seq {at}")).unwrap_or_default();
        writeln!(out, "source {source}{at}")?;
    }
    if !meta.edits.is_empty() {
        writeln!(out, "edits {}", crate::output::edits_line(&meta.edits))?;
    }
    // A replay stores its divergence, not the events it replayed: the report is what to show.
    if let Some(value) = &meta.divergence {
        match serde_json::from_value::<retrace_core::Divergence>(value.clone()) {
            Ok(d) => write!(out, "{}", d.to_string().trim_end().to_owned() + "\n")?,
            Err(_) => writeln!(out, "divergence {value}")?,
        }
    }
    if count == 0 {
        // An empty header says nothing: say why there is nothing under it.
        let why = match (meta.mode, meta.source_run.as_deref()) {
            (retrace_core::run::RunMode::Replay, Some(source)) => format!(
                "(no events: a replay stores only its outcome; `retrace show {source}` shows the steps it replayed)"
            ),
            _ if meta.status == retrace_core::run::RunStatus::Running => "(no events yet)".to_owned(),
            _ => format!("(no events: the run ended {} before its first step)", meta.status),
        };
        writeln!(out, "{why}")?;
        out.flush()?;
        return Ok(());
    }
    let seq_width = count.to_string().len().max(3);
    let mut line = format!("{:>seq_width$}  {:>7}  {:<8}", "SEQ", "LAMPORT", "KEY");
    for lane in lanes {
        line.push_str("  ");
        line.push_str(&pad(&fit(&lane.agent, lane.width), lane.width));
    }
    writeln!(out, "{}", line.trim_end())?;
    for_each_event(store, &meta.id, |e| {
        let Some(column) = lanes.iter().position(|lane| lane.agent == e.agent_id) else {
            return Ok(());
        };
        line.clear();
        let key = &e.key.hex()[..8];
        line.push_str(&format!("{:>seq_width$}  {:>7}  {key}", e.seq, e.lamport));
        for lane in &lanes[..column] {
            line.extend(std::iter::repeat_n(' ', lane.width + 2));
        }
        line.push_str("  ");
        let mut text = cell(e);
        if let Some(mark) = marks.get(&e.seq) {
            text.push_str(mark);
        }
        line.push_str(&fit(&text, lanes[column].width));
        writeln!(out, "{line}")?;
        Ok(())
    })?;
    out.flush()?;
    Ok(())
}

/// For a proxied call (its output a `retrace-http/1` document), what went wrong, if anything:
/// ` [HTTP 429]` for an error status, ` [cut short]` for a stream the upstream broke off,
/// ` [client left]` for a call whose client gave up (before the answer, the 504 is the proxy's own
/// saying so, and is not marked as the upstream's error).
fn http_outcome(store: &dyn Store, e: &Event) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Gone {
        #[serde(default)]
        answered_ms: Option<u64>,
    }
    #[derive(serde::Deserialize)]
    struct Head {
        format: String,
        status: u16,
        #[serde(default)]
        end: Option<String>,
        #[serde(default)]
        client_gone: Option<Gone>,
    }
    if e.kind != EventType::ModelCall || !e.name.as_deref().is_some_and(|n| n.contains('/')) {
        return None;
    }
    let doc = store.get_blob(&e.output_ref?).ok()?;
    let head: Head = serde_json::from_slice(&doc).ok()?;
    if head.format != retrace_core::http_doc::FORMAT {
        return None;
    }
    let mut marks = String::new();
    let left_unanswered = head.client_gone.as_ref().is_some_and(|g| g.answered_ms.is_none());
    if head.status >= 400 && !left_unanswered {
        marks.push_str(&format!(" [HTTP {}]", head.status));
    }
    if head.end.as_deref() == Some("truncated") {
        marks.push_str(" [cut short]");
    }
    if head.client_gone.is_some() {
        marks.push_str(" [client left]");
    }
    (!marks.is_empty()).then_some(marks)
}

/// The edit of a fork (`tool-output:5=@out.json`) that gave `e` its output or message instead of
/// the source's: its `source` says `recorded`, as a step served from the log (QA25 D5), so the
/// timeline and `show --seq` say it was edited.
pub(crate) fn edit_of<'a>(meta: &'a RunMeta, e: &Event) -> Option<&'a str> {
    let origin = e.origin_seq.filter(|_| e.run_id == meta.id && e.source == Source::Recorded)?;
    meta.edits.iter().map(String::as_str).find(|text| {
        matches!(
            text.parse::<retrace_core::edit::Edit>(),
            Ok(edit @ (retrace_core::edit::Edit::ToolOutput { .. }
                | retrace_core::edit::Edit::ModelOutput { .. }
                | retrace_core::edit::Edit::Message { .. })) if edit.seqs() == [origin]
        )
    })
}

/// What an event's lane shows: its label, as `retrace diff` names the step too
/// ([`retrace_core::label::step`]: the model's name for a model call, the other agent for a
/// message), plus what a reader needs at a glance.
fn cell(e: &Event) -> String {
    let mut text = match e.kind {
        EventType::Approval => match e.approval.as_ref().map(|a| serde_json::to_value(a.outcome)) {
            Some(Ok(serde_json::Value::String(outcome))) => format!("approval {outcome}"),
            _ => e.label(),
        },
        _ => label::of_event(e),
    };
    match (e.kind, &e.model, &e.message, e.causal_parent) {
        // A call whose response named no pinned snapshot may get another model next time; a
        // cache hit's answer came from an earlier call, whose snapshot the cache doesn't keep,
        // so its null snapshot says nothing.
        (EventType::ModelCall, Some(model), ..)
            if model.snapshot.is_none() && e.source != Source::CacheHit =>
        {
            text.push_str(" (alias only)");
        }
        (EventType::Deliver, _, Some(m), _) if m.timed_out => {}
        (EventType::Deliver, _, _, Some(send)) => text.push_str(&format!(" #{send}")),
        _ => {}
    }
    match e.source {
        Source::CacheHit => text.push_str(" [cache]"),
        Source::DryRun => text.push_str(" [dry run]"),
        Source::Live | Source::Recorded => {}
    }
    if e.error.is_some() {
        text.push_str(" [error]");
    }
    text
}
