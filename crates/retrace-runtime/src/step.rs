//! The step pipeline shared by record and replay: canonicalise → mask → key → (live call and
//! append | match against the recorded log). Nothing is persisted before masking, and keys are
//! computed on the masked request.
use std::borrow::Cow;
use std::sync::atomic::Ordering;

use retrace_core::canonical::canonical_value;
use retrace_core::envelope::Usage;
use retrace_core::json::{self, Json};
use retrace_core::json_diff::first_difference_bytes;
use retrace_core::run::RunStatus;
use retrace_core::{Digest, Divergence, DivergenceCode, Event, EventType};
use retrace_store::{BlobHint, BlobPut};
use serde_json::Value;

use crate::agent::Agent;
use crate::error::{RuntimeError, RuntimeResult};
use crate::session::Mode;

/// A step about to run: its event template and its request.
pub(crate) struct StepInput {
    template: Event,
    request: Value,
    version: Option<String>,
    intent: bool,
    hint: BlobHint,
    has_output: bool,
}

impl StepInput {
    pub(crate) fn new(template: Event, request: Value) -> StepInput {
        StepInput {
            template,
            request,
            version: None,
            intent: false,
            hint: BlobHint::Raw,
            has_output: true,
        }
    }
    pub(crate) fn versioned(mut self, version: &str) -> Self {
        self.version = Some(version.to_owned());
        self
    }
    pub(crate) fn with_intent(mut self) -> Self {
        self.intent = true;
        self
    }
    pub(crate) fn model_request(mut self) -> Self {
        self.hint = BlobHint::ModelRequest;
        self
    }
    pub(crate) fn no_output(mut self) -> Self {
        self.has_output = false;
        self
    }
}

/// What a live call produced.
#[derive(Debug, Default)]
pub(crate) struct LiveOutput {
    value: Option<Value>,
    error: Option<String>,
    latency_ms: Option<u64>,
    snapshot: Option<String>,
    usage: Option<Usage>,
}

impl LiveOutput {
    pub(crate) fn value(v: Value) -> Self {
        LiveOutput {
            value: Some(v),
            ..Default::default()
        }
    }
    pub(crate) fn error(message: String) -> Self {
        LiveOutput {
            error: Some(message),
            ..Default::default()
        }
    }
    pub(crate) fn none() -> Self {
        LiveOutput::default()
    }
    pub(crate) fn latency(mut self, ms: u64) -> Self {
        self.latency_ms = Some(ms);
        self
    }
    pub(crate) fn snapshot(mut self, s: Option<String>) -> Self {
        self.snapshot = s;
        self
    }
    pub(crate) fn usage(mut self, u: Option<Usage>) -> Self {
        self.usage = u;
        self
    }
}

/// A request after canonicalisation and masking, with its key.
struct Prepared {
    masked: Vec<u8>,
    key: Digest,
}

impl Agent {
    /// Runs one step through the pipeline; returns the value the program sees.
    pub(crate) fn run_step(
        &self,
        input: StepInput,
        live: impl FnOnce() -> RuntimeResult<LiveOutput>,
    ) -> RuntimeResult<Value> {
        let inner = &self.session.inner;
        if let Some(d) = inner.divergence.lock().clone() {
            return Err(d.into());
        }
        inner.steps.fetch_add(1, Ordering::Relaxed);
        let label = input.template.label();
        let prepared = self.prepare(&input, input.template.kind, &label)?;
        match inner.mode {
            Mode::Off => {
                inner.live_calls.fetch_add(1, Ordering::Relaxed);
                let out = live()?;
                self.program_value(&label, out).map(|(v, _)| v)
            }
            Mode::Record => self.record(input, prepared, &label, live),
            Mode::Replay => self.replay(input, prepared, &label),
        }
    }

