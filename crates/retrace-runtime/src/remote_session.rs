//! The session's remote backend: with `RETRACE_URL` set, a [`Session`] is a client of the
//! daemon's scheduler, like the Python SDK, over the same routes (`/api/runs/{run}/agents/{agent}/
//! steps`, `send`, `recv`, `decide`, `template`, `exit`, `/api/runs/{run}/finish`). The daemon
//! runs every step through the runtime's one pipeline for that run, so a run launched with an
//! embedded daemon has exactly one sequencer, and the program's own function runs only when
//! the daemon says it must: in record (before the step is posted, or after the intent of a
//! side effect is stored: the daemon answers `{"status": "run", "step": ID}`), and for a
//! changed or new step of a fork; never in replay.
//!
//! A model call ([`Agent::model`]) is posted as a `model_call` step with its provider and
//! endpoint, which the daemon runs through [`Agent::model_async`] itself: the event and its key
//! are exactly those of a model call the runtime records in process, and a fork's `model:` and
//! `param:` edits come back as the request the program's function must send.
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use retrace_core::run::{RunMeta, RunMode, RunStatus};
use retrace_core::Divergence;
use serde_json::{json, Map, Value};

use crate::agent::{Agent, DryRunFn};
use crate::error::{Refusal, RuntimeError, RuntimeResult};
use crate::remote_client::Client;
use crate::session::{Mode, Outcome, RunReport, Session, SessionOptions};

/// Which of a daemon's runs a [`Session::connect`] session takes its steps in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DaemonRun {
    /// A new run to record into, created on the daemon; [`Session::finish`] ends it.
    New,
    /// A run a launcher (`retrace record|replay|fork -- CMD`) created: its mode is the run's,
    /// and the launcher ends it with the program's exit status; [`Session::finish`] leaves it
    /// `running` ([`RunReport::status`]).
    Join(String),
    /// A new replay of this recorded run (joined when it names a replay run already);
    /// [`Session::finish`] ends a replay it created.
    Replay(String),
    /// The fork run `retrace fork` made, executed as [`DaemonRun::Join`] does; any other run is
    /// refused (`RETRACE_MODE=fork` naming a recording would record into it live).
    Fork(String),
}

/// A session's run on a daemon.
#[derive(Debug)]
pub(crate) struct RemoteRun {
    client: Arc<Client>,
    run: String,
    /// This session created the run, so `finish` ends it.
    owned: bool,
    agents: Mutex<BTreeSet<String>>,
    divergence: Mutex<Option<Divergence>>,
}

impl Session {
    /// A session whose agents take every step through the daemon at `url` (`http://HOST:PORT`),
    /// presenting `RETRACE_TOKEN` when set. [`Session::from_env`] opens one when `RETRACE_URL`
    /// is set. `options` give a new run its name and labels, and the clock `now_ms` reads in
    /// record; the daemon holds everything else (store, masking, scheduling, the run's lease).
    pub fn connect(url: &str, run: DaemonRun, options: SessionOptions) -> RuntimeResult<Session> {
        let token = std::env::var("RETRACE_TOKEN").ok().filter(|t| !t.is_empty());
        let client = Arc::new(Client::new(url, token)?);
        let fork = matches!(run, DaemonRun::Fork(_));
        let (id, owned) = match run {
            DaemonRun::New => {
                let body = json!({ "name": options.name, "labels": options.labels });
                (str_field(&client, &client.post("/api/runs", &body)?, "run_id")?, true)
            }
            DaemonRun::Join(id) | DaemonRun::Fork(id) => (id, false),
            DaemonRun::Replay(id) => {
                let found = client.get(&format!("/api/runs/{}", quote(&id)))?;
                if found.get("mode").and_then(Value::as_str) == Some("replay") {
                    (str_field(&client, &found, "run_id")?, false)
                } else {
                    let made = client.post(&format!("/api/runs/{}/replay", quote(&id)), &json!({}))?;
                    (str_field(&client, &made, "run_id")?, true)
                }
            }
        };
        let found = client.get(&format!("/api/runs/{}", quote(&id)))?;
        let mode: RunMode = serde_json::from_value(found.get("mode").cloned().unwrap_or_default())
            .map_err(|e| client.error("protocol", format!("run {id} has no mode the runtime knows: {e}")))?;
        let id = str_field(&client, &found, "run_id")?;
        if fork && mode != RunMode::Fork {
            let status = found.get("status").and_then(Value::as_str).unwrap_or("?");
            return Err(RuntimeError::Usage(format!(
                "run {id} is a {} run with status {status}, not a fork: RETRACE_MODE=fork executes the fork \
                 run that `retrace fork` makes; fork this run with `retrace fork {id} -- ...`",
                mode.as_str()
            )));
        }
        let mut meta = RunMeta::new(id.clone(), mode, options.clock.now_ms());
        meta.source_run = found.get("source_run").and_then(Value::as_str).map(str::to_owned);
        meta.name = found.get("name").and_then(Value::as_str).map(str::to_owned);
        let mode = match mode {
            RunMode::Record => Mode::Record,
            RunMode::Replay => Mode::Replay,
            RunMode::Fork => Mode::Fork,
        };
        let remote =
            RemoteRun { client, run: id, owned, agents: Mutex::default(), divergence: Mutex::default() };
        Ok(Session::remote(mode, meta, Arc::new(remote), options))
    }

