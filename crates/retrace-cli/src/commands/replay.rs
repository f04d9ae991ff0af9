//! `retrace replay RUN [-- CMD]`: exact replay of a run by running its program again.
use clap::Parser;
use retrace_core::run::{RunMeta, RunMode, RunStatus};
use retrace_core::{Divergence, DivergenceCode};
use retrace_runtime::env_sources::{new_run_id, Clock, SystemClock};

use super::store_from_env;
use crate::daemon::Embedded;
use crate::exit::{check_failed, usage};
use crate::launcher::{self, Child};
use crate::output::print_json;
use retrace_server::host::{RECORDER_DAEMON, RECORDER_LABEL};

/// Replay a recorded run exactly: run its program again (by default the recorded command, from
/// the same directory relative to the git top level) with zero live calls. Every step is
/// answered from the log; a step the log doesn't hold, recorded steps left over, other final
/// decisions or another exit status are a divergence (exit 1, report on standard error).
///
/// Examples:
///   retrace replay 01jd3k
///   retrace replay 01jd3k -- ./target/release/my-agents --fixed-input
#[derive(Debug, Parser)]
pub struct Args {
    /// The run to replay (id or unique prefix).
    run: String,
    /// Declare a stall when waiting steps make no progress for this many seconds.
    #[arg(long, value_name = "S", default_value_t = 30.0)]
    stall_timeout: f64,
    /// Every step waits for all earlier seqs (programs whose agents interact only through Retrace).
    #[arg(long)]
    strict: bool,
    /// Print the outcome as JSON on standard output.
    #[arg(long)]
    json: bool,
    /// The program to run instead of the recorded command.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let store = store_from_env()?;
    let source = launcher::source_run(store.as_ref(), &args.run)?;
    let (argv, cwd) = launcher::command_for(&source, &args.command)?;
    // Refused before anything runs: tokens made under another key would never match.
    let mask = super::mask_from_env()?;
    retrace_runtime::masking::check_key(&source, Some(&mask.key)).map_err(|e| usage(e.to_string()))?;
    let id = new_run_id();
    let mut meta = RunMeta::new(id.clone(), RunMode::Replay, SystemClock.now_ms());
    meta.source_run = Some(source.id.clone());
    meta.name = source.name.clone();
    meta.command = Some(retrace_core::run::Command { argv: argv.clone(), cwd: launcher::recorded_cwd()? });
    store.create_run(&meta)?;
    eprintln!("retrace: replaying {} as {id}: {} (in {})", source.id, argv.join(" "), cwd.display());
    // Replay makes no live call: the daemon's upstreams point nowhere.
    let nowhere = Some("http://127.0.0.1:9/replay-makes-no-live-calls".to_owned());
    let mut config = super::serve::config(nowhere.clone(), nowhere, args.stall_timeout)?;
    config.default_run = Some(id.clone());
    let daemon = Embedded::start(store.clone(), config)?;
    let mut env = launcher::store_env()?;
    env.extend(daemon.child_env());
    env.push(("RETRACE_MODE".into(), "replay".into()));
    env.push(("RETRACE_RUN".into(), id.clone()));
    env.push(("RETRACE_STALL_TIMEOUT".into(), args.stall_timeout.to_string()));
    if args.strict {
        env.push(("RETRACE_STRICT".into(), "1".into()));
    }
    for key in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"] {
        if std::env::var_os(key).is_none() {
            env.push((key.into(), "retrace-replay-placeholder".into()));
        }
    }
    let status = match launcher::run(&Child { argv, cwd, env }) {
        Ok(status) => status,
        Err(e) => {
            daemon.stop();
            return Err(e);
        }
    };
    let recorded_by_daemon = source.labels.get(RECORDER_LABEL).map(String::as_str) == Some(RECORDER_DAEMON);
    let unfinished = store.run(&id)?.status == RunStatus::Running;
    if daemon.hosts(&id) || (recorded_by_daemon && unfinished) {
        // The daemon answered the program's calls (or should have): it checks what was left
        // unconsumed, the exit status, and stores the outcome.
        if let Err(e) = daemon.finish(&id, status) {
            eprintln!("retrace: finishing replay {id}: {e:#}");
        }
    }
    daemon.stop();
    let outcome = conclude(store.as_ref(), &id, &source, status)?;
    if args.json {
        print_json(&serde_json::json!({
            "replay": id, "source": source.id, "status": outcome.status, "exit_status": status,
            "divergence": outcome.divergence,
        }))?;
    }
    match outcome.divergence {
        None => {
            eprintln!("retrace: replay {id} ok: every step matched, exit status {status}");
            Ok(())
        }
        Some(d) => {
            let rendered = serde_json::from_value::<Divergence>(d.clone())
                .map(|d| d.to_string())
                .unwrap_or(d.to_string());
            eprint!("{rendered}");
            Err(check_failed(format!("replay {id} of {} diverged", source.id)))
        }
    }
}

/// Stores the replay run's final outcome once the program has exited.
fn conclude(
    store: &dyn retrace_store::Store,
    id: &str,
    source: &RunMeta,
    status: i32,
) -> anyhow::Result<RunMeta> {
    let mut meta = store.run(id)?;
    meta.exit_status = Some(status);
    if meta.divergence.is_none() {
        let d = if meta.status == RunStatus::Running {
            Some(Divergence::new(DivergenceCode::StepsLeft, "*").detail(format!(
                "the program exited with status {status} without finishing its Retrace session (Session::finish)"
            )))
        } else {
            match source.exit_status {
                Some(recorded) if recorded != status => Some(
                    Divergence::new(DivergenceCode::ExitStatus, "*")
                        .detail(format!("recorded exit status {recorded}, replay exited {status}")),
                ),
                _ => None,
            }
        };
        if let Some(d) = d {
            meta.divergence = Some(d.to_json());
            meta.status = RunStatus::Diverged;
        }
    }
    if meta.status == RunStatus::Running {
        meta.status = RunStatus::Ok;
    }
    meta.finished_at_ms.get_or_insert(SystemClock.now_ms());
    store.update_run(&meta)?;
    Ok(meta)
}
