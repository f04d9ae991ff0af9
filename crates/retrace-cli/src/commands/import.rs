//! `retrace import`: read a trace file into the store, verifying all of it first.
use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

use retrace_store::import::{import_reader, ImportOptions, ImportOutcome};

use crate::commands::store_from_env;
use crate::exit;
use crate::output::{failure, Progress};

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace import tests/traces/backfill.jsonl\n  \
         gunzip -c backfill.jsonl.gz | retrace import -"
    };
}

/// Import a trace file.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Read a trace file written by `retrace export` into the store and print the run's id.\n\n\
Every line is verified before anything is stored: the header's format and counts, each event's \
seq, hash and link to the previous event, each blob's digest, that every referenced blob is in the \
file and nothing follows the last one. Errors name the file and line.\n\n\
Importing a run that is already stored with the same events does nothing (exit 0, and says so); \
one stored with different events is refused (exit 1, naming the first differing seq). A fork's \
inherited events must equal its source's where the source is stored.\n\n\
Exit codes: 0 imported or already present; 1 the file fails verification or conflicts with the \
store; 2 the file is not a trace, is truncated, or has an unknown format version.",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// The trace file, or `-` for standard input.
    pub file: PathBuf,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let stdin = args.file.as_os_str() == "-";
    let name = if stdin { "<stdin>".to_owned() } else { args.file.display().to_string() };
    let (reader, size): (Box<dyn std::io::Read>, u64) = if stdin {
        (Box::new(std::io::stdin().lock()), 0)
    } else {
        let file = File::open(&args.file).map_err(|e| exit::usage(format!("cannot open {name}: {e}")))?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        (Box::new(file), size)
    };
    let store = store_from_env()?;
    let mut progress = Progress::new("importing bytes", size);
    let mut last = 0;
    let mut report = |done: u64| {
        progress.add(done - last);
        last = done;
    };
    let opts = ImportOptions {
        file_name: Some(name.clone()),
        progress: Some(&mut report),
        ..ImportOptions::default()
    };
    let outcome = import_reader(&*store, BufReader::with_capacity(1 << 20, reader), opts);
    progress.finish();
    match outcome.map_err(|e| failure(e.exit_code(), &e))? {
        ImportOutcome::Imported { run_id, events, blobs } => {
            eprintln!("imported run {run_id} from {name}: {events} events, {blobs} blobs");
            println!("{run_id}");
        }
        ImportOutcome::AlreadyPresent { run_id } => {
            eprintln!("run {run_id} is already present with the same events; nothing imported");
            println!("{run_id}");
        }
    }
    Ok(())
}
