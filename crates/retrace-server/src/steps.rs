//! The SDK's step routes: a program in another process takes its steps through the daemon,
//! which runs them through the runtime's own pipeline for that run and agent.
//!
//! `POST /api/runs/{run}/agents/{agent}/steps` with `{type, name, request, tool?}` and, when the
//! program already ran the step (record), its `output` or `error`. The answer is
//! `{"status": "done", "output": …}`, `{"status": "error", "error": …}` (a recorded failure,
//! raised again), or `{"status": "run", "step": ID}`: the program must run the step now and post
//! `{"step": ID, "output" | "error"}` (a side effect in record, after its intent is stored; a
//! changed or new step of a fork; with `"dry_run": true`, a side effect of a fork whose tool said
//! `"dry_run": true`: the program runs its dry run, and what it reports is recorded). A divergence is HTTP 409 with the report. A side effect the
//! autonomy policy refuses is `{"status": "refused", "error"}`; one held for `retrace approve`
//! past its wait is `{"status": "approval_required", "approval": ID, "error"}` (the SDK raises
//! `ApprovalRequired(ID)`); both are recorded `approval` events, answered alike in replay.
//! A `model_call` step (the Rust runtime's `Agent::model` under `RETRACE_URL`) also names
//! `model: {provider, endpoint}` and runs through the runtime's own model step, so its event and
//! key are those of an in-process model call; a completed one adds `model: {snapshot, usage}`,
//! and a `run` answer carries the `request` to send (a fork's `model:` / `param:` edits applied).
//! `send`, `recv`, `decide` and `exit` are the agent's messages, decisions and ending; `role`
//! (`{"role": "planner"}`) declares the role recorded on each of the agent's events, its model
//! calls through the proxy included.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use parking_lot::Mutex;
use retrace_core::envelope::ToolClass;
use retrace_core::run::RunStatus;
use retrace_runtime::{Agent, ModelCall, ModelReply, RemoteKind, RemoteStep, RuntimeError, ToolSpec};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::AppState;

/// How long the daemon waits for a program to report a step it was told to run.
const OUTCOME_TIMEOUT: Duration = Duration::from_secs(600);

/// What a program reports for a step it ran: its output or error, and for a model call the
/// snapshot and usage the provider reported.
type Outcome = (Result<Value, String>, Option<ModelBody>);

/// A step waiting for its program's outcome: where to send it, the step's task, and the run and
/// agent it belongs to (its outcome is taken only on their route).
type Waiting = (oneshot::Sender<Outcome>, tokio::task::JoinHandle<StepResult>, (String, String));

/// Steps waiting for their program to report what happened.
#[derive(Default)]
pub struct Pending(Mutex<HashMap<String, Waiting>>);

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Pending").field(&self.0.lock().len()).finish()
    }
}

type StepResult = Result<Value, RuntimeError>;

/// The tool of a `tool_call` step.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolBody {
    #[serde(default = "one")]
    version: String,
    class: String,
    #[serde(default)]
    ttl_s: Option<u64>,
    /// A side effect the program can dry-run: a fork asks for the dry run (`"run"` with
    /// `"dry_run": true`) and records what it reports instead of answering `"dry_run"`.
    #[serde(default)]
    dry_run: bool,
}

fn one() -> String {
    "1".into()
}

/// The model of a `model_call` step (the Rust runtime's `Agent::model`): provider and endpoint
/// with the request; the snapshot and usage with the outcome.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelBody {
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    snapshot: Option<String>,
    #[serde(default)]
    usage: Option<retrace_core::envelope::Usage>,
}

/// What a step request asks the runtime to run.
enum Work {
    /// A tool call, clock read, random value or env read.
    Step(RemoteStep),
    /// A model call.
    Model(ModelCall),
}

/// The body of a step request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepBody {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    request: Option<Value>,
    #[serde(default)]
    tool: Option<ToolBody>,
    #[serde(default)]
    model: Option<ModelBody>,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    error: Option<String>,
    /// Completes a step the daemon asked the program to run.
    #[serde(default)]
    step: Option<String>,
    /// How long the program's function ran, when it ran before the step was posted (record).
    #[serde(default)]
    latency_ms: Option<u64>,
}

