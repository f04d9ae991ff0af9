//! `retrace runs`: list the runs in the store, oldest first.
use std::io::Write;

use crate::commands::readable_store_from_env;
use crate::output::{fit, print_json, table, utc_time};
use retrace_core::run::RunMeta;
use retrace_store::import::UNFINISHED_LABEL;

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace runs\n  \
         retrace runs --last 10 --mode record\n  \
         retrace runs --name nightly --status diverged\n  \
         retrace runs --label team=data --json | jq -r '.[].id'"
    };
}

/// List runs.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "List the runs in the store (RETRACE_STORE, or RETRACE_HOME, default ./.retrace), \
oldest first: id, name, mode (record, replay, fork), status (running, ok, failed, diverged, \
interrupted), number of events, start time (UTC) and, for replays and forks, the source run.\n\n\
A run whose stored record can't be read (damaged in the database) is listed as `unreadable`, \
with the reason under the table (`--json`: `{id, run_id, unreadable}`), and the others as usual.\n\n\
A run whose recorder was acknowledged for events the store lacks (an ack log that recovery \
could not apply, under RETRACE_DURABILITY=event) has its status marked `*` and is explained \
under the table; `--json` gives the reason as `unrecovered`. A status marked `?` is an import \
that stopped part way (importing its file again stores the rest; `--json`: the label \
`retrace.unfinished_import`), and `!` a run imported with --force despite failed checks \
(`retrace verify RUN` names them; the label `retrace.forced_import`).\n\n\
With no store yet (nothing recorded there), the list is empty (`[]` with --json), and stderr \
says so.\n\n\
--name, --mode, --status and --label keep the runs that match all of them; --last N keeps the N \
most recent of those, still listed oldest first. Unreadable runs are listed whatever the filters.\n\n\
Any command that takes RUN accepts a unique prefix of the id (at least 4 characters).",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// Print a JSON array: every stored field of each run (its id as `id` and as `run_id`), plus
    /// `events` (and `unrecovered`, the reason, for a run that may lack acknowledged events).
    #[arg(long)]
    pub json: bool,
    /// Only the runs given this `--name` when recorded, with their replays and forks (which go by
    /// their source's name).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Only runs of this mode: record, replay or fork.
    #[arg(long, value_name = "MODE")]
    pub mode: Option<retrace_core::run::RunMode>,
    /// Only runs with this status: running, ok, failed, diverged or interrupted.
    #[arg(long, value_name = "STATUS")]
    pub status: Option<retrace_core::run::RunStatus>,
    /// Only runs with this label (repeatable: all of them).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Only the N most recent runs (of those the other filters keep).
    #[arg(long, value_name = "N")]
    pub last: Option<usize>,
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

impl Args {
    fn filters(&self) -> bool {
        self.name.is_some()
            || self.mode.is_some()
            || self.status.is_some()
            || !self.labels.is_empty()
            || self.last.is_some()
    }

