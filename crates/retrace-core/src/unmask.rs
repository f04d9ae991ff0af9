//! Handing originals back into a masked value: what replay under a rule with
//! `replay = "original"` gives the program (SPEC §7), the masking stage run backwards.
//!
//! The masking stage finds a secret in a *decoded* string and splices its token into the raw
//! bytes, so the original of a token must be escaped once for each level of JSON string the
//! stage decoded to find it. [`unmask`] walks a value the way [`Masker::mask_output`] did:
//!
//! | where the token is | levels |
//! |---|---|
//! | a JSON value (a tool output, a request, a document's `body` or `error`), in a string | 1 |
//! | bytes that are not JSON, outside anything that looks like a string | 0 |
//! | a `retrace-http/1` header value (plain text in the document's string) | 1 |
//! | a `body_text` that holds JSON, in one of its strings | 2 |
//! | a `stream` chunk (or a `body_text` that is a whole event stream), in a string of an event line | 2 |
//!
//! A changed header, `body_text` or chunk is written back as the masking stage wrote it: a
//! JSON string (a chunk that is not UTF-8, or was base64, as `{"b64": ...}`); every other byte
//! stays. Chunk boundaries of the masked stream never fall inside a token; the original goes
//! into the chunk where its token starts.
//!
//! This gives back the recorded bytes exactly when the masking stage rewrote nothing but the
//! secrets: a secret inside one string, written with the escapes `serde_json` writes. A secret
//! a model streamed across several deltas comes back whole in the first of them (the masked
//! stream no longer says where the deltas split it), and a rewritten string loses escapes the
//! upstream chose (`\/`, `\u00e9`). The text is the same; for the bytes, the runtime keeps the
//! recorded form itself in the vault when it differs from what [`unmask`] would give
//! (`retrace_runtime`'s `vaulting.rs`).
//!
//! [`Masker::mask_output`]: crate::mask::Masker::mask_output
use std::borrow::Cow;
use std::ops::Range;

use crate::http_doc::{self, BodySpan, ChunkSpan};
use crate::mask::{string_spans, token_prefix_len, TOKEN_PREFIX};
use crate::mask_http::{json_string, looks_like_sse, write_chunk};

/// `masked` with each token for which `original` gives an original replaced by it, escaped
/// once per level of JSON string around the token (module docs). `original` answers `None`
/// for a token to leave as it is; its error stops the walk.
pub fn unmask<'a, E>(
    masked: &'a [u8],
    original: &mut dyn FnMut(&str) -> Result<Option<String>, E>,
) -> Result<Cow<'a, [u8]>, E> {
    if memchr::memmem::find(masked, TOKEN_PREFIX.as_bytes()).is_none() {
        return Ok(Cow::Borrowed(masked));
    }
    let changed = match http_doc::layout(masked) {
        Ok(layout) => unmask_document(masked, &layout, original)?,
        Err(_) => unmask_json(masked, original)?,
    };
    Ok(changed.map_or(Cow::Borrowed(masked), Cow::Owned))
}

/// The tokens in `bytes`, in order (a token glued to the word after it included, as the
/// masking stage may write it).
pub fn tokens_in(bytes: &[u8]) -> Vec<&str> {
    let mut tokens = Vec::new();
    let mut after = 0;
    for at in memchr::memmem::find_iter(bytes, TOKEN_PREFIX.as_bytes()) {
        if at < after {
            continue;
        }
        if let Some(len) = token_prefix_len(&bytes[at..]) {
            after = at + len;
            tokens.push(std::str::from_utf8(&bytes[at..after]).expect("tokens are ASCII"));
        }
    }
    tokens
}

/// The kind of a token (`email` of `rtk_email_...`), if `token` is one.
pub fn token_kind(token: &str) -> Option<&str> {
    let len = token_prefix_len(token.as_bytes())?;
    let kind_and_tail = &token[TOKEN_PREFIX.len()..len];
    kind_and_tail.rsplit_once('_').map(|(kind, _)| kind)
}

/// New bytes for a range of a value.
type Splice = (Range<usize>, Vec<u8>);

/// A document part by part; `None` when nothing changed.
fn unmask_document<E>(
    raw: &[u8],
    layout: &http_doc::Layout,
    original: &mut dyn FnMut(&str) -> Result<Option<String>, E>,
) -> Result<Option<Vec<u8>>, E> {
    let mut splices: Vec<Splice> = Vec::new();
    for header in &layout.headers {
        let value = header.value.as_bytes();
        if let Some(new) = substitute(value, &[], original)? {
            splices.push((header.span.clone(), json_string(&String::from_utf8_lossy(&new))));
        }
    }
    match &layout.body {
        Some(BodySpan::Json(span)) => {
            if let Some(new) = unmask_json(&raw[span.clone()], original)? {
                splices.push((span.clone(), new));
            }
        }
        Some(BodySpan::Text(span)) => {
            let text = serde_json::from_slice::<String>(&raw[span.clone()]).ok();
            let new = match text.as_deref() {
                Some(events) if looks_like_sse(events) => unmask_events(events.as_bytes(), original)?,
                Some(text) => unmask_json(text.as_bytes(), original)?,
                None => None,
            };
            if let Some(new) = new {
                splices.push((span.clone(), json_string(&String::from_utf8_lossy(&new))));
            }
        }
        Some(BodySpan::Stream(chunks)) => splices.extend(unmask_chunks(chunks, original)?),
        Some(BodySpan::Base64(_)) | None => {}
    }
    if let Some(span) = &layout.error {
        if let Some(new) = unmask_json(&raw[span.clone()], original)? {
            splices.push((span.clone(), new));
        }
    }
    if splices.is_empty() {
        return Ok(None);
    }
    Ok(Some(http_doc::splice(raw, splices)))
}

