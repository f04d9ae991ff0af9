//! `retrace export`: write a run as one self-contained trace file (`retrace-trace/1`, JSON Lines).
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use retrace_store::export::{export_run, ExportError, ExportStats, RunEvents};

use crate::commands::readable_store_from_env;
use crate::exit::usage;
use crate::output::count;
use crate::output::{failure, is_stdout, Progress};

/// The examples every help shows.
macro_rules! examples {
    () => {
        "Examples:\n  \
         retrace export 01j5c3 -o tests/traces/backfill.jsonl\n  \
         retrace export 01j5c3 | gzip > backfill.jsonl.gz"
    };
}

/// Export a run to a trace file.
#[derive(Debug, clap::Args)]
#[command(
    after_help = examples!(),
    after_long_help = concat!(
        "Write a run as one self-contained trace file (format retrace-trace/1, JSON Lines): \
a header with the run, whether it holds mask tokens, its mask-key fingerprint and masking rules; \
then one event per line in seq order; then every blob the events reference. A fork's export \
includes the events it inherits.\n\n\
The output is deterministic: exporting the same run twice, or exporting it again after `retrace \
import` into another store, gives identical bytes, so trace files can be committed to git and \
checked in CI. Writes to standard output unless -o is given.",
        "\n\n",
        examples!()
    )
)]
pub struct Args {
    /// The run: its id or a unique prefix of it (at least 4 characters).
    pub run: String,
    /// Write to FILE (atomically: a temporary file renamed into place) instead of standard output
    /// (`-o -` is standard output too).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// With -o FILE, print what was written as a JSON object: `{run, file, events, blobs,
    /// bytes}` (standard output holds the trace itself without -o).
    #[arg(long)]
    pub json: bool,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let output = args.output.as_deref().filter(|path| !is_stdout(path));
    if args.json && output.is_none() {
        return Err(crate::exit::usage_hint(
            "--json needs -o FILE: without it standard output is the trace itself",
            format!("retrace export {} -o FILE --json", args.run),
        ));
    }
    let store = readable_store_from_env()?;
    let meta = crate::commands::runs::find(&*store, &args.run)?;
    let total = RunEvents::new(&*store, &meta.id).map_or(0, |pages| pages.count());
    if meta.labels.contains_key(retrace_store::import::UNFINISHED_LABEL) {
        // Its file would carry the mark to every store it reaches, where importing it again
        // could never store the rest.
        return Err(crate::exit::usage_hint(
            format!(
                "run {} is an unfinished import: the store holds {total} of its events, not the whole run",
                meta.id
            ),
            "import its trace file again (`retrace import FILE` stores the rest), then export it",
        ));
    }
    if let (retrace_core::run::RunMode::Replay, Some(source)) = (meta.mode, &meta.source_run) {
        eprintln!(
            "retrace: note: run {} is a replay: it holds only its outcome, not the steps it replayed, \
             so its file means something only beside run {source}'s (export that one too)",
            meta.id
        );
    }
    let mut progress = Progress::new("exporting events", total);
    let mut last = 0;
    let mut report = |done: u64| {
        progress.add(done - last);
        last = done;
    };
    let stats = match output {
        None => {
            // Not locked: a writer thread writes (export buffers 1 MiB per write).
            let mut out = std::io::stdout();
            export_run(&*store, &meta.id, &mut out, &mut report)
        }
        Some(path) => write_atomically(path, |file| export_run(&*store, &meta.id, file, &mut report))?,
    };
    progress.finish();
    let ExportStats { events, blobs, bytes } = match stats {
        Ok(stats) => stats,
        // A closed pipe (`retrace export RUN | head`) ends quietly, but not as a success: the
        // reader didn't get the trace whole (exit 141, as `cat` would).
        Err(ExportError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            return Err(crate::exit::CutShort.into())
        }
        // Named: a full disk said only "No space left on device" (QA31 D1); nothing was written.
        Err(ExportError::Io(e)) if output.is_some() => {
            let path = output.expect("matched").display();
            return Err(crate::exit::usage(format!("writing {path}: {e}; nothing was written there")));
        }
        Err(e) => return Err(failure(e.exit_code(), &e)),
    };
    if meta.status == retrace_core::run::RunStatus::Running {
        // Said with the count the file holds, read in the export's own snapshot (QA36 D2: the
        // count read before it was off by a few events).
        eprintln!(
            "retrace: warning: run {} is still being recorded: the file holds the {events} events stored when \
             it was read, and a replay or gate of it ends there (log_ended); export it again once it has \
             finished",
            meta.id
        );
    }
    if let Some(path) = output {
        eprintln!(
            "exported run {} to {}: {}, {}, {}",
            meta.id,
            path.display(),
            count(events, "event"),
            count(blobs, "blob"),
            count(bytes, "byte")
        );
        if args.json {
            let said = serde_json::json!({"run": meta.id, "file": path.display().to_string(), "events": events, "blobs": blobs, "bytes": bytes});
            crate::output::print_json(&said)?;
        }
    }
    Ok(())
}

/// Runs `write` on a temporary file beside `path`, renamed to `path` when it succeeds.
///
/// A `path` that is a symbolic link is written through: the temporary file goes beside the
/// file it names, which is replaced, and the link stays. A `path` that exists and is not a
/// regular file (`/dev/null`, a FIFO, a terminal) is written directly, as a shell's `>` would:
/// renaming over it would replace a device with a file (as root, `-o /dev/null` did).
pub(crate) fn write_atomically<T, E>(
    path: &Path,
    write: impl FnOnce(&mut File) -> Result<T, E>,
) -> anyhow::Result<Result<T, E>> {
    write_file(path, write, true)
}

