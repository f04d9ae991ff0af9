//! `retrace import`: read a trace file into the store, verifying all of it first.
use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

use retrace_store::import::{
    import_reader, ImportError, ImportErrorKind, ImportOptions, ImportOutcome, UNFINISHED_LABEL,
};

use crate::commands::store_from_env;
use crate::exit;
use crate::output::count;
use crate::output::{failure, Progress};

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace import tests/traces/backfill.jsonl\n  \
         gunzip -c backfill.jsonl.gz | retrace import -\n  \
         retrace import --force damaged.jsonl && retrace verify --all"
    };
}

/// Import a trace file.
#[derive(Clone, Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Read a trace file written by `retrace export` into the store and print the run's id.\n\n\
Every line is verified before anything is stored: the header's format and counts, each event's \
seq, hash and link to the previous event, each blob's digest, that every referenced blob is in the \
file and nothing follows the last one. Errors name the file and line. The verified lines are held \
in memory until they are stored, so an import needs about as much free memory as the file is \
large.\n\n\
Importing a run that is already stored with the same events does nothing (exit 0, and says so), \
except that a file whose retention tier is stronger than the stored run's raises it (a run pinned \
where it was exported is pinned here too; a weaker tier leaves the store's); one stored with different events is refused (exit 1, naming the first differing seq). A fork's \
inherited events must equal its source's where the source is stored.\n\n\
The run looks whole only once its last event is stored: an import stopped part way (a full disk, \
a killed process) leaves it marked as an unfinished import (`retrace runs` shows `?`), and \
importing the same file again stores the rest.\n\n\
With --force, a file that fails verification or is truncated is imported anyway, for inspection: \
each failure is printed as a warning, events are stored as they are, a blob that doesn't match its \
digest is left out, and a truncated file's complete lines are kept; `retrace verify` then names \
the damage. A line that is not JSON, an unknown format or seqs out of order are refused even then.\n\n\
Exit codes: 0 imported or already present (with --force, even with warnings); 1 the file fails \
verification or conflicts with the store; 2 the file is not a trace, is truncated, or has an \
unknown format version, or the store failed (a full disk, say).",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// The trace file, or `-` for standard input.
    pub file: PathBuf,
    /// Import even if the file fails verification or is truncated (each failure is printed).
    #[arg(long)]
    pub force: bool,
    /// Print the outcome as a JSON object instead of the run's id: `{run, file, imported
    /// (false when already present), events and blobs stored (0 when already present),
    /// forced_checks, retention_raised_from}`.
    #[arg(long)]
    pub json: bool,
}

/// The label a run imported with `--force` despite failed checks carries: how many, and from
/// which file (`retrace runs` marks the run).
pub const FORCED_LABEL: &str = "retrace.forced_import";