    pub(crate) fn finish_remote(&self, remote: &RemoteRun, outcome: Outcome) -> RuntimeResult<RunReport> {
        let agents: Vec<String> = remote.agents.lock().iter().cloned().collect();
        for agent in agents {
            remote.exit(&agent);
        }
        let run = if remote.owned {
            let body = json!({ "exit_status": outcome.exit_status });
            remote.client.post(&format!("/api/runs/{}/finish", quote(&remote.run)), &body)?
        } else {
            remote.client.get(&format!("/api/runs/{}", quote(&remote.run)))?
        };
        if let Some(report) = run.get("divergence").filter(|d| !d.is_null()) {
            let d: Divergence = serde_json::from_value(report.clone()).map_err(|e| {
                remote.client.error("protocol", format!("a divergence that does not decode: {e}"))
            })?;
            return Err(d.into());
        }
        if let Some(error) = run.get("error").and_then(Value::as_str) {
            return Err(remote.client.error("finish", error));
        }
        let status: RunStatus = serde_json::from_value(run.get("status").cloned().unwrap_or_default())
            .map_err(|e| {
                remote.client.error("protocol", format!("a run status the runtime doesn't know: {e}"))
            })?;
        Ok(RunReport {
            run_id: remote.run.clone(),
            source_run: self.source_run(),
            status,
            steps: self.inner.steps.load(Ordering::Relaxed),
            live_calls: self.live_calls(),
        })
    }
}

impl RemoteRun {
    /// Notes that the program uses `agent` (so `finish` says it exited).
    pub(crate) fn agent_started(&self, agent: &str) {
        self.agents.lock().insert(agent.to_owned());
    }

    /// The first divergence the daemon reported to this session.
    pub(crate) fn divergence(&self) -> Option<Divergence> {
        self.divergence.lock().clone()
    }

    fn route(&self, agent: &str, route: &str) -> String {
        format!("/api/runs/{}/agents/{}/{route}", quote(&self.run), quote(agent))
    }

    fn noted(&self, result: RuntimeResult<Value>) -> RuntimeResult<Value> {
        if let Err(RuntimeError::Divergence(d)) = &result {
            self.divergence.lock().get_or_insert_with(|| (**d).clone());
        }
        result
    }

    /// `POST` to one of `agent`'s routes, from async code.
    pub(crate) async fn post(&self, agent: &str, route: &str, body: Value) -> RuntimeResult<Value> {
        self.noted(self.client.post_async(&self.route(agent, route), body).await)
    }

    /// `POST` to one of `agent`'s routes, blocking.
    pub(crate) fn post_blocking(&self, agent: &str, route: &str, body: &Value) -> RuntimeResult<Value> {
        self.noted(self.client.post(&self.route(agent, route), body))
    }

    /// Says `agent` takes no more steps; a daemon that can't be told is past caring.
    pub(crate) fn exit(&self, agent: &str) {
        let _ = self.client.post(&self.route(agent, "exit"), &json!({}));
    }

    /// The session was dropped without [`Session::finish`] (a panic, an early return): a run it
    /// created is stored `interrupted`, as an in-process session's is; one it joined is its
    /// launcher's to end.
    pub(crate) fn abandon(&self) {
        if !self.owned {
            return;
        }
        let agents: Vec<String> = self.agents.lock().iter().cloned().collect();
        for agent in agents {
            self.exit(&agent);
        }
        let body = json!({ "interrupted": true });
        let _ = self.client.post(&format!("/api/runs/{}/finish", quote(&self.run)), &body);
    }

