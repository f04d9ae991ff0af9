//! The autonomy policy at a side effect (SPEC §7 "Policy in replay"): evaluated only in record,
//! where a call by an agent below the bar is refused or held; holds, approvals and refusals are
//! `approval` events, which replay and fork reproduce from the log without reading the policy.
//!
//! An `approval` event has the side effect's name and tool, the key
//! `key(approval, name, version, "<step key>")`, `approval.outcome`, and as output
//! `{outcome, id?, rung, bar, why, by?, reason?}`. In record:
//! - at or above the bar: nothing is recorded, the call runs;
//! - `below = "refuse"`: `refused`, and the call fails with [`RuntimeError::NotPermitted`];
//! - `below = "hold"`: a pending approval is stored (the approvals table); the call blocks up to
//!   `approval_timeout_s` polling it, then records `approved` (and runs), `refused`, or
//!   `timed_out` and fails with [`RuntimeError::ApprovalRequired`]. Asked again later with the
//!   same request, the call finds its decision and records it. This process holds the run's
//!   lease, so it is the one that appends the event.
use std::collections::HashSet;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use retrace_core::envelope::{Approval, ApprovalOutcome};
use retrace_core::json::Json;
use retrace_core::{Digest, Event, EventType};
use retrace_store::ledger::ApprovalRecord;
use retrace_store::{BlobHint, BlobPut};
use serde_json::{json, Value};

use crate::agent::Agent;
use crate::error::{RuntimeError, RuntimeResult};
use crate::step::Prepared;

/// How often a held call looks for its decision.
const POLL: Duration = Duration::from_millis(50);

/// Approvals this session has already spent (each releases one call).
#[derive(Debug, Default)]
pub(crate) struct Spent(Mutex<HashSet<String>>);

impl Agent {
    /// The key of the `approval` event guarding the step keyed `step_key`.
    pub(crate) fn approval_key(&self, template: &Event, step_key: &Digest) -> RuntimeResult<Digest> {
        let version = template.tool.as_ref().map(|t| t.version.as_str());
        let request = Json::String(step_key.to_string());
        self.session.inner.keys.key(EventType::Approval, template.name.as_deref(), version, &request).map_err(
            |e| RuntimeError::NotCanonical { agent: self.id.clone(), step: template.label(), source: e },
        )
    }

    /// Record: applies the policy to a side effect about to run. `Ok` lets it run.
    pub(crate) async fn govern(&self, template: &Event, prepared: &Prepared) -> RuntimeResult<()> {
        let inner = &self.session.inner;
        let Some(governor) = inner.autonomy.clone() else { return Ok(()) };
        let key = self.approval_key(template, &prepared.key)?;
        let tool = template.name.clone().unwrap_or_default();
        let run = self.session.run_id();
        // A decision given since an earlier attempt of this same call, or its hold still pending.
        let mut pending = None;
        if let Some(record) = inner.store.approval_for(&run, &self.id, &key)? {
            if record.decision.is_some() && inner.spent.0.lock().insert(record.id.clone()) {
                return self.decided(template, key, &record).await;
            }
            if record.decision.is_none() {
                pending = Some(record.id);
            }
        }
        let local = inner.store.ledger_entries(Some(&governor.project))?;
        let standing = governor.standing_with(&self.id, local.iter().find(|e| e.agent == self.id));
        if standing.side_effects_allowed {
            return Ok(());
        }
        let mut detail = json!({
            "rung": standing.rung.as_str(), "bar": standing.bar, "why": standing.why,
        });
        if governor.policy.below == retrace_core::autonomy::Below::Refuse {
            detail["outcome"] = json!("refused");
            detail["by"] = json!("policy");
            self.append_approval(template, key, ApprovalOutcome::Refused, &detail)?;
            return Err(not_permitted(&self.id, &tool, &detail));
        }
        let id = match pending {
            Some(id) => id,
            None => self.hold(template, key, &standing)?,
        };
        let tool = template.name.clone().unwrap_or_default();
        let timeout = Duration::from_secs(governor.policy.approval_timeout_s);
        if !timeout.is_zero() {
            eprintln!(
                "retrace: side effect {tool} of agent {:?} is held for approval: retrace approve {id} --reason TEXT \
                 (waiting up to {}s)",
                self.id,
                timeout.as_secs()
            );
        }
        let began = Instant::now();
        while began.elapsed() < timeout {
            pause(POLL).await;
            if let Some(record) = inner.store.approval(&id)? {
                if record.decision.is_some() {
                    inner.spent.0.lock().insert(id.clone());
                    return self.decided(template, key, &record).await;
                }
            }
        }
        detail["outcome"] = json!("timed_out");
        detail["id"] = json!(id);
        self.append_approval(template, key, ApprovalOutcome::TimedOut, &detail)?;
        Err(approval_required(&self.id, &tool, &detail))
    }

    /// Stores a pending approval for this call; returns its id.
    fn hold(
        &self,
        template: &Event,
        key: Digest,
        standing: &retrace_core::autonomy::Standing,
    ) -> RuntimeResult<String> {
        let inner = &self.session.inner;
        let tool = template.name.clone().unwrap_or_default();
        let id = format!("ap_{:016x}", rand::random::<u64>());
        let record = ApprovalRecord {
            id: id.clone(),
            run: self.session.run_id(),
            agent: self.id.clone(),
            tool: tool.clone(),
            key,
            rung: standing.rung.as_str().into(),
            why: format!("{}; the bar is {}", standing.why, standing.bar),
            requested_at_ms: inner.clock.now_ms(),
            decision: None,
        };
        inner.store.approval_request(&record)?;
        Ok(id)
    }

