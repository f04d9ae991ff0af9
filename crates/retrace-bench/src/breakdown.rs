//! Where a step's time goes: the record and replay pipelines taken apart into the public calls
//! they are made of (same 1 KB payloads), each timed alone, beside the whole step through the
//! Session. INFO lines only; for profiling, not a target.
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use retrace_core::canonical::{canonical_value, decodes_to_itself};
use retrace_core::envelope::{ToolClass, ToolRef};
use retrace_core::json::Json;
use retrace_core::key::KeyConfig;
use retrace_core::mask::Masker;
use retrace_core::run::{RunMeta, RunMode};
use retrace_core::{Digest, Event, EventType};
use retrace_runtime::matcher::RecordedLog;
use retrace_store::{BlobHint, BlobPut, Durability, LeaseHolder, RunWriter, Store};
use serde_json::Value;

use crate::drive::{self, TOOL};
use crate::env::{note, Config};
use crate::record::steps;
use crate::report::{median, print, Line, Target};

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let n = cfg.pick(5_000, 20_000);
    note(&format!("breakdown: {n} steps of 1 KB + 1 KB, each part timed alone, {} repeats", cfg.repeats));
    let data = steps(n);
    let mut parts: Vec<(&str, Vec<f64>)> = Vec::new();
    let mut add = |name, us: f64| match parts.iter_mut().find(|(n, _)| *n == name) {
        Some((_, v)) => v.push(us),
        None => parts.push((name, vec![us])),
    };
    for _ in 0..cfg.repeats {
        let per = |began: Instant| began.elapsed().as_secs_f64() * 1e6 / n as f64;
        let store = cfg.store("breakdown", Durability::Batch);
        add(
            "step: record through the Session",
            per_event(n, drive::record(store.store.clone(), &data, 1, false).wall),
        );
        for (name, us) in pieces(&data) {
            add(name, us);
        }
        let events = sealed(&data);
        let fresh = cfg.store("writer", Durability::Batch);
        let began = Instant::now();
        write_all(fresh.store.clone(), &events, &data);
        add("rec: RunWriter append+group commit (no step)", per(began));

        let began = Instant::now();
        let log = RecordedLog::load(fresh.store.as_ref(), &events[0].run_id).expect("loading the log");
        add("rep: RecordedLog::load", per(began));
        black_box(log);
        let (events_us, blobs_us, decode_us) = serve(fresh.store.as_ref(), &events[0].run_id, n);
        add("rep: store.events (pages of 4096)", events_us);
        add("rep: store.get_blob (1 KB output)", blobs_us);
        add("rep: decode output bytes (from_slice)", decode_us);
    }
    for (name, values) in parts {
        print(lines, Line::new(name, median(&values), "us/ev", None, Target::Info));
    }
}

fn per_event(n: usize, d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}

/// The pure parts of a recorded step, each over every step.
fn pieces(data: &[(Value, Value)]) -> Vec<(&'static str, f64)> {
    let n = data.len();
    let masker = Masker::empty();
    let keys = KeyConfig::default();
    let mut out = Vec::new();
    let mut time = |name, f: &mut dyn FnMut(&(Value, Value))| {
        let began = Instant::now();
        data.iter().for_each(&mut *f);
        out.push((name, per_event(n, began.elapsed())));
    };
    time("rec: args to Value (to_value)", &mut |(req, _)| {
        black_box(serde_json::to_value(req).expect("to_value"));
    });
    time("rec: canonical request", &mut |(req, _)| {
        black_box(canonical_value(req).expect("canonical"));
    });
    let bytes: Vec<(Vec<u8>, Vec<u8>)> =
        data.iter().map(|(r, o)| (canonical_value(r).expect("c"), canonical_value(o).expect("c"))).collect();
    let mut at = 0;
    time("rec: mask (empty rules) request + output", &mut |_| {
        let (r, o) = &bytes[at % n];
        black_box((masker.mask_json(r).tokens, masker.mask_json(o).tokens));
        at += 1;
    });
    time("rec: Json::from_value + key", &mut |(req, _)| {
        let json = Json::from_value(req);
        black_box(keys.key(EventType::ToolCall, Some(TOOL), Some("1"), &json).expect("key"));
    });
    time("rec: sha256 request + output blobs", &mut |_| {
        let (r, o) = &bytes[at % n];
        black_box((Digest::of(r), Digest::of(o)));
        at += 1;
    });
    // As the Session does: the program gets its own value back when it decodes to itself.
    time("rec: output canonical (+ decode if needed)", &mut |(_, out)| {
        let canonical = canonical_value(out).expect("canonical");
        if !decodes_to_itself(out) {
            black_box(serde_json::from_slice::<Value>(&canonical).expect("decode"));
        }
        black_box(canonical);
    });
    let mut copies: Vec<Value> = data.iter().map(|(_, out)| out.clone()).collect();
    time("rec: result to T (from_value)", &mut |_| {
        let value = std::mem::take(&mut copies[at % n]);
        black_box(serde_json::from_value::<Value>(value).expect("from_value"));
        at += 1;
    });
    let template = tool_event("run-x", &data[0]);
    time("rec: event seal (to_value+canonical+sha256)", &mut |_| {
        let mut event = template.clone();
        event.seal(None).expect("seal");
        black_box(event.hash);
    });
    out
}

