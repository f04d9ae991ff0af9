//! `retrace delete`: delete named runs now, whatever their tier, and the blobs only they used.
use retrace_store::gc::{collect, delete, DeleteError, GcConfig};
use retrace_store::StoreErrorKind;

use crate::commands::gc::{now_ms, print_report, retention};
use crate::exit;
use crate::output::count;

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace delete 01j5c3 --dry-run\n  \
         retrace delete 01j5c3\n  \
         retrace delete 01j5c3 01j5c9 --json | jq .bytes_freed\n  \
         retrace delete 01j5c3 && retrace import trace.jsonl   # replace a run"
    };
}

/// Delete runs now.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Delete the named runs now, whatever their retention tier, with every replay of them, \
then every blob no remaining run references; report what went, as `retrace gc` does.\n\n\
A run is refused, and nothing is deleted, while something still needs it: it is running, a \
replay of it is running, or a fork of it remains (a fork inherits its source's events before its \
fork point): name the fork too to delete both. Blobs stored since the oldest running recording \
began, or within [retention] blob_grace_minutes of ./retrace.toml (default 60), stay until a \
later `retrace gc`: a recording may not yet have written what references them.\n\n\
Everything happens in one transaction. --dry-run reports exactly what would go and changes \
nothing. To replace a run with a trace file of the same id, delete it, then import the file.",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// The runs: ids or unique prefixes (at least 4 characters).
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<String>,
    /// Report what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON: `{"dry_run", "runs_deleted": [...], "events_deleted", "blobs_deleted",
    /// "bytes_freed", "cache_entries_dropped", "vault_originals_deleted", "blobs_in_grace"}`
    /// (`vault_originals_deleted`: secrets' originals that only these runs held;
    /// `blobs_in_grace`: blobs no run uses that stay until a later `retrace gc`, stored within
    /// `blob_grace_minutes`).
    #[arg(long)]
    pub json: bool,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let retention = retention()?;
    let store = super::store_for_collecting(args.dry_run)?;
    let (mut named, mut damaged) = (vec![], vec![]);
    for run in &args.runs {
        match store.find_run(run) {
            Ok(meta) => named.push(meta),
            // A run whose record can't be read can still be deleted by its id (or a unique
            // prefix): it is in the way of nothing else then.
            Err(e) if e.kind == StoreErrorKind::Corrupt => match unreadable(&*store, run)? {
                Some(id) => {
                    eprintln!("retrace: run {id}'s record can't be read; deleting it by its id");
                    damaged.push(id);
                }
                None => return Err(e.into()),
            },
            // Not found, ambiguous: said as every command says it.
            Err(_) => named.push(crate::commands::runs::find(&*store, run)?),
        }
    }
    let mut config = GcConfig::from_retention(now_ms(), &retention);
    config.dry_run = args.dry_run;
    let report = delete(&*store, &named, &damaged, &config).map_err(|e| match &e {
        DeleteError::Running { run } => exit::usage_hint(
            e.to_string(),
            format!("wait for it to end (`retrace runs` shows its status), then `retrace delete {run}`"),
        ),
        DeleteError::Needed { run, by, by_mode: "fork", .. } => {
            exit::usage_hint(e.to_string(), format!("delete both: retrace delete {by} {run}"))
        }
        DeleteError::Needed { run, .. } => exit::usage_hint(
            e.to_string(),
            format!("wait for the replay to end, then `retrace delete {run}`"),
        ),
        DeleteError::Store(_) => anyhow::Error::from(e),
    })?;
    // Blobs only the deleted runs used but stored within the grace stay for now: said, so a
    // run deleted for what it holds isn't taken for gone with "0 blobs" (QA14 S2).
    let held = match (args.dry_run, config.blob_grace_ms) {
        (false, 1..) => {
            let ungraced =
                GcConfig { blob_grace_ms: 0, routine_max_age_ms: u64::MAX, dry_run: true, ..config };
            collect(&*store, &ungraced)?.blobs_deleted
        }
        // Nothing is deleted yet: the same delete with no grace says how many more blobs it
        // would take, and those are the ones the grace keeps (QA21 D5).
        (true, 1..) => {
            let ungraced = GcConfig { blob_grace_ms: 0, ..config };
            delete(&*store, &named, &damaged, &ungraced)?.blobs_deleted.saturating_sub(report.blobs_deleted)
        }
        _ => 0,
    };
    print_report(&report, args.json, &[("blobs_in_grace", held.into())])?;
    if held > 0 && !args.json {
        println!(
            "{} no run uses {} kept for now: stored in the last {} minutes ([retention] \
             blob_grace_minutes), a recording may still reference them; `retrace gc` removes them after that",
            count(held, "blob"),
            if held == 1 { "is" } else { "are" },
            retention.blob_grace_minutes
        );
    }
    Ok(())
}

/// The id of the run whose stored record can't be read that `id_or_prefix` names (its id, or a
/// prefix of at least 4 characters the store found no other run for).
fn unreadable(store: &dyn retrace_store::Store, id_or_prefix: &str) -> anyhow::Result<Option<String>> {
    let (_, unreadable) = store.runs_and_unreadable()?;
    let matching: Vec<&str> = unreadable
        .iter()
        .map(|r| r.id.as_str())
        .filter(|id| *id == id_or_prefix || (id_or_prefix.len() >= 4 && id.starts_with(id_or_prefix)))
        .collect();
    Ok(match matching[..] {
        [id] => Some(id.to_owned()),
        _ => matching.iter().find(|id| **id == id_or_prefix).map(|id| (*id).to_owned()),
    })
}
