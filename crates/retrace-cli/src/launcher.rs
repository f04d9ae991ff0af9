//! The one `-- CMD` launcher used by `record`, `replay`, `fork` and `gate`: runs a child with
//! Retrace's environment, passes its standard input, output and error through, forwards SIGINT
//! and SIGTERM ([`signals`]), ends it if Retrace dies first, and returns how it ended. Runs
//! remember their working directory relative to the git top level, so a replay runs from the
//! same place in any clone.
pub mod line_end;
pub mod signals;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use retrace_core::terminal::shell_words;

use crate::exit::{usage, usage_hint};

/// A child process to run.
#[derive(Debug, Clone, Default)]
pub struct Child {
    /// argv as typed.
    pub argv: Vec<String>,
    /// Where to run it.
    pub cwd: PathBuf,
    /// Variables to set on top of the inherited environment.
    pub env: Vec<(String, String)>,
    /// Inherited variables to remove (applied before `env`).
    pub remove_env: Vec<String>,
    /// Where its standard output and error go, with standard input closed (`gate` runs many at
    /// once); `None` passes all three through.
    pub output: Option<PathBuf>,
    /// How long it may run: past it, it is stopped (SIGTERM, then SIGKILL 5 s later) and
    /// [`Ended::timed_out`] says so. `None`: as long as it takes.
    pub time_limit: Option<std::time::Duration>,
}

/// How a program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// Its exit status (128 + signal when killed by one).
    pub status: i32,
    /// The signal Retrace itself received (and forwarded) before the program ended: the user
    /// stopped it. `None` when it ended on its own, whatever its status (a program may exit 130
    /// by itself).
    pub interrupted: Option<Signal>,
    /// It ran past [`Child::time_limit`] and was stopped.
    pub timed_out: bool,
}

/// Runs `child` to completion; returns how it ended. A program is not started once Retrace
/// has received SIGINT or SIGTERM (an error that exits `128 + signal`).
pub fn run(child: &Child) -> anyhow::Result<Ended> {
    let Some((program, args)) = child.argv.split_first() else {
        return Err(usage_hint("no command to run", "put the program after `--`, e.g. `-- python app.py`"));
    };
    signals::watch()?;
    if let Some(signal) = signals::received() {
        return Err(crate::exit::interrupted(
            signal,
            format!("interrupted ({signal}) before `{program}` started"),
        ));
    }
    let mut command = Command::new(executable(program));
    command.args(args).current_dir(&child.cwd);
    for name in &child.remove_env {
        command.env_remove(name);
    }
    command.envs(child.env.iter().map(|(k, v)| (k, v)));
    end_with_us(&mut command);
    if let Some(path) = &child.output {
        let file = std::fs::File::create(path)
            .with_context(|| format!("creating the program's output file {}", path.display()))?;
        command.stdin(std::process::Stdio::null()).stdout(file.try_clone()?).stderr(file);
    } else if line_end::tracked() {
        command.stdout(std::process::Stdio::piped());
    }
    let mut process = match command.spawn() {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // The same error when the working directory is missing: say which it is.
            check_cwd(&child.argv, &child.cwd)?;
            return Err(usage_hint(
                format!("program not found: `{}` (in {})", shell_words(&child.argv), child.cwd.display()),
                "check the command, or pass another one after `--`",
            ));
        }
        Err(e) => return Err(e).with_context(|| format!("starting `{}`", shell_words(&child.argv))),
    };
    let pid = Pid::from_raw(process.id() as i32);
    let forwarding = signals::Forwarding::to(pid);
    let copied = process.stdout.take().map(line_end::copy);
    let limit = child.time_limit.map(|limit| TimeLimit::start(pid, limit));
    let status = process.wait().context("waiting for the program")?;
    let timed_out = limit.is_some_and(TimeLimit::ended);
    drop(forwarding);
    if let Some(copied) = copied {
        copied.drained();
    }
    let status = exit_code(status);
    Ok(Ended { status, interrupted: signals::received_by_end(status), timed_out })
}

