//! The demo's model simulator: a stand-in for a hosted model whose answers vary from call to
//! call, as real models do even at temperature 0. It is clearly not a real model.
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use retrace_core::envelope::Usage;
use retrace_runtime::ModelReply;
use serde_json::{json, Value};

/// The simulator's snapshot name, reported in every response's `model` field.
pub const SNAPSHOT: &str = "retrace-sim-1-2026-11-01";

/// A model stand-in with its own random source: seeded, so a whole demo is reproducible, while
/// consecutive calls still answer differently.
#[derive(Debug)]
pub struct Simulator(Mutex<StdRng>);

impl Simulator {
    /// A simulator seeded with `seed`.
    pub fn new(seed: u64) -> Simulator {
        Simulator(Mutex::new(StdRng::seed_from_u64(seed)))
    }

    /// Answers an OpenAI-style chat request with one of several plausible, varying replies.
    pub fn chat(&self, request: &Value) -> ModelReply {
        chat(request, &mut self.0.lock())
    }
}

fn chat(request: &Value, rng: &mut StdRng) -> ModelReply {
    let prompt = request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    // The demo's programs are a support desk and a database migration team: each hears replies
    // about its own work (the system prompt says which).
    let migration = request["messages"].as_array().is_some_and(|messages| {
        messages.iter().any(|m| m["content"].as_str().is_some_and(|c| c.contains("migration")))
    });
    let (openings, verdicts) = if migration {
        (
            [
                "Looking at the schema,",
                "Based on the migration plan,",
                "In short,",
                "Having read the change,",
            ],
            [
                "rename the column first, then backfill from its new name.",
                "the statement is safe to run inside one transaction.",
                "check that every column the backfill reads still exists when it runs.",
                "this takes a lock on users: run it off-peak.",
            ],
        )
    } else {
        (
            [
                "Looking at this ticket,",
                "Based on the policy excerpt,",
                "In short,",
                "Having read the thread,",
            ],
            [
                "the customer qualifies for a refund under the 30-day policy.",
                "this is a billing question that needs a human: escalate it.",
                "the refund window has passed; offer store credit instead.",
                "a refund applies, but the amount needs a supervisor: escalate it.",
            ],
        )
    };
    let text =
        format!("{} {}", openings.choose(rng).expect("non-empty"), verdicts.choose(rng).expect("non-empty"));
    let input_tokens = (prompt.len() / 4) as u64 + 12;
    let output_tokens = (text.len() / 4) as u64;
    let body = json!({
        "id": format!("chatcmpl-sim{:016x}", rng.gen::<u64>()),
        "object": "chat.completion",
        "created": 1_764_000_000u64 + rng.gen_range(0..1_000_000u64),
        "model": SNAPSHOT,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}
    });
    ModelReply {
        body,
        snapshot: Some(SNAPSHOT.into()),
        usage: Some(Usage { input_tokens, output_tokens, cost_usd: None, ..Default::default() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(sim: &Simulator, system: &str) -> Vec<String> {
        let request =
            json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "?"}]});
        (0..8)
            .map(|_| sim.chat(&request).body["choices"][0]["message"]["content"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn each_program_hears_about_its_own_work_and_answers_vary() {
        let sim = Simulator::new(7);
        let migration = answers(&sim, "You are the planner of a database migration team.");
        assert!(migration.iter().all(|a| !a.contains("refund")), "{migration:?}");
        let desk = answers(&sim, "You triage support tickets.");
        assert!(desk.iter().all(|a| !a.contains("column") && !a.contains("schema")), "{desk:?}");
        let distinct: std::collections::HashSet<_> = migration.iter().collect();
        assert!(distinct.len() > 1, "a stand-in for a model that is not bit-stable: {migration:?}");
    }
}
