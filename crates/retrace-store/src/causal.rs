//! Causal queries: what an agent knew when it acted (`retrace knew RUN SEQ`): the messages
//! delivered to it before that step, in the order heard, each with its causal chain back to its
//! origin. Answered from [`Store::heard_with_chains`]: the deliveries and their messages' bodies
//! (SQLite: one table clustered by receiving agent, each row naming its body's blob by row id
//! and holding its send's head) and the chains (SQLite: through the rows of the agents on them
//! while they alternate a send and a delivery to its sender, else packed head blocks, a row per
//! 256 seqs), never by scanning the run; SQLite reads the head blocks on a thread of their own
//! while it reads the bodies. The answer (bodies parsed, chains turned into links) is built in
//! parts on a few threads when it is long.
//!
//! In a fork that inherits its source's events by reference, an inherited step knew what it
//! knew in the source; a step of the fork's own is answered stretch by stretch from the indexes
//! of the fork and of its sources (`causal/fork.rs`): what the agent heard in the source before
//! the fork point as a recording answers it, then the fork's own deliveries, their chains
//! followed from the fork's events into the source's. No step of a fork is answered by reading
//! its events.

mod fork;

use std::sync::Arc;

use retrace_core::terminal::{count, one_line};
use retrace_core::EventType;
use serde::Serialize;
use serde_json::Value;

use crate::head::SeqMap;
use crate::{Chains, DeliveryHead, Store, StoreResult};

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
    /// `send -> reviewer`, `deliver <- planner`, `model_call openai/chat.completions`...
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
    /// The send and its causes, back to an event with no causal parent, or [`MAX_CHAIN`] links.
    pub chain: Vec<Link>,
    /// Whether `chain` stops at [`MAX_CHAIN`] links short of its origin.
    pub chain_cut: bool,
    /// A recorded `recv` timeout, not a message: nothing was heard.
    pub timed_out: bool,
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
    let meta = store.run(run)?;
    if let (Some(source), Some(at)) = (&meta.source_run, meta.fork_at) {
        // A fork imported with the events it inherits holds them, and their indexes, itself: it
        // is read as a whole run, its source need not be stored (QA22 D4). Seq 0 is nobody's.
        let whole = seq == 0 || crate::export::holds_inherited(store, &meta)?;
        if meta.mode == retrace_core::run::RunMode::Fork && !whole {
            return knew_in_fork(store, run, source, at, seq);
        }
    }
    let step = store.event(run, seq)?;
    let (deliveries, chains) = store.heard_with_chains(run, &step.agent_id, seq, MAX_CHAIN)?;
    let heard = assemble(deliveries, &chains);
    let decision = decision_text(&step.decision);
    Ok(Knew {
        run: run.to_owned(),
        seq,
        agent: step.agent_id.clone(),
        label: knew_label(&step),
        decision,
        heard,
    })
}

/// The acting step's name in a [`Knew`]: as `retrace show` names it; a decision's action
/// follows in its own words ([`decision_text`]), so a decision is named by its type alone.
pub(crate) fn knew_label(step: &retrace_core::Event) -> String {
    match step.decision {
        Some(_) => step.label(),
        None => retrace_core::label::of_event(step),
    }
}

/// [`knew`] in a fork: an inherited step (before the fork point `at`) knew what it knew in the
/// source; a step of the fork's own heard what its agent heard in the source before `at` and in
/// the fork since, answered from the indexes of the fork and of its sources (`causal/fork.rs`).
fn knew_in_fork(store: &dyn Store, run: &str, source: &str, at: u64, seq: u64) -> StoreResult<Knew> {
    if seq < at {
        return Ok(Knew { run: run.to_owned(), ..knew_inner(store, source, seq)? });
    }
    fork::knew_of_own_step(store, run, seq)
}

/// `approve step:backfill_users`.
fn decision_text(decision: &Option<retrace_core::envelope::Decision>) -> Option<String> {
    decision.as_ref().map(|d| match &d.target {
        Some(t) => format!("{} {t}", d.action),
        None => d.action.clone(),
    })
}

/// A delivery and its send's request, as [`Store::heard_with_chains`] returns them.
type Delivered = (DeliveryHead, Option<Vec<u8>>);

/// Deliveries below which [`assemble`] works on one thread: a thread costs tens of µs to start.
const PARALLEL_FROM: usize = 128;