/// A watch that stops a program running past its time limit (QA33 D2: a program hung outside
/// Retrace's steps hung `gate` until CI killed the job).
struct TimeLimit {
    done: std::sync::mpsc::Sender<()>,
    watch: std::thread::JoinHandle<bool>,
}

impl TimeLimit {
    fn start(pid: Pid, limit: std::time::Duration) -> TimeLimit {
        use std::sync::mpsc::RecvTimeoutError;
        let (done, ended) = std::sync::mpsc::channel::<()>();
        let watch = std::thread::spawn(move || {
            if ended.recv_timeout(limit) != Err(RecvTimeoutError::Timeout) {
                return false;
            }
            let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
            if ended.recv_timeout(std::time::Duration::from_secs(5)) == Err(RecvTimeoutError::Timeout) {
                let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            }
            true
        });
        TimeLimit { done, watch }
    }

    /// Once the program has ended: whether the limit stopped it.
    fn ended(self) -> bool {
        let _ = self.done.send(());
        self.watch.join().unwrap_or(false)
    }
}

/// Refuses (exit 2) to run `argv` in `cwd` when that directory doesn't exist: a replay or fork
/// run from another checkout, or after the directory was removed. Said before anything is
/// created, rather than as the spawn's "not found", which reads as a missing program.
pub fn check_cwd(argv: &[String], cwd: &Path) -> anyhow::Result<()> {
    if cwd.is_dir() {
        return Ok(());
    }
    Err(usage_hint(
        format!(
            "the working directory {} does not exist (`{}` was to run there)",
            cwd.display(),
            shell_words(argv)
        ),
        "run retrace from the checkout the run was recorded in (a recorded directory is kept relative to \
         the git top level), or give the program to run after `--`: it then runs in the current directory",
    ))
}

