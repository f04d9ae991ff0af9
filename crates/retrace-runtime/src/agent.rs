//! An agent's handle: the steps of SPEC §6 (`tool`, `model`, `now`, `random`, `env`, `decide`).
//! Every step goes through `step.rs`, the one pipeline record and replay share.
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use retrace_core::canonical::canonical_value;
use retrace_core::envelope::{Decision, ModelRef, ToolClass, ToolRef, Usage};
use retrace_core::mask::Masker;
use retrace_core::run::FinalDecision;
use retrace_core::{Event, EventType};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use crate::error::{RuntimeError, RuntimeResult};
use crate::panic;
use crate::remote_session::outcome;
use crate::session::{AgentState, Mode, Session};
use crate::step::{LiveOutput, StepInput};

/// What a side effect's dry run returns, given the call's arguments.
pub type DryRunFn = Arc<dyn Fn(&Value) -> Value + Send + Sync>;

/// How a tool behaves under replay and fork.
#[derive(Clone)]
pub struct ToolSpec {
    /// Determinism class.
    pub class: ToolClass,
    /// Tool version; part of the key.
    pub version: String,
    /// Cache lifetime for `time_bound` tools.
    pub ttl_s: Option<u64>,
    /// For a `side_effect` tool: what a fork hands the program instead of running it.
    pub dry_run: Option<DryRunFn>,
}

impl std::fmt::Debug for ToolSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSpec")
            .field("class", &self.class)
            .field("version", &self.version)
            .field("ttl_s", &self.ttl_s)
            .field("dry_run", &self.dry_run.is_some())
            .finish()
    }
}

impl ToolSpec {
    /// A deterministic tool of `version`.
    pub fn deterministic(version: &str) -> ToolSpec {
        ToolSpec { class: ToolClass::Deterministic, version: version.into(), ttl_s: None, dry_run: None }
    }
    /// A time-bound tool of `version`, cached for `ttl_s` seconds.
    pub fn time_bound(version: &str, ttl_s: u64) -> ToolSpec {
        ToolSpec { class: ToolClass::TimeBound, version: version.into(), ttl_s: Some(ttl_s), dry_run: None }
    }
    /// A side-effecting tool of `version`: never executed by replay or fork.
    pub fn side_effect(version: &str) -> ToolSpec {
        ToolSpec { class: ToolClass::SideEffect, version: version.into(), ttl_s: None, dry_run: None }
    }
    /// What a fork returns instead of running this side effect (without one, a fork raises
    /// [`RuntimeError::DryRun`]).
    pub fn with_dry_run(mut self, f: impl Fn(&Value) -> Value + Send + Sync + 'static) -> ToolSpec {
        self.dry_run = Some(Arc::new(f));
        self
    }
}

/// A model request: provider, endpoint and the request body.
#[derive(Clone, Debug)]
pub struct ModelCall {
    /// `openai`, `anthropic`, or any name.
    pub provider: String,
    /// `chat.completions`, `messages`, ...
    pub endpoint: String,
    /// The request body; its `model` field names the model.
    pub body: Value,
}

/// What a live model call returns.
#[derive(Clone, Debug)]
pub struct ModelReply {
    /// The response body.
    pub body: Value,
    /// The pinned snapshot the provider reported (its response's `model`), if any.
    pub snapshot: Option<String>,
    /// Tokens and cost.
    pub usage: Option<Usage>,
}

impl ModelCall {
    /// A call of `endpoint` of `provider` with `body`.
    pub fn new(provider: &str, endpoint: &str, body: Value) -> ModelCall {
        ModelCall { provider: provider.to_owned(), endpoint: endpoint.to_owned(), body }
    }

    /// An OpenAI Chat Completions call (`openai`, `chat.completions`) with `body`.
    pub fn openai_chat(body: Value) -> ModelCall {
        ModelCall::new("openai", "chat.completions", body)
    }

