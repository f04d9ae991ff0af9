//! `POST /api/runs/{run}/retain`, `POST /api/gc` and `POST /api/runs/{run}/delete`:
//! `retrace retain`, `retrace gc` and `retrace delete` over HTTP, through the same
//! [`retrace_store::gc::retain`], [`retrace_store::gc::collect`] and [`retrace_store::gc::delete`].
//! Routine runs expire after the daemon's `[retention]` settings ([`crate::ServerConfig`]'s
//! `retention`), or `older_than_days`.
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use retrace_core::run::Retention;
use retrace_store::gc::{
    collect, delete as delete_runs, refuse_while_running, retain as retain_run, DeleteError, GcConfig,
    RetainError,
};
use retrace_store::StoreErrorKind;
use serde::Deserialize;
use serde_json::json;

use super::{answer, blocking, now_ms, required_body, AdminError};
use crate::AppState;

/// The body of `POST /api/runs/{run}/retain`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetainBody {
    /// `routine`, `incident` or `pinned`.
    tier: String,
}

/// `POST /api/runs/{run}/retain`: sets the run's tier; `{run, retention, previous}`. A run still
/// recording keeps the tier when it ends.
pub async fn retain(State(app): State<Arc<AppState>>, Path(id): Path<String>, body: Bytes) -> Response {
    let tier = match required_body::<RetainBody>(&body).and_then(|b| parse_tier(&b.tier)) {
        Ok(tier) => tier,
        Err(e) => return e.into_response(),
    };
    let store = app.host.store().clone();
    answer(
        blocking(move || {
            let meta = find(&*store, &id)?;
            let retained = retain_run(&*store, meta, tier).map_err(|e| match e {
                RetainError::Replay { source_run: ref source, .. } => {
                    let source = source.as_deref().unwrap_or("its source");
                    AdminError::ReplayHasNoTier(format!("{e}: retain {source} instead"))
                }
                RetainError::Store(e) => AdminError::from_store(&e),
            })?;
            Ok(json!({
                "run": retained.run,
                "retention": retained.retention.as_str(),
                "previous": retained.previous.as_str(),
            }))
        })
        .await,
    )
}

/// The run `id` names (an id or a unique prefix).
fn find(store: &dyn retrace_store::Store, id: &str) -> Result<retrace_core::run::RunMeta, AdminError> {
    store.find_run(id).map_err(|e| match e.kind {
        StoreErrorKind::NotFound => AdminError::UnknownRun(e.to_string()),
        StoreErrorKind::Invalid => AdminError::BadRequest(e.to_string()),
        _ => AdminError::from_store(&e),
    })
}

fn parse_tier(text: &str) -> Result<Retention, AdminError> {
    text.parse().map_err(AdminError::BadRequest)
}

/// The body of `POST /api/gc`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcBody {
    /// Report what would go, delete nothing (required: a collection is never implied).
    dry_run: bool,
    /// Routine runs expire after this many days (default: the daemon's `[retention]`).
    older_than_days: Option<u64>,
    /// Then shrink the database file (`retrace gc --compact`); 409 `run_in_use`, before
    /// anything is deleted, while any run is running.
    #[serde(default)]
    compact: bool,
}

/// `POST /api/gc`: expired runs, then unreferenced blobs; the report `retrace gc --json` prints
/// (`dry_run`, `runs_deleted`, `events_deleted`, `blobs_deleted`, `bytes_freed`,
/// `cache_entries_dropped`, `routine_days`, and with `compact` `compacted`).
pub async fn gc(State(app): State<Arc<AppState>>, body: Bytes) -> Response {
    let body: GcBody = match required_body(&body) {
        Ok(body) => body,
        Err(e) => return e.into_response(),
    };
    let mut retention = app.config.retention;
    if let Some(days) = body.older_than_days {
        retention.routine_days = days;
    }
    let store = app.host.store().clone();
    answer(
        blocking(move || {
            let config = GcConfig { dry_run: body.dry_run, ..GcConfig::from_retention(now_ms(), &retention) };
            if body.compact {
                let runs = store.runs().map_err(|e| AdminError::from_store(&e))?;
                refuse_while_running(&runs).map_err(|e| AdminError::RunInUse(e.to_string()))?;
            }
            let report = collect(&*store, &config).map_err(|e| AdminError::from_store(&e))?;
            let mut out = serde_json::to_value(&report).map_err(|e| AdminError::Internal(e.to_string()))?;
            out["routine_days"] = retention.routine_days.into();
            if body.compact {
                let compacted = match body.dry_run {
                    true => None,
                    false => Some(store.compact().map_err(|e| match e.kind {
                        StoreErrorKind::Busy => {
                            AdminError::RunInUse(format!("collected, but not compacted: {e}"))
                        }
                        _ => AdminError::from_store(&e),
                    })?),
                };
                out["compacted"] =
                    serde_json::to_value(compacted).map_err(|e| AdminError::Internal(e.to_string()))?;
            }
            Ok(out)
        })
        .await,
    )
}

/// The body of `POST /api/runs/{run}/delete`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteBody {
    /// Report what would go, delete nothing (required, as for gc).
    dry_run: bool,
}

/// `POST /api/runs/{run}/delete`: the run now, whatever its tier, with its replays, then the
/// blobs nothing references any more; the report `retrace delete --json` prints. 409
/// `run_in_use` while the run is running or a remaining fork or running replay needs it.
pub async fn delete(State(app): State<Arc<AppState>>, Path(id): Path<String>, body: Bytes) -> Response {
    let body: DeleteBody = match required_body(&body) {
        Ok(body) => body,
        Err(e) => return e.into_response(),
    };
    let retention = app.config.retention;
    let store = app.host.store().clone();
    answer(
        blocking(move || {
            let meta = find(&*store, &id)?;
            let config = GcConfig { dry_run: body.dry_run, ..GcConfig::from_retention(now_ms(), &retention) };
            let report = delete_runs(&*store, &[meta], &[], &config).map_err(|e| match e {
                DeleteError::Store(e) => AdminError::from_store(&e),
                _ => AdminError::RunInUse(e.to_string()),
            })?;
            serde_json::to_value(&report).map_err(|e| AdminError::Internal(e.to_string()))
        })
        .await,
    )
}