/// [`write_atomically`], but never over a file: one that appeared at `path` while this was
/// written (another `gate --accept` of the same trace) is kept, and this is an error.
pub(crate) fn write_new_atomically<T, E>(
    path: &Path,
    write: impl FnOnce(&mut File) -> Result<T, E>,
) -> anyhow::Result<Result<T, E>> {
    write_file(path, write, false)
}

fn write_file<T, E>(
    path: &Path,
    write: impl FnOnce(&mut File) -> Result<T, E>,
    replace: bool,
) -> anyhow::Result<Result<T, E>> {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let resolved = match is_link {
        true => std::fs::canonicalize(path).ok(),
        false => None,
    };
    let path = resolved.as_deref().unwrap_or(path);
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => anyhow::bail!("cannot write {}: it is a directory", path.display()),
        Ok(meta) if !meta.is_file() => {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
            let result = write(&mut file);
            if result.is_ok() {
                file.flush().map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
            }
            return Ok(result);
        }
        _ => {}
    }
    // The folder is made, as `gate --junit` makes its report's (`-o tests/traces/x.jsonl` in a
    // fresh project: QA23 S9).
    crate::output::make_folder_of(path).map_err(|e| {
        let folder = path.parent().unwrap_or(Path::new(".")).display();
        usage(format!("cannot write {}: cannot make its folder {folder}: {e}", path.display()))
    })?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    // Installed before the file exists: a signal between the two would leave it.
    let removal = RemoveOnSignal::install(&temp);
    // Named by the path the user gave: the temporary file beside it is an implementation detail.
    let mut file = File::create(&temp).map_err(|e| {
        let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        match folder.is_dir() {
            false if folder.exists() => usage(format!(
                "cannot write {}: {} is a file, not a folder",
                path.display(),
                folder.display()
            )),
            // Removed since it was made above.
            false => usage(format!("cannot write {}: no folder {}", path.display(), folder.display())),
            true => anyhow::anyhow!("cannot write {}: {e}", path.display()),
        }
    })?;
    let result = write(&mut file);
    let finished = result.is_ok().then(|| file.flush().and_then(|()| file.sync_all()));
    drop(file);
    match finished {
        Some(Ok(())) if replace => std::fs::rename(&temp, path)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?,
        // A link fails where a file is, as a rename would not: nothing is ever replaced.
        Some(Ok(())) => {
            let linked = std::fs::hard_link(&temp, path);
            let _ = std::fs::remove_file(&temp);
            linked.map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => crate::exit::usage_hint(
                    format!(
                        "{} already exists (written while this was): it was left as it is",
                        path.display()
                    ),
                    "review it and move it over the old trace, or delete it, then run the gate again",
                ),
                _ => anyhow::anyhow!("cannot write {}: {e}", path.display()),
            })?
        }
        Some(Err(e)) => {
            let _ = std::fs::remove_file(&temp);
            return Err(anyhow::anyhow!("cannot write {}: {e}", path.display()));
        }
        None => {
            let _ = std::fs::remove_file(&temp);
        }
    }
    drop(removal);
    Ok(result)
}

/// Removes a temporary file if SIGINT or SIGTERM ends the process while it is written (Ctrl-C
/// in the middle of `export -o`), then ends the process as the signal would have: otherwise a
/// hidden file the size of the export stays behind. Not installed when the launcher's watcher
/// handles those signals: the command then ends on its own, through the error path that
/// removes the file. Dropping it removes the handlers.
struct RemoveOnSignal(Vec<signal_hook::SigId>);

impl RemoveOnSignal {
    #[allow(unsafe_code)] // a signal handler: `low_level::register` is unsafe
    fn install(temp: &Path) -> RemoveOnSignal {
        use std::os::unix::ffi::OsStrExt;
        if crate::launcher::signals::watching() {
            return RemoveOnSignal(Vec::new());
        }
        let Ok(name) = std::ffi::CString::new(temp.as_os_str().as_bytes()) else {
            return RemoveOnSignal(Vec::new());
        };
        // Leaked: a handler may run until it is unregistered, and this is one short path per
        // file written.
        let name: &'static std::ffi::CStr = Box::leak(name.into_boxed_c_str());
        let mut ids = Vec::new();
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // SAFETY: the handler calls only async-signal-safe functions (unlink, and
            // emulate_default_handler, documented as such) and allocates nothing.
            let registered = unsafe {
                signal_hook::low_level::register(sig, move || {
                    libc::unlink(name.as_ptr());
                    let _ = signal_hook::low_level::emulate_default_handler(sig);
                })
            };
            ids.extend(registered);
        }
        RemoveOnSignal(ids)
    }
}

impl Drop for RemoveOnSignal {
    fn drop(&mut self) {
        for id in self.0.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::write_new_atomically;

    /// A file that appears while an accepted trace is written (a second `gate --accept` of the
    /// same trace finished first) is kept, and the writer is told (QA19 D3).
    #[test]
    fn writing_a_new_file_never_replaces_one_that_appeared_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.accepted.jsonl");
        let written = write_new_atomically(&path, |f| {
            std::fs::write(&path, "the other gate's\n").unwrap();
            f.write_all(b"this gate's\n")
        });
        let said = format!("{:#}", written.unwrap_err());
        assert!(said.contains("already exists (written while this was)"), "{said}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "the other gate's\n");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file is left: {left:?}");

        let fresh = dir.path().join("fresh.jsonl");
        write_new_atomically(&fresh, |f| f.write_all(b"new\n")).unwrap().unwrap();
        assert_eq!(std::fs::read_to_string(&fresh).unwrap(), "new\n");
    }
}
