//! `retrace show RUN --seq N`: one event's fields, then its request and output.
use std::io::{BufWriter, Write};

use base64::Engine as _;
use retrace_core::run::RunMeta;
use retrace_core::Digest;
use retrace_store::{Store, StoreErrorKind};
use serde_json::{json, Value};

use crate::exit;
use crate::output::{one_line, print_json};

/// Event fields in the order they are shown (the envelope's order).
const FIELDS: [&str; 27] = [
    "run_id",
    "seq",
    "lamport",
    "agent_id",
    "role",
    "type",
    "name",
    "causal_parent",
    "inbound",
    "key",
    "request_ref",
    "output_ref",
    "output_hash",
    "model",
    "params",
    "prompt_template",
    "tool",
    "message",
    "decision",
    "approval",
    "usage",
    "latency_ms",
    "source",
    "origin_seq",
    "error",
    "prev",
    "hash",
];

/// How much of a blob the text view prints without `--full`: a page of JSON or text is read
/// whole; a 20 MB output is not read on a terminal, and would bury the event's fields.
const SHOWN: usize = 64 << 10;

/// Prints event `seq` of `meta`'s run with its blobs (each cut after [`SHOWN`] bytes unless
/// `full`).
pub fn show(store: &dyn Store, meta: &RunMeta, seq: u64, json: bool, full: bool) -> anyhow::Result<()> {
    let event = match event_of(store, meta, seq) {
        Ok(event) => event,
        Err(e) if e.kind == StoreErrorKind::NotFound => {
            let count = retrace_store::export::RunEvents::new(store, &meta.id)?.count();
            return Err(exit::not_found_hint(
                format!(
                    "run {} has {}; there is no seq {seq}",
                    meta.id,
                    crate::output::count(count, "event")
                ),
                format!("`retrace show {}` lists its events", meta.id),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    let request = event.request_ref.map(|d| blob(store, &d));
    let output = event.output_ref.map(|d| blob(store, &d));
    if json {
        let value = json!({ "run": meta.id, "event": event, "request": request, "output": output });
        return print_json(&value);
    }
    let fields = serde_json::to_value(&event)?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    // Names and ids come from the recorded program: each is kept on one line, its control
    // characters escaped, as the timeline shows them.
    let (label, agent) = (retrace_core::label::of_event(&event), &event.agent_id);
    writeln!(out, "run {} seq {seq}: {} (agent {})", meta.id, one_line(&label), one_line(agent))?;
    for name in FIELDS {
        let value = &fields[name];
        let empty = value.is_null() || value.as_array().is_some_and(Vec::is_empty);
        if !empty {
            let text = match value {
                Value::String(s) => one_line(s).into_owned(),
                other => other.to_string(),
            };
            writeln!(out, "  {name:<16}{text}")?;
        }
    }
    if let Some(edit) = super::edit_of(meta, &event) {
        writeln!(out, "  {:<16}its output is the edit's, not the source's: {}", "edited", one_line(edit))?;
    }
    let limit = if full { usize::MAX } else { SHOWN };
    for (title, blob) in [("request", request), ("output", output)] {
        let Some(blob) = blob else { continue };
        writeln!(out)?;
        if write_blob(&mut out, title, &blob, limit)? {
            let whole = format!("retrace show {} --seq {seq} --full", meta.id);
            writeln!(out, "(the {title} is cut here; all of it: {whole}, or --json)")?;
        }
    }
    out.flush()?;
    Ok(())
}

/// A blob as JSON: `{digest, bytes, json | text | base64 | error}`.
fn blob(store: &dyn Store, digest: &Digest) -> Value {
    match store.get_blob(digest) {
        Err(e) => json!({ "digest": digest, "error": e.to_string() }),
        Ok(bytes) => {
            let size = bytes.len();
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                return json!({ "digest": digest, "bytes": size, "json": value });
            }
            match String::from_utf8(bytes) {
                Ok(text) => json!({ "digest": digest, "bytes": size, "text": text }),
                Err(e) => {
                    let encoded = base64::engine::general_purpose::STANDARD.encode(e.as_bytes());
                    json!({ "digest": digest, "bytes": size, "base64": encoded })
                }
            }
        }
    }
}

/// Writes `blob` under a title line, at most `limit` bytes of its body; returns whether it was
/// cut. Text is the recorded program's: its control characters other than newlines and tabs
/// are escaped (`\u{1b}`), so an output can't drive the reader's terminal.
fn write_blob(out: &mut impl Write, title: &str, blob: &Value, limit: usize) -> anyhow::Result<bool> {
    let digest = blob["digest"].as_str().unwrap_or("?");
    if let Some(error) = blob["error"].as_str() {
        writeln!(out, "{title} ({digest}): cannot read: {error}")?;
        return Ok(false);
    }
    let size = &blob["bytes"];
    let (kind, body) = if let Some(value) = blob.get("json") {
        ("JSON", serde_json::to_string_pretty(value)?)
    } else if let Some(text) = blob["text"].as_str() {
        ("text", printable(text.trim_end_matches('\n')))
    } else {
        ("binary, base64", blob["base64"].as_str().unwrap_or("").to_owned())
    };
    writeln!(out, "{title} ({digest}, {size} bytes, {kind}):")?;
    let (shown, cut) = cut_at(&body, limit);
    writeln!(out, "{shown}")?;
    if cut > 0 {
        writeln!(out, "… {cut} more bytes")?;
    }
    Ok(cut > 0)
}

/// `text` with its control characters other than `\n` and `\t` escaped.
fn printable(text: &str) -> String {
    let keep = |c: char| !c.is_control() || c == '\n' || c == '\t';
    text.chars().map(|c| if keep(c) { c.to_string() } else { c.escape_debug().to_string() }).collect()
}

/// The first `limit` bytes of `text` or fewer (whole characters), and how many bytes are left.
fn cut_at(text: &str, limit: usize) -> (&str, usize) {
    if text.len() <= limit {
        return (text, 0);
    }
    let end = (0..=limit).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    (&text[..end], text.len() - end)
}

/// Event `seq` of `meta`'s run: a fork's events before its fork point are its source's.
fn event_of(store: &dyn Store, meta: &RunMeta, seq: u64) -> retrace_store::StoreResult<retrace_core::Event> {
    match (&meta.source_run, meta.fork_at) {
        // Inherited by reference (a fork imported with its inherited events holds them itself).
        (Some(source), Some(at))
            if meta.mode == retrace_core::run::RunMode::Fork
                && seq < at
                && !retrace_store::export::holds_inherited(store, meta)? =>
        {
            event_of(store, &store.run(source)?, seq)
        }
        _ => store.event(&meta.id, seq),
    }
}
