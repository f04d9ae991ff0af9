//! Model calls that arrive as HTTP requests: the daemon's recording proxy hands each one to its
//! agent here, so proxied calls run through the same step pipeline, matcher and scheduler as the
//! Rust runtime's own steps (there is no second engine).
//!
//! The request body is kept byte for byte (masking splices tokens into its strings) and keyed on
//! its canonical form together with the headers that change its meaning. The output is an opaque
//! document that the caller builds (the proxy's recorded response: status, headers, body or
//! stream chunks); the runtime masks and stores it as given and hands it back in replay.
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::Ordering;

use retrace_core::envelope::{ModelRef, Usage};
use retrace_core::{Event, EventType, Source};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::agent::{Agent, PARAM_FIELDS};
use crate::error::{RuntimeError, RuntimeResult};
use crate::matcher::Prefetched;
use crate::session::Mode;
use crate::step::{LiveOutput, RawRequest, StepInput};

/// A model request as the proxy received it.
#[derive(Clone, Debug)]
pub struct HttpModelCall {
    /// `openai`, `anthropic`.
    pub provider: String,
    /// `POST`.
    pub method: String,
    /// The provider path, after the proxy prefix: `/v1/chat/completions`.
    pub path: String,
    /// Headers that change the request's meaning, lowercase names (`anthropic-version`...).
    pub key_headers: Vec<(String, String)>,
    /// The decoded request body (JSON), byte for byte.
    pub body: Vec<u8>,
}

impl HttpModelCall {
    /// The step's name: `openai/v1/chat/completions` (the method too when it isn't POST).
    pub fn step_name(&self) -> String {
        let path = self.path.trim_start_matches('/');
        if self.method.eq_ignore_ascii_case("POST") {
            format!("{}/{path}", self.provider)
        } else {
            format!("{}/{} {path}", self.provider, self.method.to_ascii_uppercase())
        }
    }
}

/// What the live call produced.
#[derive(Clone, Debug, Default)]
pub struct HttpModelOutput {
    /// The document to persist as the step's output.
    pub document: Vec<u8>,
    /// The snapshot the provider reported, if it pins one.
    pub snapshot: Option<String>,
    /// Tokens (cost comes from the session's price table).
    pub usage: Option<Usage>,
    /// Wall time of the call.
    pub latency_ms: u64,
    /// The response says the call failed (an error status, the proxy's own 502 or 504, a stream
    /// cut short): recorded and replayed as it was, but never served to a fork from the LLM
    /// cache.
    pub failed: bool,
}

/// The step's outcome.
#[derive(Clone, Debug)]
pub struct HttpModelReply {
    /// The output document: in record, the live one (unmasked); in replay, the recorded one.
    pub document: Vec<u8>,
    /// Where it came from.
    pub source: Source,
}

impl Agent {
    /// A fork's `model:` and `param:` edits rewrite the body's fields (SPEC §4), once they apply.
    fn apply_raw_model_edits(&self, call: &mut HttpModelCall) {
        if self.session.inner.plan.is_none() {
            return;
        }
        let Ok(body) = serde_json::from_slice::<Value>(&call.body) else { return };
        let model_call =
            crate::agent::ModelCall { provider: call.provider.clone(), endpoint: call.path.clone(), body };
        let edited = self.apply_model_edits(&model_call);
        if edited.body != model_call.body {
            call.body = serde_json::to_vec(&edited.body).expect("a JSON value serializes");
        }
    }

