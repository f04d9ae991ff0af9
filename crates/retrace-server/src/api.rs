//! The daemon's JSON API (the part the proxy and the launchers need; the SDK API grows here):
//! runs, and record and replay sessions for them.
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use retrace_core::run::{RunMeta, RunMode, RunStatus};
use retrace_runtime::env_sources::{new_run_id, Clock, SystemClock};
use retrace_runtime::Outcome;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::AppState;

/// An API error: `{"error": {"code": ..., "message": ...}}` with a status.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    /// An error whose code follows from its status (`bad_request`, `unknown_run`, `conflict`,
    /// `internal`).
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        let code = match status.as_u16() {
            400 => "bad_request",
            404 => "unknown_run",
            409 => "conflict",
            _ => "internal",
        };
        ApiError { status, code, message: message.into() }
    }

    /// An error with its own code, which a client can branch on.
    pub fn coded(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

fn not_found(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, e.to_string())
}

/// A run that `find_run` didn't find: 404, or 400 for a prefix that is ambiguous or too short.
fn unfound_run(e: retrace_store::StoreError) -> ApiError {
    match e.kind {
        retrace_store::StoreErrorKind::NotFound => not_found(e),
        retrace_store::StoreErrorKind::Invalid => ApiError::new(StatusCode::BAD_REQUEST, e.to_string()),
        _ => internal(e),
    }
}

/// A write the store refused: 409 `read_only` when it is open read-only (`serve` over a folder
/// it can't write, as the admin routes say), else 500.
fn refused_write(e: retrace_store::StoreError) -> ApiError {
    match e.kind {
        retrace_store::StoreErrorKind::ReadOnly => {
            ApiError { status: StatusCode::CONFLICT, code: "read_only", message: e.to_string() }
        }
        _ => internal(e),
    }
}

/// Why the host could not do it, with the codes the step routes answer ([`crate::steps`]'s
/// `host_failure`): 404 `unknown_run`, 409 `run_finished` or `run_unavailable`.
fn host_error(e: crate::host::HostError) -> ApiError {
    use crate::host::HostError;
    let (status, code) = match &e {
        HostError::UnknownRun(_) => (StatusCode::NOT_FOUND, "unknown_run"),
        HostError::Finished(_) => (StatusCode::CONFLICT, "run_finished"),
        HostError::Open { .. } => (StatusCode::CONFLICT, "run_unavailable"),
    };
    ApiError { status, code, message: e.to_string() }
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

type ApiResult = Result<Json<Value>, ApiError>;

/// An optional JSON body: empty is the default; anything else must parse (400 otherwise).
/// Handlers always read their body, so a client that sends one never finds its keep-alive
/// connection dropped.
pub fn optional_body<T: serde::de::DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("bad request body: {e}")))
}

/// `GET /api/health`
pub async fn health(State(app): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"ok": true, "version": env!("CARGO_PKG_VERSION"), "store": app.host.store().backend()}))
}

/// `GET /api/runs`
pub async fn runs(State(app): State<Arc<AppState>>) -> ApiResult {
    let runs = app.host.store().runs().map_err(internal)?;
    Ok(Json(Value::Array(runs.iter().map(run_json).collect())))
}

/// `GET /api/runs/{run}`
pub async fn run(State(app): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult {
    let meta = app.host.store().find_run(&id).map_err(unfound_run)?;
    Ok(Json(run_json(&meta)))
}

/// The body of `POST /api/runs`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRun {
    name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// `POST /api/runs`: a new run to record into; its calls are recorded once they name it.
pub async fn create_run(State(app): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> ApiResult {
    let body: NewRun = optional_body(&body)?;
    if let Some(problem) = retrace_core::run::naming_problem(
        body.name.as_deref(),
        body.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    ) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("retrace: {problem}")));
    }
    let mut meta = RunMeta::new(new_run_id(), RunMode::Record, SystemClock.now_ms());
    // Masked as `retrace record --name/--label` masks them (QA27 D1: stored in clear).
    let mask = |text: &str| app.masker.mask_text(text).0.into_owned();
    meta.name = body.name.as_deref().map(mask);
    meta.labels = body.labels.iter().map(|(k, v)| (mask(k), mask(v))).collect();
    // A limit other than the default is the run's, as `record --max-body` keeps it: its
    // replays and forks refuse what it refused (QA32 D4).
    if app.config.max_body != crate::ServerConfig::default().max_body {
        meta.max_body = Some(app.config.max_body as u64);
    }
    // A literal rule's value is the secret itself: the run records its digest.
    meta.masking_rules = app.config.mask_rules.sealed(app.config.mask_key.as_ref());
    meta.mask_key_fingerprint = app.config.mask_key.as_ref().map(|k| k.fingerprint());
    app.host.store().create_run(&meta).map_err(refused_write)?;
    // Open the session now: its writer holds the run's lease while the daemon lives, so a run
    // waiting for its first call is not taken for one whose recorder died (`interrupted`) by
    // the next process that opens the store.
    app.host.session(&meta.id).map_err(|e| ApiError::new(StatusCode::CONFLICT, e.to_string()))?;
    // The SDK's process finishes the run it created; if it dies first, the run is interrupted.
    let pid = headers.get("x-retrace-process").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    if let Some(pid) = pid {
        app.processes.keep(&app.host, &meta.id, pid);
    }
    Ok(Json(json!({"run_id": meta.id, "mode": "record"})))
}