    /// An Anthropic Messages call (`anthropic`, `messages`) with `body`.
    pub fn anthropic_messages(body: Value) -> ModelCall {
        ModelCall::new("anthropic", "messages", body)
    }
}

impl ModelReply {
    /// A reply of `body` with no snapshot and no usage; see [`ModelReply::snapshot`] and
    /// [`ModelReply::usage`].
    pub fn new(body: Value) -> ModelReply {
        ModelReply { body, snapshot: None, usage: None }
    }

    /// The pinned snapshot the provider reported (its response's `model`).
    pub fn snapshot(mut self, snapshot: impl Into<String>) -> ModelReply {
        self.snapshot = Some(snapshot.into());
        self
    }

    /// Tokens and cost.
    pub fn usage(mut self, usage: Usage) -> ModelReply {
        self.usage = Some(usage);
        self
    }
}

/// Request fields copied into an event's `params`.
pub(crate) const PARAM_FIELDS: &[&str] = &[
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "seed",
    "top_k",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "n",
];

/// One agent of a session. Cheap to clone; steps from several threads are fine.
#[derive(Clone, Debug)]
pub struct Agent {
    pub(crate) session: Session,
    pub(crate) id: String,
    pub(crate) state: Arc<Mutex<AgentState>>,
}

impl Agent {
    pub(crate) fn new(session: Session, id: String, state: Arc<Mutex<AgentState>>) -> Agent {
        Agent { session, id, state }
    }

    /// The agent's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Sets the agent's role (recorded on each of its events). Under `RETRACE_URL` the daemon
    /// records the events, so it is told too; if it can't be, the agent's next step reports why.
    pub fn with_role(self, role: &str) -> Agent {
        self.state.lock().role = Some(role.to_owned());
        if let Some(remote) = self.remote() {
            let _ = remote.post_blocking(&self.id, "role", &json!({ "role": role }));
        }
        self
    }

    pub(crate) fn event(&self, kind: EventType, name: Option<&str>) -> Event {
        let mut e = Event::new(self.session.run_id(), self.id.clone(), kind);
        e.name = name.map(|n| self.masked_name(n));
        e.role = self.state.lock().role.clone();
        e
    }

