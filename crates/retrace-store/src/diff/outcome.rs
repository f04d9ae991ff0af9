//! What each run cost and which decisions moved: the parts of a [`RunDiff`](super::RunDiff)
//! that look at one run at a time.
use std::collections::BTreeMap;

use retrace_core::Source;

use super::load::{Loaded, Names};
use super::{MovedDecision, RunSide, Tokens, Which};

/// `run` as reported; `fork_at` is set when `run` is the fork of `other` (then it has savings).
pub(super) fn side(run: &Loaded, other: &Loaded, fork_at: Option<u64>) -> RunSide {
    let own_from = run.own_from();
    let mut live = Tokens::default();
    for step in run.steps.iter().filter(|s| s.seq >= own_from && s.source == Source::Live) {
        match &step.usage {
            Some(usage) => live.add(usage),
            None if step.kind == retrace_core::EventType::ModelCall => live.add_unmetered(),
            None => {}
        }
    }
    let source_live =
        |seq: u64| other.step(seq).filter(|s| s.source == Source::Live).and_then(|s| s.usage.as_ref());
    let (saved, inherited) = match fork_at {
        None => (None, None),
        Some(at) => {
            let (mut saved, mut inherited) = (Tokens::default(), Tokens::default());
            for step in run.steps.iter().filter(|s| matches!(s.source, Source::Recorded | Source::CacheHit)) {
                // An origin before the fork point is inherited, counted below.
                if let Some(usage) = step.origin_seq.filter(|o| *o >= at).and_then(source_live) {
                    saved.add(usage);
                }
            }
            for usage in (1..at).filter_map(source_live) {
                inherited.add(usage);
            }
            (Some(saved), Some(inherited))
        }
    };
    let meta = &run.meta;
    RunSide {
        id: meta.id.clone(),
        name: meta.name.clone(),
        mode: meta.mode,
        status: meta.status,
        started_at_ms: meta.started_at_ms,
        events: run.count,
        source_run: meta.source_run.clone(),
        fork_at: meta.fork_at,
        edits: meta.edits.clone(),
        live,
        saved,
        inherited,
    }
}

/// The decisions that stand differently at the end of A and B, by agent and target. A fork
/// loaded from its fork point starts from its source's decisions before it.
pub(super) fn moved_decisions(
    a: &Loaded,
    b: &Loaded,
    fork_at: Option<u64>,
    source: Which,
    names: &Names,
) -> Vec<MovedDecision> {
    type Finals = BTreeMap<(String, Option<String>), String>;
    let finals = |run: &Loaded, inherited_from: Option<&Loaded>| -> Finals {
        let inherited = inherited_from.into_iter().flat_map(|s| &s.decisions);
        let before = fork_at.unwrap_or(1);
        let inherited = inherited.filter(|d| d.seq < before);
        let all = inherited.chain(run.decisions.iter().filter(|d| d.seq >= run.first));
        all.map(|d| ((names.name(d.agent).to_owned(), d.target.clone()), d.action.clone())).collect()
    };
    let (finals_a, finals_b) = match (fork_at, source) {
        (Some(_), Which::A) => (finals(a, None), finals(b, Some(a))),
        (Some(_), Which::B) => (finals(a, Some(b)), finals(b, None)),
        (None, _) => (finals(a, None), finals(b, None)),
    };
    let mut keys: Vec<&(String, Option<String>)> = finals_a.keys().chain(finals_b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| finals_a.get(*k) != finals_b.get(*k))
        .map(|k| MovedDecision {
            agent: k.0.clone(),
            target: k.1.clone(),
            a: finals_a.get(k).cloned(),
            b: finals_b.get(k).cloned(),
        })
        .collect()
}