/// JSON (or bytes that are not): a token inside a string is one level deep, one outside any
/// string none.
fn unmask_json<E>(
    bytes: &[u8],
    original: &mut dyn FnMut(&str) -> Result<Option<String>, E>,
) -> Result<Option<Vec<u8>>, E> {
    substitute(bytes, &string_spans(bytes), original)
}

/// A whole event stream held in one string: its strings are found line by line, as the stream
/// masker reads them (an event line's JSON never spans lines).
fn unmask_events<E>(
    stream: &[u8],
    original: &mut dyn FnMut(&str) -> Result<Option<String>, E>,
) -> Result<Option<Vec<u8>>, E> {
    substitute(stream, &event_strings(stream), original)
}

/// The changed chunks of a stream, each with its span in the document and its new value.
fn unmask_chunks<E>(
    chunks: &[ChunkSpan],
    original: &mut dyn FnMut(&str) -> Result<Option<String>, E>,
) -> Result<Vec<Splice>, E> {
    let stream: Vec<u8> = chunks.iter().flat_map(|c| c.bytes.iter().copied()).collect();
    let subs = substitutions(&stream, &event_strings(&stream), original)?;
    if subs.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let (mut start, mut pos, mut next) = (0, 0, 0);
    for chunk in chunks {
        let end = start + chunk.bytes.len();
        let mut new = Vec::with_capacity(chunk.bytes.len());
        // `pos` may already be past this chunk's start: the rest of a token that began before.
        while pos < end {
            match subs.get(next) {
                Some((range, bytes)) if range.start < end => {
                    new.extend_from_slice(&stream[pos..range.start]);
                    new.extend_from_slice(bytes);
                    pos = range.end;
                    next += 1;
                }
                _ => {
                    new.extend_from_slice(&stream[pos..end]);
                    pos = end;
                }
            }
        }
        if new != chunk.bytes {
            out.push((chunk.span.clone(), write_chunk(&new, chunk.b64)));
        }
        start = end;
    }
    Ok(out)
}

/// The spans of the strings of each line of `stream`.
fn event_strings(stream: &[u8]) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let mut start = 0;
    for line in stream.split(|b| *b == b'\n') {
        spans.extend(string_spans(line).into_iter().map(|s| s.start + start..s.end + start));
        start += line.len() + 1;
    }
    spans
}

/// `bytes` with its tokens replaced ([`substitutions`]); `None` when none was.
fn substitute<E>(
    bytes: &[u8],
    quoted: &[Range<usize>],
    original: &mut dyn FnMut(&str) -> Result<Option<String>, E>,
) -> Result<Option<Vec<u8>>, E> {
    let subs = substitutions(bytes, quoted, original)?;
    if subs.is_empty() {
        return Ok(None);
    }
    Ok(Some(http_doc::splice(bytes, subs)))
}

/// Each token of `bytes` that `original` answers, with what replaces it: the original,
/// JSON-escaped when the token lies inside one of the `quoted` spans (sorted, disjoint).
fn substitutions<E>(
    bytes: &[u8],
    quoted: &[Range<usize>],
    original: &mut dyn FnMut(&str) -> Result<Option<String>, E>,
) -> Result<Vec<Splice>, E> {
    let mut subs = Vec::new();
    let mut after = 0;
    for at in memchr::memmem::find_iter(bytes, TOKEN_PREFIX.as_bytes()) {
        if at < after {
            continue;
        }
        let Some(len) = token_prefix_len(&bytes[at..]) else { continue };
        let range = at..at + len;
        after = range.end;
        let token = std::str::from_utf8(&bytes[range.clone()]).expect("tokens are ASCII");
        let Some(text) = original(token)? else { continue };
        let in_string = quoted
            .get(quoted.partition_point(|q| q.end <= range.start))
            .is_some_and(|q| q.start < range.start && range.end < q.end);
        let new = if in_string {
            let escaped = json_string(&text);
            escaped[1..escaped.len() - 1].to_vec()
        } else {
            text.into_bytes()
        };
        subs.push((range, new));
    }
    Ok(subs)
}

#[cfg(test)]
mod tests;