    fn prepare(&self, input: &StepInput, kind: EventType, label: &str) -> RuntimeResult<Prepared> {
        let inner = &self.session.inner;
        let canonical =
            canonical_value(&input.request).map_err(|e| RuntimeError::NotCanonical {
                agent: self.id.clone(),
                step: label.to_owned(),
                source: e,
            })?;
        let masked = inner.masker.mask_json(&canonical);
        let parsed: Cow<'_, Json> = if masked.tokens == 0 {
            Cow::Owned(Json::from_value(&input.request))
        } else {
            inner.holds_tokens.store(true, Ordering::Relaxed);
            Cow::Owned(json::parse(&masked.bytes).expect("masking keeps JSON valid"))
        };
        let key = inner
            .keys
            .key(
                kind,
                input.template.name.as_deref(),
                input.version.as_deref(),
                &parsed,
            )
            .map_err(|e| RuntimeError::NotCanonical {
                agent: self.id.clone(),
                step: label.to_owned(),
                source: e,
            })?;
        Ok(Prepared {
            masked: masked.bytes.into_owned(),
            key,
        })
    }

    /// Canonicalises a live output: the value the program gets back, and the bytes to persist.
    fn program_value(
        &self,
        label: &str,
        out: LiveOutput,
    ) -> RuntimeResult<(Value, Option<Vec<u8>>)> {
        if let Some(message) = out.error {
            return Err(RuntimeError::StepFailed {
                agent: self.id.clone(),
                step: label.into(),
                message,
            });
        }
        let Some(value) = out.value else {
            return Ok((Value::Null, None));
        };
        let canonical = canonical_value(&value).map_err(|e| RuntimeError::NotCanonical {
            agent: self.id.clone(),
            step: label.into(),
            source: e,
        })?;
        let decoded: Value = serde_json::from_slice(&canonical).expect("canonical JSON decodes");
        Ok((decoded, Some(canonical)))
    }

    fn record(
        &self,
        input: StepInput,
        prepared: Prepared,
        label: &str,
        live: impl FnOnce() -> RuntimeResult<LiveOutput>,
    ) -> RuntimeResult<Value> {
        let inner = &self.session.inner;
        let writer = inner
            .writer
            .as_ref()
            .expect("record sessions have a writer");
        let request = BlobPut::new(prepared.masked, input.hint);
        let mut event = input.template;
        event.key = prepared.key;
        event.request_ref = Some(request.digest);
        let mut blobs = vec![request];
        if input.intent {
            let mut intent = event.clone();
            intent.kind = EventType::Intent;
            intent.key = self.intent_key(&event)?;
            intent.lamport = self.state.lock().clock.tick();
            let acked = writer.append_sync(intent, std::mem::take(&mut blobs))?;
            event.causal_parent = Some(acked.seq);
        }
        inner.live_calls.fetch_add(1, Ordering::Relaxed);
        let out = live()?;
        event.latency_ms = out.latency_ms;
        event.usage = out.usage.clone();
        if let (Some(model), Some(snapshot)) = (event.model.as_mut(), out.snapshot.clone()) {
            model.snapshot = Some(snapshot);
        }
        let error = out.error.clone();
        let (value, canonical) = match self.program_value(label, out) {
            Ok(v) => v,
            Err(RuntimeError::StepFailed { .. }) => (Value::Null, None),
            Err(e) => return Err(e),
        };
        event.error = error.clone();
        if let Some(canonical) = canonical {
            let masked = inner.masker.mask_json(&canonical);
            if masked.tokens > 0 {
                inner.holds_tokens.store(true, Ordering::Relaxed);
            }
            let output = BlobPut::new(masked.bytes.into_owned(), BlobHint::Raw);
            event.output_ref = Some(output.digest);
            event.output_hash = Some(output.digest);
            blobs.push(output);
        }
        event.lamport = self.state.lock().clock.tick();
        let ticket = writer.append(event, blobs)?;
        if inner.wait_for_ack {
            ticket.wait()?;
        }
        match error {
            Some(message) => Err(RuntimeError::StepFailed {
                agent: self.id.clone(),
                step: label.into(),
                message,
            }),
            None => Ok(value),
        }
    }

    fn intent_key(&self, event: &Event) -> RuntimeResult<Digest> {
        let tool = event.tool.as_ref().map(|t| t.version.as_str());
        let request = Json::String(event.key.to_string());
        self.session
            .inner
            .keys
            .key(EventType::Intent, event.name.as_deref(), tool, &request)
            .map_err(|e| RuntimeError::NotCanonical {
                agent: self.id.clone(),
                step: event.label(),
                source: e,
            })
    }

    fn replay(&self, input: StepInput, prepared: Prepared, label: &str) -> RuntimeResult<Value> {
        let inner = &self.session.inner;
        let log = inner.replay.as_ref().expect("replay sessions have a log");
        let mut event = input.template;
        event.key = prepared.key;
        if input.intent {
            let intent_key = self.intent_key(&event)?;
            match log.take(&self.id, &intent_key) {
                Some(step) if !step.completed => {
                    return Err(self.diverge(
                        Divergence::new(DivergenceCode::PendingIntent, self.id.clone())
                            .at(step.seq)
                            .step(label)
                            .detail("the recording logged this side effect's intent but not its completion")
                            .detail(format!("run `retrace resolve <run> {} --outcome @FILE | --not-executed`", step.seq)),
                    ));
                }
                Some(_) => {}
                None => return Err(self.mismatch(EventType::Intent, &event, &prepared, label)),
            }
        }
        let Some(step) = log.take(&self.id, &prepared.key) else {
            return Err(self.mismatch(event.kind, &event, &prepared, label));
        };
        self.state.lock().clock.tick();
        if let Some(message) = step.error {
            return Err(RuntimeError::StepFailed {
                agent: self.id.clone(),
                step: label.into(),
                message,
            });
        }
        if !input.has_output {
            return Ok(Value::Null);
        }
        let Some(output_ref) = step.output_ref else {
            return Ok(Value::Null);
        };
        let bytes = inner.store.get_blob(&output_ref)?;
        serde_json::from_slice(&bytes).map_err(|e| RuntimeError::Decode {
            agent: self.id.clone(),
            step: label.into(),
            message: e.to_string(),
        })
    }

    fn mismatch(
        &self,
        kind: EventType,
        event: &Event,
        prepared: &Prepared,
        label: &str,
    ) -> RuntimeError {
        let inner = &self.session.inner;
        let log = inner.replay.as_ref().expect("replay sessions have a log");
        let expected = log.expected(&self.id, kind, event.name.as_deref());
        let interrupted = inner
            .run
            .lock()
            .labels
            .get("source_status")
            .map(String::as_str)
            == Some(RunStatus::Interrupted.as_str());
        let d = match expected {
            Some(step) => {
                let path = step
                    .request_ref
                    .and_then(|r| inner.store.get_blob(&r).ok())
                    .and_then(|recorded| first_difference_bytes(&recorded, &prepared.masked));
                let mut d = Divergence::new(DivergenceCode::StepMismatch, self.id.clone())
                    .at(step.seq)
                    .step(label)
                    .keys(Some(step.key), Some(prepared.key))
                    .path(path.clone());
                if let (Some(path), Some(r)) = (path, step.request_ref) {
                    if let Ok(recorded) = inner.store.get_blob(&r) {
                        d = d
                            .detail(format!("recorded {path} = {}", value_at(&recorded, &path)))
                            .detail(format!(
                                "replayed {path} = {}",
                                value_at(&prepared.masked, &path)
                            ));
                    }
                }
                d
            }
            None if log.next_of(&self.id).is_none() && interrupted => {
                Divergence::new(DivergenceCode::LogEnded, self.id.clone())
                    .at(log.last_seq())
                    .step(label)
                    .keys(None, Some(prepared.key))
                    .detail(format!("the recording ends at seq {}", log.last_seq()))
            }
            None => {
                let mut d = Divergence::new(DivergenceCode::UnexpectedStep, self.id.clone())
                    .step(label)
                    .keys(None, Some(prepared.key));
                d = match log.next_of(&self.id) {
                    Some(next) => d.detail(format!(
                        "the agent's next recorded step is seq {} ({})",
                        next.seq,
                        next.label()
                    )),
                    None => d.detail("the agent has no recorded steps left"),
                };
                d
            }
        };
        self.diverge(d)
    }

    fn diverge(&self, d: Divergence) -> RuntimeError {
        let mut slot = self.session.inner.divergence.lock();
        let first = slot.get_or_insert(d).clone();
        first.into()
    }
}