    /// A name as it is persisted and keyed (a step's, a model's): masked like any input, in
    /// record and replay alike (QA27 D1: an env var named after a key, a tool named after a
    /// customer's email were stored in clear while the request blob masked them).
    pub(crate) fn masked_name(&self, name: &str) -> String {
        let inner = &self.session.inner;
        let (masked, tokens) = inner.masker.mask_text(name);
        if tokens > 0 {
            inner.holds_tokens.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        masked.into_owned()
    }

    /// Calls a tool. Record: runs `live`, records its output (or error) and returns the decoded
    /// canonical form of what it returned. Replay: returns the recorded output; `live` never runs.
    /// A `side_effect` tool's intent is acknowledged before `live` runs.
    pub fn tool<A, T, E, F>(&self, name: &str, args: &A, spec: ToolSpec, live: F) -> RuntimeResult<T>
    where
        A: Serialize + ?Sized,
        T: Serialize + DeserializeOwned + 'static,
        E: std::fmt::Display,
        F: FnOnce() -> Result<T, E>,
    {
        self.block_on(self.tool_async(name, args, spec, move || std::future::ready(live())))
    }

    /// [`Agent::tool`] with an async live function.
    pub async fn tool_async<A, T, E, F, Fut>(
        &self,
        name: &str,
        args: &A,
        spec: ToolSpec,
        live: F,
    ) -> RuntimeResult<T>
    where
        A: Serialize + ?Sized,
        T: Serialize + DeserializeOwned + 'static,
        E: std::fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.named(name, "tool", "the tool's name")?;
        self.named(&spec.version, "tool", "the tool's version")?;
        let label = format!("tool_call {name}");
        let args = to_json(args, &self.id, &label)?;
        // A panic in the function is recorded as the step's failure, then goes on as it would
        // have (a program that catches it, with a task's JoinHandle, say, takes the path it
        // took); replay panics again with its message (see `panicked`).
        let panicked = panic::Caught::default();
        if let Some(remote) = self.remote() {
            let body = json!({
                "type": "tool_call",
                "name": name,
                "request": args,
                "tool": {"version": spec.version, "class": spec.class.as_str(), "ttl_s": spec.ttl_s},
            });
            let out = remote
                .step(self, object(body), spec.dry_run.as_ref(), |_| async {
                    let result = panicked.catch(live()).await;
                    outcome(match result {
                        Ok(Ok(value)) => into_json(value, &self.id, &label).map_err(|e| e.to_string()),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(message) => Err(message),
                    })
                })
                .await;
            return self.decode(name, panicked.resume(out)?);
        }
        let mut template = self.event(EventType::ToolCall, Some(name));
        template.tool = Some(ToolRef {
            name: template.name.clone().unwrap_or_default(),
            version: spec.version.clone(),
            class: spec.class,
            ttl_s: spec.ttl_s,
        });
        let input = StepInput::new(template, args).versioned(&spec.version);
        let mut input = if spec.class == ToolClass::SideEffect { input.with_intent() } else { input };
        input.dry_run = spec.dry_run.clone();
        let out = self
            .run_step_async(input, || async {
                let started = Instant::now();
                let result = panicked.catch(live()).await;
                let latency = started.elapsed().as_millis() as u64;
                match result {
                    // An output JSON can't hold is the step's failure, recorded (the function has
                    // run): replay fails the same way.
                    Ok(Ok(value)) => match into_json(value, &self.id, &label) {
                        Ok(json) => Ok(LiveOutput::value(json).latency(latency)),
                        Err(refused) => Ok(LiveOutput::error(refused.to_string()).latency(latency)),
                    },
                    Ok(Err(e)) => Ok(LiveOutput::error(e.to_string()).latency(latency)),
                    Err(message) => Ok(LiveOutput::error(message).latency(latency)),
                }
            })
            .await;
        self.decode(name, panicked.resume(out)?)
    }

    /// Calls a model. Record: runs `live` with the request body to send (a fork's `model:` and
    /// `param:` edits already applied); replay: returns the recorded response body.
    pub fn model<E, F>(&self, call: &ModelCall, live: F) -> RuntimeResult<Value>
    where
        E: std::fmt::Display,
        F: FnOnce(Value) -> Result<ModelReply, E>,
    {
        self.block_on(self.model_async(call, move |body| std::future::ready(live(body))))
    }

