//! Record overhead of masking (issue 7): µs per step to record realistic chat-completions
//! steps (a multi-turn request of prose, code and tool results, and a reply) with the default
//! masking rules on, against the same steps with no rules. Target: ≤ 1.3×.
//!
//! Both sides run the whole record pipeline (canonical form, masking stage, key, blobs, group
//! commit) on a SQLite store with batch durability, one pipelined writer; only the rule set
//! differs. The corpus holds no secrets, as most prompts don't: the cost measured is the
//! scanning every step pays.
use std::time::{Duration, Instant};

use retrace_core::mask::{MaskKey, MaskRules};
use retrace_runtime::{Outcome, Session, SessionOptions};
use retrace_store::Durability;
use serde_json::{json, Value};

use crate::drive::spec;
use crate::env::{note, Config};
use crate::payload::Rng;
use crate::report::{median, print, Line, Target};

fn corpus(count: usize) -> Vec<(Value, Value)> {
    let mut rng = Rng::new(7);
    (0..count)
        .map(|_| {
            let request: Value = serde_json::from_slice(&crate::mask::request(&mut rng, 4)).expect("JSON");
            let n = 800 + rng.below(1_500) as usize;
            let reply = json!({"role": "assistant", "content": crate::mask::prose(&mut rng, n)});
            (request, reply)
        })
        .collect()
}

fn record(cfg: &Config, data: &[(Value, Value)], rules: MaskRules) -> Duration {
    let store = cfg.store("mask-record", Durability::Batch);
    let options = SessionOptions {
        wait_for_ack: false,
        mask_rules: rules,
        mask_key: Some(MaskKey::from_bytes([1; 32])),
        ..SessionOptions::default()
    };
    let session = Session::record(store.store.clone(), options).expect("starting a recording");
    let agent = session.agent("writer");
    let began = Instant::now();
    for (request, reply) in data {
        let reply = reply.clone();
        let _: Value = agent.tool("chat", request, spec(), move || Ok::<_, String>(reply)).expect("a step");
    }
    session.finish(Outcome::default()).expect("finishing");
    began.elapsed()
}

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let n = cfg.pick(200, 1_000);
    let data = corpus(n);
    let bytes: usize = data.iter().map(|(r, o)| r.to_string().len() + o.to_string().len()).sum();
    note(&format!(
        "mask-record: {n} chat steps, {:.1} KB each on average, default rules vs none, {} repeats",
        bytes as f64 / n as f64 / 1e3,
        cfg.repeats
    ));
    record(cfg, &data[..n.min(50)], MaskRules::defaults());
    let per_step = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    let (mut bare, mut masked) = (vec![], vec![]);
    for _ in 0..cfg.repeats {
        bare.push(per_step(record(cfg, &data, MaskRules::default())));
        masked.push(per_step(record(cfg, &data, MaskRules::defaults())));
    }
    let bare = median(&bare);
    print(lines, Line::new("mask-record: no rules", bare, "us/step", None, Target::Info));
    print(
        lines,
        Line::new(
            "mask-record: default rules",
            median(&masked),
            "us/step",
            Some(bare),
            Target::RatioAtMost(1.3),
        ),
    );
}