/// The label a run imported from a file exported while it was still being recorded carries:
/// the store holds a snapshot, which the complete export later replaces.
pub const PARTIAL_LABEL: &str = "retrace.partial_import";

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let stdin = args.file.as_os_str() == "-";
    let name = if stdin { "<stdin>".to_owned() } else { args.file.display().to_string() };
    // How a hint names the input to import again: standard input is read anew.
    let again = if stdin { "- < FILE".to_owned() } else { name.clone() };
    let (reader, size): (Box<dyn std::io::Read>, u64) = if stdin {
        (Box::new(std::io::stdin().lock()), 0)
    } else {
        let file = File::open(&args.file).map_err(|e| exit::usage(format!("cannot open {name}: {e}")))?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        (Box::new(file), size)
    };
    let store = store_from_env()?;
    let mut progress = Progress::bytes("importing", size);
    let mut last = 0;
    let mut report = |done: u64| {
        progress.add(done - last);
        last = done;
    };
    let mut forgiven = 0usize;
    let mut warn = |err: &ImportError| {
        forgiven += 1;
        eprintln!("\rwarning: {err} (--force: kept, not refused)");
    };
    let opts = ImportOptions {
        file_name: Some(name.clone()),
        progress: Some(&mut report),
        forced: if args.force { Some(&mut warn) } else { None },
        ..ImportOptions::default()
    };
    let outcome = import_reader(&*store, BufReader::with_capacity(1 << 20, reader), opts);
    progress.finish();
    let outcome = match outcome {
        Ok(outcome) => outcome,
        // The stored copy is a snapshot taken while the run was recording, and this file goes
        // on from it: the file takes its place.
        Err(ImportError::Conflict { ref run_id, seq, .. }) if partial_copy(&*store, run_id, Some(seq)) => {
            return replace_snapshot(store, run_id, stdin, &name, args);
        }
        Err(ImportError::HeaderConflict { ref run_id, .. }) if partial_copy(&*store, run_id, None) => {
            return replace_snapshot(store, run_id, stdin, &name, args);
        }
        // The stored copy came from a file whose events were damaged (`--force`), so this one
        // differs from it: once it is checked whole on its own, it takes the copy's place, as
        // it does where only a blob was damaged (QA40 D6).
        Err(ImportError::Conflict { ref run_id, .. } | ImportError::HeaderConflict { ref run_id, .. })
            if !args.force && !stdin && forced_copy(&*store, run_id) && passes_alone(&args.file) =>
        {
            replace_copy(&*store, run_id, "a damaged file (imported with --force)")?;
            eprintln!("run {run_id} was stored from a damaged file (imported with --force): replacing it with {name}'s, which passes every check");
            drop(store);
            return run(args);
        }
        Err(e) => return Err(explained(&*store, e, args.force, &again)),
    };
    let mut said =
        serde_json::json!({"file": name, "forced_checks": forgiven, "retention_raised_from": null});
    match outcome {
        ImportOutcome::Imported { run_id, events, blobs } => {
            said["run"] = run_id.clone().into();
            said["imported"] = true.into();
            (said["events"], said["blobs"]) = (events.into(), blobs.into());
            eprintln!(
                "imported run {run_id} from {name}: {}, {}",
                count(events, "event"),
                count(blobs, "blob")
            );
            let mut meta = store.run(&run_id)?;
            if let Some(warning) = key_warning(&meta)? {
                eprintln!("{warning}");
            }
            if let Some(missing) = crate::launcher::missing_source(&*store, &meta)? {
                said["missing_source"] = missing.clone().into();
                eprintln!(
                    "warning: run {run_id} is a fork of run {missing}, which this store doesn't hold: import \
                     {missing}'s trace too to replay or fork it"
                );
            }
            if meta.status == retrace_core::run::RunStatus::Running {
                // Only the file says so: no one records it here.
                meta.labels
                    .insert(PARTIAL_LABEL.into(), format!("exported while being recorded, from {name}"));
                store.update_run(&meta)?;
                eprintln!(
                    "warning: run {run_id} was still being recorded when {name} was exported: the store \
                     holds the events up to then (it replays to log_ended); importing its complete \
                     export later replaces this copy"
                );
            }
            if forgiven > 0 {
                // The run says so wherever it is listed or exported, not only in this output.
                let mut meta = store.run(&run_id)?;
                meta.labels
                    .insert(FORCED_LABEL.into(), format!("{} in {name}", count(forgiven, "failed check")));
                store.update_run(&meta)?;
                eprintln!(
                    "warning: the file failed {} and was imported anyway (--force); \
                     `retrace verify {run_id}` lists what the store now holds",
                    count(forgiven, "check")
                );
            }
        }
        ImportOutcome::AlreadyPresent { run_id, .. } if forgiven == 0 && forced_copy(&*store, &run_id) => {
            // The stored copy came from a damaged file (`--force`): it may lack blobs the file's
            // events need. This file passes every check: it takes the damaged copy's place.
            if stdin {
                return Err(exit::usage_hint(
                    format!("run {run_id} is stored from a damaged file (imported with --force); this one passes every check"),
                    format!("replace the damaged copy: retrace delete {run_id} && retrace import - < FILE"),
                ));
            }
            replace_copy(&*store, &run_id, "a damaged file (imported with --force)")?;
            eprintln!("run {run_id} was stored from a damaged file (imported with --force): replacing it with {name}'s, which passes every check");
            drop(store);
            return run(args);
        }
        ImportOutcome::AlreadyPresent { run_id, raised } => {
            said["run"] = run_id.clone().into();
            said["imported"] = false.into();
            if let Some(r) = &raised {
                said["retention_raised_from"] = r.previous.to_string().into();
            }
            (said["events"], said["blobs"]) = (0.into(), 0.into());
            match raised {
                Some(r) => eprintln!(
                    "run {run_id} is already present with the same events; nothing imported but its \
                     retention, raised from {} to {} as the file has it",
                    r.previous, r.retention
                ),
                None => eprintln!("run {run_id} is already present with the same events; nothing imported"),
            }
        }
    }
    match args.json {
        true => crate::output::print_json(&said)?,
        false => println!("{}", said["run"].as_str().unwrap_or_default()),
    }
    Ok(())
}