/// Each delivery as [`Heard`]: its body parsed from its send's request, its chain built from
/// `chains`. A long answer is built in parts on scoped threads, one per CPU (up to 4), each
/// with its own shared strings; the parts are put back in order.
fn assemble(deliveries: Vec<Delivered>, chains: &Chains) -> Vec<Heard> {
    let threads = query_threads();
    if threads == 1 || deliveries.len() < PARALLEL_FROM {
        return heard_part(deliveries, chains);
    }
    let per = deliveries.len().div_ceil(threads);
    let mut parts: Vec<Vec<Delivered>> = Vec::with_capacity(threads);
    let mut rest = deliveries;
    while rest.len() > per {
        let tail = rest.split_off(per);
        parts.push(rest);
        rest = tail;
    }
    parts.push(rest);
    std::thread::scope(|scope| {
        let mut parts = parts.into_iter();
        let first = parts.next().unwrap_or_default();
        let others: Vec<_> = parts.map(|part| scope.spawn(move || heard_part(part, chains))).collect();
        let mut heard = heard_part(first, chains);
        for other in others {
            match other.join() {
                Ok(part) => heard.extend(part),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        heard
    })
}

/// Threads a query splits its work over: one per CPU, at most 4.
pub(crate) fn query_threads() -> usize {
    // Asked once: the answer reads cgroup files on Linux.
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4))
}