/// An SDK error answer: `{"error": {"code", "message", "divergence"?}}`.
pub(crate) fn fail(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Response {
    (status, Json(json!({"error": {"code": code, "message": message.to_string()}}))).into_response()
}

/// A step route's JSON body, whatever its `Content-Type` says (`curl -d` sends a form type), as
/// `POST /api/runs` takes its own; a body that doesn't parse is a 400 naming why.
///
/// An integer beyond 64 bits is refused (400 `not_json`, naming its path): the body becomes
/// `serde_json` values, which would turn it into the nearest double and give two different ids
/// one key (SPEC §2 keeps their digits). Send such a number as a string.
pub(crate) fn json_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Box<Response>> {
    if let Some((path, digits)) = wide_integer(bytes) {
        return Err(Box::new(fail(
            StatusCode::BAD_REQUEST,
            "not_json",
            format!(
                "the integer {digits} at {path} is beyond 64 bits, which a step can't keep exactly: \
                 send it as a string"
            ),
        )));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| Box::new(fail(StatusCode::BAD_REQUEST, "bad_request", format!("bad request body: {e}"))))
}

/// The first integer in JSON text that neither `i64` nor `u64` holds, with its path in the
/// body. A cheap scan first: such an integer has at least 19 digits in a row.
fn wide_integer(bytes: &[u8]) -> Option<(String, String)> {
    let mut run = 0;
    bytes.iter().find(|b| {
        run = if b.is_ascii_digit() { run + 1 } else { 0 };
        run >= 19
    })?;
    fn walk(value: &retrace_core::json::Json, path: &mut String) -> Option<(String, String)> {
        use retrace_core::json::{path_push_index, path_push_key, Json};
        match value {
            Json::Number(n) if n.is_integer() && n.as_i64().is_none() && n.as_u64().is_none() => {
                Some((path.clone(), n.as_str().to_owned()))
            }
            Json::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
                let len = path.len();
                path_push_index(path, i);
                let found = walk(item, path);
                path.truncate(len);
                found
            }),
            Json::Object(members) => members.iter().find_map(|(key, item)| {
                let len = path.len();
                path_push_key(path, key);
                let found = walk(item, path);
                path.truncate(len);
                found
            }),
            _ => None,
        }
    }
    walk(&retrace_core::json::parse(bytes).ok()?, &mut String::from("$"))
}

/// The answer for a step's runtime outcome.
pub fn answer(result: StepResult, app: &AppState, run: &str) -> Response {
    match result {
        Ok(output) => Json(json!({"status": "done", "output": output})).into_response(),
        Err(RuntimeError::StepFailed { message, .. }) => {
            Json(json!({"status": "error", "error": message})).into_response()
        }
        Err(RuntimeError::DryRun { tool, args }) => {
            Json(json!({"status": "dry_run", "tool": tool, "args": args})).into_response()
        }
        Err(e @ RuntimeError::NotPermitted(_)) => {
            Json(json!({"status": "refused", "error": e.to_string()})).into_response()
        }
        Err(ref e @ RuntimeError::ApprovalRequired { ref id, .. }) => {
            Json(json!({"status": "approval_required", "approval": id, "error": e.to_string()}))
                .into_response()
        }
        Err(e) => runtime_failure(&e, app, run),
    }
}

/// A runtime error as an SDK answer: 409 for a divergence (with its report), 503 when the
/// store failed (the run is marked failed), 400 for misuse.
pub fn runtime_failure(e: &RuntimeError, app: &AppState, run: &str) -> Response {
    match e {
        RuntimeError::Divergence(d) => (
            StatusCode::CONFLICT,
            Json(
                json!({"error": {"code": "divergence", "message": d.to_string(), "divergence": d.to_json()}}),
            ),
        )
            .into_response(),
        // A step (a side effect's outcome, say) that comes after its run ended: the run is as
        // it was stored, not failed (QA20 D6).
        RuntimeError::Store(_) if app.host.store().run(run).is_ok_and(|m| m.status != RunStatus::Running) => {
            fail(
                StatusCode::CONFLICT,
                "run_finished",
                format!("run {run} has finished: it takes no more steps; start a new run"),
            )
        }
        RuntimeError::Store(s) => {
            app.host.mark_failed(run, &s.to_string());
            fail(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_failed",
                // Recording fails closed; a replay can't serve the step from its recording.
                format!("the store failed at this step (the run is marked failed): {s}"),
            )
        }
        other => fail(StatusCode::BAD_REQUEST, "bad_step", other),
    }
}

