//! The Retrace daemon (`retrace serve`, and the one `record` / `replay` embed): an HTTP API over
//! the store and the OpenAI/Anthropic-compatible recording proxy (SPEC §5).
//!
//! It owns no replay logic: every proxied call is a step of a runtime [`Session`] hosted in
//! [`host::RunHost`], so matching, scheduling and masking are the runtime's and the core's.
//! [`router`] is apart from [`serve`] so tests can call the daemon in-process.
//!
//! [`Session`]: retrace_runtime::Session
#![warn(missing_docs)]

pub mod admin;
pub mod api;
pub mod auth;
pub mod host;
pub mod json_errors;
pub mod openapi;
pub mod processes;
pub mod proxy;
pub mod reads;
pub mod steps;
pub mod template;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{any, get, post};
use axum::Router;
use retrace_core::mask::{MaskKey, MaskRules};
use retrace_store::Store;

use host::RunHost;
pub use proxy::Upstreams;

/// Where the daemon listens by default.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7420";

/// How the daemon is set up.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// OpenAI-compatible upstream, as in `OPENAI_BASE_URL` (with `/v1`).
    pub upstream_openai: String,
    /// Anthropic-compatible upstream, as in `ANTHROPIC_BASE_URL`.
    pub upstream_anthropic: String,
    /// Largest request body accepted, after decoding.
    pub max_body: usize,
    /// How long an upstream may take to answer, and between stream chunks.
    pub upstream_timeout: Duration,
    /// How long waiting replay steps may go without progress before the run is a stall.
    pub stall_timeout: Duration,
    /// The run that calls naming no run belong to (set by `record`, `replay` and `fork`).
    pub default_run: Option<String>,
    /// The mask key of every session the daemon opens (none: a key per session, for tests).
    pub mask_key: Option<MaskKey>,
    /// The masking rules of runs the daemon creates (`POST /api/runs`).
    pub mask_rules: MaskRules,
    /// The vault key of every session the daemon opens (`RETRACE_VAULT_KEY`).
    pub vault_key: Option<retrace_core::vault::VaultKey>,
    /// The tokens callers must present ([`auth`]); none: every call is allowed.
    pub tokens: auth::Tokens,
    /// The autonomy policy side effects of recorded runs answer to (`./retrace.toml`'s
    /// `[autonomy]` where the daemon runs); `None`: not governed.
    pub autonomy: Option<Arc<retrace_runtime::autonomy::Governor>>,
    /// When routine runs expire for `POST /api/gc` (`./retrace.toml`'s `[retention]` for
    /// `retrace serve`).
    pub retention: retrace_store::gc::RetentionConfig,
    /// What model tokens cost: the built-in prices, and `[prices]` of `retrace.toml` where the
    /// daemon runs (`record`, `serve`, `fork`).
    pub prices: Arc<retrace_core::prices::PriceTable>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            upstream_openai: "https://api.openai.com/v1".into(),
            upstream_anthropic: "https://api.anthropic.com".into(),
            max_body: 32 << 20,
            upstream_timeout: Duration::from_secs(600),
            stall_timeout: Duration::from_secs(30),
            default_run: None,
            mask_key: None,
            mask_rules: MaskRules::default(),
            vault_key: None,
            tokens: auth::Tokens::none(),
            autonomy: None,
            retention: retrace_store::gc::RetentionConfig::default(),
            prices: Arc::new(retrace_core::prices::PriceTable::builtin()),
        }
    }
}

/// What every handler shares.
pub struct AppState {
    /// The hosted runs.
    pub host: Arc<RunHost>,
    /// Which process owns which agent.
    pub processes: Arc<processes::Processes>,
    /// The upstreams.
    pub upstreams: Upstreams,
    /// The configuration.
    pub config: ServerConfig,
    /// The run of calls that name none.
    pub default_run: Option<String>,
    /// SDK steps waiting for their program's outcome.
    pub pending: steps::Pending,
    /// The daemon's own masker, for what it persists or logs outside a run's steps: the names
    /// and labels of runs created through the API, routes in its warnings.
    pub masker: retrace_core::mask::Masker,
    /// Proxied requests refused for their body (too large, not JSON a step can hold).
    pub refused: Refused,
}

/// The proxied requests the daemon refused for their body, answered and never recorded: how
/// many, and the first one's reason.
#[derive(Debug, Default)]
pub struct Refused(std::sync::Mutex<(u64, Option<String>)>);

impl Refused {
    /// Notes one refusal.
    pub fn note(&self, why: &str) {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        seen.0 += 1;
        seen.1.get_or_insert_with(|| why.to_owned());
    }

    /// How many were refused and the first one's reason; `None` when none was.
    pub fn summary(&self) -> Option<(u64, String)> {
        let seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        seen.1.clone().map(|first| (seen.0, first))
    }
}