    /// Runs one proxied model call. Record: runs `live` with the body to send, then appends the
    /// event and waits for its acknowledgment, so whatever the caller releases afterwards depends
    /// on a stored event. In a fork the body handed to `live` is the call's with the fork's
    /// `model:` and `param:` edits applied (SPEC §4: the proxy rewrites the body's fields), the
    /// request the event records. Replay: matches the call by key against this agent's
    /// unconsumed recorded steps (SPEC §7) and returns the recorded document; `live` never runs.
    pub async fn http_model<F, Fut>(&self, call: HttpModelCall, live: F) -> RuntimeResult<HttpModelReply>
    where
        F: FnOnce(Vec<u8>) -> Fut,
        Fut: Future<Output = RuntimeResult<HttpModelOutput>>,
    {
        if self.remote().is_some() {
            return Err(RuntimeError::Usage(
                "http_model is the proxy's step; a session of a daemon's run sends model calls through \
                 the daemon's proxy (OPENAI_BASE_URL) or Agent::model"
                    .into(),
            ));
        }
        let inner = &self.session.inner;
        let mut call = call;
        self.apply_raw_model_edits(&mut call);
        // Masked like everything persisted: a query can carry a key (`?key=AIza...`).
        let name = inner.masker.mask_url(&call.step_name()).0.into_owned();
        let mut template = self.event(EventType::ModelCall, Some(&name));
        // The agent's prompt template (set by `template()`), as on in-process model calls.
        template.prompt_template = self.state.lock().prompt.clone();
        // The body's top-level fields, each left unparsed: only the model and the sampling
        // parameters are decoded (a conversation's messages are skipped over, not built).
        let fields: BTreeMap<String, &RawValue> = serde_json::from_slice(&call.body).unwrap_or_default();
        let model_name = fields.get("model").and_then(|raw| serde_json::from_str::<String>(raw.get()).ok());
        // A route that names no model (`GET /v1/models`) has none to pin.
        template.model = model_name.map(|name| ModelRef {
            provider: call.provider.clone(),
            name: self.masked_name(&name),
            snapshot: None,
        });
        let mut params: BTreeMap<String, Value> = PARAM_FIELDS
            .iter()
            .filter_map(|f| Some(((*f).to_owned(), serde_json::from_str(fields.get(*f)?.get()).ok()?)))
            .collect();
        for (k, v) in &call.key_headers {
            params.insert(k.clone(), Value::String(v.clone()));
        }
        template.params = (!params.is_empty()).then_some(params);
        let mut input = StepInput::new(template, Value::Null).model_request().acknowledged();
        // What goes upstream, if anything does: the request as recorded.
        let send = match inner.mode {
            Mode::Replay => Vec::new(),
            _ => call.body.clone(),
        };
        input.raw_request = Some(RawRequest { body: call.body, key_headers: call.key_headers });
        if let Some(d) = self.session.divergence() {
            return Err(d.into());
        }
        inner.steps.fetch_add(1, Ordering::Relaxed);
        let label = input.template.label();
        let prepared = self.prepare(&input, &label)?;
        match inner.mode {
            Mode::Off => {
                inner.live_calls.fetch_add(1, Ordering::Relaxed);
                let out = live(send).await?;
                Ok(HttpModelReply { document: out.document, source: Source::Live })
            }
            Mode::Record | Mode::Fork => {
                let mut document = None;
                let slot = &mut document;
                let live = || async move {
                    let out = live(send).await?;
                    *slot = Some(out.document.clone());
                    Ok(LiveOutput::raw(out.document)
                        .latency(out.latency_ms)
                        .snapshot(out.snapshot)
                        .usage(out.usage)
                        .uncached(out.failed))
                };
                let recorded = match inner.mode {
                    Mode::Fork => self.fork(input, prepared, &label, live).await?,
                    _ => self.record(input, prepared, &label, live).await?,
                };
                match document {
                    Some(document) => Ok(HttpModelReply { document, source: Source::Live }),
                    // A fork step served from the source run or a cache: its stored document.
                    None => {
                        let output_ref = recorded.output_ref.ok_or_else(|| RuntimeError::Decode {
                            agent: self.id.clone(),
                            step: label.clone(),
                            message: "the recorded step has no output".into(),
                        })?;
                        let document = inner.for_program(inner.store.get_blob(&output_ref)?)?;
                        Ok(HttpModelReply { document, source: Source::Recorded })
                    }
                }
            }
            Mode::Replay => {
                let (_, mut step) = self.replay(input.no_output(), prepared, &label, None).await?;
                let output_ref = step.output_ref.ok_or_else(|| RuntimeError::Decode {
                    agent: self.id.clone(),
                    step: label.clone(),
                    message: "the recorded step has no output".into(),
                })?;
                // Read and verified ahead by the log's reader, as stored.
                let document = match step.output.take() {
                    Some(Prefetched::Bytes(bytes)) => inner.for_program(bytes)?,
                    _ => inner.recorded_output(&output_ref)?,
                };
                Ok(HttpModelReply { document, source: Source::Recorded })
            }
        }
    }
}

/// A key header (`anthropic-beta`...) whose value differs between a recorded proxied call and
/// the one replayed, each value as a terminal shows it (`(absent)` when not sent).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct HeaderDifference {
    pub(crate) name: String,
    pub(crate) recorded: String,
    pub(crate) replayed: String,
}

/// The first key header, by name, whose value differs between two model calls' events: a
/// proxied call records its key headers among its params, beside the body's sampling parameters.
pub(crate) fn key_header_difference(recorded: &Event, replayed: &Event) -> Option<HeaderDifference> {
    let headers = |e: &Event| -> BTreeMap<String, Value> {
        let params = e.params.iter().flatten();
        params
            .filter(|(k, _)| !PARAM_FIELDS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let (recorded, replayed) = (headers(recorded), headers(replayed));
    let shown = |v: Option<&Value>| v.map_or_else(|| "(absent)".to_owned(), Value::to_string);
    let name =
        recorded.keys().chain(replayed.keys()).filter(|k| recorded.get(*k) != replayed.get(*k)).min()?;
    Some(HeaderDifference {
        name: name.clone(),
        recorded: shown(recorded.get(name)),
        replayed: shown(replayed.get(name)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(params: &[(&str, Value)]) -> Event {
        let mut event = Event::new("r", "a", EventType::ModelCall);
        event.params = Some(params.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect());
        event
    }

    #[test]
    fn the_first_differing_key_header_is_named_with_both_values() {
        let beta = |v: &str| ("anthropic-beta", Value::from(v));
        let version = |v: &str| ("anthropic-version", Value::from(v));
        let temperature = ("temperature", Value::from(0.5));
        let check = |recorded: &[(&str, Value)], replayed: &[(&str, Value)]| {
            key_header_difference(&call(recorded), &call(replayed))
                .map(|d| format!("{}: {} vs {}", d.name, d.recorded, d.replayed))
        };
        let same = [version("2023-06-01"), temperature.clone()];
        assert_eq!(check(&same, &same), None);
        // The body's sampling parameters are the body's diff to name, never a header.
        assert_eq!(check(&[version("2023-06-01")], &same), None);
        assert_eq!(
            check(&[version("2023-06-01")], &[version("2023-06-01"), beta("x-2025")]).as_deref(),
            Some(r#"anthropic-beta: (absent) vs "x-2025""#)
        );
        assert_eq!(
            check(&[beta("a"), version("1")], &[beta("b"), version("2")]).as_deref(),
            Some(r#"anthropic-beta: "a" vs "b""#),
            "the first by name"
        );
        assert_eq!(
            check(&[version("2023-06-01")], &[]).as_deref(),
            Some(r#"anthropic-version: "2023-06-01" vs (absent)"#)
        );
    }
}
