//! `retrace`: the command line. Thin commands over the library crates; errors become exit codes
//! here and nowhere else (0 ok, 1 divergence or failed check, 2 usage or input error).
/// The allocator of this binary (the CLI, the daemon and the proxy): with 16
/// agents recording on two cores it took 6-12% less CPU per step than the system's (see
/// ARCHITECTURE.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod commands;
mod daemon;
mod exit;
mod launcher;
mod ledger;
mod output;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// What `retrace -h` and `retrace --help` say first: what the tool is for.
const ABOUT: &str = "Record multi-agent LLM programs step by step, replay them exactly, fork them.";

/// `retrace --help`: the account before the commands.
const LONG_ABOUT: &str = "Record multi-agent LLM programs step by step, replay them exactly, fork them.

`retrace record -- CMD` runs a program and records every step each agent takes (model calls \
through the built-in proxy, tool calls, messages, clock reads, random ids, env vars, decisions) \
in a hash-chained event log. `retrace replay RUN` runs it again with zero live calls, answering \
every step from the log, and reports the first step that differs as a divergence. `retrace fork` \
replays with one input changed and runs only what the change reaches.";

/// After the commands, in `-h` and `--help` alike: what scripts and CI need (exit codes and the
/// environment, as `exit.rs`, SPEC §3 and the store's `StoreConfig::from_env` have them).
const AFTER_HELP: &str =
    "Start with `retrace demo`: it records a multi-agent program, replays a bad run exactly \
and forks it, in ./.retrace.

Exit codes:
  0  ok
  1  a divergence, or a failed check (verify, gate, an import that conflicts with the store,
     a store found corrupt)
  2  usage, input or store error
  130/143  stopped by Ctrl-C (SIGINT) / SIGTERM: a replay, fork or gate is stored `interrupted`,
     judged neither way
  `record` exits with the program's own status.

Environment:
  RETRACE_HOME          the store's folder (default ./.retrace): retrace.db, blobs/ and mask.key
  RETRACE_STORE         sqlite:///path/retrace.db (overrides RETRACE_HOME)
  RETRACE_BLOBS         file:///path: where large blobs go (default: beside the database)
  RETRACE_DURABILITY    batch (default: fsync at least every 10 ms), event (fsync before each
                        acknowledgment) or os (never fsync)
  RETRACE_MASK_KEY      the 32-byte base64 key masked secrets become tokens under; unset, one is
                        generated into mask.key in the store's folder (RETRACE_HOME, or that of
                        RETRACE_STORE's database). Give CI the same key as a secret
  RETRACE_VAULT_KEY     the key the originals of masked values are sealed under
  RETRACE_LEDGER_KEY    the Ed25519 key `ledger export` signs with
  RETRACE_SERVE_TOKENS  `serve`'s tokens and roles: viewer:T1,debugger:T2,admin:T3
  RETRACE_URL, RETRACE_RUN, RETRACE_MODE, RETRACE_TOKEN
                        how an SDK program finds its daemon and run: `record`, `replay`, `fork`
                        and `gate` set them for the program they run (RETRACE_TOKEN: the
                        bearer token of a daemon that requires one)

Every command has -h (examples) and --help (the whole account).";

/// Record, replay and fork multi-agent LLM runs, step by step.
#[derive(Debug, Parser)]
#[command(
    name = "retrace",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP,
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the built-in demo: record a multi-agent program under chaos, replay the bad run exactly.
    Demo(commands::demo::Args),
    /// Run a program with recording on.
    Record(commands::record::Args),
    /// Replay a recorded run exactly, with zero live calls.
    Replay(commands::replay::Args),
    /// Fork a run with one input changed; only what the change reaches runs.
    Fork(commands::fork::Args),
    /// Compare two runs step by step: same, changed, only in one; decisions that moved; cost.
    Diff(commands::diff::Args),
    /// Record what happened to a side effect that may or may not have happened.
    Resolve(commands::resolve::Args),
    /// List runs.
    Runs(commands::runs::Args),
    /// Show what an agent knew when it acted: the messages it had heard, with their causes.
    Knew(commands::knew::Args),
    /// Show a run's timeline as per-agent lanes, or one event with its request and output.
    Show(commands::show::Args),
    /// Check hash chains, blob digests and seq/lamport invariants.
    Verify(commands::verify::Args),
    /// Run the daemon: the HTTP API and the OpenAI/Anthropic-compatible recording proxy.
    Serve(commands::serve::Args),
    /// Serve a local stand-in for the OpenAI and Anthropic APIs (the demo's simulator, not a model).
    Simulate(commands::simulate::Args),
    /// Write a run as one self-contained trace file (JSON Lines).
    Export(commands::export::Args),
    /// Read a trace file into the store.
    Import(commands::import::Args),
    /// Set how long a run is kept: routine, incident or pinned.
    Retain(commands::retain::Args),
    /// Delete expired runs and the blobs nothing references any more.
    Gc(commands::gc::Args),
    /// Delete named runs now, whatever their tier, with their replays and the blobs only they used.
    Delete(commands::delete::Args),
    /// Reveal the original of a masked value (audited), or list the audit log.
    Vault(commands::vault::Args),
    /// Replay recorded traces as tests, each in a temporary store; exit 1 if any diverges.
    Gate(commands::gate::Args),
    /// The replay ledger: show it, or export it signed under RETRACE_LEDGER_KEY.
    Ledger(commands::ledger::Args),
    /// Release (or refuse) a side effect held by the autonomy policy.
    Approve(commands::approve::Args),
    /// Each agent's replay record and autonomy rung, and why.
    Agents(commands::agents::Args),
}

fn main() -> ExitCode {
    exit::quiet_on_closed_stdout();
    // `--json` among Retrace's own arguments (not the program's, after `--`): errors are then
    // a JSON line on standard output too.
    let json = std::env::args().skip(1).take_while(|a| a != "--").any(|a| a == "--json");
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            if e.use_stderr() {
                exit::usage_error_json(&e.to_string(), json);
            }
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let result = match cli.command {
        Command::Demo(args) => commands::demo::run(args),
        Command::Record(args) => commands::record::run(args),
        Command::Replay(args) => commands::replay::run(args),
        Command::Fork(args) => commands::fork::run(args),
        Command::Diff(args) => commands::diff::run(args),
        Command::Resolve(args) => commands::resolve::run(args),
        Command::Runs(args) => commands::runs::run(args),
        Command::Show(args) => commands::show::run(args),
        Command::Knew(args) => commands::knew::run(args),
        Command::Verify(args) => commands::verify::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Simulate(args) => commands::simulate::run(args),
        Command::Export(args) => commands::export::run(args),
        Command::Import(args) => commands::import::run(args),
        Command::Retain(args) => commands::retain::run(args),
        Command::Gc(args) => commands::gc::run(args),
        Command::Delete(args) => commands::delete::run(args),
        Command::Vault(args) => commands::vault::run(args),
        Command::Gate(args) => commands::gate::run(args),
        Command::Ledger(args) => commands::ledger::run(args),
        Command::Approve(args) => commands::approve::run(args),
        Command::Agents(args) => commands::agents::run(args),
    };
    exit::finish(result, json)
}
