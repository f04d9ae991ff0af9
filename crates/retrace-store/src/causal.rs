//! Causal queries: what an agent knew when it acted (`retrace knew RUN SEQ`): the messages
//! delivered to it before that step, in the order heard, each with its causal chain back to its
//! origin. Answered from the deliveries index and batched lookups, never by scanning the run.
use std::collections::HashMap;

use retrace_core::{Event, EventType};
use serde::Serialize;
use serde_json::Value;

use crate::{Store, StoreResult};

/// Longest causal chain followed (a guard against malformed logs).
pub const MAX_CHAIN: usize = 256;

/// One link of a causal chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Link {
    /// The event's seq.
    pub seq: u64,
    /// Its agent.
    pub agent: String,
    /// `send reviewer`, `model_call openai/chat.completions`...
    pub label: String,
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

/// What the agent of event `seq` of `run` knew when it acted.
pub fn knew(store: &dyn Store, run: &str, seq: u64) -> StoreResult<Knew> {
    let step = store.event(run, seq)?;
    let deliveries = store.deliveries_to(run, &step.agent_id, seq)?;
    let sends: Vec<u64> = deliveries.iter().filter_map(|d| d.causal_parent).collect();
    let chains = chains(store, run, &sends)?;
    let mut heard = Vec::with_capacity(deliveries.len());
    for d in &deliveries {
        let message = d.message.as_ref();
        let body = match d.causal_parent {
            Some(s) => chains.get(&s).and_then(|c| c.1.clone()),
            None => None,
        };
        heard.push(Heard {
            deliver_seq: d.seq,
            send_seq: d.causal_parent,
            from: message.and_then(|m| m.from.clone()),
            kind: message.and_then(|m| m.kind.clone()),
            body,
            chain: d.causal_parent.map(|s| chain_from(&chains, s)).unwrap_or_default(),
        });
    }
    let decision = step.decision.as_ref().map(|d| match &d.target {
        Some(t) => format!("{} {t}", d.action),
        None => d.action.clone(),
    });
    Ok(Knew { run: run.to_owned(), seq, agent: step.agent_id.clone(), label: step.label(), decision, heard })
}

type Node = (Link, Option<Value>, Option<u64>);

/// Every event on the causal chains of `starts`, fetched level by level in batches.
fn chains(store: &dyn Store, run: &str, starts: &[u64]) -> StoreResult<HashMap<u64, Node>> {
    let mut nodes: HashMap<u64, Node> = HashMap::new();
    let mut frontier: Vec<u64> = starts.to_vec();
    for _ in 0..MAX_CHAIN {
        frontier.retain(|s| !nodes.contains_key(s));
        frontier.sort_unstable();
        frontier.dedup();
        if frontier.is_empty() {
            break;
        }
        let events = store.events_at(run, &frontier)?;
        let mut next = Vec::new();
        for e in events {
            let body = if e.kind == EventType::Send && starts.contains(&e.seq) {
                send_body(store, &e)
            } else {
                None
            };
            if let Some(p) = e.causal_parent {
                next.push(p);
            }
            nodes.insert(
                e.seq,
                (Link { seq: e.seq, agent: e.agent_id.clone(), label: e.label() }, body, e.causal_parent),
            );
        }
        frontier = next;
    }
    Ok(nodes)
}

fn chain_from(nodes: &HashMap<u64, Node>, start: u64) -> Vec<Link> {
    let mut out = Vec::new();
    let mut cur = Some(start);
    while let Some(seq) = cur {
        let Some((link, _, parent)) = nodes.get(&seq) else { break };
        out.push(link.clone());
        if out.len() >= MAX_CHAIN {
            break;
        }
        cur = *parent;
    }
    out
}

fn send_body(store: &dyn Store, send: &Event) -> Option<Value> {
    let bytes = store.get_blob(&send.request_ref?).ok()?;
    let request: Value = serde_json::from_slice(&bytes).ok()?;
    request.get("body").cloned()
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