    /// Whether the filters keep `meta`; `named` says whether it goes by `--name`.
    fn keeps(&self, meta: &RunMeta, named: &dyn Fn(&RunMeta) -> bool) -> bool {
        named(meta)
            && self.mode.is_none_or(|mode| meta.mode == mode)
            && self.status.is_none_or(|status| meta.status == status)
            && self.labels.iter().all(|(k, v)| meta.labels.get(k) == Some(v))
    }
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    // No store yet is no runs yet: listed as none (`[]` with --json), said on stderr, rather
    // than an error a script must tell from a real one (QA9 D8). `verify --all` still refuses:
    // a check of nothing must not pass as a check of a mistyped store.
    let store = match crate::commands::missing_store_from_env()? {
        Some(missing) => {
            eprintln!("retrace: {missing}");
            retrace_store::open_store(&retrace_store::StoreConfig::memory())?
        }
        None => readable_store_from_env()?,
    };
    let (mut runs, unreadable) = store.runs_and_unreadable()?;
    // A fork is named `fork of NAME`: it goes by its source's name too, as replays do (theirs is
    // the source's), so `--name nightly` lists the nightly runs with their replays and forks.
    let by_id: std::collections::HashMap<&str, &RunMeta> = runs.iter().map(|r| (r.id.as_str(), r)).collect();
    let named = |meta: &RunMeta| {
        let Some(name) = &args.name else { return true };
        let mut at = Some(meta);
        for _ in 0..64 {
            let Some(run) = at else { break };
            if run.name.as_ref() == Some(name) {
                return true;
            }
            at = run.source_run.as_deref().and_then(|id| by_id.get(id).copied());
        }
        false
    };
    let kept: Vec<bool> = runs.iter().map(|meta| args.keeps(meta, &named)).collect();
    let mut kept = kept.into_iter();
    runs.retain(|_| kept.next().unwrap_or(false));
    if let Some(last) = args.last {
        // The store lists oldest first.
        runs.drain(..runs.len().saturating_sub(last));
    }
    let mut counted = Vec::with_capacity(runs.len());
    for meta in runs {
        // A fork's seqs continue its source's: one that took no step of its own still holds
        // the events before its fork point.
        let inherited = meta.fork_at.filter(|_| meta.mode == retrace_core::run::RunMode::Fork);
        let events = store.last_seq(&meta.id)?.max(inherited.map_or(0, |at| at.saturating_sub(1)));
        let unrecovered = store.unrecovered(&meta.id);
        counted.push((meta, events, unrecovered));
    }
    if args.json {
        let list = counted
            .iter()
            .map(|(meta, events, unrecovered)| {
                let mut value = serde_json::to_value(meta)?;
                // `run_id` too, as the daemon's API (`/api/runs`) and the SDKs name it.
                value["run_id"] = meta.id.as_str().into();
                value["events"] = (*events).into();
                if let Some(why) = unrecovered {
                    value["unrecovered"] = why.as_str().into();
                }
                Ok(value)
            })
            .chain(unreadable.iter().map(|run| {
                Ok(serde_json::json!({"id": run.id, "run_id": run.id, "unreadable": run.error.to_string()}))
            }))
            .collect::<anyhow::Result<Vec<_>>>()?;
        return print_json(&serde_json::Value::Array(list));
    }
    if counted.is_empty() && unreadable.is_empty() {
        match args.filters() {
            true => eprintln!("no runs match: `retrace runs` lists them all"),
            false => eprintln!("no runs yet: record one with `retrace demo` or `retrace record -- CMD`"),
        }
        return Ok(());
    }
    let rows: Vec<Vec<String>> = counted
        .iter()
        .map(|(meta, events, unrecovered)| {
            let forced = meta.labels.contains_key(super::import::FORCED_LABEL);
            let unfinished = meta.labels.contains_key(UNFINISHED_LABEL);
            let marked = match (unrecovered.is_some(), forced, unfinished) {
                (true, _, _) => "*",
                (false, true, _) => "!",
                (false, false, true) => "?",
                (false, false, false) => "",
            };
            vec![
                meta.id.clone(),
                fit(meta.name.as_deref().unwrap_or("-"), 24),
                meta.mode.to_string(),
                format!("{}{marked}", meta.status),
                events.to_string(),
                utc_time(meta.started_at_ms),
                meta.source_run.as_deref().map_or("-".into(), |s| fit(s, 13)),
            ]
        })
        .chain(unreadable.iter().map(|run| {
            let mut row = vec!["-".to_owned(); 7];
            (row[0], row[3]) = (run.id.clone(), "unreadable".to_owned());
            row
        }))
        .collect();
    let mut text = table(&["ID", "NAME", "MODE", "STATUS", "EVENTS", "STARTED (UTC)", "SOURCE"], &rows);
    for run in &unreadable {
        text.push_str(&format!(
            "x {}: its record can't be read ({}); `retrace verify --all` checks the other runs\n",
            run.id, run.error
        ));
    }
    for (meta, _, unrecovered) in &counted {
        if let Some(why) = unrecovered {
            text.push_str(&format!("* {} may lack acknowledged events: {why}\n", meta.id));
        }
        if meta.labels.contains_key(UNFINISHED_LABEL) {
            text.push_str(&format!(
                "? {} is an unfinished import: importing its file again stores the rest\n",
                meta.id
            ));
        }
        if let Some(what) = meta.labels.get(super::import::FORCED_LABEL) {
            text.push_str(&format!(
                "! {} was imported with --force despite {what}: `retrace verify {}` names the damage\n",
                meta.id, meta.id
            ));
        }
    }
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(())
}

/// The run `id_or_prefix` names; not found or ambiguous is a usage error with a hint.
pub fn find(
    store: &dyn retrace_store::Store,
    id_or_prefix: &str,
) -> anyhow::Result<retrace_core::run::RunMeta> {
    use retrace_store::StoreErrorKind;
    match store.find_run(id_or_prefix) {
        Ok(meta) => Ok(meta),
        Err(e) if e.kind == StoreErrorKind::NotFound => {
            Err(crate::exit::not_found_hint(e.to_string(), named_hint(store, id_or_prefix)))
        }
        Err(e) if e.kind == StoreErrorKind::Invalid => {
            Err(crate::exit::usage_hint(e.to_string(), named_hint(store, id_or_prefix)))
        }
        Err(e) => Err(e.into()),
    }
}

/// What to do about a run that no id matches: a run is named by its id, but one given its
/// `--name` is the likely meaning, so the runs of that name are listed, newest first.
fn named_hint(store: &dyn retrace_store::Store, text: &str) -> String {
    const SHOWN: usize = 5;
    let mut named: Vec<_> =
        store.runs().unwrap_or_default().into_iter().filter(|r| r.name.as_deref() == Some(text)).collect();
    if named.is_empty() {
        return "list the runs in this store with `retrace runs`".into();
    }
    named.sort_by_key(|r| std::cmp::Reverse(r.started_at_ms));
    let listed: Vec<String> =
        named.iter().take(SHOWN).map(|r| format!("{} ({} {})", r.id, r.mode, r.status)).collect();
    let more = match named.len() > SHOWN {
        true => format!(" and {} more", named.len() - SHOWN),
        false => String::new(),
    };
    format!(
        "runs are given by id (or a unique prefix of it); the runs named {text:?}: {}{more}",
        listed.join(", ")
    )
}
