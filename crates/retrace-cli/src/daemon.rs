//! The daemon that `record` and `replay` embed for the program they run: the proxy and API on
//! a free loopback port, over the same store, with the launched run as the default run of
//! calls that name none (SPEC §5).
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use retrace_runtime::{Outcome, RunReport, RuntimeError};
use retrace_server::{AppState, ServerConfig};
use retrace_store::Store;
use tokio::sync::oneshot;

/// A running embedded daemon.
pub struct Embedded {
    runtime: tokio::runtime::Runtime,
    state: Arc<AppState>,
    addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Embedded {
    /// Starts a daemon over `store` on `127.0.0.1:0`.
    pub fn start(store: Arc<dyn Store>, config: ServerConfig) -> anyhow::Result<Embedded> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("retrace-daemon")
            .build()
            .context("starting the embedded daemon's runtime")?;
        let state = AppState::new(store, config);
        let bound = runtime
            .block_on(retrace_server::bind("127.0.0.1:0"))
            .context("binding the embedded daemon to a loopback port")?;
        let addr = bound.addr;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = runtime.spawn(retrace_server::serve(bound, state.clone(), async move {
            let _ = stopped.await;
        }));
        Ok(Embedded { runtime, state, addr, stop: Some(stop), task: Some(task) })
    }

    /// What the child needs to reach the daemon and its proxy, and the proxy's own upstreams
    /// (`RETRACE_UPSTREAM_OPENAI`, `RETRACE_UPSTREAM_ANTHROPIC`): a program that records its
    /// model calls itself, through the SDK, sends them there, since through the proxy they
    /// would be recorded a second time.
    pub fn child_env(&self) -> Vec<(String, String)> {
        let base = format!("http://{}", self.addr);
        let config = &self.state.config;
        vec![
            ("RETRACE_URL".into(), base.clone()),
            ("OPENAI_BASE_URL".into(), format!("{base}/proxy/openai/v1")),
            ("ANTHROPIC_BASE_URL".into(), format!("{base}/proxy/anthropic")),
            ("RETRACE_UPSTREAM_OPENAI".into(), config.upstream_openai.clone()),
            ("RETRACE_UPSTREAM_ANTHROPIC".into(), config.upstream_anthropic.clone()),
        ]
    }

    /// The requests its proxy refused for their body (answered, not recorded): how many, and
    /// the first one's reason.
    pub fn refused(&self) -> Option<(u64, String)> {
        self.state.refused.summary()
    }

    /// How many recorded steps the replay `run` has served (0 when the program took none).
    pub fn steps_served(&self, run: &str) -> usize {
        self.state.host.steps_served(run).unwrap_or(0)
    }

    /// Whether the daemon hosted a session for `run` (the program called through the proxy).
    pub fn hosts(&self, run: &str) -> bool {
        self.state.host.hosts(run)
    }

    /// Ends `run`'s hosted session with the program's exit status.
    pub fn finish(&self, run: &str, exit_status: i32) -> anyhow::Result<Result<RunReport, RuntimeError>> {
        let _guard = self.runtime.enter();
        let streaming = self.state.host.calls_in_flight(run);
        if streaming > 0 {
            let (they_are, them) = if streaming == 1 { ("it is", "it") } else { ("they are", "them") };
            eprintln!(
                "retrace: waiting for {} the program stopped reading or gave up on: {they_are} \
                 recorded once the upstream ends (at most {} s; Ctrl-C stops waiting, and the run is \
                 stored interrupted without {them})",
                crate::output::count(streaming, "model call"),
                self.state.host.call_wait().as_secs()
            );
        }
        // A `HostError`'s message names its cause already (the API sends it as the reason):
        // taken as a chain, `{:#}` would print the cause twice on one line.
        // A signal that stopped the program came before the wait: calls about to be stored (a
        // client that left gets its answer at once) still get two seconds; one that comes during
        // the wait ends it.
        let (began, earlier) = (std::time::Instant::now(), crate::launcher::signals::received().is_some());
        let stopped = || {
            crate::launcher::signals::received().is_some()
                && (!earlier || began.elapsed() >= std::time::Duration::from_secs(2))
        };
        self.state
            .host
            .finish_unless(run, Outcome { exit_status: Some(exit_status) }, &stopped)
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// Stops serving (in-flight calls get two seconds to end).
    pub fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = self.runtime.block_on(async { tokio::time::timeout(Duration::from_secs(2), task).await });
        }
        self.runtime.shutdown_timeout(Duration::from_secs(1));
    }
}

/// The upstream for `provider`: the flag, else the caller's own base-URL variable (unless it
/// already points at a Retrace proxy), else the provider's public API.
pub fn upstream(flag: Option<String>, env_var: &str, public: &str) -> String {
    flag.or_else(|| std::env::var(env_var).ok().filter(|u| !u.is_empty() && !u.contains("/proxy/")))
        .unwrap_or_else(|| public.to_owned())
}