/// [`assemble`] on this thread.
fn heard_part(deliveries: Vec<Delivered>, chains: &Chains) -> Vec<Heard> {
    let mut links = Links::new(chains);
    // Only a send's request holds a message body.
    let is_send = |s: &u64| chains.get(*s).is_some_and(|h| h.kind == EventType::Send);
    deliveries
        .into_iter()
        .map(|(d, request)| {
            let timed_out = d.message.as_ref().is_some_and(|m| m.timed_out);
            let (from, kind) = d.message.map_or((None, None), |m| (m.from, m.kind));
            let body = d.causal_parent.filter(is_send).and_then(|_| message_body(&request?));
            let (chain, chain_cut) = d.causal_parent.map(|s| links.chain_from(s)).unwrap_or_default();
            Heard {
                deliver_seq: d.seq,
                send_seq: d.causal_parent,
                from,
                kind,
                body,
                chain,
                chain_cut,
                timed_out,
            }
        })
        .collect()
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

    /// The chain from `start` back to its origin, at most [`MAX_CHAIN`] links, and whether it
    /// was cut there.
    fn chain_from(&mut self, start: u64) -> (Vec<Link>, bool) {
        let chains = self.chains;
        let mut out = Vec::new();
        let mut cur = Some(start);
        while let Some(seq) = cur {
            let Some(h) = chains.get(seq) else { break };
            let key = (u64::from(h.kind.code()) << 32) | h.name.map_or(0, |n| u64::from(n) + 1);
            // As `retrace show` names the step (`send -> reviewer`, `deliver <- planner`), so a
            // delivery reads from its sender, not as a send to it (QA25 D6).
            let label = self.labels.entry(key).or_insert_with(|| {
                let name = h.name.map(|n| chains.string(n));
                match (h.kind, name) {
                    (retrace_core::EventType::Deliver, None) => "deliver (timed out)".into(),
                    (kind, name) => retrace_core::label::step(retrace_core::label::StepParts {
                        kind,
                        name,
                        model: None,
                        message: None,
                        decision: None,
                    })
                    .into(),
                }
            });
            let label = label.clone();
            let id = h.agent as usize;
            if self.agents.len() <= id {
                self.agents.resize(id + 1, None);
            }
            let agent = self.agents[id].get_or_insert_with(|| chains.string(h.agent).into()).clone();
            out.push(Link { seq, agent, label });
            if out.len() >= MAX_CHAIN {
                return (out, h.causal_parent.is_some());
            }
            cur = h.causal_parent;
        }
        (out, false)
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
/// Agent ids, labels and message kinds come from the recorded program: each is kept on one line
/// ([`one_line`]).
pub fn render(k: &Knew) -> String {
    let mut out = String::new();
    let acted = match &k.decision {
        Some(d) => format!("{} ({d})", k.label),
        None => k.label.clone(),
    };
    let timeouts = k.heard.iter().filter(|h| h.timed_out).count();
    out.push_str(&format!(
        "{} had heard {}{} when it acted at seq {}: {}\n",
        one_line(&k.agent),
        count(k.heard.len() - timeouts, "message"),
        match timeouts {
            0 => String::new(),
            n => format!(" (and waited in vain {}: recv timed out)", count(n, "time")),
        },
        k.seq,
        one_line(&acted)
    ));
    let mut number = 0;
    for h in &k.heard {
        match (&h.from, h.send_seq, h.timed_out) {
            (Some(from), Some(send), false) => {
                number += 1;
                out.push_str(&format!(
                    "  {number}. seq {:>5}  {} from {} (sent at seq {send})\n",
                    h.deliver_seq,
                    one_line(h.kind.as_deref().unwrap_or("message")),
                    one_line(from)
                ))
            }
            _ => out.push_str(&format!("  -  seq {:>5}  recv timed out\n", h.deliver_seq)),
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
            let links: Vec<String> = h
                .chain
                .iter()
                .map(|l| format!("seq {} {} {}", l.seq, one_line(&l.agent), one_line(&l.label)))
                .collect();
            let end = match h.chain_cut {
                true => format!("… (cut after {MAX_CHAIN} links)"),
                false => "(origin)".to_owned(),
            };
            out.push_str(&format!("       chain: {} {end}\n", links.join(" ← ")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::head::ChainHead;
    use retrace_core::envelope::MessageRef;

    /// A timeout is not a message heard, and a chain cut at its cap doesn't claim its origin.
    #[test]
    fn render_counts_messages_not_timeouts_and_says_where_a_chain_was_cut() {
        let link = |seq| Link { seq, agent: "a".into(), label: "send b".into() };
        let heard = |deliver_seq: u64, timed_out: bool, chain_cut: bool| Heard {
            deliver_seq,
            send_seq: (!timed_out).then_some(deliver_seq - 1),
            from: (!timed_out).then(|| "a".to_owned()),
            kind: None,
            body: None,
            chain: if timed_out { vec![] } else { vec![link(deliver_seq - 1)] },
            chain_cut,
            timed_out,
        };
        let k = Knew {
            run: "r".into(),
            seq: 9,
            agent: "b".into(),
            label: "decision".into(),
            decision: None,
            heard: vec![heard(1, true, false), heard(4, false, false), heard(8, false, true)],
        };
        let text = render(&k);
        assert!(
            text.starts_with("b had heard 2 messages (and waited in vain 1 time: recv timed out)"),
            "{text}"
        );
        assert!(text.contains("  -  seq     1  recv timed out") && text.contains("  2. seq     8"), "{text}");
        assert!(
            text.contains("seq 3 a send b (origin)")
                && text.contains("seq 7 a send b … (cut after 256 links)"),
            "{text}"
        );
        let json = serde_json::to_value(&k).unwrap();
        assert_eq!(
            (json["heard"][0]["timed_out"].as_bool(), json["heard"][2]["chain_cut"].as_bool()),
            (Some(true), Some(true))
        );
    }

    /// `n` deliveries to `hub`, each of a send whose chain alternates sends and deliveries back
    /// `depth(i)` links, with a body; every tenth is a recorded timeout.
    fn fixture(n: usize) -> crate::HeardWithChains {
        let mut chains = Chains::default();
        let (relay, hub, note) = (chains.intern("relay"), chains.intern("hub"), chains.intern("note"));
        let mut deliveries = Vec::new();
        let mut seq = 1;
        for i in 0..n {
            let start = seq;
            for link in 0..i % 7 {
                let kind = if link % 2 == 0 { EventType::Send } else { EventType::Deliver };
                let parent = (link > 0).then(|| seq - 1);
                chains.insert_interned(
                    seq,
                    ChainHead { kind, agent: relay, name: Some(note), causal_parent: parent },
                );
                seq += 1;
            }
            // The send delivered to the hub, after the chain (if any) that led to it.
            let send = seq;
            seq += 1;
            chains.insert_interned(
                send,
                ChainHead {
                    kind: EventType::Send,
                    agent: relay,
                    name: Some(hub),
                    causal_parent: (send > start).then(|| send - 1),
                },
            );
            let message = MessageRef {
                from: Some("relay".into()),
                to: Some("hub".into()),
                kind: Some("note".into()),
                timed_out: false,
            };
            let (parent, message, body) = match i % 10 {
                9 => (None, MessageRef { timed_out: true, from: None, kind: None, ..message }, None),
                _ => (Some(send), message, Some(format!("{{\"body\":{{\"n\":{i}}}}}").into_bytes())),
            };
            deliveries.push((DeliveryHead { seq, causal_parent: parent, message: Some(message) }, body));
            seq += 1;
        }
        (deliveries, chains)
    }

    #[test]
    fn an_answer_built_in_parts_equals_one_built_whole_and_follows_the_chains() {
        for n in [0, 1, PARALLEL_FROM - 1, PARALLEL_FROM, 1_001] {
            let (deliveries, chains) = fixture(n);
            let whole = heard_part(deliveries.clone(), &chains);
            let parts = assemble(deliveries.clone(), &chains);
            assert_eq!(parts, whole, "{n} deliveries");
            assert_eq!(parts.len(), n);
            for (i, (h, (d, _))) in parts.iter().zip(&deliveries).enumerate() {
                assert_eq!((h.deliver_seq, h.send_seq), (d.seq, d.causal_parent), "in the order heard");
                let Some(send) = d.causal_parent else {
                    assert!(h.chain.is_empty() && h.body.is_none(), "a timeout has no chain and no body");
                    continue;
                };
                let seqs: Vec<u64> = h.chain.iter().map(|l| l.seq).collect();
                let expected: Vec<u64> =
                    std::iter::successors(Some(send), |s| chains.get(*s)?.causal_parent).collect();
                assert_eq!(seqs, expected, "the chain of delivery {}", d.seq);
                assert_eq!(&*h.chain[0].label, "send -> hub", "named as `show` names it");
                assert_eq!(h.body, Some(serde_json::json!({ "n": i })));
            }
        }
    }
}
