//! The canonical JSON of an [`Event`], written member by member in key order.
//!
//! Every recorded step hashes its event (the chain), so this is on every recorder's hot path.
//! The generic writer (`canonical::write_serialized`) keeps each member of an object apart and
//! orders them when the object ends, copying every byte twice. An event's members are known, so
//! they are written here straight in their canonical order, each key a constant. Only the nested
//! objects (`model`, `params`, `tool`, `message`, ...) and the enums go through the generic
//! writer. The definition stays `serde_json::to_value` of the event, then canonical JSON; the
//! tests hold this writer to it.
use std::ops::Range;

use serde::Serialize;

use super::Event;
use crate::canonical::{self, CanonError};
use crate::Digest;

/// Appends the canonical JSON of `event` to `out`, without its `hash` member unless
/// `with_hash`. Returns where the members `prev` and `seq` lie in `out` (key through value, no
/// comma), and the `hash` member with the comma before it (empty without it): the bytes to
/// leave out for the form without `hash`.
pub(super) fn write(
    event: &Event,
    with_hash: bool,
    out: &mut Vec<u8>,
) -> Result<[Range<usize>; 3], CanonError> {
    let mut m = Members { out, first: true };
    m.out.push(b'{');
    m.key(b"\"agent_id\":");
    m.text(&event.agent_id);
    m.key(b"\"approval\":");
    m.nested(event.approval.as_ref())?;
    m.key(b"\"causal_parent\":");
    m.number(event.causal_parent);
    m.key(b"\"decision\":");
    m.nested(event.decision.as_ref())?;
    if let Some(error) = &event.error {
        m.key(b"\"error\":");
        m.text(error);
    }
    let mut hash = 0..0;
    if with_hash {
        // `agent_id` always comes first, so a comma precedes the member.
        let at = m.key(b"\"hash\":") - 1;
        m.digest(Some(&event.hash));
        hash = at..m.out.len();
    }
    m.key(b"\"inbound\":");
    m.out.push(b'[');
    for (i, seq) in event.inbound.iter().enumerate() {
        if i > 0 {
            m.out.push(b',');
        }
        canonical::write_u64(*seq, m.out);
    }
    m.out.push(b']');
    m.key(b"\"key\":");
    m.digest(Some(&event.key));
    m.key(b"\"lamport\":");
    m.number(Some(event.lamport));
    m.key(b"\"latency_ms\":");
    m.number(event.latency_ms);
    m.key(b"\"message\":");
    m.nested(event.message.as_ref())?;
    m.key(b"\"model\":");
    m.nested(event.model.as_ref())?;
    m.key(b"\"name\":");
    m.optional_text(event.name.as_deref());
    m.key(b"\"origin_seq\":");
    m.number(event.origin_seq);
    m.key(b"\"output_hash\":");
    m.digest(event.output_hash.as_ref());
    m.key(b"\"output_ref\":");
    m.digest(event.output_ref.as_ref());
    m.key(b"\"params\":");
    m.nested(event.params.as_ref())?;
    let prev_at = m.key(b"\"prev\":");
    m.digest(event.prev.as_ref());
    let prev = prev_at..m.out.len();
    m.key(b"\"prompt_template\":");
    m.nested(event.prompt_template.as_ref())?;
    m.key(b"\"request_ref\":");
    m.digest(event.request_ref.as_ref());
    m.key(b"\"role\":");
    m.optional_text(event.role.as_deref());
    m.key(b"\"run_id\":");
    m.text(&event.run_id);
    let seq_at = m.key(b"\"seq\":");
    m.number(Some(event.seq));
    let seq = seq_at..m.out.len();
    m.key(b"\"source\":");
    m.nested(Some(&event.source))?;
    m.key(b"\"tool\":");
    m.nested(event.tool.as_ref())?;
    m.key(b"\"type\":");
    m.nested(Some(&event.kind))?;
    m.key(b"\"usage\":");
    m.nested(event.usage.as_ref())?;
    m.out.push(b'}');
    Ok([prev, seq, hash])
}

/// Writes an object's members, in the order they are given.
struct Members<'o> {
    out: &'o mut Vec<u8>,
    first: bool,
}

impl Members<'_> {
    /// Starts a member with `key` (its quoted, escaped text and the colon); returns where the
    /// member starts.
    fn key(&mut self, key: &[u8]) -> usize {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        let at = self.out.len();
        self.out.extend_from_slice(key);
        at
    }

    fn null(&mut self) {
        self.out.extend_from_slice(b"null");
    }

    fn text(&mut self, text: &str) {
        canonical::write_escaped(self.out, text);
    }

    fn optional_text(&mut self, text: Option<&str>) {
        match text {
            Some(text) => self.text(text),
            None => self.null(),
        }
    }

    fn number(&mut self, n: Option<u64>) {
        match n {
            Some(n) => canonical::write_u64(n, self.out),
            None => self.null(),
        }
    }

    /// A digest's text (`sha256:` and hex: nothing to escape).
    fn digest(&mut self, digest: Option<&Digest>) {
        match digest {
            Some(digest) => {
                self.out.push(b'"');
                self.out.extend_from_slice(digest.text(&mut [0; 7 + 64]).as_bytes());
                self.out.push(b'"');
            }
            None => self.null(),
        }
    }

    /// Any other value, through the generic writer, or through a `serde_json::Value` where
    /// that writer gives up (the same bytes either way).
    fn nested<T: Serialize>(&mut self, value: Option<&T>) -> Result<(), CanonError> {
        let Some(value) = value else {
            self.null();
            return Ok(());
        };
        let start = self.out.len();
        if canonical::write_serialized(value, self.out).is_ok() {
            return Ok(());
        }
        self.out.truncate(start);
        let value = serde_json::to_value(value).expect("every part of an event serializes");
        canonical::write_canonical_value(&value, self.out)
    }
}
