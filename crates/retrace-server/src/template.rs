//! `POST /api/runs/{run}/agents/{agent}/template`: SPEC §6 `template()` for SDK agents. The
//! daemon reads `prompts/<name>/<version>.txt` (or `RETRACE_PROMPTS`) from its working directory,
//! the program's when `record`, `replay` or `fork` embed it, through the runtime's own
//! [`Agent::template`](retrace_runtime::Agent::template): the agent's model calls that follow
//! carry the template's id and digest, and a fork's `prompt:AGENT=VERSION` edit hands the agent
//! that version's text from the fork point on.
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::steps::{agent, fail, json_body, runtime_failure};
use crate::AppState;

/// The body of a template request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateBody {
    /// `name@version`, e.g. `planner@v3`.
    template: String,
    /// Values for the `{name}` placeholders (a JSON object).
    #[serde(default)]
    vars: Option<Value>,
    /// The program's prompts folder (the Rust runtime sends it): read instead of the daemon's
    /// own only by a daemon without tokens, which listens on loopback for the same user.
    #[serde(default)]
    prompts_dir: Option<std::path::PathBuf>,
}

/// `POST /api/runs/{run}/agents/{agent}/template`: the text of the agent's prompt template.
pub async fn template(
    State(app): State<Arc<AppState>>,
    Path((run, agent_id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: TemplateBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let vars = body.vars.unwrap_or_else(|| json!({}));
    if !vars.is_object() {
        return fail(StatusCode::BAD_REQUEST, "bad_request", "vars must be a JSON object");
    }
    if !valid_id(&body.template) {
        return fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "template must be name@version, each of letters, digits, '.', '_' or '-' and not starting with '.'",
        );
    }
    let agent = match agent(&app, &run, &agent_id, &headers) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let id = body.template.clone();
    let prompts_dir = body.prompts_dir.filter(|_| app.config.tokens.is_empty());
    let filled = tokio::task::spawn_blocking(move || {
        let agent = agent.with_prompt_template(&id);
        match prompts_dir {
            Some(dir) => agent.template_in(&vars, &dir),
            None => agent.template(&vars),
        }
    })
    .await;
    match filled {
        Ok(Ok(text)) => Json(json!({"status": "done", "text": text})).into_response(),
        Ok(Err(retrace_runtime::RuntimeError::Usage(why))) => {
            fail(StatusCode::NOT_FOUND, "unknown_template", why)
        }
        Ok(Err(e @ retrace_runtime::RuntimeError::TemplateVar { .. })) => {
            fail(StatusCode::BAD_REQUEST, "template_var", e)
        }
        Ok(Err(e)) => runtime_failure(&e, &app, &run),
        Err(e) => fail(StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
    }
}

/// `name@version` where each part is a plain file name: no path can leave the prompts folder.
fn valid_id(id: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && p.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    };
    matches!(id.split_once('@'), Some((name, version)) if part(name) && part(version))
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_plain_file_names() {
        for ok in ["planner@v3", "review.v2@2024-01", "a_b@c-d"] {
            assert!(super::valid_id(ok), "{ok}");
        }
        for bad in
            ["planner", "..@x", "a@..", "a/b@v1", "a@v1/x", "@v1", "a@", ".hidden@v1", "a@v\\1", "a@v\u{0}"]
        {
            assert!(!super::valid_id(bad), "{bad}");
        }
    }
}