    /// [`Agent::model`] with an async live function (an HTTP call, say).
    pub async fn model_async<E, F, Fut>(&self, call: &ModelCall, live: F) -> RuntimeResult<Value>
    where
        E: std::fmt::Display,
        F: FnOnce(Value) -> Fut,
        Fut: Future<Output = Result<ModelReply, E>>,
    {
        let name = format!("{}/{}", call.provider, call.endpoint);
        if let Some(remote) = self.remote() {
            // The daemon runs it through this same function: same event, same key.
            // `model` names the call; the completed step's `model` adds snapshot and usage.
            let model = json!({"provider": call.provider, "endpoint": call.endpoint});
            let body = json!({"type": "model_call", "name": name, "request": call.body, "model": model});
            let out = remote
                .step(self, object(body), None, |edited| async {
                    let result = live(edited.unwrap_or_else(|| call.body.clone())).await;
                    match result {
                        Ok(reply) => {
                            let mut fields = outcome(Ok(reply.body));
                            let usage = reply.usage.map(|u| serde_json::to_value(u).unwrap_or_default());
                            let model = json!({
                                "provider": call.provider,
                                "endpoint": call.endpoint,
                                "snapshot": reply.snapshot,
                                "usage": usage,
                            });
                            fields.insert("model".into(), model);
                            fields
                        }
                        Err(e) => outcome(Err(e.to_string())),
                    }
                })
                .await?;
            return self.decode(&name, out);
        }
        let mut template = self.event(EventType::ModelCall, Some(&name));
        let call = &self.apply_model_edits(call);
        let model_name = call.body.get("model").and_then(Value::as_str).unwrap_or_default();
        template.model = Some(ModelRef {
            provider: call.provider.clone(),
            name: self.masked_name(model_name),
            snapshot: None,
        });
        let params: BTreeMap<String, Value> = PARAM_FIELDS
            .iter()
            .filter_map(|f| call.body.get(*f).map(|v| ((*f).to_owned(), v.clone())))
            .collect();
        template.params = (!params.is_empty()).then_some(params);
        template.prompt_template = self.state.lock().prompt.clone();
        let input = StepInput::new(template, call.body.clone()).model_request();
        let body = call.body.clone();
        let out = self
            .run_step_async(input, || async {
                let started = Instant::now();
                let result = live(body).await;
                let latency = started.elapsed().as_millis() as u64;
                match result {
                    Ok(reply) => Ok(LiveOutput::value(reply.body)
                        .latency(latency)
                        .snapshot(reply.snapshot)
                        .usage(reply.usage)),
                    Err(e) => Ok(LiveOutput::error(e.to_string()).latency(latency)),
                }
            })
            .await?;
        self.decode(&name, out)
    }

    /// The wall clock, in Unix milliseconds: live in record, recorded in replay.
    pub fn now_ms(&self) -> RuntimeResult<u64> {
        let clock = self.session.inner.clock.clone();
        let out = self.read(EventType::Clock, "wall", json!({}), || json!({ "unix_ms": clock.now_ms() }))?;
        field(&out, "unix_ms", "clock")
            .and_then(|v| v.as_u64().ok_or_else(|| self.bad_output("clock", "unix_ms is not an integer")))
    }

    /// A random 64-bit number: live in record, recorded in replay.
    pub fn random_u64(&self) -> RuntimeResult<u64> {
        let out =
            self.read(EventType::Random, "u64", json!({}), || json!({ "u64": rand::random::<u64>() }))?;
        field(&out, "u64", "random")
            .and_then(|v| v.as_u64().ok_or_else(|| self.bad_output("random", "not a u64")))
    }

    /// A random id (32 hex digits): live in record, recorded in replay.
    pub fn random_id(&self) -> RuntimeResult<String> {
        let out = self.read(
            EventType::Random,
            "id",
            json!({}),
            || json!({ "id": format!("{:032x}", rand::random::<u128>()) }),
        )?;
        field(&out, "id", "random").and_then(|v| {
            v.as_str().map(str::to_owned).ok_or_else(|| self.bad_output("random", "not a string"))
        })
    }

    /// Refuses an empty `name` for step `step` (what it names: `what`) before anything is
    /// recorded: a step named by nothing says nothing in the log, and a message sent to no
    /// agent could never be received.
    pub(crate) fn named(&self, name: &str, step: &str, what: &str) -> RuntimeResult<()> {
        match name.is_empty() {
            true => Err(RuntimeError::Usage(format!("agent {:?}: {step}: {what} is empty", self.id))),
            false => Ok(()),
        }
    }

    /// An environment variable: live in record (masked before it is stored), recorded in replay.
    pub fn env(&self, name: &str) -> RuntimeResult<Option<String>> {
        self.named(name, "env", "an environment variable's name")?;
        let out = self.read(
            EventType::Env,
            name,
            json!({ "name": name }),
            || json!({ "value": std::env::var(name).ok() }),
        )?;
        let v = field(&out, "value", "env")?;
        Ok(v.as_str().map(str::to_owned))
    }

