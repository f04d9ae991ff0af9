//! Masking a step's recorded output: a `retrace-http/1` document ([`crate::http_doc`]) part by
//! part, anything else as JSON.
//!
//! In a document, each header value goes through the header rules
//! ([`Masker::mask_header`]) and then the value rules; a JSON `body` is masked as
//! [`Masker::mask_json`] masks a document, a `body_text` as text (its quoted strings decoded
//! first, so an escaped secret in a JSON body with trailing whitespace is found too; one that
//! is a whole event stream as a one-chunk stream), a `body_b64` of a textual type (not all
//! UTF-8: a Latin-1 answer) as text around the bytes that aren't UTF-8 ([`Masker::mask_bytes`];
//! one of another type, an image or audio, is left whole, as masking would break it), and a `stream` is masked by [`Masker::mask_stream`], each chunk
//! written back the way it was (a string, or `{"b64": ...}` when it is not UTF-8). Each
//! rewritten value is spliced in at its span: every other byte of the document stays.
use std::borrow::Cow;
use std::ops::Range;

use base64::Engine as _;

use crate::http_doc::{self, BodySpan, ChunkSpan};
use crate::mask::{Masked, Masker};
use crate::mask_stream::count_tokens;

impl Masker {
    /// Masks a step's output: a `retrace-http/1` document part by part (headers, body, stream
    /// chunks), anything else as [`Masker::mask_json`] does.
    pub fn mask_output<'a>(&self, raw: &'a [u8]) -> Masked<'a> {
        if self.rules().is_empty() {
            return Masked { bytes: Cow::Borrowed(raw), tokens: 0 };
        }
        let Ok(layout) = http_doc::layout(raw) else { return self.mask_json(raw) };
        let mut splices: Vec<(Range<usize>, Vec<u8>)> = Vec::new();
        let mut tokens = 0;
        for header in &layout.headers {
            let named = self.mask_header(&header.name, &header.value);
            let value = named.as_deref().unwrap_or(&header.value);
            let (masked, n) = self.mask_text(value);
            let added =
                |v: &str| count_tokens(v.as_bytes()).saturating_sub(count_tokens(header.value.as_bytes()));
            let count = n + named.as_deref().map_or(0, added);
            if masked != header.value.as_str() {
                tokens += count.max(1);
                splices.push((header.span.clone(), json_string(&masked)));
            }
        }
        match &layout.body {
            Some(BodySpan::Json(span)) => self.splice_json(raw, span, &mut splices, &mut tokens),
            Some(BodySpan::Text(span)) => {
                let text = serde_json::from_slice::<String>(&raw[span.clone()]).ok();
                if let Some(events) = text.as_deref().filter(|t| looks_like_sse(t)) {
                    let one = [events.as_bytes()];
                    let masked = self.mask_stream(&one);
                    if masked.tokens > 0 {
                        tokens += masked.tokens;
                        splices.push((
                            span.clone(),
                            json_string(&String::from_utf8_lossy(&masked.chunks.concat())),
                        ));
                    }
                } else if let Some(text) = text {
                    let inner = self.mask_json(text.as_bytes());
                    let inner_text = String::from_utf8_lossy(&inner.bytes);
                    let (masked, n) = self.mask_text(&inner_text);
                    if inner.tokens + n > 0 {
                        tokens += inner.tokens + n;
                        splices.push((span.clone(), json_string(&masked)));
                    }
                }
            }
            Some(BodySpan::Stream(chunks)) => tokens += self.splice_stream(chunks, &mut splices),
            // A textual answer with bytes that aren't UTF-8 (QA40 D1: its secrets were kept);
            // an image or audio is left whole, as masking would break it.
            Some(BodySpan::Base64(span)) if textual(&layout.headers) => {
                let engine = base64::engine::general_purpose::STANDARD;
                let decoded = serde_json::from_slice::<String>(&raw[span.clone()]).ok();
                if let Some(bytes) = decoded.and_then(|b64| engine.decode(b64).ok()) {
                    let (masked, n) = self.mask_bytes(&bytes);
                    if n > 0 {
                        tokens += n;
                        splices.push((span.clone(), json_string(&engine.encode(masked))));
                    }
                }
            }
            Some(BodySpan::Base64(_)) | None => {}
        }
        if let Some(span) = &layout.error {
            self.splice_json(raw, span, &mut splices, &mut tokens);
        }
        if splices.is_empty() {
            return Masked { bytes: Cow::Borrowed(raw), tokens: 0 };
        }
        Masked { bytes: Cow::Owned(http_doc::splice(raw, splices)), tokens }
    }

    fn splice_json(
        &self,
        raw: &[u8],
        span: &Range<usize>,
        splices: &mut Vec<(Range<usize>, Vec<u8>)>,
        tokens: &mut usize,
    ) {
        let masked = self.mask_json(&raw[span.clone()]);
        if masked.tokens > 0 {
            *tokens += masked.tokens;
            splices.push((span.clone(), masked.bytes.into_owned()));
        }
    }

    /// Masks a stream's chunks and queues the changed ones, written as they were.
    fn splice_stream(&self, chunks: &[ChunkSpan], splices: &mut Vec<(Range<usize>, Vec<u8>)>) -> usize {
        let bytes: Vec<&[u8]> = chunks.iter().map(|c| c.bytes.as_slice()).collect();
        let masked = self.mask_stream(&bytes);
        for (chunk, new) in chunks.iter().zip(&masked.chunks) {
            if new.as_ref() == chunk.bytes.as_slice() {
                continue;
            }
            splices.push((chunk.span.clone(), write_chunk(new, chunk.b64)));
        }
        masked.tokens
    }
}

/// Whether a response's `content-type` names text (JSON, XML, `text/*`, a form, an event
/// stream), or is absent: a body of another type (an image, audio, a PDF) is not masked.
fn textual(headers: &[http_doc::HeaderSpan]) -> bool {
    let Some(header) = headers.iter().find(|h| h.name.eq_ignore_ascii_case("content-type")) else {
        return true;
    };
    let essence = header.value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let (kind, sub) = essence.split_once('/').unwrap_or((essence.as_str(), ""));
    kind == "text"
        || sub == "json"
        || sub.ends_with("+json")
        || sub == "xml"
        || sub.ends_with("+xml")
        || sub.contains("ndjson")
        || sub == "x-www-form-urlencoded"
        || sub == "javascript"
}

/// Whether a text body is a server-sent event stream (a stream answered whole).
pub(crate) fn looks_like_sse(text: &str) -> bool {
    ["data:", "event:", ":", "id:"].iter().any(|p| text.starts_with(p))
}

/// `text` as a JSON string, as the document's encoder writes it.
pub(crate) fn json_string(text: &str) -> Vec<u8> {
    serde_json::to_vec(text).expect("a string serializes")
}

/// A stream chunk's value in the document: a string, or `{"b64": ...}` when it was written so
/// or is not UTF-8.
pub(crate) fn write_chunk(bytes: &[u8], b64: bool) -> Vec<u8> {
    match std::str::from_utf8(bytes) {
        Ok(text) if !b64 => json_string(text),
        _ => {
            let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
            serde_json::to_vec(&serde_json::json!({ "b64": b64 })).expect("a value serializes")
        }
    }
}

#[cfg(test)]
mod tests;
