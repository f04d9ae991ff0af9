//! Deterministic, random-ish JSON payloads: ~1 KB tool requests and outputs, chat messages and
//! large text documents, each a pure function of a seed (record and replay regenerate them).
use retrace_core::canonical::canonical_value;
use std::sync::OnceLock;

use serde_json::{json, Value};

/// xorshift64*: small, fast and good enough for payloads.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, zero included).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

const WORDS: [&str; 48] = [
    "agent", "plan", "tool", "query", "result", "index", "vector", "model", "latency", "budget", "invoice",
    "customer", "refund", "policy", "ticket", "search", "summary", "draft", "review", "retry", "timeout",
    "cache", "shard", "replica", "quorum", "ledger", "audit", "token", "prompt", "context", "window",
    "stream", "batch", "commit", "branch", "merge", "deploy", "rollback", "metric", "trace", "span", "alert",
    "owner", "region", "zone", "quota", "limit", "state",
];

/// ASCII words separated by spaces, exactly `len` bytes long.
pub fn words(rng: &mut Rng, len: usize) -> String {
    let mut s = String::with_capacity(len + 16);
    while s.len() < len {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
        if rng.below(5) == 0 {
            s.push_str(&rng.below(10_000).to_string());
        }
    }
    s.truncate(len);
    s
}

fn canonical_len(v: &Value) -> usize {
    canonical_value(v).expect("payloads are canonical").len()
}

/// Pads the string field `field` of object `v` so that `v`'s canonical form is `size` bytes.
fn fill(rng: &mut Rng, mut v: Value, field: &str, size: usize) -> Value {
    let short = size.saturating_sub(canonical_len(&v));
    v[field] = Value::String(words(rng, short));
    v
}

/// Distinct random bodies behind [`request`] and [`output`]; each step clones one and stamps
/// its seed into it, so making a payload costs about a clone (bench harness time stays small).
const POOL: u64 = 256;

fn pool(which: &'static OnceLock<Vec<Value>>, make: fn(u64) -> Value) -> &'static [Value] {
    which.get_or_init(|| (0..POOL).map(make).collect())
}

/// A tool request of about 1 KB (canonical), unique to `seed`.
pub fn request(seed: u64) -> Value {
    static BODIES: OnceLock<Vec<Value>> = OnceLock::new();
    let mut v = pool(&BODIES, random_request)[(seed % POOL) as usize].clone();
    v["task"] = seed.into();
    v
}

/// A tool output of about 1 KB (canonical), unique to `seed`.
pub fn output(seed: u64) -> Value {
    static BODIES: OnceLock<Vec<Value>> = OnceLock::new();
    let mut v = pool(&BODIES, random_output)[(seed % POOL) as usize].clone();
    v["id"] = format!("call-{seed}").into();
    v
}

fn random_request(seed: u64) -> Value {
    let mut rng = Rng::new(seed);
    let context: Vec<Value> = (0..4)
        .map(|_| {
            json!({
                "id": rng.below(1 << 40),
                "title": words(&mut rng, 48),
                "score": rng.below(1000) as f64 / 1000.0,
            })
        })
        .collect();
    let v = json!({
        "model": "gpt-4o-mini",
        "task": seed,
        "query": words(&mut rng, 160),
        "filters": {"lang": "en", "limit": rng.between(1, 50), "min_score": rng.below(100) as f64 / 100.0},
        "context": context,
        "notes": "",
    });
    fill(&mut rng, v, "notes", 1024)
}

fn random_output(seed: u64) -> Value {
    let mut rng = Rng::new(seed ^ 0x5555_5555);
    let results: Vec<Value> = (0..3)
        .map(|rank| {
            json!({
                "rank": rank,
                "url": format!("https://example.com/{}/{}", words(&mut rng, 12), rng.below(1_000_000)),
                "snippet": words(&mut rng, 120),
                "relevance": rng.below(10_000) as f64 / 10_000.0,
            })
        })
        .collect();
    let v = json!({"id": format!("call-{seed}"), "status": "ok", "results": results, "summary": ""});
    fill(&mut rng, v, "summary", 1024)
}

/// A chat message whose canonical form is `size` bytes.
pub fn message(rng: &mut Rng, role: &str, size: usize) -> Value {
    fill(rng, json!({"role": role, "content": ""}), "content", size)
}

/// `{"doc": <text>}` of `size` canonical bytes: a large, text-only tool output.
pub fn document(seed: u64, size: usize) -> Value {
    let mut rng = Rng::new(seed ^ 0xABCD);
    fill(&mut rng, json!({"doc": ""}), "doc", size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_deterministic_and_sized() {
        assert_eq!(request(7), request(7));
        assert_ne!(request(7), request(8));
        assert_ne!(output(7), output(7 + POOL));
        assert!((1020..1040).contains(&canonical_len(&request(3))));
        assert!((1020..1040).contains(&canonical_len(&output(1 << 40))));
        assert_eq!(canonical_len(&message(&mut Rng::new(1), "user", 300)), 300);
        assert_eq!(canonical_len(&document(1, 70_000)), 70_000);
    }
}