/// `e` as the command reports it, with the hint that helps (`again` names the input to import
/// again).
fn explained(store: &dyn retrace_store::Store, e: ImportError, force: bool, again: &str) -> anyhow::Error {
    // Forcing helps a file whose header was read; an empty file stays empty.
    let forcible = match &e {
        ImportError::Truncated { at, .. } => at.line > 1,
        ImportError::Order { .. } => false,
        _ => e.kind() == ImportErrorKind::Verification,
    };
    let hinted = |hint: String| {
        let mut failed = failure(e.exit_code(), &e);
        if let Some(f) = failed.downcast_mut::<exit::Failure>() {
            f.hint = Some(hint);
        }
        failed
    };
    match e {
        _ if forcible && !force => hinted(format!(
            "`retrace import --force {again}` stores it anyway, for `retrace verify` to examine"
        )),
        // The imported run itself differs (not a fork's source, which other forks may need).
        ImportError::HeaderConflict { ref run_id, .. } => replaceable(store, &e, run_id, again),
        ImportError::Conflict { ref run_id, .. } => replaceable(store, &e, run_id, again),
        ImportError::Inherited { source_run: ref source, fork_in_file: true, .. } => hinted(format!(
            "the fork was made from another recording of {source} than this store's: import it into a \
                 store that holds that one (or none), or replace this store's {source} with the one the \
                 fork came from (`retrace delete {source}`, then import its trace first)"
        )),
        ImportError::Inherited { ref fork, source_run: ref source, .. } => hinted(format!(
            "the stored fork {fork} was made from another recording of {source}: to keep this file's, \
             `retrace delete {fork} && retrace import {again}`"
        )),
        ImportError::Store { ref run_id, .. } => unfinished(store, &e, run_id, again),
        _ => failure(e.exit_code(), &e),
    }
}

/// Replaces the snapshot of `run_id` a file exported mid-recording left with the file `name`
/// (which goes on from it), by importing it again once the snapshot is gone. Standard input
/// can't be read twice: then the hint says how.
fn replace_snapshot(
    store: std::sync::Arc<dyn retrace_store::Store>,
    run_id: &str,
    stdin: bool,
    name: &str,
    args: Args,
) -> anyhow::Result<()> {
    if stdin {
        return Err(exit::usage_hint(
            format!("run {run_id} is stored from a file exported while it was being recorded; this one holds more"),
            format!("replace the snapshot: retrace delete {run_id} && retrace import - < FILE"),
        ));
    }
    replace_copy(&*store, run_id, "a file exported while it was being recorded")?;
    eprintln!("run {run_id} was stored from a file exported while it was being recorded: replacing it with {name}'s");
    drop(store);
    run(args)
}

/// Whether the trace file at `path` passes every check of an import on its own (into a store
/// in memory, which is then dropped).
fn passes_alone(path: &std::path::Path) -> bool {
    let Ok(file) = File::open(path) else { return false };
    let scratch = retrace_store::memory::MemoryStore::new();
    import_reader(&scratch, BufReader::with_capacity(1 << 20, file), ImportOptions::default()).is_ok()
}

/// True when run `run_id` was imported with `--force` from a file that failed checks.
fn forced_copy(store: &dyn retrace_store::Store, run_id: &str) -> bool {
    store.run(run_id).is_ok_and(|m| m.labels.contains_key(FORCED_LABEL))
}

