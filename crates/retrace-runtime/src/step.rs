//! The step pipeline shared by record and replay: canonicalise → mask → key → (live call and
//! append | match through the replay scheduler). Nothing is persisted before masking, and keys
//! are computed on the masked request.
use std::borrow::Cow;
use std::future::Future;
use std::sync::atomic::Ordering;

use retrace_core::canonical::{canonical_value, decodes_to_itself};
use retrace_core::envelope::ToolClass;
use retrace_core::envelope::Usage;
use retrace_core::json::{self, Json};
use retrace_core::mask::Masked;
use retrace_core::{Digest, Divergence, DivergenceCode, Event, EventType, Source};
use retrace_store::{BlobHint, BlobPut, CacheEntry};
use serde_json::Value;

use crate::agent::Agent;
use crate::error::{RuntimeError, RuntimeResult};
use crate::matcher::{Prefetched, RecordedStep, Resolution};
use crate::session::Mode;
use crate::vaulting::MaskedAs;

mod mismatch;

/// A step about to run: its event template and its request.
pub(crate) struct StepInput {
    pub(crate) template: Event,
    pub(crate) request: Value,
    version: Option<String>,
    pub(crate) intent: bool,
    hint: BlobHint,
    has_output: bool,
    must_ack: bool,
    /// Where the output comes from (fork steps served from the log or a cache say so).
    pub(crate) source: Source,
    /// In a fork: the source step this one was matched or paired with.
    pub(crate) origin_seq: Option<u64>,
    /// A side-effect tool's dry run: what a fork hands the program instead of running it.
    pub(crate) dry_run: Option<crate::agent::DryRunFn>,
    /// For a side effect of a program in another process: the program has a dry run of its
    /// own, so a fork runs the step's live function as the dry run and records its outcome.
    pub(crate) program_dry_run: bool,
    /// A request given as raw JSON bytes (the proxy's bodies): stored byte for byte (masked by
    /// splicing), keyed on its canonical form; `request` is then unused.
    pub(crate) raw_request: Option<RawRequest>,
}

/// A request kept byte for byte, and what else its key covers.
pub(crate) struct RawRequest {
    pub(crate) body: Vec<u8>,
    /// Headers that change the request's meaning (`anthropic-version`...): keyed beside the body.
    pub(crate) key_headers: Vec<(String, String)>,
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
            must_ack: false,
            source: Source::Live,
            origin_seq: None,
            dry_run: None,
            program_dry_run: false,
            raw_request: None,
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
    /// The event must be acknowledged before the step returns (sends: nothing reaches another
    /// agent before its event is in the store).
    pub(crate) fn acknowledged(mut self) -> Self {
        self.must_ack = true;
        self
    }
}

/// What a live call produced.
#[derive(Debug, Default)]
pub(crate) struct LiveOutput {
    value: Option<Value>,
    /// An output persisted as these bytes (masked), not as canonical JSON of a value.
    raw: Option<Vec<u8>>,
    error: Option<String>,
    latency_ms: Option<u64>,
    snapshot: Option<String>,
    usage: Option<Usage>,
    /// Recorded, but never left in the LLM or tool cache: a response that says the call failed
    /// (an HTTP error status, a stream cut short) would otherwise be served to forks as if the
    /// provider had answered.
    uncached: bool,
}

impl LiveOutput {
    pub(crate) fn value(v: Value) -> Self {
        LiveOutput { value: Some(v), ..Default::default() }
    }
    pub(crate) fn raw(bytes: Vec<u8>) -> Self {
        LiveOutput { raw: Some(bytes), ..Default::default() }
    }
    pub(crate) fn error(message: String) -> Self {
        LiveOutput { error: Some(message), ..Default::default() }
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
    pub(crate) fn uncached(mut self, yes: bool) -> Self {
        self.uncached = yes;
        self
    }
}

/// What recording a step produced.
pub(crate) struct Recorded {
    pub(crate) value: Value,
    pub(crate) seq: u64,
    pub(crate) lamport: u64,
    pub(crate) causal_parent: Option<u64>,
    /// The blob of the step's stored output (the source's, for an inherited step).
    pub(crate) output_ref: Option<Digest>,
}

/// A request after canonicalisation and masking, with its key.
pub(crate) struct Prepared {
    pub(crate) masked: Vec<u8>,
    pub(crate) key: Digest,
}

impl Agent {
    /// Runs one step with a synchronous live function (see [`Agent::run_step_async`]).
    pub(crate) fn run_step(
        &self,
        input: StepInput,
        live: impl FnOnce() -> RuntimeResult<LiveOutput>,
    ) -> RuntimeResult<Value> {
        self.block_on(self.run_step_async(input, move || std::future::ready(live())))
    }

