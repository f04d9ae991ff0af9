//! Which step of one run corresponds to which step of the other.
//!
//! - A fork and its source: by the fork's `origin_seq` ([`by_origin`]).
//! - Any other two runs: the pairing rule of SPEC §7 with the older run as source
//!   ([`by_pairing`]).
use std::collections::{HashMap, VecDeque};

use retrace_core::{Digest, EventType};

use super::load::Loaded;

/// The alignment of a source run (`source`) and another run (`other`), in seqs.
#[derive(Debug, Default)]
pub(super) struct Aligned {
    /// `(source seq, other seq)` of each pair of corresponding steps, in the other run's order.
    pub(super) pairs: Vec<(u64, u64)>,
    /// Source steps nothing corresponds to.
    pub(super) only_source: Vec<u64>,
    /// The other run's steps nothing corresponds to.
    pub(super) only_other: Vec<u64>,
    /// Source steps `1..=inherited` that a fork inherits: the same steps in both runs.
    pub(super) inherited: u64,
}

/// A fork (`fork`, loaded from `at`) against its source (loaded whole): the source's events
/// before `at` are inherited; each fork step pairs with the source step its `origin_seq` names,
/// or is only in the fork when it names none (or a source step before `at`, or one already
/// paired, or none that exists); source steps from `at` on that no fork step names are only in
/// the source.
pub(super) fn by_origin(source: &Loaded, fork: &Loaded, at: u64) -> Aligned {
    let count = source.steps.len() as u64;
    let mut aligned = Aligned { inherited: at.saturating_sub(1).min(count), ..Aligned::default() };
    let mut claimed = vec![false; source.steps.len()];
    for step in &fork.steps {
        match step.origin_seq.filter(|o| *o >= at && *o <= count) {
            Some(origin) if !claimed[origin as usize - 1] => {
                claimed[origin as usize - 1] = true;
                aligned.pairs.push((origin, step.seq));
            }
            _ => aligned.only_other.push(step.seq),
        }
    }
    let from = aligned.inherited as usize;
    aligned.only_source =
        (from..source.steps.len()).filter(|i| !claimed[*i]).map(|i| source.steps[i].seq).collect();
    aligned
}

/// Two runs by the pairing rule, `older` as source (both loaded whole). Per agent: each step of
/// the newer run takes the older run's earliest unpaired step with the same key; then each
/// newer step still unpaired takes the older run's earliest unpaired step of the same type and
/// name; what remains is only in one run. Deliveries pair per agent in order among deliveries.
pub(super) fn by_pairing(older: &Loaded, newer: &Loaded) -> Aligned {
    let mut aligned = Aligned::default();
    let mut taken = vec![false; older.steps.len()];
    let mut unpaired: Vec<usize> = Vec::new();

    let mut by_key: HashMap<(u32, Digest), VecDeque<usize>> = HashMap::new();
    let mut deliveries: HashMap<u32, VecDeque<usize>> = HashMap::new();
    for (i, step) in older.steps.iter().enumerate() {
        match step.kind {
            EventType::Deliver => deliveries.entry(step.agent).or_default().push_back(i),
            _ => by_key.entry((step.agent, step.key)).or_default().push_back(i),
        }
    }
    let pair = |aligned: &mut Aligned, taken: &mut [bool], i: usize, seq: u64| {
        taken[i] = true;
        aligned.pairs.push((older.steps[i].seq, seq));
    };
    for (j, step) in newer.steps.iter().enumerate() {
        let queue = match step.kind {
            EventType::Deliver => deliveries.get_mut(&step.agent),
            _ => by_key.get_mut(&(step.agent, step.key)),
        };
        match queue.and_then(VecDeque::pop_front) {
            Some(i) => pair(&mut aligned, &mut taken, i, step.seq),
            None if step.kind == EventType::Deliver => aligned.only_other.push(step.seq),
            None => unpaired.push(j),
        }
    }

    let mut by_name: HashMap<(u32, EventType, Option<u32>), VecDeque<usize>> = HashMap::new();
    for (i, step) in older.steps.iter().enumerate() {
        if !taken[i] && step.kind != EventType::Deliver {
            by_name.entry((step.agent, step.kind, step.name)).or_default().push_back(i);
        }
    }
    for j in unpaired {
        let step = &newer.steps[j];
        match by_name.get_mut(&(step.agent, step.kind, step.name)).and_then(VecDeque::pop_front) {
            Some(i) => pair(&mut aligned, &mut taken, i, step.seq),
            None => aligned.only_other.push(step.seq),
        }
    }
    aligned.only_source = (0..older.steps.len()).filter(|i| !taken[*i]).map(|i| older.steps[i].seq).collect();
    aligned.only_other.sort_unstable();
    aligned
}
