//! `retrace serve`: the daemon, until SIGINT or SIGTERM.
use std::net::ToSocketAddrs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use retrace_server::auth::Tokens;
use retrace_server::{AppState, ServerConfig, DEFAULT_ADDR};

use super::served_store_from_env;
use crate::daemon::upstream;
use crate::exit;

/// OpenAI's public API: the proxy's upstream when nothing else is named.
pub(crate) const PUBLIC_OPENAI: &str = "https://api.openai.com/v1";
/// Anthropic's public API.
pub(crate) const PUBLIC_ANTHROPIC: &str = "https://api.anthropic.com";
/// What `serve --help` says after the options.
const LONG_HELP: &str = "\
The daemon over the store (RETRACE_STORE / RETRACE_HOME): the HTTP API under /api/ and the \
recording proxy, OpenAI-compatible under /proxy/openai/v1/ and Anthropic-compatible under \
/proxy/anthropic/. A call names its run and agent with the headers X-Retrace-Run and \
X-Retrace-Agent, or by path: /proxy/run/RUN/agent/AGENT/openai/v1/... Runs are created with \
`POST /api/runs` (record) or `POST /api/runs/RUN/replay` (a new replay of RUN; its calls are \
answered from RUN's log), and ended with `POST /api/runs/RUN/finish`.

Access: on a loopback address with no tokens, every call is allowed. Tokens with roles come from \
RETRACE_SERVE_TOKENS (`viewer:TOKEN,debugger:TOKEN,admin:TOKEN`) and/or --tokens FILE (one `role \
TOKEN [NAME]` per line, `#` comments; refused if other users can read it: chmod 600). A token is \
at least 16 visible characters. With tokens, every route but /api/health and /api/openapi.json \
needs one: `Authorization: Bearer TOKEN` on /api/, `X-Retrace-Token: TOKEN` on /proxy/ (there \
Authorization and x-api-key belong to the provider and pass through untouched). Clients (the \
Python SDK) read it from RETRACE_TOKEN. Roles: viewer reads runs, events, blobs and exports; \
debugger also records, replays, and calls the SDK routes and the proxy; admin may do everything, \
including the admin routes: POST /api/vault/reveal (under RETRACE_VAULT_KEY, audited), GET \
/api/vault/audit, POST /api/runs/RUN/retain and POST /api/gc (routine runs expire after \
./retrace.toml's [retention]). A tokens file line may name the token's holder (`admin TOKEN \
alice`): the audit log then says who revealed what, else `api`. No token or an unknown one is \
401, too low a role 403. A non-loopback --addr (0.0.0.0:7420) is refused without tokens \
(exit 2).

Output: the daemon's URL alone on standard output, once it listens (`--addr 127.0.0.1:0` takes a \
free port: read it there); everything else on standard error.

Stopping: SIGINT or SIGTERM stops taking connections and gives open requests (a proxied stream, \
a long recv) up to 10 s to end; a second signal stops at once. Runs left running are stored \
interrupted the next time the store is opened.

Examples:
  retrace serve --addr 127.0.0.1:7420 --upstream-openai http://127.0.0.1:8100/v1
  RETRACE_SERVE_TOKENS=viewer:$(openssl rand -hex 16) retrace serve --addr 0.0.0.0:7420
  retrace serve --addr 0.0.0.0:7420 --tokens /etc/retrace/tokens";

/// Run the daemon: the HTTP API and the recording proxy.
#[derive(Debug, Parser)]
#[command(
    after_help = "Tokens: RETRACE_SERVE_TOKENS=role:TOKEN,... or --tokens FILE; required off loopback. More: --help\n\n\
Examples:\n  \
retrace serve --addr 127.0.0.1:7420 --upstream-openai http://127.0.0.1:8100/v1\n  \
retrace serve --addr 0.0.0.0:7420 --tokens /etc/retrace/tokens",
    after_long_help = LONG_HELP
)]
pub struct Args {
    /// Address to listen on (loopback by default; any other address needs tokens).
    #[arg(long, default_value = DEFAULT_ADDR)]
    addr: String,
    /// A file of tokens, one `role TOKEN [NAME]` per line (roles: viewer, debugger, admin; NAME
    /// is who the audit log names), added to those of RETRACE_SERVE_TOKENS. Must not be
    /// readable by others.
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// Declare a replay stalled when its waiting calls make no progress for this many seconds.
    #[arg(long, value_name = "S", default_value_t = 30.0, value_parser = super::stall_seconds)]
    stall_timeout: f64,
    /// OpenAI-compatible upstream, with /v1 (default: $OPENAI_BASE_URL, else api.openai.com).
    #[arg(long, value_name = "URL")]
    upstream_openai: Option<String>,
    /// Anthropic-compatible upstream (default: $ANTHROPIC_BASE_URL, else api.anthropic.com).
    #[arg(long, value_name = "URL")]
    upstream_anthropic: Option<String>,
    /// Largest request body accepted, in bytes (after decoding).
    #[arg(long, value_name = "BYTES", default_value_t = 32 << 20)]
    max_body: usize,
    /// Seconds an upstream may take to answer, and between two chunks of a stream (more than 0).
    #[arg(long, value_name = "S", default_value_t = 600.0, value_parser = super::positive_seconds)]
    upstream_timeout: f64,
}

