//! Masking throughput with the default rules (issue 7): realistic chat-completions request
//! JSON without secrets (target ≥ 500 MB/s) and text dense with emails, keys, cards and IBANs
//! (target ≥ 100 MB/s), single-threaded, beside the floor of a bare pass over the same bytes
//! (counting a byte that never occurs).
//!
//! Each throughput is measured twice: per second of wall time, and per second the measuring
//! thread spent on a CPU (`/proc/thread-self/schedstat`), which other builds sharing the machine
//! don't inflate. The targets are held to the CPU-time figure; the wall figure is printed
//! beside it (INFO), and equals it on an idle machine.
use std::hint::black_box;
use std::time::Instant;

use retrace_core::mask::{MaskKey, MaskRules, Masker};
use serde_json::{json, Value};

use crate::env::{note, Config};
use crate::payload::{words, Rng};
use crate::report::{median, print, Line, Target};

const PROSE: &[&str] = &[
    "The migration ran on 2024-05-01 at 14:32 UTC and touched 1,204 rows in 3.2 s.",
    "See https://docs.example.com/guides/v2/retries#backoff for the retry policy (max 5 attempts).",
    "Revenue grew 12.5% quarter over quarter, to $4.3M, while churn fell from 2.1% to 1.8%.",
    "Call the on-call engineer at extension 4471 if the p99 latency exceeds 850 ms for 10 minutes.",
    "Version 3.11.4 fixed the leak; upgrade with `pip install -U retrace==3.11.4` before Friday.",
    "Order #88213 shipped in 2 boxes (14 kg) to warehouse B-17; ETA is 3-5 business days.",
    "\"Quoted\" text, tabs\tand a backslash \\ appear in real prompts; so do émojis 🚀 and ümlauts.",
];

const CODE: &str = "```python\ndef backoff(attempt: int, base: float = 0.5) -> float:\n    \"\"\"Seconds to wait before `attempt` (1-based).\"\"\"\n    return min(30.0, base * 2 ** (attempt - 1))\n\nfor i in range(1, 6):\n    print(f\"attempt {i}: wait {backoff(i):.1f}s\")\n```";

pub(crate) fn prose(rng: &mut Rng, len: usize) -> String {
    let mut s = String::with_capacity(len + 128);
    while s.len() < len {
        match rng.below(4) {
            0 => {
                let n = 40 + rng.below(80) as usize;
                s.push_str(&words(rng, n));
            }
            1 => s.push_str(CODE),
            _ => s.push_str(PROSE[rng.below(PROSE.len() as u64) as usize]),
        }
        s.push_str(if rng.below(3) == 0 { "\n\n" } else { " " });
    }
    s
}