/// `POST /api/runs/{run}/replay`: a new replay run of `run`; returns its id. Calls that name
/// it are answered from `run`'s log. One daemon hosts any number of concurrent replays.
pub async fn replay(
    State(app): State<Arc<AppState>>,
    holder: Option<axum::Extension<crate::auth::Holder>>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let NoOptions {} = optional_body(&body)?;
    let store = app.host.store();
    let mut source = store.find_run(&id).map_err(unfound_run)?;
    if source.mode == RunMode::Replay {
        let of = source.source_run.clone().unwrap_or_default();
        source = store.run(&of).map_err(not_found)?;
    }
    // Said before a replay run is made: the refusal used to name that run, deleted at once
    // (QA39 D5), with the generic code.
    if source.status == retrace_core::run::RunStatus::Running {
        if let Some(holder) = store.lease_holder(&source.id).map_err(internal)? {
            return Err(ApiError::coded(
                StatusCode::CONFLICT,
                "run_running",
                format!(
                    "run {} is still being recorded by {}; replay it once it has finished",
                    source.id, holder.0
                ),
            ));
        }
    }
    let mut meta = RunMeta::new(new_run_id(), RunMode::Replay, SystemClock.now_ms());
    meta.source_run = Some(source.id.clone());
    meta.name = source.name.clone();
    meta.command = source.command.clone();
    // What the recording refused as too large, its replay refuses too (QA32 D4).
    meta.max_body = source.max_body;
    store.create_run(&meta).map_err(refused_write)?;
    // Open the session now, so a bad source is reported here and not at the first call; on
    // behalf of the caller, whom the audit log names if the replay is handed originals.
    let revealer = crate::admin::vault::revealer(holder.map(|axum::Extension(h)| h));
    if let Err(e) = app.host.session_for(&meta.id, Some(revealer)) {
        discard(store.as_ref(), meta);
        return Err(ApiError::new(StatusCode::CONFLICT, e.to_string()));
    }
    Ok(Json(json!({"run_id": meta.id, "mode": "replay", "source_run": source.id})))
}

/// Deletes the replay run `meta` whose session could not open (its source still being recorded,
/// a mask key that isn't the recording's): it holds nothing, and left `running` it would stay so
/// while the daemon lives. Marked `failed` first, where the deletion itself fails.
fn discard(store: &dyn retrace_store::Store, mut meta: RunMeta) {
    let now = SystemClock.now_ms();
    meta.status = retrace_core::run::RunStatus::Failed;
    meta.finished_at_ms = Some(now);
    if store.update_run(&meta).is_ok() {
        let _ = retrace_store::gc::delete(
            store,
            std::slice::from_ref(&meta),
            &[],
            &retrace_store::gc::GcConfig::new(now, 0),
        );
    }
}

/// A body that may be empty or `{}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoOptions {}

/// The body of `POST /api/runs/{run}/finish`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Finish {
    exit_status: Option<i32>,
    /// The program stopped without finishing the run (a Rust `Session` dropped unfinished): the
    /// run is stored `interrupted` (a replay unjudged), as an in-process session's would be.
    #[serde(default)]
    interrupted: bool,
}

/// `POST /api/runs/{run}/finish`: ends the run's session. A replay checks that every recorded
/// call was consumed and that the exit status matches; its divergence, if any, is returned.
/// With `interrupted`, the run is stored `interrupted` instead, unjudged.
pub async fn finish(State(app): State<Arc<AppState>>, Path(id): Path<String>, body: Bytes) -> ApiResult {
    let body: Finish = optional_body(&body)?;
    let host = app.clone();
    let id2 = id.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        host.host.finish(&id2, Outcome { exit_status: body.exit_status })
    })
    .await
    .map_err(internal)?
    .map_err(host_error)?;
    let mut meta = app.host.store().run(&id).map_err(internal)?;
    if body.interrupted {
        meta.status = RunStatus::Interrupted;
        meta.divergence = None;
        meta.labels
            .insert("failure".into(), "the program dropped its session without finishing the run".into());
        app.host.store().update_run(&meta).map_err(internal)?;
        return Ok(Json(run_json(&meta)));
    }
    let mut out = run_json(&meta);
    if let Err(e) = outcome {
        if e.divergence().is_none() {
            out["error"] = json!(e.to_string());
        }
    }
    Ok(Json(out))
}

fn run_json(meta: &RunMeta) -> Value {
    json!({
        "run_id": meta.id,
        "id": meta.id,
        "name": meta.name,
        "retention": meta.retention.as_str(),
        "command": meta.command,
        "fork_at": meta.fork_at,
        "edits": meta.edits,
        "chaos_seed": meta.chaos_seed,
        "decisions": meta.decisions,
        "mode": meta.mode.to_string(),
        "status": meta.status.to_string(),
        "source_run": meta.source_run,
        "labels": meta.labels,
        "exit_status": meta.exit_status,
        "divergence": meta.divergence,
        "started_at_ms": meta.started_at_ms,
        "finished_at_ms": meta.finished_at_ms,
    })
}
