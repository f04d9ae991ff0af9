//! Masking a recorded server-sent event stream, chunk by chunk, without losing its shape.
//!
//! A secret in a model's streamed output rarely sits in one chunk: the model emits it as
//! several deltas, and the network may cut anywhere, even inside an escape sequence. So the
//! chunks are reassembled, the stream is read as SSE events, and each event's `data:` JSON is
//! read for its delta strings (`parts.rs`). The deltas of one output part (a choice's content,
//! a tool call's arguments, an Anthropic content block, ...) are decoded and concatenated, and
//! [`Masker::find`] runs on that text. A secret's token goes into the delta where the secret
//! starts; later deltas lose the secret's remaining characters. The rest of an event's JSON
//! (full texts in `response.completed` or `message_start`, tool names, ...) is masked as
//! [`Masker::mask_json`] masks a document, and every string of a line that is not JSON data
//! (an unparseable or truncated event, a comment) as `mask_json` masks that string.
//!
//! Each rewritten string is spliced into the stream bytes at its own span; every other byte
//! stays as received. The new stream is cut back into as many chunks as came in: a boundary
//! outside rewritten strings stays where it was, one that fell inside a rewritten string moves
//! to that string's nearer end, so a token is never split across chunks.
use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;

use crate::mask::{token_len_at, Masker, TOKEN_PREFIX};

mod parts;
mod sse;

/// A masked stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskedStream<'a> {
    /// The chunks, as many as came in; unchanged ones are borrowed.
    pub chunks: Vec<Cow<'a, [u8]>>,
    /// How many secrets were replaced by tokens.
    pub tokens: usize,
}

/// A string to write over `range` of the reassembled stream.
struct Splice {
    range: Range<usize>,
    bytes: Vec<u8>,
}

/// A delta's place in the stream and in its part's text.
struct PartDelta {
    span: Range<usize>,
    text: String,
}

impl Masker {
    /// Masks an SSE stream given as the chunks it arrived in (boundaries anywhere, even inside
    /// a line, a string or a UTF-8 character). Returns as many chunks as it was given.
    pub fn mask_stream<'a, C: AsRef<[u8]>>(&self, chunks: &'a [C]) -> MaskedStream<'a> {
        let borrowed = || chunks.iter().map(|c| Cow::Borrowed(c.as_ref())).collect();
        if self.rules().is_empty() {
            return MaskedStream { chunks: borrowed(), tokens: 0 };
        }
        let stream: Vec<u8> = chunks.iter().flat_map(|c| c.as_ref().iter().copied()).collect();
        let (mut splices, tokens) = self.stream_splices(&stream);
        if tokens == 0 {
            return MaskedStream { chunks: borrowed(), tokens: 0 };
        }
        splices.sort_by_key(|s| s.range.start);
        let mut last_end = 0;
        splices.retain(|s| {
            let keep = s.range.start >= last_end;
            last_end = last_end.max(s.range.end);
            keep
        });
        let cuts = recut(chunks.iter().map(|c| c.as_ref().len()), &splices);
        let new_stream = apply(&stream, &splices);
        let mut out = Vec::with_capacity(chunks.len());
        let mut from = 0;
        for (chunk, to) in chunks.iter().zip(cuts) {
            let piece = &new_stream[from..to];
            out.push(if piece == chunk.as_ref() {
                Cow::Borrowed(chunk.as_ref())
            } else {
                Cow::Owned(piece.to_vec())
            });
            from = to;
        }
        MaskedStream { chunks: out, tokens }
    }

    /// The strings to rewrite in `stream`, and how many tokens they hold.
    fn stream_splices(&self, stream: &[u8]) -> (Vec<Splice>, usize) {
        let mut splices = Vec::new();
        let mut tokens = 0;
        let mut parts: HashMap<parts::PartKey, Vec<PartDelta>> = HashMap::new();
        let mut order: Vec<parts::PartKey> = Vec::new();
        for event in sse::events(stream) {
            for line in &event.other {
                tokens +=
                    self.mask_strings(&stream[line.clone()], &[], &|r| shift(r, line.start), &mut splices);
            }
            if event.data.is_empty() {
                continue;
            }
            let data = event.data(stream);
            if serde_json::from_slice::<serde::de::IgnoredAny>(&data.bytes).is_err() {
                for line in &event.data {
                    tokens += self.mask_strings(
                        &stream[line.clone()],
                        &[],
                        &|r| shift(r, line.start),
                        &mut splices,
                    );
                }
                continue;
            }
            let (deltas, n) =
                self.mask_data(&data.bytes, parts::deltas(&data.bytes), &|r| data.to_stream(r), &mut splices);
            tokens += n;
            for d in deltas {
                let delta = PartDelta { span: data.to_stream(&d.span), text: d.text };
                match parts.get_mut(&d.part) {
                    Some(list) => list.push(delta),
                    None => {
                        order.push(d.part.clone());
                        parts.insert(d.part, vec![delta]);
                    }
                }
            }
        }
        for key in order {
            if let Some(deltas) = parts.get(&key) {
                tokens += self.mask_part(deltas, &mut splices);
            }
        }
        (splices, tokens)
    }

    /// Masks one event's JSON data as `mask_json` masks a document (so structural rules such
    /// as JSON paths see the event's shape), but for its delta strings, which are masked as
    /// parts of their output part. A delta that a structural rule masks on its own (what
    /// `mask_json` does to it in place differs from what it does to the string alone) is
    /// masked that way and leaves its part. Returns the deltas left to their parts.
    fn mask_data(
        &self,
        data: &[u8],
        mut deltas: Vec<parts::Delta>,
        place: &dyn Fn(&Range<usize>) -> Range<usize>,
        splices: &mut Vec<Splice>,
    ) -> (Vec<parts::Delta>, usize) {
        let whole = self.mask_json(data);
        if whole.tokens == 0 {
            return (deltas, 0);
        }
        let (old, new) = (sse::string_spans(data), sse::string_spans(&whole.bytes));
        if old.len() != new.len() {
            let skip: Vec<Range<usize>> = deltas.iter().map(|d| d.span.clone()).collect();
            return (deltas, self.mask_strings(data, &skip, place, splices));
        }
        deltas.sort_by_key(|d| d.span.start);
        let mut owned_by_rule = Vec::new();
        let mut tokens = 0;
        for (o, n) in old.iter().zip(&new) {
            let (before, after) = (&data[o.clone()], &whole.bytes[n.clone()]);
            if before == after {
                continue;
            }
            if let Ok(at) = deltas.binary_search_by_key(&o.start, |d| d.span.start) {
                if self.mask_json(before).bytes.as_ref() == after {
                    continue;
                }
                owned_by_rule.push(at);
            }
            tokens += count_tokens(after).saturating_sub(count_tokens(before)).max(1);
            splices.push(Splice { range: place(o), bytes: after.to_vec() });
        }
        for at in owned_by_rule.into_iter().rev() {
            deltas.remove(at);
        }
        (deltas, tokens)
    }

    /// Masks each JSON string of `bytes` (but those in `skip`) as `mask_json` would; `place`
    /// maps a span of `bytes` to the stream.
    fn mask_strings(
        &self,
        bytes: &[u8],
        skip: &[Range<usize>],
        place: &dyn Fn(&Range<usize>) -> Range<usize>,
        splices: &mut Vec<Splice>,
    ) -> usize {
        let mut tokens = 0;
        for span in sse::string_spans(bytes) {
            if skip.iter().any(|s| s.start < span.end && span.start < s.end) {
                continue;
            }
            let masked = self.mask_json(&bytes[span.clone()]);
            if masked.tokens > 0 {
                tokens += masked.tokens;
                splices.push(Splice { range: place(&span), bytes: masked.bytes.into_owned() });
            }
        }
        tokens
    }

    /// Masks one part's text and rewrites the deltas its secrets touch.
    fn mask_part(&self, deltas: &[PartDelta], splices: &mut Vec<Splice>) -> usize {
        let text: String = deltas.iter().map(|d| d.text.as_str()).collect();
        let found = self.find(&text);
        if found.is_empty() {
            return 0;
        }
        let (mut start, mut first) = (0, 0);
        for delta in deltas {
            let range = start..start + delta.text.len();
            start = range.end;
            while found.get(first).is_some_and(|f| f.range.end <= range.start) {
                first += 1;
            }
            let touching = found[first..].iter().take_while(|f| f.range.start < range.end);
            let mut new_text = String::with_capacity(delta.text.len());
            let mut pos = range.start;
            let mut changed = false;
            // `find` promises sorted, disjoint ranges on character boundaries; `get` keeps a
            // broken promise from panicking.
            for f in touching {
                if range.is_empty() || f.range.end <= pos {
                    continue;
                }
                changed = true;
                if f.range.start >= pos {
                    new_text.push_str(text.get(pos..f.range.start).unwrap_or_default());
                    new_text.push_str(&f.token);
                }
                pos = f.range.end.min(range.end);
            }
            if changed {
                new_text.push_str(text.get(pos..range.end).unwrap_or_default());
                let bytes = serde_json::to_vec(&new_text).expect("a string serializes");
                splices.push(Splice { range: delta.span.clone(), bytes });
            }
        }
        found.len()
    }
}