/// A chat-completions request of a multi-turn conversation: system prompt, user and assistant
/// turns of prose and code, tool calls with JSON arguments and tool results full of numbers.
pub(crate) fn request(rng: &mut Rng, turns: usize) -> Vec<u8> {
    let mut messages = vec![json!({"role": "system", "content": prose(rng, 2_000)})];
    for turn in 0..turns {
        let n = 300 + rng.below(1_500) as usize;
        messages.push(json!({"role": "user", "content": prose(rng, n)}));
        if turn % 3 == 1 {
            let id = format!("call_{:016x}", rng.next_u64());
            let args = json!({"query": words(rng, 40), "limit": 20, "filters": {"region": "eu-west-1", "since": "2024-01-01"}});
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "search_orders", "arguments": args.to_string()}}
            ]}));
            let rows: Vec<Value> = (0..30)
                .map(|i| json!({"id": 10_000 + i, "total": (rng.below(100_000) as f64) / 100.0, "status": "shipped", "note": words(rng, 30)}))
                .collect();
            messages.push(
                json!({"role": "tool", "tool_call_id": id, "content": json!({"rows": rows}).to_string()}),
            );
        }
        let n = 500 + rng.below(2_500) as usize;
        messages.push(json!({"role": "assistant", "content": prose(rng, n)}));
    }
    let tools = json!([{"type": "function", "function": {"name": "search_orders", "description": "Search orders by text and filters.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}}}]);
    let body = json!({"model": "gpt-4o-2024-08-06", "temperature": 0.2, "max_tokens": 1024, "messages": messages, "tools": tools});
    serde_json::to_vec(&body).expect("a request serializes")
}

fn luhn_card(rng: &mut Rng) -> String {
    let mut digits: Vec<u32> = vec![4];
    digits.extend((0..14).map(|_| rng.below(10) as u32));
    let sum: u32 = (0..15)
        .map(|i| {
            let d = digits[14 - i];
            if i % 2 == 0 {
                if d * 2 > 9 {
                    d * 2 - 9
                } else {
                    d * 2
                }
            } else {
                d
            }
        })
        .sum();
    digits.push((10 - sum % 10) % 10);
    let s: String = digits.iter().map(|d| char::from_digit(*d, 10).expect("a digit")).collect();
    format!("{} {} {} {}", &s[..4], &s[4..8], &s[8..12], &s[12..])
}

fn alnum(rng: &mut Rng, n: usize) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..n).map(|_| char::from(A[rng.below(A.len() as u64) as usize])).collect()
}

/// Text with a secret every ~60 bytes: emails, provider keys, JWT-ish tokens, cards, IBANs.
fn dense(rng: &mut Rng, len: usize) -> String {
    let mut s = String::with_capacity(len + 256);
    while s.len() < len {
        let n = 15 + rng.below(30) as usize;
        s.push_str(&words(rng, n));
        s.push(' ');
        let secret = match rng.below(6) {
            0 => {
                format!("{}.{}@example{}.com", words(rng, 5).replace(' ', ""), rng.below(1000), rng.below(10))
            }
            1 => format!("sk-proj-{}", alnum(rng, 40)),
            2 => format!("AKIA{}", alnum(rng, 16).to_ascii_uppercase()),
            3 => luhn_card(rng),
            4 => "GB82 WEST 1234 5698 7654 32".to_owned(),
            _ => format!("Bearer {}", alnum(rng, 32)),
        };
        s.push_str(&secret);
        s.push_str(", ");
    }
    s
}

/// Nanoseconds this thread has run on a CPU (0 where the kernel doesn't say).
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// Times `f` over `bytes` bytes: (wall MB/s, CPU MB/s).
fn measure(bytes: usize, mut f: impl FnMut()) -> (f64, f64) {
    let (began, cpu) = (Instant::now(), cpu_ns());
    f();
    let wall = began.elapsed().as_secs_f64();
    let cpu = (cpu_ns() - cpu) as f64 / 1e9;
    let mb = bytes as f64 / 1e6;
    (mb / wall, if cpu > 0.0 { mb / cpu } else { mb / wall })
}

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let masker = Masker::new(MaskRules::defaults(), Some(MaskKey::from_bytes([7; 32])))
        .expect("default rules compile");
    let mut rng = Rng::new(7);
    let requests: Vec<Vec<u8>> = (0..cfg.pick(8, 32)).map(|_| request(&mut rng, 30)).collect();
    let clean_bytes: usize = requests.iter().map(Vec::len).sum();
    let text = dense(&mut rng, cfg.pick(1 << 20, 4 << 20));
    let dense_json = serde_json::to_vec(&json!({"messages": text.split(". ").map(|s| json!({"role": "user", "content": s})).collect::<Vec<_>>()}))
        .expect("a request serializes");
    let false_positives: usize = requests.iter().map(|r| masker.mask_json(r).tokens).sum();
    let secrets = masker.mask_text(&text).1;
    note(&format!(
        "mask: {} requests, {:.1} MB of chat JSON ({false_positives} tokens: false positives); {:.1} MB of dense text, {secrets} secrets",
        requests.len(),
        clean_bytes as f64 / 1e6,
        text.len() as f64 / 1e6
    ));
    let rounds = cfg.pick(3, 8);
    let mut m: [Vec<(f64, f64)>; 4] = Default::default();
    for _ in 0..cfg.repeats {
        m[0].push(measure(clean_bytes * rounds, || {
            for _ in 0..rounds {
                for r in &requests {
                    black_box(counting_floor(r));
                }
            }
        }));
        m[1].push(measure(clean_bytes * rounds, || {
            for _ in 0..rounds {
                for r in &requests {
                    black_box(masker.mask_json(black_box(r)));
                }
            }
        }));
        m[2].push(measure(text.len(), || {
            black_box(masker.mask_text(black_box(&text)));
        }));
        m[3].push(measure(dense_json.len(), || {
            black_box(masker.mask_json(black_box(&dense_json)));
        }));
    }
    let wall = |i: usize| median(&m[i].iter().map(|x| x.0).collect::<Vec<_>>());
    let cpu = |i: usize| median(&m[i].iter().map(|x| x.1).collect::<Vec<_>>());
    let floor = Some(cpu(0));
    print(
        lines,
        Line::new("mask: chat JSON, no secrets (CPU time)", cpu(1), "MB/s", floor, Target::AtLeast(500.0)),
    );
    print(
        lines,
        Line::new("mask: chat JSON, no secrets (wall)", wall(1), "MB/s", Some(wall(0)), Target::Info),
    );
    print(
        lines,
        Line::new("mask: dense text, a secret per ~60 B (CPU)", cpu(2), "MB/s", None, Target::AtLeast(100.0)),
    );
    print(lines, Line::new("mask: dense text (wall)", wall(2), "MB/s", None, Target::Info));
    print(lines, Line::new("mask: dense text as chat JSON (CPU)", cpu(3), "MB/s", None, Target::Info));
    print(
        lines,
        Line::new("mask: false positives in chat JSON", false_positives as f64, "tokens", None, Target::Info),
    );
}

/// One pass over the bytes that finds nothing: what reading them costs.
fn counting_floor(bytes: &[u8]) -> usize {
    bytes.iter().filter(|b| **b == 0xFF).count()
}
