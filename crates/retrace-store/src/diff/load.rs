//! A run's steps as the diff needs them: read page by page as [`EventSummary`]s (digests and
//! counters, not whole envelopes), kept in about 200 bytes each.
use std::collections::HashMap;

use retrace_core::envelope::Usage;
use retrace_core::run::RunMeta;
use retrace_core::{Digest, EventType, Source};

use crate::export::{RunEvents, PAGE};
use crate::{EventSummary, Store, StoreError, StoreResult};

/// Agent and step names as small integers, shared by both runs so that they compare.
#[derive(Debug, Default)]
pub(super) struct Names {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

impl Names {
    pub(super) fn id(&mut self, name: &str) -> u32 {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), id);
        id
    }

    pub(super) fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }
}

/// What the diff keeps of one event.
#[derive(Debug)]
pub(super) struct Step {
    pub(super) seq: u64,
    pub(super) agent: u32,
    pub(super) kind: EventType,
    /// The step's name, if any.
    pub(super) name: Option<u32>,
    /// What a timeline calls it ([`EventSummary::label`]).
    pub(super) label: u32,
    /// A delivery's send.
    pub(super) causal_parent: Option<u64>,
    pub(super) key: Digest,
    pub(super) request_ref: Option<Digest>,
    pub(super) output_ref: Option<Digest>,
    pub(super) output_hash: Option<Digest>,
    pub(super) source: Source,
    pub(super) origin_seq: Option<u64>,
    pub(super) usage: Option<Usage>,
    /// Why the step failed, if it did.
    pub(super) error: Option<String>,
}

impl Step {
    /// `model_call gpt-4o`, as `retrace show` names the step ([`EventSummary::label`]).
    pub(super) fn label(&self, names: &Names) -> String {
        names.name(self.label).to_owned()
    }

    /// The same step: the same request (equal keys), the same output (equal output hashes,
    /// or none on either side) and the same failure, if any (QA25 D1: two different errors
    /// read as the same step). A step asked differently is changed even where the answer
    /// came out the same: the request diff shows what it was asked.
    pub(super) fn same_as(&self, other: &Step) -> bool {
        self.key == other.key
            && self.error == other.error
            && match (self.output_hash, other.output_hash) {
                (Some(a), Some(b)) => a == b,
                (None, None) => self.output_ref == other.output_ref,
                _ => false,
            }
    }
}

/// A decision event: who, on what, which action.
#[derive(Debug)]
pub(super) struct DecisionStep {
    pub(super) seq: u64,
    pub(super) agent: u32,
    pub(super) target: Option<String>,
    pub(super) action: String,
}

/// One run's steps from `first` on (dense), and its decisions.
#[derive(Debug)]
pub(super) struct Loaded {
    pub(super) meta: RunMeta,
    /// How many events the run has, inherited ones included.
    pub(super) count: u64,
    /// The seq of `steps[0]`.
    pub(super) first: u64,
    pub(super) steps: Vec<Step>,
    pub(super) decisions: Vec<DecisionStep>,
}

impl Loaded {
    /// The step at `seq`, if loaded.
    pub(super) fn step(&self, seq: u64) -> Option<&Step> {
        let index = seq.checked_sub(self.first)?;
        self.steps.get(usize::try_from(index).ok()?)
    }

    /// The seq from which the run's events are its own (a fork's `fork_at`, else 1).
    pub(super) fn own_from(&self) -> u64 {
        match (&self.meta.source_run, self.meta.fork_at) {
            (Some(_), Some(at)) => at,
            _ => 1,
        }
    }
}

/// Reads `meta`'s events from seq `first` on (a fork's inherited ones included), as summaries.
pub(super) fn load(store: &dyn Store, meta: RunMeta, first: u64, names: &mut Names) -> StoreResult<Loaded> {
    let segments = RunEvents::new(store, &meta.id)?.segments().to_vec();
    let count = segments.last().map_or(0, |s| s.to);
    let mut loaded = Loaded {
        meta,
        count,
        first,
        steps: Vec::with_capacity(count.saturating_sub(first.saturating_sub(1)) as usize),
        decisions: Vec::new(),
    };
    for segment in segments.iter().filter(|s| s.to >= first) {
        let mut next = segment.from.max(first);
        while next <= segment.to {
            let want = usize::try_from(segment.to - next + 1).unwrap_or(PAGE).min(PAGE);
            let page = store.summaries(&segment.run, next, want)?;
            if page.is_empty() {
                return Err(StoreError::corrupt(format!(
                    "run {} holds no events from seq {next} though its last seq is {}",
                    segment.run, segment.to
                )));
            }
            for event in page {
                if event.seq != loaded.first + loaded.steps.len() as u64 {
                    return Err(StoreError::corrupt(format!(
                        "run {}: seq {} comes where seq {} should (seqs must be dense)",
                        loaded.meta.id,
                        event.seq,
                        loaded.first + loaded.steps.len() as u64
                    )));
                }
                next = event.seq + 1;
                loaded.push(event, names);
            }
        }
    }
    Ok(loaded)
}

impl Loaded {
    fn push(&mut self, event: EventSummary, names: &mut Names) {
        let agent = names.id(&event.agent_id);
        let label = names.id(&event.label());
        if let Some(decision) = event.decision {
            let (target, action) = (decision.target, decision.action);
            self.decisions.push(DecisionStep { seq: event.seq, agent, target, action });
        }
        self.steps.push(Step {
            seq: event.seq,
            agent,
            kind: event.kind,
            name: event.name.as_deref().map(|n| names.id(n)),
            label,
            causal_parent: event.causal_parent,
            key: event.key,
            request_ref: event.request_ref,
            output_ref: event.output_ref,
            output_hash: event.output_hash,
            source: event.source,
            origin_seq: event.origin_seq,
            usage: event.usage,
            error: event.error,
        });
    }
}