/// A tool_call event of step `(request, output)` as the runtime builds it, unsealed.
fn tool_event(run: &str, (req, out): &(Value, Value)) -> Event {
    let mut e = Event::new(run, drive::agent_name(0), EventType::ToolCall);
    e.name = Some(TOOL.into());
    e.tool = Some(ToolRef {
        name: TOOL.into(),
        version: "1".into(),
        class: ToolClass::Deterministic,
        ttl_s: None,
    });
    let json = Json::from_value(req);
    e.key = KeyConfig::default().key(EventType::ToolCall, Some(TOOL), Some("1"), &json).expect("key");
    e.request_ref = Some(Digest::of(&canonical_value(req).expect("c")));
    let output = Digest::of(&canonical_value(out).expect("c"));
    (e.output_ref, e.output_hash, e.latency_ms) = (Some(output), Some(output), Some(0));
    e
}

/// One unsealed event per step, in a fresh run id.
fn sealed(data: &[(Value, Value)]) -> Vec<Event> {
    let run = format!("run-breakdown-{}", std::process::id());
    data.iter()
        .enumerate()
        .map(|(i, step)| Event { lamport: i as u64 + 1, ..tool_event(&run, step) })
        .collect()
}

/// Appends every event with its two blobs through a [`RunWriter`] and waits for the last ack.
fn write_all(store: Arc<dyn Store>, events: &[Event], data: &[(Value, Value)]) {
    let run = &events[0].run_id;
    store.create_run(&RunMeta::new(run.clone(), RunMode::Record, 0)).expect("creating the run");
    let writer = RunWriter::open(store, run, LeaseHolder::unique()).expect("opening a writer");
    for (event, (req, out)) in events.iter().zip(data) {
        let request = BlobPut::new(canonical_value(req).expect("c"), BlobHint::Raw);
        let output = BlobPut::new(canonical_value(out).expect("c"), BlobHint::Raw);
        writer.append(event.clone(), vec![request, output]).expect("append");
    }
    writer.close().expect("closing the writer");
}

/// Serves the run like replay does, timing event pages, output blobs and decoding separately.
fn serve(store: &dyn Store, run: &str, n: usize) -> (f64, f64, f64) {
    let (mut pages, mut blobs, mut decode) = (0.0, 0.0, 0.0);
    let mut from = 1;
    loop {
        let began = Instant::now();
        let page = store.events(run, from, 4096).expect("events");
        pages += began.elapsed().as_secs_f64();
        let Some(last) = page.last() else { break };
        from = last.seq + 1;
        for event in &page {
            let began = Instant::now();
            let bytes = store.get_blob(&event.output_ref.expect("output")).expect("blob");
            let mid = Instant::now();
            black_box(serde_json::from_slice::<Value>(&bytes).expect("decode"));
            (blobs, decode) = (blobs + (mid - began).as_secs_f64(), decode + mid.elapsed().as_secs_f64());
        }
    }
    let per = |s: f64| s * 1e6 / n as f64;
    (per(pages), per(blobs), per(decode))
}
