//! `retrace gc`: delete expired runs and the blobs nothing references any more.
use std::io::Write;

use retrace_store::gc::{collect, refuse_while_running, GcConfig, GcReport, RetentionConfig};

use crate::exit;
use crate::output::count;
use crate::output::print_json;

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace gc --dry-run\n  \
         retrace gc\n  \
         retrace gc --compact\n  \
         retrace gc --older-than 7 --json | jq .bytes_freed"
    };
}

/// The configuration file read from the working directory.
const CONFIG: &str = "retrace.toml";

/// Collect garbage: expired runs, then unreferenced blobs.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Delete the runs whose retention has expired, then every blob no remaining run references, \
and report what went: runs, events, blobs and bytes freed. The bytes are the blobs' (files \
removed, and space inside the database); the database file doesn't shrink: SQLite reuses the \
space for new runs. --compact gives that space back to the file system afterwards: it rewrites \
the database (SQLite's VACUUM), which takes a while on a large store and needs it to itself, so \
it is refused (exit 2, before anything is deleted) while any run is running.\n\n\
Which runs go: a `routine` run older than [retention] routine_days in ./retrace.toml (default \
30, or --older-than). `incident` and `pinned` runs stay (see `retrace retain`), and so does \
anything they need: a fork inherits its source's early events, so a source stays while any fork \
of it remains, and so gets the highest tier of its forks. Replay runs go with their source. \
Running runs never go.\n\n\
Which blobs go: those no remaining run references (requests, outputs, fork edits, the requests \
a kept request is stored as a continuation of); cache entries whose output goes are dropped too. \
Blobs stored since the oldest running recording began, or within [retention] \
blob_grace_minutes (default 60), stay: a recording may not yet have written what references \
them.\n\n\
Everything happens in one transaction, so a recording that runs meanwhile loses nothing. \
--dry-run reports exactly what would go and changes nothing.",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// Report what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Routine runs expire after DAYS days (overrides [retention] routine_days).
    #[arg(long, value_name = "DAYS")]
    pub older_than: Option<u64>,
    /// Then shrink the database file to what it holds (VACUUM): needs no run to be running.
    #[arg(long)]
    pub compact: bool,
    /// Print JSON: `{"dry_run", "runs_deleted": [...], "events_deleted", "blobs_deleted",
    /// "bytes_freed", "cache_entries_dropped", "vault_originals_deleted", "routine_days"}`
    /// (`vault_originals_deleted`: secrets' originals sealed in the vault that no remaining run
    /// holds a token of, deleted with the last run that did), and with --compact
    /// `"compacted": {"bytes_before", "bytes_after"}` (null in a dry run).
    #[arg(long)]
    pub json: bool,
}

/// `[retention]` of ./retrace.toml (else the nearest above it up to the git top level), or the
/// defaults when there is no such file (also what `retrace serve`'s `POST /api/gc` expires
/// routine runs by).
pub(crate) fn retention() -> anyhow::Result<RetentionConfig> {
    let path = retrace_runtime::config_file::config_dir(std::path::Path::new(".")).join(CONFIG);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            RetentionConfig::parse_toml(&text).map_err(|e| exit::usage(format!("{}: {e}", path.display())))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(RetentionConfig::default()),
        Err(e) => Err(exit::usage(format!("cannot read {}: {e}", path.display()))),
    }
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut retention = retention()?;
    if let Some(days) = args.older_than {
        retention.routine_days = days;
    }
    let store = super::store_for_collecting(args.dry_run)?;
    let mut config = GcConfig::from_retention(now_ms(), &retention);
    config.dry_run = args.dry_run;
    if args.compact {
        // Refused before anything is deleted: the user asked for both.
        let (runs, _) = store.runs_and_unreadable()?;
        refuse_while_running(&runs).map_err(|e| {
            exit::usage_hint(
                e.to_string(),
                "`retrace runs --status running` lists them; `retrace gc` without --compact collects now",
            )
        })?;
    }
    let report = collect(&*store, &config)?;
    // A run whose record can't be read is kept, with every blob it may use: said, with the way
    // out, so one damaged row neither stops the collection nor hides.
    let (_, unreadable) = store.runs_and_unreadable()?;
    for run in &unreadable {
        eprintln!(
            "retrace: kept run {}: its record can't be read ({}); `retrace delete {}` removes it",
            run.id, run.error, run.id
        );
    }
    let kept: Vec<&str> = unreadable.iter().map(|r| r.id.as_str()).collect();
    let mut extra = vec![("routine_days", retention.routine_days.into()), ("unreadable_kept", kept.into())];
    let compacted = match args.compact && !args.dry_run {
        true => Some(store.compact().map_err(|e| {
            exit::usage_hint(
                format!("collected, but not compacted: {e}"),
                "run `retrace gc --compact` again once no run is running",
            )
        })?),
        false => None,
    };
    if args.compact {
        extra.push(("compacted", serde_json::to_value(compacted)?));
    }
    print_report(&report, args.json, &extra)?;
    if args.json || !args.compact {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    match compacted {
        Some(c) => writeln!(
            out,
            "compacted the database: {} -> {} ({} given back)",
            human_bytes(c.bytes_before),
            human_bytes(c.bytes_after),
            human_bytes(c.bytes_before.saturating_sub(c.bytes_after))
        )?,
        None => writeln!(out, "would then compact the database file")?,
    }
    Ok(())
}

/// Prints what a collection deleted (`gc`, `delete`): a line per run and a summary, or, with
/// `json`, the report with `extra` fields added.
pub(crate) fn print_report(
    report: &GcReport,
    json: bool,
    extra: &[(&str, serde_json::Value)],
) -> anyhow::Result<()> {
    if json {
        let mut value = serde_json::to_value(report)?;
        for (k, v) in extra {
            value[*k] = v.clone();
        }
        return print_json(&value);
    }
    let mut out = std::io::stdout().lock();
    let verb = if report.dry_run { "would delete" } else { "deleted" };
    for run in &report.runs_deleted {
        writeln!(out, "{verb} run {run}")?;
    }
    writeln!(
        out,
        "{verb} {} ({}) and {}; {} {}{}{}",
        count(report.runs_deleted.len(), "run"),
        count(report.events_deleted, "event"),
        count(report.blobs_deleted, "blob"),
        human_bytes(report.bytes_freed),
        if report.dry_run { "would be freed" } else { "freed" },
        match report.cache_entries_dropped {
            0 => String::new(),
            n => format!("; {n} cache entries dropped with their outputs"),
        },
        match report.vault_originals_deleted {
            0 => String::new(),
            n => format!(
                "; {} {} from the vault, no run left holding {}",
                count(n, "secret's original"),
                if report.dry_run { "would be deleted" } else { "deleted" },
                if n == 1 { "its token" } else { "their tokens" }
            ),
        }
    )?;
    let compacting = extra.iter().any(|(k, _)| *k == "compacted");
    if !compacting && (report.events_deleted > 0 || report.bytes_freed > 0) {
        // What was freed counts the blobs' bytes; the database file itself doesn't shrink.
        writeln!(
            out,
            "(blob files are removed; the database file keeps its size and reuses the space its rows \
             left for new runs; `retrace gc --compact` shrinks it)"
        )?;
    }
    Ok(())
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `1234` → `1.2 KB`.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if bytes < 1000 {
        return count(bytes, "byte");
    }
    let mut value = bytes as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}