    /// Drives a step from synchronous code. A strict replay's step waits for other agents'
    /// steps: on a worker of a multi-thread tokio runtime, `block_in_place` first hands the
    /// worker's other tasks to another thread; otherwise a few agents waiting this way occupy
    /// every worker while the agents they wait for never run.
    pub(crate) fn block_on<F: Future>(&self, step: F) -> F::Output {
        let strict = self.session.inner.scheduler.as_ref().is_some_and(|s| s.is_strict());
        crate::block::block_on(strict, step)
    }

    /// Runs one step through the pipeline; returns the value the program sees.
    pub(crate) async fn run_step_async<F, Fut>(&self, input: StepInput, live: F) -> RuntimeResult<Value>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = RuntimeResult<LiveOutput>>,
    {
        let inner = &self.session.inner;
        if let Some(d) = self.session.divergence() {
            return Err(d.into());
        }
        inner.steps.fetch_add(1, Ordering::Relaxed);
        let label = input.template.label();
        let prepared = self.prepare(&input, &label)?;
        // Each mode's future is boxed: held inline, the largest of them (a fork's) sized every
        // step's future, which is copied whole each time it moves (into `block_on`, say).
        match inner.mode {
            Mode::Off => {
                inner.live_calls.fetch_add(1, Ordering::Relaxed);
                let out = live().await?;
                self.program_value(&label, out).map(|(v, _)| v)
            }
            Mode::Record => {
                if input.intent {
                    Box::pin(self.govern(&input.template, &prepared)).await?;
                }
                Box::pin(self.record(input, prepared, &label, live)).await.map(|r| r.value)
            }
            Mode::Fork => {
                if input.intent {
                    Box::pin(self.replay_approval(&input.template, &prepared, &label)).await?;
                }
                Box::pin(self.fork(input, prepared, &label, live)).await.map(|r| r.value)
            }
            Mode::Replay => {
                if input.intent {
                    Box::pin(self.replay_approval(&input.template, &prepared, &label)).await?;
                }
                Box::pin(self.replay(input, prepared, &label, None)).await.map(|(v, _)| v)
            }
        }
    }

    /// Canonicalises and masks the request, and computes its key.
    pub(crate) fn prepare(&self, input: &StepInput, label: &str) -> RuntimeResult<Prepared> {
        let inner = &self.session.inner;
        let not_canonical =
            |e| RuntimeError::NotCanonical { agent: self.id.clone(), step: label.to_owned(), source: e };
        if let Some(raw) = &input.raw_request {
            return self.prepare_raw(input, raw).map_err(not_canonical);
        }
        let canonical = canonical_value(&input.request).map_err(not_canonical)?;
        // Most requests hold nothing to mask: their decoded strings say so without a scan.
        let masked = if inner.masker.would_mask_value(&input.request) {
            inner.masker.mask_json(&canonical)
        } else {
            Masked { bytes: Cow::Borrowed(&canonical[..]), tokens: 0 }
        };
        if let (Some(originals), true) = (&inner.originals, masked.tokens > 0) {
            // A request is handed back to a program as a message's body.
            originals.keep_form(&canonical, &masked.bytes, MaskedAs::Json);
        }
        let (kind, name, version) =
            (input.template.kind, input.template.name.as_deref(), input.version.as_deref());
        let key = if masked.tokens == 0 {
            // The bytes are the request's canonical form: the key hashes them as they are
            // (parsing only when a volatile field may need stripping).
            inner.keys.key_canonical(kind, name, version, &masked.bytes)
        } else {
            // Masked bytes need not be canonical (a masked key may sort differently).
            inner.holds_tokens.store(true, Ordering::Relaxed);
            let parsed = json::parse(&masked.bytes).expect("masking keeps JSON valid");
            inner.keys.key(kind, name, version, &parsed)
        }
        .map_err(not_canonical)?;
        let masked = match masked.bytes {
            Cow::Owned(bytes) => bytes,
            Cow::Borrowed(_) => canonical,
        };
        Ok(Prepared { masked, key })
    }