    /// Records a person's decision; `Ok` when it released the call.
    async fn decided(&self, template: &Event, key: Digest, record: &ApprovalRecord) -> RuntimeResult<()> {
        let decision = record.decision.as_ref().expect("decided");
        let outcome = if decision.approved { ApprovalOutcome::Approved } else { ApprovalOutcome::Refused };
        let detail = json!({
            "outcome": if decision.approved { "approved" } else { "refused" },
            "id": record.id, "rung": record.rung, "why": record.why,
            "by": decision.by, "reason": decision.reason,
        });
        self.append_approval(template, key, outcome, &detail)?;
        match decision.approved {
            true => Ok(()),
            false => Err(not_permitted(&self.id, &record.tool, &detail)),
        }
    }

    /// Appends an `approval` event (acknowledged before the call goes on).
    fn append_approval(
        &self,
        template: &Event,
        key: Digest,
        outcome: ApprovalOutcome,
        detail: &Value,
    ) -> RuntimeResult<u64> {
        let inner = &self.session.inner;
        let mut event = template.clone();
        event.kind = EventType::Approval;
        event.key = key;
        event.approval = Some(Approval { outcome });
        event.causal_parent = None;
        let canonical = retrace_core::canonical::canonical_value(detail).expect("an approval is canonical");
        let output = BlobPut::new(inner.masker.mask_json(&canonical).bytes.into_owned(), BlobHint::Raw);
        event.output_ref = Some(output.digest());
        event.output_hash = Some(output.digest());
        let (ticket, _) = self.append_stamped(event, vec![output], None, None)?;
        Ok(ticket.wait()?.seq)
    }

    /// Replay and fork: the recorded `approval` of this call, if the recording holds one, taken
    /// and answered as recorded (today's policy is not read).
    pub(crate) async fn replay_approval(
        &self,
        template: &Event,
        prepared: &Prepared,
        label: &str,
    ) -> RuntimeResult<()> {
        let inner = &self.session.inner;
        let scheduler = inner.scheduler.clone().expect("replay has a scheduler");
        let key = self.approval_key(template, &prepared.key)?;
        if scheduler.log().peek(&self.id, &key).is_none() {
            return Ok(());
        }
        let output_ref = if inner.mode == crate::Mode::Fork {
            let at = scheduler.fork_at().unwrap_or(1);
            match scheduler
                .take_fork_step(&self.id, EventType::Approval, template.name.as_deref(), &key)
                .await?
            {
                Some(crate::fork_sched::ForkMatch::Matched(step)) => {
                    if step.seq >= at {
                        self.re_record_approval(template, key, &step)?;
                    } else {
                        // Inherited: the agent's clock moves past it, as for any inherited step
                        // (QA26 D2: its next own event repeated the approval's lamport).
                        self.observe_inherited(&step);
                    }
                    step.output_ref
                }
                _ => return Ok(()),
            }
        } else {
            let step = scheduler.take_step(&self.id, &key, label).await?;
            self.state.lock().clock.tick();
            step.and_then(|s| s.output_ref)
        };
        let Some(blob) = output_ref else { return Ok(()) };
        let detail: Value = serde_json::from_slice(&inner.store.get_blob(&blob)?).map_err(|e| {
            RuntimeError::Decode { agent: self.id.clone(), step: label.into(), message: e.to_string() }
        })?;
        let tool = template.name.clone().unwrap_or_default();
        match detail["outcome"].as_str() {
            Some("approved") => Ok(()),
            Some("timed_out") => Err(approval_required(&self.id, &tool, &detail)),
            _ => Err(not_permitted(&self.id, &tool, &detail)),
        }
    }

    /// A fork's own copy of a source `approval` event at or after the fork point.
    fn re_record_approval(
        &self,
        template: &Event,
        key: Digest,
        step: &crate::matcher::RecordedStep,
    ) -> RuntimeResult<()> {
        let mut event = template.clone();
        event.kind = EventType::Approval;
        event.key = key;
        event.causal_parent = None;
        event.output_ref = step.output_ref;
        event.output_hash = step.output_ref;
        event.source = retrace_core::Source::Recorded;
        event.origin_seq = Some(step.seq);
        let outcome = match step.output_ref.map(|b| self.session.inner.store.get_blob(&b)).transpose()? {
            Some(bytes) => serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| serde_json::from_value::<ApprovalOutcome>(v["outcome"].clone()).ok()),
            None => None,
        };
        event.approval = Some(Approval { outcome: outcome.unwrap_or(ApprovalOutcome::Refused) });
        let (ticket, _) = self.append_stamped(event, Vec::new(), None, None)?;
        ticket.wait()?;
        Ok(())
    }
}

fn text(detail: &Value, field: &str) -> String {
    detail[field].as_str().unwrap_or_default().to_owned()
}

fn not_permitted(agent: &str, tool: &str, detail: &Value) -> RuntimeError {
    RuntimeError::NotPermitted(Box::new(crate::error::Refusal {
        agent: agent.into(),
        tool: tool.into(),
        rung: text(detail, "rung"),
        bar: text(detail, "bar"),
        why: text(detail, "why"),
        by: text(detail, "by"),
        reason: text(detail, "reason"),
    }))
}

fn approval_required(agent: &str, tool: &str, detail: &Value) -> RuntimeError {
    RuntimeError::ApprovalRequired {
        id: text(detail, "id"),
        agent: agent.into(),
        tool: tool.into(),
        standing: match text(detail, "bar") {
            bar if bar.is_empty() => format!("rung {}: {}", text(detail, "rung"), text(detail, "why")),
            bar => format!("rung {}; the bar is {bar}", text(detail, "rung")),
        },
    }
}

/// Waits without holding a tokio worker where one is running the step.
async fn pause(d: Duration) {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::time::sleep(d).await,
        _ => std::thread::sleep(d),
    }
}