/// Why a run's session can't take steps, as an SDK answer: 404 for a run the store lacks, 409
/// for one that has finished (as a second `finish` is) or can't be opened (its lease is held
/// elsewhere, its masking rules need a key the daemon lacks), with the reason.
pub(crate) fn host_failure(e: &crate::host::HostError) -> Response {
    use crate::host::HostError;
    match e {
        HostError::UnknownRun(_) => fail(StatusCode::NOT_FOUND, "unknown_run", e),
        HostError::Finished(_) => fail(StatusCode::CONFLICT, "run_finished", e),
        HostError::Open { .. } => fail(StatusCode::CONFLICT, "run_unavailable", e),
    }
}

/// The agent a request speaks for; its process (`X-Retrace-Process`) must own it.
pub(crate) fn agent(
    app: &AppState,
    run: &str,
    agent: &str,
    headers: &HeaderMap,
) -> Result<Agent, Box<Response>> {
    if let Err(why) = valid_agent(agent) {
        return Err(Box::new(fail(StatusCode::BAD_REQUEST, "bad_request", format!("retrace: {why}"))));
    }
    let found = app.host.agent(run, agent).map_err(|e| Box::new(host_failure(&e)))?;
    let pid = headers.get("x-retrace-process").and_then(|v| v.to_str().ok()).map(str::parse::<u32>);
    match pid {
        None => Ok(found),
        Some(Err(_)) => Err(Box::new(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "X-Retrace-Process must be a process id",
        ))),
        Some(Ok(pid)) => match app.processes.claim(&app.host, run, agent, pid) {
            Ok(()) => Ok(found),
            Err(e) => Err(Box::new(fail(StatusCode::CONFLICT, "agent_owned", e))),
        },
    }
}

