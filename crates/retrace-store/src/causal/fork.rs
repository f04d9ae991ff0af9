//! `knew` of a step of a fork's own, from the store's indexes: what the agent heard in the
//! source before the fork point and what it heard in the fork since, each delivery with its
//! chain followed from the fork's events into the source's, never by reading the fork whole.
//!
//! A fork recorded here stores only its own events, from its fork point on; the events before
//! it are its source's, recursively for a fork of a fork ([`crate::export::EventCursor`] names
//! the stretch each stored run holds, as export reads them). The per-run indexes of a stored run
//! answer only for the events it stores, so the answer is put together stretch by stretch:
//!
//! - the first stretch (a run that stores its events from seq 1) answers as a recording does,
//!   with [`Store::heard_with_chains`] up to its last seq;
//! - each later stretch lists its own deliveries ([`crate::EventStore::delivery_heads_to`]) and
//!   reads their bodies from the stretch that holds each send
//!   ([`Store::request_blobs_at`]);
//! - their chains are followed a level at a time through the heads of each stretch
//!   ([`crate::EventStore::heads_at`]), highest stretch first; a link below a stretch goes on in
//!   the stretch that holds it, and the links reaching the first stretch are followed there
//!   ([`crate::EventStore::chain_heads`]).
//!
//! What it reads grows with the deliveries heard and the links of their chains, not with the
//! length of the fork or its source.
use crate::export::{EventCursor, Segment};
use crate::head::SeqMap;
use crate::{Chains, Store, StoreError, StoreResult};

use super::{assemble, decision_text, Knew, MAX_CHAIN};

/// [`super::knew`] of step `seq` of `run`, a fork whose own events start at its fork point
/// `at` (`seq >= at`): the deliveries to the step's agent before `seq`, stretch by stretch as
/// the module doc says, in seq order.
pub(super) fn knew_of_own_step(store: &dyn Store, run: &str, seq: u64) -> StoreResult<Knew> {
    let segments = EventCursor::new(store, run)?.segments().to_vec();
    let top = match segments.last() {
        Some(top) if top.from <= seq && seq <= top.to && top.run == run => top,
        last => {
            return Err(StoreError::not_found(format!(
                "run {run} has no event {seq} (its last seq is {})",
                last.map_or(0, |s| s.to)
            )))
        }
    };
    let step = store.event(&top.run, seq)?;
    let agent = step.agent_id.as_str();
    let (first, later) = segments.split_first().expect("the top segment");
    let (mut deliveries, mut chains) =
        store.heard_with_chains(&first.run, agent, before(first, seq), MAX_CHAIN)?;
    // The chains still to follow in each stretch: (seq, links left).
    let mut pending: Vec<Vec<(u64, usize)>> = vec![Vec::new(); segments.len()];
    for segment in later {
        let heads = store.delivery_heads_to(&segment.run, agent, before(segment, seq))?;
        let mut sends: Vec<u64> = heads.iter().filter_map(|d| d.causal_parent).collect();
        sends.sort_unstable();
        sends.dedup();
        let bodies = bodies(store, &segments, &sends)?;
        for send in &sends {
            pending[holder(&segments, *send)?].push((*send, MAX_CHAIN));
        }
        deliveries.extend(heads.into_iter().map(|d| {
            let body = d.causal_parent.and_then(|s| bodies.get(&s).cloned().flatten());
            (d, body)
        }));
    }
    for i in (1..segments.len()).rev() {
        let starts = std::mem::take(&mut pending[i]);
        for (below, left) in follow(store, &segments[i], starts, &mut chains)? {
            pending[holder(&segments[..i], below)?].push((below, left));
        }
    }
    // Links into the first stretch, most of them already on the chains of what was heard there.
    pending[0].retain(|(seq, left)| !on_chains(&chains, *seq, *left));
    if let Some(depth) = pending[0].iter().map(|(_, left)| *left).max() {
        let starts: Vec<u64> = pending[0].iter().map(|(s, _)| *s).collect();
        chains.extend(&store.chain_heads(&first.run, &starts, depth)?);
    }
    let heard = assemble(deliveries, &chains);
    let decision = decision_text(&step.decision);
    Ok(Knew {
        run: run.to_owned(),
        seq,
        agent: step.agent_id.clone(),
        label: super::knew_label(&step),
        decision,
        heard,
    })
}