    /// A read of the world (clock, random, env) that replay answers from the log: in process
    /// through the pipeline, or as a step of the daemon's run.
    fn read(
        &self,
        kind: EventType,
        name: &str,
        request: Value,
        live: impl FnOnce() -> Value,
    ) -> RuntimeResult<Value> {
        match self.remote() {
            Some(remote) => {
                let body = json!({ "type": kind.to_string(), "name": name, "request": request });
                self.block_on(remote.step(self, object(body), None, |_| async { outcome(Ok(live())) }))
            }
            None => {
                let input = StepInput::new(self.event(kind, Some(name)), request);
                self.run_step(input, || Ok(LiveOutput::value(live())))
            }
        }
    }

    /// Records a decision; in replay a different decision is a divergence.
    pub fn decide(&self, action: &str, target: Option<&str>) -> RuntimeResult<()> {
        self.named(action, "decide", "a decision's action")?;
        if let Some(remote) = self.remote() {
            let body = json!({ "action": action, "target": target });
            return remote.post_blocking(&self.id, "decide", &body).map(drop);
        }
        let request = json!({ "action": action, "target": target });
        // The event and the run's final decisions hold the decision as its request is stored:
        // masked (a target may name a person, or hold a key). Replay masks its own the same way.
        let (action, target) = masked_decision(&self.session.inner.masker, &request)?;
        let mut template = self.event(EventType::Decision, None);
        template.decision = Some(Decision { action: action.clone(), target: target.clone() });
        let input = StepInput::new(template, request).no_output();
        self.run_step(input, || Ok(LiveOutput::none()))?;
        self.session.inner.decisions.lock().push(FinalDecision { agent: self.id.clone(), action, target });
        Ok(())
    }

    fn decode<T: DeserializeOwned + 'static>(&self, step: &str, value: Value) -> RuntimeResult<T> {
        // A program that asks for a `Value` gets the decoded one itself, not a copy rebuilt node
        // by node through serde.
        let mut slot = Some(value);
        if let Some(same) = (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<T>>() {
            return Ok(same.take().expect("set just above"));
        }
        let value = slot.expect("taken only when T is Value");
        serde_json::from_value(value).map_err(|e| RuntimeError::Decode {
            agent: self.id.clone(),
            step: step.to_owned(),
            message: e.to_string(),
        })
    }

    fn bad_output(&self, step: &str, message: &str) -> RuntimeError {
        RuntimeError::Decode { agent: self.id.clone(), step: step.into(), message: message.into() }
    }

    /// A fork's `model:` and `param:` edits rewrite this agent's requests once it has consumed
    /// every source step before the fork point (in the fork and in replays of it), those the
    /// edit fits ([`crate::fork::model_edit_applies`]).
    /// Borrows `call` when none applies: a request body (a whole conversation) is copied only to
    /// be changed.
    pub(crate) fn apply_model_edits<'a>(&self, call: &'a ModelCall) -> Cow<'a, ModelCall> {
        let inner = &self.session.inner;
        let (Some(plan), Some(scheduler)) = (&inner.plan, &inner.scheduler) else {
            return Cow::Borrowed(call);
        };
        // Each edit applies once the agent is past its fork point: this fork's, or for an edit
        // inherited from the source fork, the source's.
        let past = |target: String| scheduler.past(&self.id, plan.applies_from(&target));
        let model = plan
            .models
            .get(&self.id)
            .filter(|(name, _)| crate::fork::model_edit_applies(name, &call.provider, &call.endpoint))
            .filter(|_| past(crate::fork::model_target(&self.id)));
        let params: Vec<(&String, &Value)> = match crate::fork::param_edit_applies(&call.endpoint) {
            true => plan
                .params
                .get(&self.id)
                .into_iter()
                .flatten()
                .filter(|(name, _)| past(crate::fork::param_target(&self.id, name)))
                .collect(),
            false => Vec::new(),
        };
        if model.is_none() && params.is_empty() {
            return Cow::Borrowed(call);
        }
        let mut call = call.clone();
        if let (Some((name, snapshot)), Some(body)) = (model, call.body.as_object_mut()) {
            body.insert("model".into(), Value::String(snapshot.clone().unwrap_or_else(|| name.clone())));
        }
        if let Some(body) = call.body.as_object_mut() {
            for (k, v) in params {
                body.insert(k.clone(), v.clone());
            }
        }
        Cow::Owned(call)
    }

    /// Declares that this agent takes no more steps (replay can then tell a stall at once).
    pub fn exit(&self) {
        match (&self.session.inner.remote, &self.session.inner.scheduler) {
            (Some(remote), _) => remote.exit(&self.id),
            (None, Some(s)) => s.agent_exited(&self.id),
            (None, None) => {}
        }
    }

    /// The daemon's run this agent's steps go to, when the session is remote.
    pub(crate) fn remote(&self) -> Option<&Arc<crate::remote_session::RemoteRun>> {
        self.session.inner.remote.as_ref()
    }

    /// True unless the session replays: in record and off every step runs live, in a fork the
    /// changed and new ones do (the others are answered from the source).
    pub fn is_live(&self) -> bool {
        self.session.mode() != Mode::Replay
    }
}