/// The daemon's configuration from the flags shared by `serve`, `record` and `replay`, with
/// the store's mask key and `./retrace.toml`'s masking rules.
pub fn config(
    upstream_openai: Option<String>,
    upstream_anthropic: Option<String>,
    stall_timeout: f64,
) -> anyhow::Result<ServerConfig> {
    config_masked(upstream_openai, upstream_anthropic, stall_timeout, super::mask_from_env()?)
}

/// [`config`] with the masking given (`gate` resolves it once, not from each temporary store).
pub fn config_masked(
    upstream_openai: Option<String>,
    upstream_anthropic: Option<String>,
    stall_timeout: f64,
    mask: super::MaskSetup,
) -> anyhow::Result<ServerConfig> {
    let openai = upstream(upstream_openai, "OPENAI_BASE_URL", PUBLIC_OPENAI);
    let anthropic = upstream(upstream_anthropic, "ANTHROPIC_BASE_URL", PUBLIC_ANTHROPIC);
    check_upstream(&openai, "--upstream-openai or OPENAI_BASE_URL", PUBLIC_OPENAI)?;
    check_upstream(&anthropic, "--upstream-anthropic or ANTHROPIC_BASE_URL", PUBLIC_ANTHROPIC)?;
    Ok(ServerConfig {
        upstream_openai: openai,
        upstream_anthropic: anthropic,
        stall_timeout: Duration::from_secs_f64(stall_timeout.max(0.0)),
        mask_key: Some(mask.key),
        mask_rules: mask.rules,
        vault_key: retrace_runtime::masking::vault_key_from_env()?,
        // The autonomy policy is read where runs are recorded (`record`, `serve`: see
        // [`with_autonomy`]), never by replay, fork or gate (SPEC §7; QA26 D4: a typo in it
        // failed every replay).
        autonomy: None,
        ..ServerConfig::default()
    })
}

/// `config` with the `[autonomy]` policy of `retrace.toml` (the working folder's, else the
/// nearest above it up to the git top level): for a daemon that records.
pub fn with_autonomy(mut config: ServerConfig) -> anyhow::Result<ServerConfig> {
    config.autonomy = retrace_runtime::autonomy::from_cwd()?;
    with_prices(config)
}

/// `config` with the built-in prices and `[prices]` of `retrace.toml` (found as for
/// [`with_autonomy`]): for a daemon whose model calls run live (`record`, `serve`, `fork`).
pub fn with_prices(mut config: ServerConfig) -> anyhow::Result<ServerConfig> {
    config.prices = std::sync::Arc::new(retrace_runtime::config_file::prices_in(&std::env::current_dir()?)?);
    Ok(config)
}

/// Refuses an upstream that is not an `http://` or `https://` URL with a host, before anything
/// runs: a typo would otherwise surface as a 502 on the program's first model call.
fn check_upstream(url: &str, from: &str, example: &str) -> anyhow::Result<()> {
    retrace_server::proxy::upstream::check_base_url(url).map_err(|why| {
        exit::usage_hint(
            format!("the upstream {url:?} (from {from}) is not an http:// or https:// URL: {why}"),
            format!("give the provider's base URL, e.g. {example}"),
        )
    })
}