/// Whether `chains` hold the chain from `seq` for `left` links, or to its origin.
fn on_chains(chains: &Chains, seq: u64, left: usize) -> bool {
    let mut link = Some(seq);
    for _ in 0..left {
        let Some(seq) = link else { return true };
        let Some(head) = chains.get(seq) else { return false };
        link = head.causal_parent;
    }
    true
}

/// The seq before which `segment` answers for a step at `seq`: past its last seq, or `seq`.
fn before(segment: &Segment, seq: u64) -> u64 {
    seq.min(segment.to.saturating_add(1))
}

/// The index of the stretch of `segments` that holds `seq`; `NotFound` when none does.
fn holder(segments: &[Segment], seq: u64) -> StoreResult<usize> {
    let i = segments.partition_point(|s| s.to < seq);
    match segments.get(i) {
        Some(s) if s.from <= seq => Ok(i),
        _ => Err(StoreError::not_found(format!(
            "a causal chain names seq {seq}, which no run of the fork's lineage holds"
        ))),
    }
}

/// The request blob of each of `sends` (in seq order), read from the stretch that holds it.
fn bodies(
    store: &dyn Store,
    segments: &[Segment],
    sends: &[u64],
) -> StoreResult<SeqMap<u64, Option<Vec<u8>>>> {
    let mut out = SeqMap::default();
    let mut rest = sends;
    while let Some(first) = rest.first() {
        let segment = &segments[holder(segments, *first)?];
        let n = rest.partition_point(|s| *s <= segment.to);
        let (here, next) = rest.split_at(n);
        out.extend(here.iter().copied().zip(store.request_blobs_at(&segment.run, here)?));
        rest = next;
    }
    Ok(out)
}

/// Follows the chains of `starts` (each with its links left) through the events `segment`
/// holds, a level at a time, adding their heads to `chains`; returns the links that go on
/// below the stretch, with their links left. A seq reached again with more links left is
/// followed again from its known head. (A parent above the stretch, in a malformed log, is not
/// followed.)
fn follow(
    store: &dyn Store,
    segment: &Segment,
    starts: Vec<(u64, usize)>,
    chains: &mut Chains,
) -> StoreResult<Vec<(u64, usize)>> {
    let mut followed: SeqMap<u64, usize> = SeqMap::default();
    let mut below = Vec::new();
    let mut frontier = starts;
    while !frontier.is_empty() {
        let mut wanted = Vec::new();
        let mut next = Vec::new();
        for (seq, left) in frontier.drain(..) {
            if left == 0 || seq > segment.to {
                continue;
            }
            if seq < segment.from {
                below.push((seq, left));
                continue;
            }
            let most = followed.entry(seq).or_insert(0);
            if *most >= left {
                continue;
            }
            let first_time = *most == 0;
            *most = left;
            match chains.get(seq) {
                Some(head) => next.extend(head.causal_parent.filter(|_| left > 1).map(|p| (p, left - 1))),
                None if first_time => wanted.push(seq),
                None => {}
            }
        }
        if !wanted.is_empty() {
            wanted.sort_unstable();
            for head in store.heads_at(&segment.run, &wanted)? {
                let left = followed.get(&head.seq).copied().unwrap_or(0);
                chains.insert(&head);
                next.extend(head.causal_parent.filter(|_| left > 1).map(|p| (p, left - 1)));
            }
        }
        frontier = next;
    }
    Ok(below)
}