/// The value at a `$.a[1].b` path of a JSON document, shortened for a terminal.
fn value_at(bytes: &[u8], path: &str) -> String {
    let Ok(doc) = json::parse(bytes) else {
        return "(not JSON)".into();
    };
    let mut node = &doc;
    for part in split_path(path) {
        let next = match (&part, node) {
            (PathPart::Key(k), Json::Object(fields)) => {
                fields.iter().find(|(n, _)| n == k).map(|(_, v)| v)
            }
            (PathPart::Index(i), Json::Array(items)) => items.get(*i),
            _ => None,
        };
        match next {
            Some(n) => node = n,
            None => return "(absent)".into(),
        }
    }
    let text = String::from_utf8(retrace_core::canonical::to_canonical(node).unwrap_or_default())
        .unwrap_or_default();
    if text.chars().count() > 120 {
        format!("{}…", text.chars().take(120).collect::<String>())
    } else {
        text
    }
}

enum PathPart {
    Key(String),
    Index(usize),
}

fn split_path(path: &str) -> Vec<PathPart> {
    let mut parts = Vec::new();
    let mut rest = path.strip_prefix('$').unwrap_or(path);
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            parts.push(PathPart::Key(r[..end].to_owned()));
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("[\"") {
            let Ok(key) = serde_json::Deserializer::from_str(&format!("\"{r}"))
                .into_iter::<String>()
                .next()
                .transpose()
            else {
                break;
            };
            let Some(key) = key else { break };
            let consumed = serde_json::to_string(&key).map(|s| s.len()).unwrap_or(0) + 1;
            parts.push(PathPart::Key(key));
            rest = r.get(consumed..).unwrap_or("");
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').unwrap_or(r.len());
            match r[..end].parse() {
                Ok(i) => parts.push(PathPart::Index(i)),
                Err(_) => break,
            }
            rest = r.get(end + 1..).unwrap_or("");
        } else {
            break;
        }
    }
    parts
}