/// How many tokens `bytes` hold.
pub(crate) fn count_tokens(bytes: &[u8]) -> usize {
    let text = String::from_utf8_lossy(bytes);
    text.match_indices(TOKEN_PREFIX).filter(|(at, _)| token_len_at(&text[*at..]).is_some()).count()
}

fn shift(r: &Range<usize>, by: usize) -> Range<usize> {
    r.start + by..r.end + by
}

/// The stream with `splices` (sorted, disjoint) written over it.
fn apply(stream: &[u8], splices: &[Splice]) -> Vec<u8> {
    let grow: usize = splices.iter().map(|s| s.bytes.len()).sum();
    let mut out = Vec::with_capacity(stream.len() + grow);
    let mut copied = 0;
    for s in splices {
        out.extend_from_slice(&stream[copied..s.range.start]);
        out.extend_from_slice(&s.bytes);
        copied = s.range.end;
    }
    out.extend_from_slice(&stream[copied..]);
    out
}

/// Where each chunk ends in the spliced stream, given the old chunks' lengths. A boundary
/// inside a splice moves to its nearer end (ties: the start).
fn recut(lengths: impl Iterator<Item = usize>, splices: &[Splice]) -> Vec<usize> {
    let mut cuts = Vec::new();
    let mut old = 0;
    let mut next = 0; // the first splice not wholly before `old`
    let mut growth: isize = 0; // size change of the splices wholly before `old`
    for len in lengths {
        old += len;
        while let Some(s) = splices.get(next).filter(|s| s.range.end <= old) {
            growth += s.bytes.len() as isize - s.range.len() as isize;
            next += 1;
        }
        let new = match splices.get(next).filter(|s| s.range.start < old) {
            Some(s) if old - s.range.start <= s.range.end - old => s.range.start as isize + growth,
            Some(s) => s.range.start as isize + growth + s.bytes.len() as isize,
            None => old as isize + growth,
        };
        cuts.push(new as usize);
    }
    cuts
}

#[cfg(test)]
pub(crate) mod tests;
