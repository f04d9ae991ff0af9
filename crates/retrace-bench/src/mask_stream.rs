//! Masking a recorded stream document (issue 7): a ~2 MB `retrace-http/1` document of Chat
//! Completions chunks, an email split across three deltas every twenty events, masked with
//! the default rules by `mask_output` (per output part, chunk by chunk). Its floor is
//! `mask_json` over the same bytes, the masker it replaced, which sees each chunk's string
//! alone and so misses every split secret.
use std::hint::black_box;
use std::time::Instant;

use retrace_core::mask::{MaskKey, MaskRules, Masker};

use crate::env::{note, Config};
use crate::payload::{words, Rng};
use crate::report::{median, print, Line, Target};

/// One Chat Completions chunk carrying `content`.
fn event(content: &str) -> String {
    let content = serde_json::to_string(content).expect("a string serializes");
    format!(
        "data: {{\"id\":\"chatcmpl-ABfw031mOJeYCSHe4yI2ZjOA6kMJL\",\"object\":\"chat.completion.chunk\",\"created\":1727346168,\"model\":\"gpt-4o-2024-08-06\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{content}}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
    )
}

/// A stream document of about `len` bytes, and how many secrets it splits across deltas.
fn document(rng: &mut Rng, len: usize) -> (Vec<u8>, usize) {
    let mut doc = String::with_capacity(len + 4096);
    doc.push_str(r#"{"format":"retrace-http/1","status":200,"headers":[["content-type","text/event-stream"]],"stream":["#);
    let (mut n, mut secrets) = (0u64, 0);
    while doc.len() < len {
        let chunk = if n % 20 == 10 {
            secrets += 1;
            let user = words(rng, 3).replace(' ', ".");
            [
                event(&format!(" mail {user}")),
                event(&format!("@exam{}", rng.below(100))),
                event("ple.com now"),
                event(" "),
            ]
            .concat()
        } else {
            event(&format!(" {}", words(rng, 2)))
        };
        if n > 0 {
            doc.push(',');
        }
        doc.push_str(&format!("[{},{}]", n * 7, serde_json::to_string(&chunk).expect("a string serializes")));
        n += 1;
    }
    doc.push_str(r#"],"end":"complete"}"#);
    (doc.into_bytes(), secrets)
}

fn mb_per_s(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / 1e6 / seconds
}

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let masker = Masker::new(MaskRules::defaults(), Some(MaskKey::from_bytes([7; 32])))
        .expect("default rules compile");
    let (doc, secrets) = document(&mut Rng::new(11), cfg.pick(512 << 10, 2 << 20));
    let found = masker.mask_output(&doc).tokens;
    let seen_by_json = masker.mask_json(&doc).tokens;
    note(&format!(
        "mask-stream: {:.1} MB document, {secrets} split secrets; mask_output found {found}, mask_json {seen_by_json}",
        doc.len() as f64 / 1e6
    ));
    let (mut stream, mut floor) = (Vec::new(), Vec::new());
    for _ in 0..cfg.repeats {
        let began = Instant::now();
        black_box(masker.mask_json(black_box(&doc)));
        floor.push(mb_per_s(doc.len(), began.elapsed().as_secs_f64()));
        let began = Instant::now();
        black_box(masker.mask_output(black_box(&doc)));
        stream.push(mb_per_s(doc.len(), began.elapsed().as_secs_f64()));
    }
    let line = Line::new(
        "mask: 2 MB stream document, per part",
        median(&stream),
        "MB/s",
        Some(median(&floor)),
        Target::Info,
    );
    print(lines, line);
    print(
        lines,
        Line::new("mask: split secrets found in the stream", found as f64, "tokens", None, Target::Info),
    );
}
