//! A step in a fork: matched steps get the source's recorded output at zero cost (inherited
//! before the fork point, recorded as the fork's own event from it on); changed and new steps
//! look in the caches and otherwise run live, except side effects, which only ever dry-run.
use retrace_core::envelope::ToolClass;
use retrace_core::{Divergence, DivergenceCode, EventType, Source};
use serde_json::Value;
use std::future::Future;

use crate::agent::Agent;
use crate::error::{RuntimeError, RuntimeResult};
use crate::fork_sched::ForkMatch;
use crate::matcher::{RecordedStep, Resolution};
use crate::step::{LiveOutput, Prepared, Recorded, StepInput};

impl Agent {
    /// Runs one step of a fork.
    pub(crate) async fn fork<F, Fut>(
        &self,
        mut input: StepInput,
        prepared: Prepared,
        label: &str,
        live: F,
    ) -> RuntimeResult<Recorded>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = RuntimeResult<LiveOutput>>,
    {
        let inner = &self.session.inner;
        let scheduler = inner.scheduler.clone().expect("forks have a scheduler");
        let at = scheduler.fork_at().unwrap_or(1);
        let mut probe = input.template.clone();
        probe.key = prepared.key;
        if input.intent {
            input.intent = false;
            let intent_key = self.intent_key(&probe)?;
            match scheduler
                .take_fork_step(&self.id, EventType::Intent, probe.name.as_deref(), &intent_key)
                .await?
            {
                // No intent before the fork point: the source (itself a fork) may have dry-run
                // this side effect, which logs no intent; its completion is matched below, and a
                // step the source doesn't hold at all is reported there (QA22 D2).
                None => {}
                Some(ForkMatch::Matched(step)) if step.resolution == Some(Resolution::NotExecuted) => {
                    // A person said it never happened: the fork treats the call as new (dry run).
                    return self.fork_execute(input, prepared, label, live, Some(step.seq)).await;
                }
                Some(ForkMatch::Matched(step)) if matches!(step.resolution, Some(Resolution::Outcome(_))) => {
                    let Some(Resolution::Outcome(blob)) = step.resolution else {
                        unreachable!("matched above")
                    };
                    let value = self.blob_value(&blob, label)?;
                    if step.seq < at {
                        return Ok(Recorded {
                            output_ref: Some(blob),
                            value,
                            seq: step.seq,
                            lamport: step.lamport,
                            causal_parent: step.causal_parent,
                        });
                    }
                    input.source = Source::Recorded;
                    input.origin_seq = Some(step.seq);
                    return self
                        .record(input, prepared, label, || async { Ok(LiveOutput::value(value)) })
                        .await;
                }
                Some(ForkMatch::Matched(step)) if step.completed && step.seq >= at => {
                    // The source's intent, re-recorded as the fork's own: nothing runs.
                    let mut intent = input.template.clone();
                    intent.kind = EventType::Intent;
                    intent.key = intent_key;
                    intent.request_ref = step.request_ref;
                    intent.source = Source::Recorded;
                    intent.origin_seq = Some(step.seq);
                    self.take_inbound(&mut intent);
                    let (ticket, _) = self.append_stamped(intent, Vec::new(), None, None)?;
                    input.template.causal_parent = Some(ticket.acked().await?.seq);
                }
                Some(ForkMatch::Matched(step)) if step.completed => {
                    // The source's intent before the fork point, inherited: the completion that
                    // follows it (the fork's own) comes after it in the agent's clock and names
                    // it as its cause, as at record.
                    self.observe_inherited(&step);
                    input.template.causal_parent = Some(step.seq);
                }
                Some(ForkMatch::Matched(step)) => {
                    let source = self.session.source_run().unwrap_or_else(|| "SOURCE".into());
                    let d = Divergence::new(DivergenceCode::PendingIntent, self.id.clone())
                        .at(step.seq)
                        .step(label)
                        .detail("the source run logged this side effect's intent but not its completion")
                        .detail(format!(
                            "run `retrace resolve {source} {} --outcome @FILE | --not-executed`",
                            step.seq
                        ));
                    return Err(scheduler.diverge(d).into());
                }
                Some(_) => {}
            }
        }
        let kind = input.template.kind;
        let matched = scheduler.take_fork_step(&self.id, kind, probe.name.as_deref(), &prepared.key).await?;
        match matched {
            None => Err(self.mismatch(kind, &probe, &prepared, label)),
            Some(ForkMatch::Matched(step)) if step.seq < at => {
                if kind == EventType::ModelCall {
                    // Inherited, it counts as the source counted it (see `model_cache_key`).
                    self.model_cache_key(&prepared.key, true);
                }
                self.inherited(&step, label)
            }
            Some(ForkMatch::Matched(step)) => {
                let plan = inner.plan.clone().expect("forks have a plan");
                let raw = input.raw_request.is_some();
                let output = match plan.outputs.get(&step.seq).or(step.output_ref.as_ref()) {
                    Some(blob) => Some(self.stored_output(blob, label, raw)?),
                    None => None,
                };
                // A dry run's outcome served from the source is still a dry run's: stored as
                // such, a replay takes it without the intent a real side effect logs (QA15 D3).
                input.source = match step.source {
                    Source::DryRun => Source::DryRun,
                    _ => Source::Recorded,
                };
                input.origin_seq = Some(step.seq);
                let recorded = match (&step.error, output) {
                    (Some(e), _) if !plan.outputs.contains_key(&step.seq) => LiveOutput::error(e.clone()),
                    (_, Some(out)) => out,
                    (_, None) => LiveOutput::none(),
                };
                // The source's model answered it (unless the answer is an edit's): the same
                // pinned snapshot, so the fork's step doesn't read as an alias.
                let snapshot = step.snapshot.clone().filter(|_| !plan.outputs.contains_key(&step.seq));
                let recorded = recorded.snapshot(snapshot);
                self.record(input, prepared, label, || async { Ok(recorded) }).await
            }
            Some(ForkMatch::Changed(step)) => {
                let plan = inner.plan.clone().expect("forks have a plan");
                match plan.outputs.get(&step.seq) {
                    // The step's output was edited: the edit answers it, whatever else changed
                    // its request (a prompt edit, changed arguments), as it would have answered
                    // the step unchanged (QA15 D1: the edit was dropped and the step ran).
                    Some(blob) => {
                        let output = self.stored_output(blob, label, input.raw_request.is_some())?;
                        input.source = Source::Recorded;
                        input.origin_seq = Some(step.seq);
                        self.record(input, prepared, label, || async { Ok(output) }).await
                    }
                    None => self.fork_execute(input, prepared, label, live, Some(step.seq)).await,
                }
            }
            Some(ForkMatch::New) => self.fork_execute(input, prepared, label, live, None).await,
        }
    }

