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
    let openings =
        ["Looking at this ticket,", "Based on the policy excerpt,", "In short,", "Having read the thread,"];
    let verdicts = [
        "the customer qualifies for a refund under the 30-day policy.",
        "this is a billing question that needs a human: escalate it.",
        "the refund window has passed; offer store credit instead.",
        "a refund applies, but the amount needs a supervisor: escalate it.",
    ];
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
        usage: Some(Usage { input_tokens, output_tokens, cost_usd: None }),
    }
}