/// `POST /api/runs/{run}/agents/{agent}/steps`
pub async fn step(
    State(app): State<Arc<AppState>>,
    Path((run, agent_id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: StepBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    if let Some(id) = body.step {
        let taken = {
            let mut pending = app.pending.0.lock();
            // A step's outcome on another run's or agent's route would be stored in the step's
            // own run and answered as this one's (a finished run's step then "failed" the
            // run named in the route): it is no step of this route's.
            match pending.get(&id) {
                Some((_, _, owner)) if *owner == (run.clone(), agent_id.clone()) => pending.remove(&id),
                _ => None,
            }
        };
        let Some((tx, task, _)) = taken else {
            return fail(
                StatusCode::NOT_FOUND,
                "unknown_step",
                format!("no step {id} of agent {agent_id:?} in run {run} is waiting for its outcome"),
            );
        };
        let outcome = match (body.output, body.error) {
            (_, Some(e)) => Err(e),
            (Some(v), None) => Ok(v),
            (None, None) => Ok(Value::Null),
        };
        let _ = tx.send((outcome, body.model));
        return match task.await {
            Ok(result) => answer(result, &app, &run),
            Err(e) => fail(StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
        };
    }
    let agent = match agent(&app, &run, &agent_id, &headers) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let program_dry_run = body.tool.as_ref().is_some_and(|t| t.dry_run);
    let spec = match body.tool.map(|t| t.class.parse::<ToolClass>().map(|class| (t, class))).transpose() {
        Ok(t) => t.map(|(t, class)| ToolSpec { class, version: t.version, ttl_s: t.ttl_s, dry_run: None }),
        Err(e) => return fail(StatusCode::BAD_REQUEST, "bad_request", e),
    };
    let side_effect = spec.as_ref().is_some_and(|s| s.class == ToolClass::SideEffect);
    let kind_name = body.kind.as_deref().unwrap_or("tool_call");
    let Some(name) = body.name else {
        return fail(StatusCode::BAD_REQUEST, "bad_request", "a step needs its name");
    };
    let request = body.request.unwrap_or_else(|| json!({}));
    // A model call (the Rust runtime's `Agent::model`) runs through the runtime's own model step.
    let work = match (kind_name, &body.model) {
        ("model_call", Some(ModelBody { provider: Some(provider), endpoint: Some(endpoint), .. })) => {
            Work::Model(ModelCall { provider: provider.clone(), endpoint: endpoint.clone(), body: request })
        }
        ("model_call", _) => {
            return fail(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "a model_call step needs model: {provider, endpoint}",
            )
        }
        _ => match RemoteKind::parse(kind_name, spec) {
            Ok(kind) => Work::Step(RemoteStep {
                kind,
                name,
                request,
                program_dry_run,
                reported_latency_ms: body.latency_ms,
            }),
            Err(e) => return fail(StatusCode::BAD_REQUEST, "bad_request", e),
        },
    };
    // A side effect's intent must be stored before it runs: its outcome always comes second.
    let reported = match (body.output, body.error) {
        _ if side_effect => None,
        (_, Some(e)) => Some(Err(e)),
        (Some(v), None) => Some(Ok(v)),
        (None, None) => None,
    };
    let reported = reported.map(|r| (r, body.model));
    let (need_tx, need_rx) = oneshot::channel::<Option<Value>>();
    let (outcome_tx, outcome_rx) = oneshot::channel::<Outcome>();
    // The program's outcome: the one it posted, else asked for (with the request it must send,
    // for a model call whose request a fork's edits rewrote).
    let live = move |to_send: Option<Value>| async move {
        if let Some(outcome) = reported {
            return outcome;
        }
        let _ = need_tx.send(to_send);
        match tokio::time::timeout(OUTCOME_TIMEOUT, outcome_rx).await {
            Ok(Ok(outcome)) => outcome,
            _ => (Err("the program never reported this step's outcome".into()), None),
        }
    };
    // Outside record a side effect is never run: when asked to, it is for the program's dry run.
    let dry_run_asked = side_effect && !agent.runs_live();
    let mut task = match work {
        Work::Step(step) => {
            tokio::spawn(async move { agent.remote_step(step, || async { live(None).await.0 }).await })
        }
        Work::Model(call) => tokio::spawn(async move {
            agent
                .model_async(&call, |body| async move {
                    let (outcome, model) = live(Some(body)).await;
                    let model = model.unwrap_or_default();
                    outcome.map(|body| ModelReply { body, snapshot: model.snapshot, usage: model.usage })
                })
                .await
        }),
    };
    tokio::select! {
        result = &mut task => match result {
            Ok(result) => answer(result, &app, &run),
            Err(e) => fail(StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
        },
        needed = need_rx => match needed {
            Ok(to_send) => {
                let id = format!("{:032x}", rand_id());
                app.pending.0.lock().insert(id.clone(), (outcome_tx, task, (run.clone(), agent_id.clone())));
                let mut answer = json!({"status": "run", "step": id});
                if let Some(request) = to_send {
                    answer["request"] = request;
                }
                if dry_run_asked {
                    answer["dry_run"] = json!(true);
                }
                Json(answer).into_response()
            }
            // The step finished without asking (replay): its answer is the task's.
            Err(_) => match task.await {
                Ok(result) => answer(result, &app, &run),
                Err(e) => fail(StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
            },
        },
    }
}

fn rand_id() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let a = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let b = std::collections::hash_map::RandomState::new().build_hasher().finish();
    (u128::from(a) << 64) | u128::from(b)
}

/// The body of `send`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendBody {
    to: String,
    #[serde(default)]
    kind: Option<String>,
    body: Value,
    #[serde(default)]
    parent: Option<u64>,
}

/// `POST /api/runs/{run}/agents/{agent}/send` → `{"seq": n}`
pub async fn send(
    State(app): State<Arc<AppState>>,
    Path((run, agent_id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: SendBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let agent = match agent(&app, &run, &agent_id, &headers) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let kind = body.kind.unwrap_or_else(|| "message".into());
    match agent.send(&body.to, &kind, &body.body, body.parent).await {
        Ok(seq) => Json(json!({"seq": seq})).into_response(),
        Err(e) => runtime_failure(&e, &app, &run),
    }
}

/// The body of `recv`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecvBody {
    #[serde(default)]
    timeout_s: Option<f64>,
}

/// `POST /api/runs/{run}/agents/{agent}/recv` → `{"message": {seq, sender, kind, body, parent} | null}`
pub async fn recv(
    State(app): State<Arc<AppState>>,
    Path((run, agent_id)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let body: RecvBody = match crate::api::optional_body(&body) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let agent = match agent(&app, &run, &agent_id, &headers) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    // A timeout too long for a Duration (1e300 s) is no timeout: the wait has no end either way.
    let timeout = body.timeout_s.and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok());
    match agent.recv(timeout).await {
        Ok(Some(m)) => {
            Json(json!({"message": {"seq": m.seq, "sender": m.sender, "kind": m.kind, "body": m.body, "parent": m.parent}}))
                .into_response()
        }
        Ok(None) => Json(json!({"message": null})).into_response(),
        Err(e) => runtime_failure(&e, &app, &run),
    }
}

/// The body of `decide`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    action: String,
    #[serde(default)]
    target: Option<String>,
}

/// `POST /api/runs/{run}/agents/{agent}/decide`
pub async fn decide(
    State(app): State<Arc<AppState>>,
    Path((run, agent_id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: DecideBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let agent = match agent(&app, &run, &agent_id, &headers) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let decided =
        tokio::task::spawn_blocking(move || agent.decide(&body.action, body.target.as_deref())).await;
    match decided {
        Ok(Ok(())) => Json(json!({"status": "done"})).into_response(),
        Ok(Err(e)) => runtime_failure(&e, &app, &run),
        Err(e) => fail(StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
    }
}

/// `POST /api/runs/{run}/agents/{agent}/exit`: the agent takes no more steps (so a replay
/// waiting on it declares a stall at once).
pub async fn exit(
    State(app): State<Arc<AppState>>,
    Path((run, agent_id)): Path<(String, String)>,
    headers: HeaderMap,
    _body: axum::body::Bytes,
) -> Response {
    match agent(&app, &run, &agent_id, &headers) {
        Ok(a) => {
            a.exit();
            Json(json!({"status": "done"})).into_response()
        }
        Err(r) => *r,
    }
}

/// `POST /api/runs/{run}/agents/{agent}/claim`: ties the agent to the calling process
/// (`X-Retrace-Process`) before its first step, or answers `agent_owned` (409) when another
/// live process has it. The SDK asks before the first step whose live function runs before the
/// step is sent (a recorded tool), so a process that can't speak for the agent is told so
/// before that function has run.
pub async fn claim(
    State(app): State<Arc<AppState>>,
    Path((run, agent_id)): Path<(String, String)>,
    headers: HeaderMap,
    _body: axum::body::Bytes,
) -> Response {
    match agent(&app, &run, &agent_id, &headers) {
        Ok(_) => Json(json!({"status": "done"})).into_response(),
        Err(r) => *r,
    }
}

/// The body of `role`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleBody {
    role: String,
}

/// `POST /api/runs/{run}/agents/{agent}/role`: the role recorded on the agent's events from now
/// on. It doesn't start the agent (a replay waits for no step of it).
pub async fn role(
    State(app): State<Arc<AppState>>,
    Path((run, agent_id)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let body: RoleBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    if let Err(why) = valid_role(&body.role).and_then(|()| valid_agent(&agent_id)) {
        return fail(StatusCode::BAD_REQUEST, "bad_request", why);
    }
    match app.host.session(&run) {
        Ok(session) => {
            session.set_role(&agent_id, &body.role);
            Json(json!({"status": "done"})).into_response()
        }
        Err(e) => host_failure(&e),
    }
}

/// An agent id as every route takes it (the SDK routes' path, the proxy's header and path
/// forms): not empty, no control character, at most 256 characters (QA20 D4). An agent named
/// `""` could never be sent a message, and a newline in one breaks every listing.
pub(crate) fn valid_agent(agent: &str) -> Result<(), String> {
    retrace_core::run::agent_id_problem(agent).map_or(Ok(()), Err)
}

/// A role is 1 to 128 characters, none of them a control character.
pub(crate) fn valid_role(role: &str) -> Result<(), String> {
    match role.chars().count() {
        0 => Err("role must not be empty".into()),
        n if n > 128 => Err(format!("role is {n} characters long; at most 128")),
        _ if role.chars().any(char::is_control) => Err(format!("role {role:?} holds a control character")),
        _ => Ok(()),
    }
}
