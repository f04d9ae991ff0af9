//! `retrace serve`: the daemon, until SIGINT or SIGTERM.
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use retrace_server::{AppState, ServerConfig, DEFAULT_ADDR};

use super::store_from_env;
use crate::daemon::upstream;

/// Run the daemon over the store (RETRACE_STORE / RETRACE_HOME): the HTTP API under /api/ and
/// the recording proxy, OpenAI-compatible under /proxy/openai/v1/ and Anthropic-compatible under
/// /proxy/anthropic/. A call names its run and agent with the headers X-Retrace-Run and
/// X-Retrace-Agent, or by path: /proxy/run/RUN/agent/AGENT/openai/v1/... Runs are created with
/// `POST /api/runs` (record) or `POST /api/runs/RUN/replay` (a new replay of RUN; its calls are
/// answered from RUN's log), and ended with `POST /api/runs/RUN/finish`.
///
/// Example: retrace serve --addr 127.0.0.1:7420 --upstream-openai http://127.0.0.1:8000/v1
#[derive(Debug, Parser)]
pub struct Args {
    /// Address to listen on (loopback by default).
    #[arg(long, default_value = DEFAULT_ADDR)]
    addr: String,
    /// Declare a replay stalled when its waiting calls make no progress for this many seconds.
    #[arg(long, value_name = "S", default_value_t = 30.0)]
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
    /// Seconds an upstream may take to answer, and between two chunks of a stream.
    #[arg(long, value_name = "S", default_value_t = 600.0)]
    upstream_timeout: f64,
}

/// The daemon's configuration from the flags shared by `serve`, `record` and `replay`, with
/// the store's mask key and `./retrace.toml`'s masking rules.
pub fn config(
    upstream_openai: Option<String>,
    upstream_anthropic: Option<String>,
    stall_timeout: f64,
) -> anyhow::Result<ServerConfig> {
    Ok(config_masked(upstream_openai, upstream_anthropic, stall_timeout, super::mask_from_env()?))
}

/// [`config`] with the masking given (`gate` resolves it once, not from each temporary store).
pub fn config_masked(
    upstream_openai: Option<String>,
    upstream_anthropic: Option<String>,
    stall_timeout: f64,
    mask: super::MaskSetup,
) -> ServerConfig {
    ServerConfig {
        upstream_openai: upstream(upstream_openai, "OPENAI_BASE_URL", "https://api.openai.com/v1"),
        upstream_anthropic: upstream(upstream_anthropic, "ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
        stall_timeout: Duration::from_secs_f64(stall_timeout.max(0.0)),
        mask_key: Some(mask.key),
        mask_rules: mask.rules,
        ..ServerConfig::default()
    }
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let store = store_from_env()?;
    let mut config = config(args.upstream_openai, args.upstream_anthropic, args.stall_timeout)?;
    config.max_body = args.max_body;
    config.upstream_timeout = Duration::from_secs_f64(args.upstream_timeout.max(0.001));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let bound =
            retrace_server::bind(&args.addr).await.with_context(|| format!("listening on {}", args.addr))?;
        let base = format!("http://{}", bound.addr);
        eprintln!("retrace: serving on {base} (store: {})", store.backend());
        eprintln!("retrace:   OPENAI_BASE_URL={base}/proxy/openai/v1  → {}", config.upstream_openai);
        eprintln!("retrace:   ANTHROPIC_BASE_URL={base}/proxy/anthropic  → {}", config.upstream_anthropic);
        let state = AppState::new(store, config);
        retrace_server::serve(bound, state, shutdown_signal()).await.context("serving")?;
        eprintln!("retrace: stopped");
        Ok(())
    })
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}