    /// The agent took `step` before the fork point: its clock passes the step's, and what it
    /// had heard before it was consumed by it.
    pub(crate) fn observe_inherited(&self, step: &RecordedStep) {
        let mut state = self.state.lock();
        state.clock.observe(step.lamport.saturating_sub(1));
        state.pending_inbound.clear();
    }

    /// A step before the fork point: the source's output, nothing stored.
    fn inherited(&self, step: &RecordedStep, label: &str) -> RuntimeResult<Recorded> {
        self.observe_inherited(step);
        if let Some(message) = &step.error {
            return Err(RuntimeError::StepFailed {
                agent: self.id.clone(),
                step: label.into(),
                message: message.clone(),
            });
        }
        let value = match &step.output_ref {
            Some(blob) => self.blob_value(blob, label)?,
            None => Value::Null,
        };
        Ok(Recorded {
            value,
            seq: step.seq,
            lamport: step.lamport,
            causal_parent: step.causal_parent,
            output_ref: step.output_ref,
        })
    }

    /// A changed or new step: dry run for side effects, else the caches, else live.
    async fn fork_execute<F, Fut>(
        &self,
        mut input: StepInput,
        prepared: Prepared,
        label: &str,
        live: F,
        origin: Option<u64>,
    ) -> RuntimeResult<Recorded>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = RuntimeResult<LiveOutput>>,
    {
        let inner = &self.session.inner;
        input.origin_seq = origin;
        let class = input.template.tool.as_ref().map(|t| t.class);
        if class == Some(ToolClass::SideEffect) {
            input.source = Source::DryRun;
            let tool = input.template.name.clone().unwrap_or_default();
            let args = input.request.clone();
            if input.program_dry_run {
                // `live` asks the program for its dry run; its outcome is the fork's output.
                return self.record(input, prepared, label, live).await;
            }
            return match input.dry_run.clone() {
                Some(dry_run) => {
                    let value = dry_run(&args);
                    self.record(input, prepared, label, || async { Ok(LiveOutput::value(value)) }).await
                }
                None => {
                    let message = format!("dry run: side effect {tool} was not executed");
                    let failed = self
                        .record(input, prepared, label, || async { Ok(LiveOutput::error(message)) })
                        .await;
                    match failed {
                        Err(RuntimeError::StepFailed { .. }) => Err(RuntimeError::DryRun { tool, args }),
                        Err(e) => Err(e),
                        Ok(_) => Err(RuntimeError::DryRun { tool, args }),
                    }
                }
            };
        }
        let cacheable = input.template.kind == EventType::ModelCall || class.is_some();
        if cacheable {
            // A model call's n-th identical call in this fork has the n-th cache entry (`record`
            // counts it once it runs).
            let cache_key = match input.template.kind {
                EventType::ModelCall => self.model_cache_key(&prepared.key, false),
                _ => prepared.key,
            };
            if let Some(entry) = inner.store.cache_get(&cache_key)? {
                if entry.usable_at(inner.clock.now_ms()) {
                    let out = self
                        .stored_output(&entry.output_ref, label, input.raw_request.is_some())?
                        .snapshot(entry.snapshot);
                    input.source = Source::CacheHit;
                    return self.record(input, prepared, label, || async { Ok(out) }).await;
                }
            }
        }
        input.source = Source::Live;
        self.record(input, prepared, label, live).await
    }

    /// A stored output as a step's output: its bytes as they are for a raw step (the proxy's
    /// documents), else the JSON value they hold.
    fn stored_output(
        &self,
        blob: &retrace_core::Digest,
        label: &str,
        raw: bool,
    ) -> RuntimeResult<LiveOutput> {
        if raw {
            return Ok(LiveOutput::raw(
                self.session.inner.for_program(self.session.inner.store.get_blob(blob)?)?,
            ));
        }
        Ok(LiveOutput::value(self.blob_value(blob, label)?))
    }

    fn blob_value(&self, blob: &retrace_core::Digest, label: &str) -> RuntimeResult<Value> {
        let bytes = self.session.inner.for_program(self.session.inner.store.get_blob(blob)?)?;
        serde_json::from_slice(&bytes).map_err(|e| RuntimeError::Decode {
            agent: self.id.clone(),
            step: label.into(),
            message: e.to_string(),
        })
    }
}