    /// Masks a raw request by splicing and keys its canonical form (with its key headers).
    fn prepare_raw(
        &self,
        input: &StepInput,
        raw: &RawRequest,
    ) -> Result<Prepared, retrace_core::canonical::CanonError> {
        let inner = &self.session.inner;
        let masked = inner.masker.mask_json(&raw.body);
        if masked.tokens > 0 {
            inner.holds_tokens.store(true, Ordering::Relaxed);
        }
        let body = json::parse(&masked.bytes)?;
        let keyed = if raw.key_headers.is_empty() {
            body
        } else {
            let headers = raw.key_headers.iter().map(|(k, v)| (k.clone(), Json::String(v.clone()))).collect();
            Json::Object(vec![("body".into(), body), ("headers".into(), Json::Object(headers))])
        };
        let t = &input.template;
        let key = inner.keys.key(t.kind, t.name.as_deref(), input.version.as_deref(), &keyed)?;
        Ok(Prepared { masked: masked.bytes.into_owned(), key })
    }

    /// Canonicalises a live output: the value the program gets back, and the bytes to persist.
    fn program_value(&self, label: &str, out: LiveOutput) -> RuntimeResult<(Value, Option<Vec<u8>>)> {
        if let Some(message) = out.error {
            return Err(RuntimeError::StepFailed { agent: self.id.clone(), step: label.into(), message });
        }
        let Some(value) = out.value else { return Ok((Value::Null, None)) };
        let canonical = canonical_value(&value).map_err(|e| RuntimeError::NotCanonical {
            agent: self.id.clone(),
            step: label.into(),
            source: e,
        })?;
        // Most values are their canonical form decoded: only the others are decoded.
        let decoded = if decodes_to_itself(&value) {
            value
        } else {
            serde_json::from_slice(&canonical).expect("canonical JSON decodes")
        };
        Ok((decoded, Some(canonical)))
    }

    /// Record: runs `live` and appends the event; returns the program's value and the event's
    /// seq, lamport and causal parent.
    pub(crate) async fn record<F, Fut>(
        &self,
        input: StepInput,
        prepared: Prepared,
        label: &str,
        live: F,
    ) -> RuntimeResult<Recorded>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = RuntimeResult<LiveOutput>>,
    {
        let inner = &self.session.inner;
        let request = BlobPut::new(prepared.masked, input.hint);
        let mut event = input.template;
        event.key = prepared.key;
        let cache_key = (event.kind == EventType::ModelCall).then(|| self.model_cache_key(&event.key, true));
        event.request_ref = Some(request.digest());
        self.take_inbound(&mut event);
        let mut blobs = vec![request];
        if input.intent {
            let mut intent = event.clone();
            intent.kind = EventType::Intent;
            intent.key = self.intent_key(&event)?;
            let (ticket, _) = self.append_stamped(intent, std::mem::take(&mut blobs), None, None)?;
            let seq = ticket.acked().await?.seq;
            event.causal_parent = Some(seq);
            inner.open_intents.lock().insert(seq, label.to_owned());
        }
        if input.source == Source::Live {
            inner.live_calls.fetch_add(1, Ordering::Relaxed);
        }
        let mut out = live().await?;
        event.source = input.source;
        event.origin_seq = input.origin_seq;
        event.latency_ms = out.latency_ms;
        event.usage = out.usage.clone();
        if let (Some(model), Some(snapshot)) = (event.model.as_mut(), out.snapshot.clone()) {
            model.snapshot = Some(snapshot);
        }
        if let (Some(usage), Some(model), Source::Live) = (event.usage.as_mut(), &event.model, input.source) {
            if usage.cost_usd.is_none() {
                let prices = &inner.prices;
                usage.cost_usd = model
                    .snapshot
                    .as_deref()
                    .and_then(|s| prices.cost(s, usage))
                    .or_else(|| prices.cost(&model.name, usage));
            }
        }
        let error = out.error.clone();
        let uncached = out.uncached;
        let raw_output = out.raw.take();
        let (value, canonical) = match self.program_value(label, out) {
            Ok(v) => v,
            Err(RuntimeError::StepFailed { .. }) => (Value::Null, None),
            Err(e) => return Err(e),
        };
        // A failure's message is persisted like any output: masked.
        event.error = error.as_deref().map(|e| inner.masker.mask_text(e).0.into_owned());
        // A plain value's strings say whether masking would change it; a raw output (an HTTP
        // document) is masked per part.
        let clean = raw_output.is_none() && !inner.masker.would_mask_value(&value);
        // A model's reply as canonical JSON holds the message the next request carries back.
        let output_hint = match (input.hint, &raw_output) {
            (BlobHint::ModelRequest, None) => BlobHint::ModelResponse,
            _ => BlobHint::Raw,
        };
        if let Some(canonical) = raw_output.or(canonical) {
            let masked = if clean {
                Masked { bytes: Cow::Borrowed(&canonical[..]), tokens: 0 }
            } else {
                inner.masker.mask_output(&canonical)
            };
            if masked.tokens > 0 {
                inner.holds_tokens.store(true, Ordering::Relaxed);
                if let Some(originals) = &inner.originals {
                    originals.keep_form(&canonical, &masked.bytes, MaskedAs::Output);
                }
            }
            let output = BlobPut::new(masked.bytes.into_owned(), output_hint);
            event.output_ref = Some(output.digest());
            event.output_hash = Some(output.digest());
            blobs.push(output);
        }
        let (causal_parent, output_ref) = (event.causal_parent, event.output_ref);
        if let Some(originals) = &inner.originals {
            originals.flush(inner.store.as_ref(), &self.session.run_id())?;
        }
        let cache = if uncached { None } else { self.cache_entry(&event, cache_key) };
        let intent = if input.intent { causal_parent } else { None };
        let (ticket, lamport) = self.append_stamped(event, blobs, cache, None)?;
        if let Some(seq) = intent {
            inner.open_intents.lock().remove(&seq);
        }
        let seq = ticket.seq;
        if inner.wait_for_ack || input.must_ack {
            ticket.acked().await?;
        }
        match error {
            Some(message) => {
                Err(RuntimeError::StepFailed { agent: self.id.clone(), step: label.into(), message })
            }
            None => Ok(Recorded { value, seq, lamport, causal_parent, output_ref }),
        }
    }