/// The tokens of RETRACE_SERVE_TOKENS and of `file`.
fn tokens(file: Option<&Path>) -> anyhow::Result<Tokens> {
    let mut tokens = Tokens::none();
    if let Ok(value) = std::env::var("RETRACE_SERVE_TOKENS") {
        tokens.add_env(&value).map_err(|e| exit::usage(e.to_string()))?;
    }
    if let Some(file) = file {
        let name = file.display().to_string();
        let meta = std::fs::metadata(file).map_err(|e| exit::usage(format!("cannot read {name}: {e}")))?;
        let mode = meta.permissions().mode();
        if mode & 0o007 != 0 {
            return Err(exit::usage_hint(
                format!(
                    "refusing the tokens file {name}: other users can access it (mode {:o})",
                    mode & 0o777
                ),
                format!("chmod 600 {name}"),
            ));
        }
        if mode & 0o070 != 0 {
            eprintln!(
                "retrace: warning: the tokens file {name} is readable by its group (mode {:o})",
                mode & 0o777
            );
        }
        let text =
            std::fs::read_to_string(file).map_err(|e| exit::usage(format!("cannot read {name}: {e}")))?;
        tokens.add_file(&name, &text).map_err(|e| exit::usage(e.to_string()))?;
    }
    Ok(tokens)
}

/// Refuses a non-loopback `addr` when there are no tokens, before anything is bound or opened.
fn check_addr(addr: &str, tokens: &Tokens) -> anyhow::Result<()> {
    let addrs: Vec<std::net::SocketAddr> =
        addr.to_socket_addrs().map_err(|e| exit::usage(format!("bad --addr {addr}: {e}")))?.collect();
    retrace_server::auth::check_exposure(&addrs, tokens).map_err(|e| exit::usage(e.to_string()))
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let tokens = tokens(args.tokens.as_deref())?;
    check_addr(&args.addr, &tokens)?;
    let (store, read_only) = served_store_from_env()?;
    let mask = match &read_only {
        None => super::mask_from_env()?,
        Some(_) => super::mask_for_read_only()?,
    };
    let mut config = with_autonomy(config_masked(
        args.upstream_openai,
        args.upstream_anthropic,
        args.stall_timeout,
        mask,
    )?)?;
    config.tokens = tokens;
    config.retention = super::gc::retention()?;
    config.max_body = args.max_body;
    config.upstream_timeout = Duration::from_secs_f64(args.upstream_timeout);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let bound =
            retrace_server::bind(&args.addr).await.with_context(|| format!("listening on {}", args.addr))?;
        let base = format!("http://{}", bound.addr);
        // Alone on standard output, as `simulate` prints its own: a script that asked for
        // `--addr 127.0.0.1:0` reads the port there (QA37 S1).
        println!("{base}");
        eprintln!("retrace: serving on {base} (store: {})", store.backend());
        eprintln!("retrace:   OPENAI_BASE_URL={base}/proxy/openai/v1  → {}", config.upstream_openai);
        eprintln!("retrace:   ANTHROPIC_BASE_URL={base}/proxy/anthropic  → {}", config.upstream_anthropic);
        if let Some(why) = &read_only {
            eprintln!(
                "retrace:   read-only ({why}): runs can be browsed and exported; recording, replays and \
                 admin changes are refused"
            );
        }
        match config.tokens.counts() {
            (0, 0, 0) => eprintln!("retrace:   no tokens: every call on this loopback address is allowed"),
            (viewer, debugger, admin) => eprintln!(
                "retrace:   tokens required (viewer {viewer}, debugger {debugger}, admin {admin}); clients set RETRACE_TOKEN"
            ),
        }
        let state = AppState::new(store, config);
        // The first SIGINT or SIGTERM stops taking connections and lets the open requests end
        // (a proxied stream, a long `recv`), for at most SHUTDOWN_GRACE; a second one, or the
        // grace's end, stops at once (QA17 D1: a stream that never ended held the daemon for
        // good, and further signals went unheard).
        let (signalled, first) = tokio::sync::oneshot::channel();
        let serving = retrace_server::serve(bound, state, async move {
            shutdown_signal().await;
            let _ = signalled.send(());
        });
        tokio::pin!(serving);
        tokio::select! {
            served = &mut serving => served.context("serving")?,
            _ = first => {
                eprintln!(
                    "retrace: stopping: letting open requests end (at most {} s; Ctrl-C again stops now)",
                    SHUTDOWN_GRACE.as_secs()
                );
                tokio::select! {
                    served = &mut serving => served.context("serving")?,
                    _ = shutdown_signal() => eprintln!("retrace: stopping now, with requests still open"),
                    _ = tokio::time::sleep(SHUTDOWN_GRACE) => eprintln!(
                        "retrace: requests still open after {} s were cut short",
                        SHUTDOWN_GRACE.as_secs()
                    ),
                }
            }
        }
        eprintln!("retrace: stopped");
        Ok(())
    })
}

/// How long a stopping daemon lets its open requests end.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}