/// A `json!` object literal as its map.
fn object(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

fn field(out: &Value, name: &str, step: &str) -> RuntimeResult<Value> {
    out.get(name).cloned().ok_or_else(|| RuntimeError::Decode {
        agent: String::new(),
        step: step.into(),
        message: format!("recorded output has no {name:?} field"),
    })
}

/// Serializes a program value (tool arguments and outputs, message bodies), refusing NaN and
/// infinities, naming the step: serde_json would turn them into null.
pub(crate) fn to_json<T: Serialize + ?Sized>(value: &T, agent: &str, step: &str) -> RuntimeResult<Value> {
    let json = serde_json::to_value(value).map_err(|e| {
        let at = crate::finite::failing_path(value).map(|path| format!(" at {path}")).unwrap_or_default();
        RuntimeError::Usage(format!(
            "step {step} of agent {agent:?}: the value{at} does not serialize to JSON ({e}); refusing to record it"
        ))
    })?;
    // serde_json turns NaN and infinities into null: only a value holding a null can hide one,
    // so only then is it probed again, float by float.
    if holds_null(&json) {
        if let Err(path) = crate::finite::check_finite(value) {
            return Err(RuntimeError::Usage(format!(
                "step {step} of agent {agent:?}: the value at {path} is NaN or infinite, which JSON can't hold; refusing to record it"
            )));
        }
    }
    Ok(json)
}

/// [`to_json`] of an owned value: a `Value` is taken as it is (it can't hold NaN or infinities).
fn into_json<T: Serialize + 'static>(value: T, agent: &str, step: &str) -> RuntimeResult<Value> {
    let mut slot = Some(value);
    if let Some(json) = (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<Value>>() {
        return Ok(json.take().expect("set just above"));
    }
    to_json(&slot.expect("taken only when T is Value"), agent, step)
}

fn holds_null(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(items) => items.iter().any(holds_null),
        Value::Object(fields) => fields.values().any(holds_null),
        _ => false,
    }
}

/// The action and target of a decision's `request` (`{"action", "target"}`) as the masking
/// stage stores them.
fn masked_decision(masker: &Masker, request: &Value) -> RuntimeResult<(String, Option<String>)> {
    let field = |v: &Value, name: &str| v.get(name).and_then(Value::as_str).map(str::to_owned);
    let masked = if masker.would_mask_value(request) {
        let canonical =
            canonical_value(request).map_err(|e| RuntimeError::Usage(format!("decision: {e}")))?;
        let masked = masker.mask_json(&canonical);
        serde_json::from_slice(&masked.bytes).expect("masking keeps JSON valid")
    } else {
        request.clone()
    };
    Ok((field(&masked, "action").unwrap_or_default(), field(&masked, "target")))
}
