//! [`EventHead`]: an event's place in the causal graph, what `retrace knew` follows and shows,
//! so that walking long causal chains reads a narrow index, not whole envelopes
//! ([`crate::EventStore::heads_at`]).
use std::collections::{HashMap, HashSet};

use retrace_core::envelope::MessageRef;
use retrace_core::{Event, EventType};

use crate::{EventStore, StoreResult};

/// An event's seq, agent, type, name and causal parent. Every field equals the event's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventHead {
    /// The event's seq.
    pub seq: u64,
    /// The agent that took the step.
    pub agent_id: String,
    /// What kind of step it is.
    pub kind: EventType,
    /// The step's name.
    pub name: Option<String>,
    /// The event this one acted on.
    pub causal_parent: Option<u64>,
}

impl EventHead {
    /// `send reviewer`, `model_call openai/chat.completions`... as [`Event::label`].
    pub fn label(&self) -> String {
        match &self.name {
            Some(name) => format!("{} {name}", self.kind),
            None => self.kind.to_string(),
        }
    }
}

impl From<&Event> for EventHead {
    fn from(e: &Event) -> EventHead {
        EventHead {
            seq: e.seq,
            agent_id: e.agent_id.clone(),
            kind: e.kind,
            name: e.name.clone(),
            causal_parent: e.causal_parent,
        }
    }
}

/// Every event on some causal chains, by seq, as [`EventStore::chain_heads`] answers: each
/// one's type, parent, and agent and name interned once (a run has few of them, and a long
/// walk meets each many times).
#[derive(Clone, Debug, Default)]
pub struct Chains {
    strings: Vec<String>,
    interned: HashMap<String, u32>,
    heads: SeqMap<u64, ChainHead>,
}

/// One event of [`Chains`]; `agent` and `name` index [`Chains::string`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainHead {
    /// What kind of step it is.
    pub kind: EventType,
    /// The agent that took the step.
    pub agent: u32,
    /// The step's name.
    pub name: Option<u32>,
    /// The event this one acted on.
    pub causal_parent: Option<u64>,
}

impl Chains {
    /// The id of `s` among this value's strings, adding it when new.
    pub fn intern(&mut self, s: &str) -> u32 {
        if let Some(id) = self.interned.get(s) {
            return *id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(s.to_owned());
        self.interned.insert(s.to_owned(), id);
        id
    }

    /// Chains of `heads` whose ids index `strings`.
    pub(crate) fn from_parts(strings: Vec<String>, heads: SeqMap<u64, ChainHead>) -> Chains {
        let interned = strings.iter().enumerate().map(|(i, s)| (s.clone(), i as u32)).collect();
        Chains { strings, interned, heads }
    }

    /// The string of `id` (from [`Chains::intern`]).
    pub fn string(&self, id: u32) -> &str {
        &self.strings[id as usize]
    }

    /// Adds `head` (or keeps the one already there: events never change).
    pub fn insert(&mut self, head: &EventHead) {
        let (agent, name) = (self.intern(&head.agent_id), head.name.as_deref().map(|n| self.intern(n)));
        let chain_head = ChainHead { kind: head.kind, agent, name, causal_parent: head.causal_parent };
        self.insert_interned(head.seq, chain_head);
    }

    /// Adds the head of `seq` whose strings are already interned.
    pub fn insert_interned(&mut self, seq: u64, head: ChainHead) {
        self.heads.entry(seq).or_insert(head);
    }

    /// Adds every head of `other` (keeping those already here: events never change).
    pub fn extend(&mut self, other: &Chains) {
        let ids: Vec<u32> = other.strings.iter().map(|s| self.intern(s)).collect();
        self.heads.reserve(other.heads.len());
        for (seq, h) in &other.heads {
            let head =
                ChainHead { agent: ids[h.agent as usize], name: h.name.map(|n| ids[n as usize]), ..*h };
            self.insert_interned(*seq, head);
        }
    }

    /// The head of `seq`, if it is on the chains.
    pub fn get(&self, seq: u64) -> Option<&ChainHead> {
        self.heads.get(&seq)
    }

    /// Whether `seq` is on the chains.
    pub fn contains(&self, seq: u64) -> bool {
        self.heads.contains_key(&seq)
    }

    /// How many events the chains hold.
    pub fn len(&self) -> usize {
        self.heads.len()
    }

    /// Whether they hold none.
    pub fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }

    /// Every head, as [`EventHead`]s in seq order (for tests and comparisons).
    pub fn heads(&self) -> Vec<EventHead> {
        let mut seqs: Vec<u64> = self.heads.keys().copied().collect();
        seqs.sort_unstable();
        seqs.iter()
            .map(|s| {
                let h = self.heads[s];
                EventHead {
                    seq: *s,
                    agent_id: self.string(h.agent).to_owned(),
                    kind: h.kind,
                    name: h.name.map(|n| self.string(n).to_owned()),
                    causal_parent: h.causal_parent,
                }
            })
            .collect()
    }
}

/// [`EventStore::chain_heads`] a level at a time: each level's unseen parents in one
/// [`EventStore::heads_at`], added to `chains`.
pub fn chain_heads_by_level(
    store: &(impl EventStore + ?Sized),
    run: &str,
    starts: &[u64],
    depth: usize,
    chains: &mut Chains,
) -> StoreResult<()> {
    // Its own record of what it followed, not `chains`: a seq already there may have been
    // reached with fewer links left than it has here.
    let mut seen: SeqSet<u64> = SeqSet::default();
    let mut frontier: Vec<u64> = starts.to_vec();
    for _ in 0..depth {
        frontier.retain(|s| !seen.contains(s));
        frontier.sort_unstable();
        frontier.dedup();
        if frontier.is_empty() {
            break;
        }
        let level = store.heads_at(run, &frontier)?;
        frontier.clear();
        for h in level {
            frontier.extend(h.causal_parent);
            seen.insert(h.seq);
            chains.insert(&h);
        }
    }
    Ok(())
}

/// A delivery as `retrace knew` lists it: its seq, the send it delivered and the message's
/// envelope. Every field equals the `deliver` event's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryHead {
    /// The `deliver` event's seq.
    pub seq: u64,
    /// The send it delivered (None for a recorded timeout).
    pub causal_parent: Option<u64>,
    /// The message's envelope.
    pub message: Option<MessageRef>,
}

impl From<&Event> for DeliveryHead {
    fn from(e: &Event) -> DeliveryHead {
        DeliveryHead { seq: e.seq, causal_parent: e.causal_parent, message: e.message.clone() }
    }
}

/// A map keyed by seq (or another integer id) with a multiply-fold hash instead of SipHash:
/// seqs come from the store, not from an adversary, and walking long chains hashes each one
/// several times. Digests, which a trace file chooses, use the keyed
/// [`retrace_core::digest_map`] instead.
pub(crate) type SeqMap<K, V> = std::collections::HashMap<K, V, BuildSeqHasher>;

/// A set of seqs, hashed as [`SeqMap`]'s keys.
pub(crate) type SeqSet<K> = HashSet<K, BuildSeqHasher>;

/// Builds [`SeqHasher`]s.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BuildSeqHasher;

impl std::hash::BuildHasher for BuildSeqHasher {
    type Hasher = SeqHasher;
    fn build_hasher(&self) -> SeqHasher {
        SeqHasher(0)
    }
}

/// Hashes integers by a 64×64→128-bit multiply folded to 64 bits (mixes into high and low bits).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SeqHasher(u64);

impl std::hash::Hasher for SeqHasher {
    fn finish(&self) -> u64 {
        let m = u128::from(self.0) * 0x9e37_79b9_7f4a_7c15;
        (m as u64) ^ ((m >> 64) as u64)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = self.0.rotate_left(32) ^ n;
    }
    fn write_i64(&mut self, n: i64) {
        self.write_u64(n as u64);
    }
}