/// True when run `run_id` was imported from a file exported while it was being recorded and,
/// where the file conflicts with it at `seq`, the stored events are the file's first ones.
fn partial_copy(store: &dyn retrace_store::Store, run_id: &str, seq: Option<u64>) -> bool {
    let labelled = store.run(run_id).is_ok_and(|m| m.labels.contains_key(PARTIAL_LABEL));
    labelled && seq.is_none_or(|seq| store.last_seq(run_id).is_ok_and(|last| seq == last + 1))
}

/// Deletes the copy of `run_id` stored from `from` (as `retrace delete` would, with the blobs
/// only it used), for a better file to take its place.
fn replace_copy(store: &dyn retrace_store::Store, run_id: &str, from: &str) -> anyhow::Result<()> {
    use retrace_store::gc::{delete, DeleteError, GcConfig};
    let held = store.run(run_id)?;
    let config = GcConfig::from_retention(super::gc::now_ms(), &super::gc::retention()?);
    delete(store, &[held], &[], &config).map_err(|e| match &e {
        DeleteError::Store(_) => anyhow::Error::from(e),
        _ => exit::usage_hint(
            format!("run {run_id} is stored from {from}, and can't be replaced: {e}"),
            format!("once nothing needs it, `retrace delete {run_id}`, then import this file again"),
        ),
    })?;
    Ok(())
}

/// The store failed (a full disk, say); if that left the run stored in part, the hint says
/// how to finish it.
fn unfinished(store: &dyn retrace_store::Store, e: &ImportError, run_id: &str, name: &str) -> anyhow::Error {
    let mut failed = failure(e.exit_code(), e);
    let left = store.run(run_id).is_ok_and(|m| m.labels.contains_key(UNFINISHED_LABEL));
    if let (true, Some(f)) = (left, failed.downcast_mut::<exit::Failure>()) {
        f.hint = Some(format!(
            "run {run_id} is stored in part and marked unfinished; once the store works again \
             (room on its disk), `retrace import {name}` stores the rest"
        ));
    }
    failed
}

/// A conflict with the stored run, with the hint that replaces it by the file's; a run still
/// being recorded can't be deleted, so the hint says to wait for it.
fn replaceable(store: &dyn retrace_store::Store, e: &ImportError, run_id: &str, name: &str) -> anyhow::Error {
    let mut failed = failure(e.exit_code(), e);
    let running = store.run(run_id).is_ok_and(|m| m.status == retrace_core::run::RunStatus::Running);
    if let Some(f) = failed.downcast_mut::<exit::Failure>() {
        f.hint = Some(match running {
            true => format!(
                "run {run_id} is still being recorded here; once it has finished, `retrace delete {run_id} && \
                 retrace import {name}` replaces it with the file's"
            ),
            false => format!(
                "to replace the stored run with the file's, delete it first: \
                 retrace delete {run_id} && retrace import {name}"
            ),
        });
    }
    failed
}

/// A warning for an imported run that holds tokens made under a mask key this store doesn't
/// use (or when it has none yet): its replay, fork and gate need that key, which is best said
/// now, where the file came in, than at the first replay (QA14 D2).
fn key_warning(meta: &retrace_core::run::RunMeta) -> anyhow::Result<Option<String>> {
    let Some(theirs) = meta.mask_key_fingerprint.as_deref().filter(|_| meta.holds_tokens) else {
        return Ok(None);
    };
    let ours = retrace_runtime::masking::existing_key(&retrace_store::StoreConfig::from_env()?)?;
    let here = match ours.map(|k| k.fingerprint()) {
        Some(ours) if ours == theirs => return Ok(None),
        Some(ours) => format!("this store's key is {ours}"),
        None => "this store has no mask key yet".to_owned(),
    };
    Ok(Some(format!(
        "warning: run {} holds masked tokens made under mask key {theirs}, and {here}: to replay, \
         fork or gate it, set RETRACE_MASK_KEY to the key with fingerprint {theirs}",
        meta.id
    )))
}