impl AppState {
    /// State over `store`.
    pub fn new(store: Arc<dyn Store>, config: ServerConfig) -> Arc<AppState> {
        Arc::new(AppState {
            host: Arc::new(
                RunHost::new(store, config.stall_timeout, config.mask_key.clone(), config.vault_key.clone())
                    .with_autonomy(config.autonomy.clone())
                    .with_mask_rules(config.mask_rules.clone())
                    .with_prices(config.prices.clone())
                    .with_upstream_timeout(config.upstream_timeout),
            ),
            processes: Arc::default(),
            upstreams: Upstreams::new(
                &config.upstream_openai,
                &config.upstream_anthropic,
                config.upstream_timeout,
            ),
            default_run: config.default_run.clone(),
            pending: steps::Pending::default(),
            masker: retrace_runtime::masking::masker_with(
                config.mask_rules.clone(),
                &Default::default(),
                config.mask_key.as_ref(),
            )
            .unwrap_or_else(|_| retrace_core::mask::Masker::empty()),
            refused: Refused::default(),
            config,
        })
    }
}

/// The daemon's routes.
pub fn router(state: Arc<AppState>) -> Router {
    // The API reads bodies whole: at most --max-body, as the proxy (which reads its own, its
    // limit applying after decoding) does (QA20 D3).
    let api_limit = axum::extract::DefaultBodyLimit::max(state.config.max_body);
    let routes = Router::new()
        .route("/api/health", get(api::health))
        .route("/api/openapi.json", get(|| async { axum::Json(openapi::document()) }))
        .route("/api/runs", get(api::runs).post(api::create_run))
        .route("/api/runs/{run}", get(api::run))
        .route("/api/runs/{run}/events", get(reads::events))
        .route("/api/runs/{run}/export", get(reads::export))
        .route("/api/blobs/{*digest}", get(reads::blob))
        .route("/api/runs/{run}/replay", post(api::replay))
        .route("/api/runs/{run}/finish", post(api::finish))
        .route("/api/runs/{run}/agents/{agent}/steps", post(steps::step))
        .route("/api/runs/{run}/agents/{agent}/send", post(steps::send))
        .route("/api/runs/{run}/agents/{agent}/recv", post(steps::recv))
        .route("/api/runs/{run}/agents/{agent}/decide", post(steps::decide))
        .route("/api/runs/{run}/agents/{agent}/template", post(template::template))
        .route("/api/runs/{run}/agents/{agent}/exit", post(steps::exit))
        .route("/api/runs/{run}/agents/{agent}/role", post(steps::role))
        .route("/api/runs/{run}/agents/{agent}/claim", post(steps::claim))
        .route("/api/runs/{run}/retain", post(admin::retention::retain))
        .route("/api/gc", post(admin::retention::gc))
        .route("/api/runs/{run}/delete", post(admin::retention::delete))
        .route("/api/vault/reveal", post(admin::vault::reveal))
        .route("/api/vault/audit", get(admin::vault::audit))
        .layer(api_limit)
        .merge(proxy_routes())
        .fallback(fallback)
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth::middleware))
        .with_state(state);
    // Around the whole router, so a 405 reaches it with the `Allow` header axum adds last.
    Router::new().fallback_service(routes).layer(axum::middleware::from_fn(json_errors::middleware))
}

/// The proxy's routes: each reads its body itself, up to --max-body after decoding.
fn proxy_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/proxy/openai/v1/{*rest}", any(proxy::openai))
        .route("/proxy/anthropic/{*rest}", any(proxy::anthropic))
        .route("/proxy/run/{run}/agent/{agent}/openai/v1/{*rest}", any(proxy::openai_for))
        .route("/proxy/run/{run}/agent/{agent}/anthropic/{*rest}", any(proxy::anthropic_for))
        .layer(axum::extract::DefaultBodyLimit::disable())
}

async fn fallback(uri: axum::http::Uri) -> axum::response::Response {
    if uri.path().starts_with("/api/") {
        // The API's own error shape (the SDKs read `error.code`), not a provider's.
        let msg = format!("retrace: no route for {}; the API's routes are in /api/openapi.json", uri.path());
        return steps::fail(axum::http::StatusCode::NOT_FOUND, "no_route", msg);
    }
    let provider = if uri.path().contains("anthropic") || uri.path().starts_with("/v1/messages") {
        proxy::reply::Provider::Anthropic
    } else {
        proxy::reply::Provider::OpenAi
    };
    let msg = format!(
        "retrace: no route for {}; the proxy lives under /proxy/openai/v1/ and /proxy/anthropic/, the API under /api/",
        uri.path()
    );
    proxy::reply::error(provider, axum::http::StatusCode::NOT_FOUND, &msg)
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("config", &self.config).finish_non_exhaustive()
    }
}

/// A daemon bound to a port.
#[derive(Debug)]
pub struct Bound {
    listener: tokio::net::TcpListener,
    /// The address it listens on.
    pub addr: SocketAddr,
}

/// Binds `addr` (`127.0.0.1:0` picks a free port).
pub async fn bind(addr: &str) -> std::io::Result<Bound> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    Ok(Bound { listener, addr })
}

/// Serves `state` on `bound` until `shutdown` resolves.
pub async fn serve(
    bound: Bound,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // TCP_NODELAY: a proxied stream's chunks (and a terminal event released on its
    // acknowledgment, right behind the chunk before it) go out as they are written, not when
    // the client's delayed ACK lets Nagle's algorithm send the next small segment.
    let listener = axum::serve::ListenerExt::tap_io(bound.listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await
}
