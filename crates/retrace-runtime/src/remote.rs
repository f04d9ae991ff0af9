//! Steps that a program in another process takes (the daemon's SDK API, the Python SDK): the
//! program runs the step itself and reports its outcome, which becomes the step's live output.
//! They run through the same pipeline as the Rust runtime's own steps, so record, replay and
//! fork treat them alike, and their events look like the Rust runtime's (a clock read is
//! `clock wall` with `{"unix_ms": …}`, a random id `random id` with `{"id": …}`, an env read
//! `env NAME` with `{"value": …}`).
use std::future::Future;
use std::time::Instant;

use retrace_core::envelope::{ToolClass, ToolRef};
use retrace_core::EventType;
use serde_json::Value;

use crate::agent::{Agent, ToolSpec};
use crate::error::{RuntimeError, RuntimeResult};
use crate::step::{LiveOutput, StepInput};

/// What kind of step a remote program takes.
#[derive(Clone, Debug)]
pub enum RemoteKind {
    /// A tool call, with its spec (class, version, TTL).
    Tool(ToolSpec),
    /// A wall-clock read (`{"unix_ms": n}`).
    Clock,
    /// A random value (`name` is `id` or `u64`).
    Random,
    /// An environment variable read (`{"value": s | null}`).
    Env,
}

/// A step a remote program takes.
#[derive(Clone, Debug)]
pub struct RemoteStep {
    /// Its kind.
    pub kind: RemoteKind,
    /// Tool name, `wall`, `id` / `u64`, or the variable's name.
    pub name: String,
    /// The request: tool arguments; `{}` for clock and random; `{"name": …}` for env.
    pub request: Value,
    /// A side effect the program can dry-run itself: where a fork would not run it, `outcome`
    /// is asked for the program's dry run instead, and what it reports is recorded.
    pub program_dry_run: bool,
    /// How long the program's function ran, when it ran before the step was reported: the
    /// step's latency (else the time `outcome` takes; QA25 D3: a tool the Python SDK ran first
    /// was recorded as 0 ms).
    pub reported_latency_ms: Option<u64>,
}

impl Agent {
    /// Runs a remote program's step. `outcome` is what the program reports it got when it ran
    /// the step: it runs only when the step runs live (record; a changed or new step of a
    /// fork), never in replay, and never for a side effect outside record.
    pub async fn remote_step<F, Fut>(&self, step: RemoteStep, outcome: F) -> RuntimeResult<Value>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Value, String>>,
    {
        if self.remote().is_some() {
            return Err(RuntimeError::Usage(
                "remote_step is the daemon's; this session's steps go to a daemon already".into(),
            ));
        }
        let (kind, spec) = match &step.kind {
            RemoteKind::Tool(spec) => (EventType::ToolCall, Some(spec)),
            RemoteKind::Clock => (EventType::Clock, None),
            RemoteKind::Random => (EventType::Random, None),
            RemoteKind::Env => (EventType::Env, None),
        };
        let mut template = self.event(kind, Some(&step.name));
        let mut input = match spec {
            Some(spec) => {
                template.tool = Some(ToolRef {
                    name: template.name.clone().unwrap_or_default(),
                    version: spec.version.clone(),
                    class: spec.class,
                    ttl_s: spec.ttl_s,
                });
                let input = StepInput::new(template, step.request).versioned(&spec.version);
                if spec.class == ToolClass::SideEffect {
                    input.with_intent()
                } else {
                    input
                }
            }
            None => StepInput::new(template, step.request),
        };
        input.dry_run = spec.and_then(|s| s.dry_run.clone());
        input.program_dry_run = step.program_dry_run;
        let reported = step.reported_latency_ms;
        self.run_step_async(input, || async {
            let started = Instant::now();
            let result = outcome().await;
            let latency = reported.unwrap_or(started.elapsed().as_millis() as u64);
            Ok(match result {
                Ok(value) => LiveOutput::value(value).latency(latency),
                Err(e) => LiveOutput::error(e).latency(latency),
            })
        })
        .await
    }

    /// Whether a remote program must run this agent's steps itself before reporting them:
    /// true in record (and off), where every step is live.
    pub fn runs_live(&self) -> bool {
        matches!(self.session.mode(), crate::Mode::Record | crate::Mode::Off)
    }
}

impl RemoteKind {
    /// Parses the wire name of a step type (`tool_call`, `clock`, `random`, `env`).
    pub fn parse(kind: &str, tool: Option<ToolSpec>) -> Result<RemoteKind, RuntimeError> {
        match (kind, tool) {
            ("tool_call" | "tool", Some(spec)) => Ok(RemoteKind::Tool(spec)),
            ("tool_call" | "tool", None) => {
                Err(RuntimeError::Usage("a tool_call step needs its tool: {version, class, ttl_s}".into()))
            }
            ("clock", _) => Ok(RemoteKind::Clock),
            ("random", _) => Ok(RemoteKind::Random),
            ("env", _) => Ok(RemoteKind::Env),
            (other, _) => Err(RuntimeError::Usage(format!(
                "unknown step type {other:?}: want tool_call, clock, random or env \
                 (messages and decisions have their own routes)"
            ))),
        }
    }
}