    /// Stamps `event` with the agent's next Lamport time (after `sender`'s, for a delivery) and
    /// appends it, both under the agent's lock: an agent whose steps run concurrently still
    /// has a clock that increases with seq.
    pub(crate) fn append_stamped(
        &self,
        mut event: Event,
        blobs: Vec<BlobPut>,
        cache: Option<(Digest, CacheEntry)>,
        sender: Option<u64>,
    ) -> RuntimeResult<(retrace_store::Ticket, u64)> {
        let writer = self.session.inner.writer.as_ref().expect("recording sessions have a writer");
        let mut state = self.state.lock();
        event.lamport = match sender {
            Some(l) => state.clock.observe(l),
            None => state.clock.tick(),
        };
        let lamport = event.lamport;
        let ticket = writer.append_cached(event, blobs, cache)?;
        drop(state);
        Ok((ticket, lamport))
    }

    /// The cache key of this agent's model call with `key` (its next one; `take`: counted, as
    /// each recorded call is, so the next identical call gets the next key): the key itself for
    /// the first call of the run with that key, then a digest of the key and `n` for the n-th.
    /// A program that asks the same thing k times (resampling, retry until the answer parses)
    /// got k answers live; a fork gets k answers too, live or cached from an earlier fork's
    /// k-th, never the first answer k times. Tools are keyed by their request alone: a
    /// deterministic tool's answer is the answer to every identical call.
    pub(crate) fn model_cache_key(&self, key: &Digest, take: bool) -> Digest {
        let mut state = self.state.lock();
        let n = state.model_calls.get(key).copied().unwrap_or(0) + 1;
        if take {
            state.model_calls.insert(*key, n);
        }
        drop(state);
        if n == 1 {
            return *key;
        }
        let mut h = retrace_core::digest::DigestWriter::new();
        h.update(b"retrace/model-cache-occurrence\0");
        h.update(key.as_bytes());
        h.update(&n.to_le_bytes());
        h.finish()
    }

    /// The cache entry a live, successful model or tool step leaves (side effects: none), under
    /// `cache_key` for a model call (see [`Agent::model_cache_key`]).
    fn cache_entry(&self, event: &Event, cache_key: Option<Digest>) -> Option<(Digest, CacheEntry)> {
        if event.source != Source::Live || event.error.is_some() {
            return None;
        }
        let output_ref = event.output_ref?;
        let (class, ttl_s) = match (event.kind, &event.tool) {
            (EventType::ModelCall, _) => (None, None),
            (EventType::ToolCall, Some(t)) if t.class != ToolClass::SideEffect => (Some(t.class), t.ttl_s),
            _ => return None,
        };
        let stored_at_ms = self.session.inner.clock.now_ms();
        let snapshot = event.model.as_ref().and_then(|m| m.snapshot.clone());
        Some((
            cache_key.unwrap_or(event.key),
            CacheEntry { output_ref, usage: event.usage.clone(), stored_at_ms, class, ttl_s, snapshot },
        ))
    }

    /// Moves the deliveries consumed since the agent's previous step into `event.inbound`; the
    /// agent's latest delivery is the step's causal parent unless one was given (what it heard
    /// last is what it is acting on).
    pub(crate) fn take_inbound(&self, event: &mut Event) {
        let mut state = self.state.lock();
        event.inbound = std::mem::take(&mut state.pending_inbound);
        if event.causal_parent.is_none() {
            event.causal_parent = state.last_delivery;
        }
    }