/// Refuses (exit 2) to `verb` (`replay`, `fork`, `gate`) run `source` while it is still being
/// recorded: it is `running` with a live lease (its recorder is alive), or with none yet (the
/// store was just opened, which marks a run whose recorder died `interrupted`, so a `running`
/// run without a lease is one whose program has not taken a step yet, or an import under way).
/// Its log is still growing: a replay would find it ending early, and a fork would branch from
/// what is stored so far.
/// The first run that `run`'s fork chain needs and the store doesn't hold, if any. A fork's
/// trace carries the events it inherits, so it replays alone; but its edits are checked and
/// applied again against its source's events (a swap names the source's seqs), so a fork with
/// edits needs its source, and that source, if a fork with edits, its own.
pub fn missing_source(
    store: &dyn retrace_store::Store,
    run: &retrace_core::run::RunMeta,
) -> anyhow::Result<Option<String>> {
    let mut at = run.clone();
    while at.mode == retrace_core::run::RunMode::Fork && !at.edits.is_empty() {
        let Some(source) = at.source_run.clone() else { return Ok(None) };
        match store.run(&source) {
            Ok(meta) => at = meta,
            Err(e) if e.kind == retrace_store::StoreErrorKind::NotFound => return Ok(Some(source)),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// Why `run`, a fork whose source this store lacks, can't be replayed or forked (QA35 D1: the
/// program ran, every step failed, and it read as a divergence of the program's).
pub fn refuse_missing_source(
    store: &dyn retrace_store::Store,
    run: &retrace_core::run::RunMeta,
    verb: &str,
) -> anyhow::Result<()> {
    let Some(missing) = missing_source(store, run)? else { return Ok(()) };
    let id = &run.id;
    Err(crate::exit::usage_hint(
        format!(
            "run {id} is a fork of run {missing}, which this store doesn't hold: its edits apply against \
             that run's events"
        ),
        format!(
            "import {missing}'s trace too (`retrace export {missing} -o FILE` in the store that recorded it, \
             then `retrace import FILE` here), then {verb} {id}"
        ),
    ))
}

pub fn check_finished(
    store: &dyn retrace_store::Store,
    source: &retrace_core::run::RunMeta,
    verb: &str,
) -> anyhow::Result<()> {
    let id = &source.id;
    refuse_missing_source(store, source, verb)?;
    let running = source.status == retrace_core::run::RunStatus::Running;
    if source.labels.contains_key(retrace_store::import::UNFINISHED_LABEL) {
        if running {
            return Err(usage(format!(
                "run {id} is still being imported; {verb} it once the import has finished"
            )));
        }
        // An import that stopped part way: its recording is whole in the file, not here, so
        // the run's end would be blamed on a recorder that never stopped.
        let held = store.last_seq(id).map_or_else(|_| "some".to_owned(), |n| n.to_string());
        return Err(crate::exit::usage_hint(
            format!("run {id} is an unfinished import: the store holds the first {held} of its events, not the whole run"),
            format!("import its trace file again (`retrace import FILE` stores the rest), then {verb} it"),
        ));
    }
    if !running {
        return Ok(());
    }
    let by = match store.lease_holder(id)? {
        Some(holder) => match holder.parts() {
            Some((host, pid, _)) => format!(" (by process {pid} on {host})"),
            None => format!(" (by {holder})"),
        },
        None => String::new(),
    };
    Err(usage(format!("run {id} is still being recorded{by}; {verb} it once it has finished")))
}

/// Has the kernel send the program SIGTERM if this process dies first (`kill -9 retrace`), so a
/// program whose recorder is gone doesn't run on, each of its steps failing closed. The signal
/// follows the spawning thread, not the process; that thread waits for the program, so it ends
/// first only when the process does. A program started after this process died ends at once.
#[allow(unsafe_code)] // `pre_exec`, the only way to run code between fork and exec
fn end_with_us(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: between fork and exec the closure calls only async-signal-safe functions
        // (prctl, getppid) and allocates nothing but on its error path.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("retrace exited before the program started"));
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

/// What to start for `program`: a bare `retrace` (the demos' recorded commands, a program
/// run by `retrace` itself) is this executable, which need not be on PATH (`cargo run --
/// replay RUN`); anything else is looked up as usual. The run keeps the name as typed.
fn executable(program: &str) -> std::ffi::OsString {
    match program == "retrace" {
        true => std::env::current_exe().map_or_else(|_| program.into(), |exe| exe.into_os_string()),
        false => program.into(),
    }
}

/// An exit status as a person reads it: `status 3`, or `status 137 (killed by SIGKILL)` for a
/// program a signal ended (the shell's 128 + N).
pub fn status_words(status: i32) -> String {
    let signal = (129..=128 + 64)
        .contains(&status)
        .then(|| nix::sys::signal::Signal::try_from(status - 128).ok())
        .flatten();
    match signal {
        Some(signal) => format!("status {status} (killed by {signal})"),
        None => format!("status {status}"),
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Ends run `id` when its program could not be started (`record`, `replay`, `fork`), rather
/// than leaving it `running` until its lease lapses and it turns `interrupted`: a run that holds
/// no step is deleted (a mistyped command, a missing directory, should not leave a run behind;
/// a replay's run holds only its outcome, and there is none), else it is kept, `failed`.
pub fn discard_unstarted(store: &dyn retrace_store::Store, id: &str) -> anyhow::Result<()> {
    use retrace_runtime::env_sources::{Clock, SystemClock};
    let now = SystemClock.now_ms();
    let mut failed = store.run(id)?;
    failed.status = retrace_core::run::RunStatus::Failed;
    failed.finished_at_ms.get_or_insert(now);
    store.update_run(&failed)?;
    if store.last_seq(id)? == 0 {
        let config = retrace_store::gc::GcConfig::new(now, 0);
        let deleted = retrace_store::gc::delete(store, std::slice::from_ref(&failed), &[], &config);
        if deleted.is_ok_and(|report| report.runs_deleted.iter().any(|r| r == id)) {
            eprintln!("retrace: run {id} discarded: its program never started");
            return Ok(());
        }
    }
    eprintln!("retrace: run {id} ended failed: its program never started");
    Ok(())
}

/// The git top level above `dir`, if any.
pub fn git_toplevel(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().find(|d| d.join(".git").exists()).map(Path::to_path_buf)
}

/// The current directory as a run records it: relative to the git top level ("." at the top),
/// or absolute outside a git repository.
pub fn recorded_cwd() -> anyhow::Result<String> {
    let cwd = std::env::current_dir().context("reading the current directory")?;
    Ok(recorded_cwd_of(&cwd))
}

/// `cwd` as a run records it (see [`recorded_cwd`]).
pub fn recorded_cwd_of(cwd: &Path) -> String {
    match git_toplevel(cwd) {
        Some(top) => {
            let rel = cwd.strip_prefix(&top).unwrap_or(Path::new("")).to_string_lossy().into_owned();
            if rel.is_empty() {
                ".".into()
            } else {
                rel
            }
        }
        None => cwd.to_string_lossy().into_owned(),
    }
}

/// Where to run a recorded command: its relative directory under this checkout's git top
/// level (or the current directory outside git), or its absolute directory.
pub fn resolve_cwd(recorded: &str) -> anyhow::Result<PathBuf> {
    let path = Path::new(recorded);
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let base = git_toplevel(&cwd).unwrap_or(cwd);
    Ok(if recorded == "." { base } else { base.join(path) })
}

/// The run a replay or fork re-executes: `run` itself, or the source of a replay run.
pub fn source_run(store: &dyn retrace_store::Store, run: &str) -> anyhow::Result<retrace_core::run::RunMeta> {
    let meta = crate::commands::runs::find(store, run)?;
    Ok(match (meta.mode, &meta.source_run) {
        (retrace_core::run::RunMode::Replay, Some(of)) => match store.run(of) {
            Ok(source) => source,
            Err(e) if e.kind == retrace_store::StoreErrorKind::NotFound => {
                return Err(usage_hint(
                    format!("run {} is a replay of run {of}, which is not in this store: it is what would be replayed", meta.id),
                    format!(
                        "import its trace too: `retrace export {of} -o FILE` where it was recorded, then \
                         `retrace import FILE` here"
                    ),
                ))
            }
            Err(e) => return Err(e.into()),
        },
        _ => meta,
    })
}

/// Refuses (exit 2) to re-execute `run` when the store lacks a run it re-executes in turn: a
/// fork's source, that source's own source, and so on, up to a fork that holds the events it
/// inherits itself (imported from its trace, which carries them: it replays whole without its
/// source). A fork recorded here inherits by reference, and replaying it reads its source's, so
/// every step would fail; `gate` replays through the same check.
pub fn check_sources(
    store: &dyn retrace_store::Store,
    run: &retrace_core::run::RunMeta,
) -> anyhow::Result<()> {
    let mut of = run.clone();
    while let Some(id) = of.source_run.clone() {
        // A fork imported with the events it inherits replays without its source (QA22 D4).
        if retrace_store::export::holds_inherited(store, &of)? {
            return Ok(());
        }
        of = match store.run(&id) {
            Ok(meta) => meta,
            Err(e) if e.kind == retrace_store::StoreErrorKind::NotFound => {
                return Err(usage_hint(
                    format!("run {} is a {} of run {id}, which is not in this store", of.id, of.mode),
                    format!(
                        "import its trace too: `retrace export {id} -o FILE` where it was recorded, \
                         then `retrace import FILE` here"
                    ),
                ))
            }
            Err(e) => return Err(e.into()),
        };
    }
    Ok(())
}

/// What to run for `source`: `given` from the current directory, or else the recorded command
/// from its recorded directory.
pub fn command_for(
    source: &retrace_core::run::RunMeta,
    given: &[String],
) -> anyhow::Result<(Vec<String>, PathBuf)> {
    if !given.is_empty() {
        return Ok((given.to_vec(), std::env::current_dir()?));
    }
    let recorded = source.command.clone().ok_or_else(|| {
        usage_hint(format!("run {} recorded no command", source.id), "give the program to run after `--`")
    })?;
    // Masked before it was stored, like everything else: the program runs with the tokens
    // where its arguments held secrets, which may change what it does.
    let masked = recorded.argv.iter().filter(|a| retrace_core::mask::contains_token(a.as_bytes())).count();
    if masked > 0 {
        eprintln!(
            "retrace: warning: run {}'s recorded command has {} masked when it was \
             recorded: the program gets the tokens in their place; to run it with the values, give \
             the command after `--`",
            source.id,
            crate::output::count(masked, "argument")
        );
    }
    Ok((recorded.argv, resolve_cwd(&recorded.cwd)?))
}

/// The store variables for a child, made absolute so the child finds the same store wherever
/// it runs.
pub fn store_env() -> anyhow::Result<Vec<(String, String)>> {
    // An empty variable is an unset one, as for the store itself (`StoreConfig::from_env`).
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut env = Vec::new();
    if let Some(url) = var("RETRACE_STORE") {
        // A relative database path would name another file in a replay's recorded folder.
        let url = match url.strip_prefix("sqlite://").map(std::path::Path::new) {
            Some(path) if path.is_relative() => {
                let path =
                    std::path::absolute(path).with_context(|| format!("resolving RETRACE_STORE={url}"))?;
                format!("sqlite://{}", path.display())
            }
            _ => url,
        };
        env.push(("RETRACE_STORE".into(), url));
    }
    let home = var("RETRACE_HOME").unwrap_or_else(|| "./.retrace".into());
    let home = std::path::absolute(&home).with_context(|| format!("resolving RETRACE_HOME={home}"))?;
    env.push(("RETRACE_HOME".into(), home.to_string_lossy().into_owned()));
    for passthrough in ["RETRACE_BLOBS", "RETRACE_DURABILITY", "RETRACE_MASK_KEY"] {
        if let Ok(v) = std::env::var(passthrough) {
            env.push((passthrough.into(), v));
        }
    }
    Ok(env)
}

/// Refuses to `verb` (replay, fork) `source` without RETRACE_VAULT_KEY when its tokens replay as
/// the originals (a rule with `replay = "original"`): every such step would fail on the vault.
pub fn check_vault_key(source: &retrace_core::run::RunMeta, verb: &str) -> anyhow::Result<()> {
    let original = source.masking_rules.replaying_originals();
    let vault_key = std::env::var("RETRACE_VAULT_KEY").is_ok_and(|v| !v.trim().is_empty());
    if source.holds_tokens && !original.is_empty() && !vault_key {
        return Err(crate::exit::usage(format!(
            "can't {verb} {}: its masking rule(s) {} hand the program the originals from the vault: set \
             RETRACE_VAULT_KEY to the key it was recorded with",
            source.id,
            original.join(", ")
        )));
    }
    Ok(())
}

/// `argv` as logged and stored in a run: each argument masked like any input (an API key passed
/// as `--token sk-...` is a token in the run's `command`, in `runs --json` and in the line that
/// says what runs).
pub fn masked_argv(argv: &[String], masker: &retrace_core::mask::Masker) -> Vec<String> {
    argv.iter().map(|a| masker.mask_text(a).0.into_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_a_signal_ended_names_the_signal() {
        assert_eq!(status_words(3), "status 3");
        assert_eq!(status_words(137), "status 137 (killed by SIGKILL)");
        assert_eq!(status_words(143), "status 143 (killed by SIGTERM)");
        assert_eq!(status_words(255), "status 255");
    }
}
