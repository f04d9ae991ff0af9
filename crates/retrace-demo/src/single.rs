//! The single-agent demo: a support-triage agent that reads a ticket id, the clock and an env var,
//! searches a knowledge base, asks the model, decides, and updates the ticket (a side effect).
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use retrace_runtime::{ModelCall, RuntimeResult, Session, ToolSpec};
use serde_json::{json, Value};

use crate::simulator::Simulator;

/// Counts the live functions the program actually ran (zero in replay).
#[derive(Debug, Default, Clone)]
pub struct LiveCounter(Arc<AtomicUsize>);

impl LiveCounter {
    /// Live calls so far.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
    fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// What the program saw and decided, in order: compared between record and replay.
pub type Transcript = Vec<String>;

/// Runs the triage agent on `session`. `live` counts the live functions that ran.
pub fn triage(session: &Session, live: &LiveCounter, model: &Simulator) -> RuntimeResult<Transcript> {
    let agent = session.agent("triage").with_role("support-triage");
    let mut seen = Vec::new();

    let ticket = agent.random_id()?;
    seen.push(format!("ticket id: {ticket}"));
    let opened = agent.now_ms()?;
    seen.push(format!("clock: {opened}"));
    let region = agent.env("RETRACE_DEMO_REGION")?.unwrap_or_else(|| "eu".into());
    seen.push(format!("region: {region}"));

    let kb: Value = agent.tool(
        "kb.search",
        &json!({"query": "refund policy", "region": region}),
        ToolSpec::deterministic("1"),
        || {
            live.hit();
            Ok::<_, String>(json!({"hits": [
                {"doc": "refunds.md", "text": "Refunds are granted within 30 days of purchase."},
                {"doc": "credit.md", "text": "After 30 days, offer store credit."}
            ]}))
        },
    )?;
    seen.push(format!("kb: {}", kb["hits"][0]["doc"].as_str().unwrap_or("?")));

    let request = json!({
        "model": "sim-1",
        "temperature": 0,
        "messages": [
            {"role": "system", "content": "You triage support tickets. Answer in one sentence."},
            {"role": "user", "content": format!(
                "Ticket {ticket} opened at {opened} in {region}: 'I bought it 25 days ago, can I get my money back?'\nPolicy: {}",
                kb["hits"][0]["text"].as_str().unwrap_or_default()
            )}
        ]
    });
    let call =
        ModelCall { provider: "openai".into(), endpoint: "chat.completions".into(), body: request.clone() };
    let reply = agent.model(&call, |_body| {
        live.hit();
        Ok::<_, String>(model.chat(&request))
    })?;
    let answer = reply["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
    seen.push(format!("model: {answer}"));

    let action = if answer.contains("escalate") { "escalate" } else { "auto_reply" };
    agent.decide(action, Some(&format!("ticket:{ticket}")))?;
    seen.push(format!("decision: {action}"));

    let update: Value = agent.tool(
        "ticket.update",
        &json!({"ticket": ticket, "status": action, "note": answer}),
        // A fork whose change reaches the update shows what it would have written (QA22 S1).
        ToolSpec::side_effect("1").with_dry_run(|args| json!({"would_update": args})),
        || {
            live.hit();
            Ok::<_, String>(json!({"updated": true, "ticket": ticket}))
        },
    )?;
    seen.push(format!("ticket.update: {update}"));
    Ok(seen)
}