    /// One step, as the Python SDK's `_step_flow` takes it: in record (except a side effect) the
    /// program's function runs first and the completed step is posted; otherwise the request is
    /// posted, and the function runs only when the daemon answers `run` (with the request to
    /// send, for a model call of a fork). `live` gives the fields its outcome adds to the body
    /// (`output` or `error`, and a model call's `model`). Returns the step's value.
    pub(crate) async fn step<F, Fut>(
        &self,
        agent: &Agent,
        mut body: Map<String, Value>,
        dry_run: Option<&DryRunFn>,
        live: F,
    ) -> RuntimeResult<Value>
    where
        F: FnOnce(Option<Value>) -> Fut,
        Fut: Future<Output = Map<String, Value>>,
    {
        let inner = &agent.session.inner;
        inner.steps.fetch_add(1, Ordering::Relaxed);
        let side_effect =
            body.get("tool").and_then(|t| t.get("class")).and_then(Value::as_str) == Some("side_effect");
        let label = format!(
            "{} {}",
            body.get("type").and_then(Value::as_str).unwrap_or_default(),
            body.get("name").and_then(Value::as_str).unwrap_or_default()
        );
        let args = body.get("request").cloned().unwrap_or(Value::Null);
        if let (true, Some(_), Some(Value::Object(tool))) = (side_effect, dry_run, body.get_mut("tool")) {
            // A fork then asks for the dry run and records its value as the step's output.
            tool.insert("dry_run".into(), Value::Bool(true));
        }
        let mut live = Some(live);
        if inner.mode == Mode::Record && !side_effect {
            if let Some(live) = live.take() {
                inner.live_calls.fetch_add(1, Ordering::Relaxed);
                body.extend(live(None).await);
            }
        }
        let mut answer = self.post(&agent.id, "steps", Value::Object(body)).await?;
        if answer.get("status").and_then(Value::as_str) == Some("run") {
            let live =
                live.take().ok_or_else(|| self.client.error("protocol", "asked to run a step twice"))?;
            let mut done = Map::new();
            done.insert("step".into(), answer.get("step").cloned().unwrap_or_default());
            match dry_run.filter(|_| answer.get("dry_run") == Some(&Value::Bool(true))) {
                // A fork's side effect: never run; its dry run is what the fork records.
                Some(f) => drop(done.insert("output".into(), f(&args))),
                None => {
                    inner.live_calls.fetch_add(1, Ordering::Relaxed);
                    done.extend(live(answer.get("request").cloned()).await);
                }
            }
            answer = self.post(&agent.id, "steps", Value::Object(done)).await?;
        }
        self.result(&agent.id, &label, answer, args, dry_run)
    }

    /// What the program gets for a step's answer (the Python SDK's `_result`).
    fn result(
        &self,
        agent: &str,
        label: &str,
        answer: Value,
        args: Value,
        dry_run: Option<&DryRunFn>,
    ) -> RuntimeResult<Value> {
        let text = |field: &str| answer.get(field).and_then(Value::as_str).unwrap_or_default().to_owned();
        let tool = label.split_once(' ').map(|(_, name)| name).unwrap_or(label).to_owned();
        match answer.get("status").and_then(Value::as_str) {
            Some("done") => Ok(answer.get("output").cloned().unwrap_or(Value::Null)),
            Some("error") => Err(RuntimeError::StepFailed {
                agent: agent.into(),
                step: label.into(),
                message: text("error"),
            }),
            Some("dry_run") => match dry_run {
                Some(f) => Ok(f(&args)),
                None => Err(RuntimeError::DryRun { tool, args: answer.get("args").cloned().unwrap_or(args) }),
            },
            Some("approval_required") => Err(RuntimeError::ApprovalRequired {
                id: text("approval"),
                agent: agent.into(),
                tool,
                standing: text("error"),
            }),
            // The daemon's answer carries the refusal in words only: kept whole in `why`.
            Some("refused") => Err(RuntimeError::NotPermitted(Box::new(Refusal {
                agent: agent.into(),
                tool,
                rung: String::new(),
                bar: String::new(),
                why: text("error"),
                by: "the daemon".into(),
                reason: text("error"),
            }))),
            _ => Err(self.client.error("protocol", format!("unexpected answer to {label}: {answer}"))),
        }
    }
}

/// An output, or a failure, as the fields a step's body carries.
pub(crate) fn outcome(result: Result<Value, String>) -> Map<String, Value> {
    let mut fields = Map::new();
    match result {
        Ok(v) => fields.insert("output".into(), v),
        Err(e) => fields.insert("error".into(), Value::String(e)),
    };
    fields
}

fn str_field(client: &Client, answer: &Value, field: &str) -> RuntimeResult<String> {
    answer
        .get(field)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| client.error("protocol", format!("the answer has no {field:?}: {answer}")))
}

/// Percent-encodes a path segment (run and agent ids may hold any character).
fn quote(segment: &str) -> String {
    retrace_core::percent::encode(segment)
}

#[cfg(test)]
mod tests {
    #[test]
    fn path_segments_are_quoted() {
        assert_eq!(super::quote("planner"), "planner");
        assert_eq!(super::quote("a b/c?"), "a%20b%2Fc%3F");
    }
}