    pub(crate) fn intent_key(&self, event: &Event) -> RuntimeResult<Digest> {
        let tool = event.tool.as_ref().map(|t| t.version.as_str());
        let request = Json::String(event.key.to_string());
        self.session.inner.keys.key(EventType::Intent, event.name.as_deref(), tool, &request).map_err(|e| {
            RuntimeError::NotCanonical { agent: self.id.clone(), step: event.label(), source: e }
        })
    }

    /// Replay: consumes the matching recorded step through the scheduler and returns its
    /// recorded output (nothing live runs). `send_body` makes a send's message deliverable.
    pub(crate) async fn replay(
        &self,
        input: StepInput,
        prepared: Prepared,
        label: &str,
        send_body: Option<Value>,
    ) -> RuntimeResult<(Value, RecordedStep)> {
        let inner = &self.session.inner;
        let scheduler = inner.scheduler.as_ref().expect("replay sessions have a scheduler");
        let mut event = input.template;
        event.key = prepared.key;
        // A fork's dry-run side effect was recorded without an intent: nothing was about to run.
        // So was one a fork of that fork served from it (stored `recorded` before QA15 D3): a
        // completion with no intent before it is taken as it is.
        let dry_run = input.intent
            && match scheduler.log().peek_source(&self.id, &prepared.key) {
                Some(Source::DryRun) => true,
                Some(_) => scheduler.log().peek(&self.id, &self.intent_key(&event)?).is_none(),
                None => false,
            };
        if input.intent && !dry_run {
            let intent_key = self.intent_key(&event)?;
            match scheduler.take_step(&self.id, &intent_key, label).await? {
                Some(step) if !step.completed => {
                    let run = self.session.source_run().unwrap_or_else(|| "RUN".into());
                    let d = Divergence::new(DivergenceCode::PendingIntent, self.id.clone())
                        .at(step.seq)
                        .step(label)
                        .detail("the recording logged this side effect's intent but not its completion")
                        .detail(format!(
                            "run `retrace resolve {run} {} --outcome @FILE | --not-executed`",
                            step.seq
                        ));
                    return Err(scheduler.diverge(d).into());
                }
                Some(step) => match &step.resolution {
                    Some(Resolution::NotExecuted) => {
                        let d = Divergence::new(DivergenceCode::LogEnded, self.id.clone())
                            .at(step.seq)
                            .step(label)
                            .detail(format!("the side effect at seq {} was resolved as not executed: the recording ends there", step.seq));
                        return Err(scheduler.diverge(d).into());
                    }
                    Some(Resolution::Outcome(blob)) => {
                        let bytes = inner.for_program(inner.store.get_blob(blob)?)?;
                        let value = serde_json::from_slice(&bytes).map_err(|e| RuntimeError::Decode {
                            agent: self.id.clone(),
                            step: label.into(),
                            message: e.to_string(),
                        })?;
                        self.state.lock().clock.tick();
                        return Ok((value, step));
                    }
                    None => {}
                },
                None => return Err(self.mismatch(EventType::Intent, &event, &prepared, label)),
            }
        }
        let taken = if event.kind == EventType::Send {
            scheduler.take_send(&self.id, &prepared.key, label, send_body).await?
        } else {
            scheduler.take_step(&self.id, &prepared.key, label).await?
        };
        let Some(step) = taken else {
            return Err(self.mismatch(event.kind, &event, &prepared, label));
        };
        {
            let mut state = self.state.lock();
            state.clock.tick();
            state.pending_inbound.clear();
        }
        if let Some(message) = step.error.clone() {
            if step.source == Source::DryRun {
                let tool = event.name.clone().unwrap_or_default();
                return Err(RuntimeError::DryRun { tool, args: input.request });
            }
            return Err(RuntimeError::StepFailed { agent: self.id.clone(), step: label.into(), message });
        }
        if !input.has_output {
            return Ok((Value::Null, step));
        }
        let Some(output_ref) = step.output_ref else { return Ok((Value::Null, step)) };
        let mut step = step;
        // Read, verified and decoded ahead by the log's reader (only where the program gets
        // the output as stored).
        let bytes = match step.output.take() {
            Some(Prefetched::Value(value)) => return Ok((value, step)),
            Some(Prefetched::Bytes(bytes)) => inner.for_program(bytes)?,
            None => inner.recorded_output(&output_ref)?,
        };
        let value = serde_json::from_slice(&bytes).map_err(|e| RuntimeError::Decode {
            agent: self.id.clone(),
            step: label.into(),
            message: e.to_string(),
        })?;
        Ok((value, step))
    }
}
