//! Causal queries: what an agent knew when it acted (`retrace knew RUN SEQ`): the messages
//! delivered to it before that step, in the order heard, each with its causal chain back to its
//! origin. Answered from [`Store::heard_with_chains`]: the deliveries and their messages' bodies
//! (SQLite: one table clustered by receiving agent, each row naming its body's blob by row id
//! and holding its send's head) and the chains (SQLite: through the rows of the agents on them
//! while they alternate a send and a delivery to its sender, else packed head blocks, a row per
//! 256 seqs), never by scanning the run.

use std::sync::Arc;

use retrace_core::EventType;
use serde::Serialize;
use serde_json::Value;

use crate::head::SeqMap;
use crate::{Chains, Store, StoreResult};

/// Longest causal chain followed (a guard against malformed logs).
pub const MAX_CHAIN: usize = 256;

/// One link of a causal chain. Its strings are shared: a run has few agents and labels, and an
/// answer may hold tens of thousands of links.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Link {
    /// The event's seq.
    pub seq: u64,
    /// Its agent.
    #[serde(serialize_with = "shared_str")]
    pub agent: Arc<str>,
    /// `send reviewer`, `model_call openai/chat.completions`...
    #[serde(serialize_with = "shared_str")]
    pub label: Arc<str>,
}

/// Serializes a shared string as the string.
fn shared_str<S: serde::Serializer>(s: &Arc<str>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(s)
}

/// A message the agent had heard.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Heard {
    /// The `deliver` event.
    pub deliver_seq: u64,
    /// The `send` it delivered (None for a recorded timeout).
    pub send_seq: Option<u64>,
    /// Sender.
    pub from: Option<String>,
    /// Message kind.
    pub kind: Option<String>,
    /// The body, from the send's request.
    pub body: Option<Value>,
    /// The send and its causes, back to an event with no causal parent.
    pub chain: Vec<Link>,
}

/// What an agent knew when it took a step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Knew {
    /// The run.
    pub run: String,
    /// The step asked about.
    pub seq: u64,
    /// Its agent.
    pub agent: String,
    /// Its label.
    pub label: String,
    /// The decision it took, if it was one (`approve step:backfill_users`).
    pub decision: Option<String>,
    /// Messages delivered to the agent before `seq`, in the order heard.
    pub heard: Vec<Heard>,
}

/// What the agent of event `seq` of `run` knew when it acted. Reads one snapshot of the store.
pub fn knew(store: &dyn Store, run: &str, seq: u64) -> StoreResult<Knew> {
    let mut result = None;
    store.with_snapshot(&mut || result = Some(knew_inner(store, run, seq)));
    result.expect("with_snapshot runs its function")
}

fn knew_inner(store: &dyn Store, run: &str, seq: u64) -> StoreResult<Knew> {
    let step = store.event(run, seq)?;
    let (deliveries, chains) = store.heard_with_chains(run, &step.agent_id, seq, MAX_CHAIN)?;
    let mut links = Links::new(&chains);
    let mut heard = Vec::with_capacity(deliveries.len());
    // Only a send's request holds a message body.
    let is_send = |s: &u64| chains.get(*s).is_some_and(|h| h.kind == EventType::Send);
    for (d, request) in deliveries {
        let (from, kind) = d.message.map_or((None, None), |m| (m.from, m.kind));
        let body = d.causal_parent.filter(is_send).and_then(|_| message_body(&request?));
        heard.push(Heard {
            deliver_seq: d.seq,
            send_seq: d.causal_parent,
            from,
            kind,
            body,
            chain: d.causal_parent.map(|s| links.chain_from(s)).unwrap_or_default(),
        });
    }
    let decision = step.decision.as_ref().map(|d| match &d.target {
        Some(t) => format!("{} {t}", d.action),
        None => d.action.clone(),
    });
    Ok(Knew { run: run.to_owned(), seq, agent: step.agent_id.clone(), label: step.label(), decision, heard })
}

/// Builds [`Link`]s from [`Chains`], each agent's name and each distinct label made once and
/// shared by every link that shows it.
struct Links<'a> {
    chains: &'a Chains,
    /// String id → the agent of that name.
    agents: Vec<Option<Arc<str>>>,
    /// `(type code << 32) | name id + 1` → label.
    labels: SeqMap<u64, Arc<str>>,
}

impl<'a> Links<'a> {
    fn new(chains: &'a Chains) -> Links<'a> {
        Links { chains, agents: Vec::new(), labels: SeqMap::default() }
    }

    /// The chain from `start` back to its origin, at most [`MAX_CHAIN`] links.
    fn chain_from(&mut self, start: u64) -> Vec<Link> {
        let chains = self.chains;
        let mut out = Vec::new();
        let mut cur = Some(start);
        while let Some(seq) = cur {
            let Some(h) = chains.get(seq) else { break };
            let key = (u64::from(h.kind.code()) << 32) | h.name.map_or(0, |n| u64::from(n) + 1);
            let label = self.labels.entry(key).or_insert_with(|| match h.name {
                Some(n) => format!("{} {}", h.kind, chains.string(n)).into(),
                None => h.kind.to_string().into(),
            });
            let label = label.clone();
            let id = h.agent as usize;
            if self.agents.len() <= id {
                self.agents.resize(id + 1, None);
            }
            let agent = self.agents[id].get_or_insert_with(|| chains.string(h.agent).into()).clone();
            out.push(Link { seq, agent, label });
            if out.len() >= MAX_CHAIN {
                break;
            }
            cur = h.causal_parent;
        }
        out
    }
}

/// The `body` member of a send's request.
fn message_body(request: &[u8]) -> Option<Value> {
    #[derive(serde::Deserialize)]
    struct Request {
        body: Option<Value>,
    }
    serde_json::from_slice::<Request>(request).ok()?.body
}

/// Renders `knew` for a terminal.
pub fn render(k: &Knew) -> String {
    let mut out = String::new();
    let acted = match &k.decision {
        Some(d) => format!("{} ({d})", k.label),
        None => k.label.clone(),
    };
    out.push_str(&format!(
        "{} had heard {} message(s) when it acted at seq {}: {acted}\n",
        k.agent,
        k.heard.len(),
        k.seq
    ));
    for (i, h) in k.heard.iter().enumerate() {
        match (&h.from, h.send_seq) {
            (Some(from), Some(send)) => out.push_str(&format!(
                "  {}. seq {:>5}  {} from {from} (sent at seq {send})\n",
                i + 1,
                h.deliver_seq,
                h.kind.as_deref().unwrap_or("message")
            )),
            _ => out.push_str(&format!("  {}. seq {:>5}  recv timed out\n", i + 1, h.deliver_seq)),
        }
        if let Some(body) = &h.body {
            let text = body.to_string();
            let short: String = text.chars().take(100).collect();
            out.push_str(&format!(
                "       body: {short}{}\n",
                if text.len() > short.len() { "…" } else { "" }
            ));
        }
        if !h.chain.is_empty() {
            let links: Vec<String> =
                h.chain.iter().map(|l| format!("seq {} {} {}", l.seq, l.agent, l.label)).collect();
            out.push_str(&format!("       chain: {} (origin)\n", links.join(" ← ")));
        }
    }
    out
}
