//! Masking a JSON document in place: decoded strings are matched, tokens are spliced into the
//! raw bytes, and every byte outside a masked string stays as received.
use std::borrow::Cow;
use std::ops::Range;

use super::engine::Engine;
use super::scan::{self, JsonString};
use super::unescape::unescape;
use super::{splice, Masked, Masker};

/// The output being built: untouched until the first masked string.
struct Splicer<'a> {
    raw: &'a [u8],
    out: Option<Vec<u8>>,
    copied: usize,
    tokens: usize,
}

impl<'a> Splicer<'a> {
    fn replace(&mut self, span: Range<usize>, masked: &str, tokens: usize) {
        let out = self.out.get_or_insert_with(|| Vec::with_capacity(self.raw.len() + 64));
        out.extend_from_slice(&self.raw[self.copied..span.start]);
        serde_json::to_writer(&mut *out, masked).expect("writing to a vec");
        self.copied = span.end;
        self.tokens += tokens;
    }

    /// As [`Splicer::replace`], for a string that is not all UTF-8: its UTF-8 runs escaped as
    /// JSON escapes them, every other byte written as it was.
    fn replace_bytes(&mut self, span: Range<usize>, masked: &[u8], tokens: usize) {
        let out = self.out.get_or_insert_with(|| Vec::with_capacity(self.raw.len() + 64));
        out.extend_from_slice(&self.raw[self.copied..span.start]);
        out.push(b'"');
        for chunk in masked.utf8_chunks() {
            let quoted = serde_json::to_vec(chunk.valid()).expect("a string serializes");
            out.extend_from_slice(&quoted[1..quoted.len() - 1]);
            out.extend_from_slice(chunk.invalid());
        }
        out.push(b'"');
        self.copied = span.end;
        self.tokens += tokens;
    }

    fn finish(self) -> Masked<'a> {
        match self.out {
            None => Masked { bytes: Cow::Borrowed(self.raw), tokens: 0 },
            Some(mut out) => {
                out.extend_from_slice(&self.raw[self.copied..]);
                Masked { bytes: Cow::Owned(out), tokens: self.tokens }
            }
        }
    }
}

impl Masker {
    /// False only when [`Masker::mask_json`] would leave the canonical form of `value`
    /// unchanged: no string of it (keys included) holds anything a text rule finds, and no
    /// `json_path` rule is set. It looks at the value's strings as they are, so the common case
    /// of a request without secrets skips scanning and unescaping its canonical bytes.
    pub fn would_mask_value(&self, value: &serde_json::Value) -> bool {
        use serde_json::Value;
        if !self.engine.looks_in_bodies || self.key.is_none() {
            return false;
        }
        if self.engine.has_paths() {
            return true;
        }
        let finds = |s: &str| {
            s.len() >= self.engine.min_len()
                && (!self.engine.find(s.as_bytes()).is_empty() || self.mask_encoded(s).is_some())
        };
        let mut stack = vec![value];
        while let Some(v) = stack.pop() {
            match v {
                Value::String(s) if finds(s) => return true,
                Value::Array(items) => stack.extend(items),
                Value::Object(fields) => {
                    for (k, v) in fields {
                        if finds(k) {
                            return true;
                        }
                        stack.push(v);
                    }
                }
                _ => {}
            }
        }
        false
    }

    /// Masks every string (keys and values) of a JSON document (or a sequence of them, as in
    /// JSON Lines), splicing tokens into the raw bytes; `json_path` rules mask whole values at
    /// their paths, a number there becoming a token string (and a revealed one a string of its
    /// digits). In bytes that are not JSON, whatever looks like a JSON string is masked as
    /// one, then the whole as text when it is UTF-8.
    pub fn mask_json<'a>(&self, raw: &'a [u8]) -> Masked<'a> {
        if !self.engine.looks_in_bodies || self.key.is_none() {
            return Masked { bytes: Cow::Borrowed(raw), tokens: 0 };
        }
        let mut splicer = Splicer { raw, out: None, copied: 0, tokens: 0 };
        let mut buf = Vec::new();
        let paths = self.engine.has_paths();
        let scanned = scan::scan(raw, |s, frames| {
            let path_rule =
                if paths && !s.is_key { self.engine.path_rule(&scan::location(raw, frames)) } else { None };
            // A number is masked only at a `json_path` rule's path, whole, into a token string.
            if !s.is_number || path_rule.is_some() {
                self.mask_string(&s, path_rule, &mut buf, &mut splicer);
            }
        });
        if scanned.is_ok() {
            return splicer.finish();
        }
        // Not JSON: mask what looks like JSON strings (so escaped secrets are still found),
        // then the whole as text.
        let mut splicer = Splicer { raw, out: None, copied: 0, tokens: 0 };
        for span in string_spans(raw) {
            let escaped = raw[span.clone()].contains(&b'\\');
            let s = JsonString { span, escaped, is_key: false, is_number: false };
            self.mask_string(&s, None, &mut buf, &mut splicer);
        }
        let strings = splicer.finish();
        let Ok(text) = std::str::from_utf8(&strings.bytes) else {
            return strings;
        };
        let (masked, more) = self.mask_text(text);
        if more == 0 {
            return strings;
        }
        let bytes = Cow::Owned(masked.into_owned().into_bytes());
        Masked { bytes, tokens: strings.tokens + more }
    }

    fn mask_string(
        &self,
        s: &JsonString,
        path_rule: Option<usize>,
        buf: &mut Vec<u8>,
        splicer: &mut Splicer<'_>,
    ) {
        let inner = match s.is_number {
            true => &splicer.raw[s.span.clone()],
            false => &splicer.raw[s.span.start + 1..s.span.end - 1],
        };
        if path_rule.is_none() && inner.len() < self.engine.min_len() {
            return;
        }
        let decoded: &[u8] = if s.escaped {
            buf.clear();
            if !unescape(inner, buf) {
                return;
            }
            buf
        } else {
            inner
        };
        let candidates = match path_rule {
            Some(rule) => Engine::whole(decoded, rule),
            None => self.engine.find(decoded),
        };
        // A URL's percent-encoded parts may hide what the rules find (`to=a%40b.com`).
        let encoded = path_rule.is_none() && super::url::may_hide(decoded);
        if candidates.is_empty() && !encoded {
            return;
        }
        // Only now, with something to mask, must the string be UTF-8. One that is not (a
        // Latin-1 answer: QA40 D1) is masked around the bytes that aren't, which stay.
        let Ok(decoded) = std::str::from_utf8(decoded) else {
            if path_rule.is_none() && !s.is_number {
                let (masked, tokens) = self.mask_bytes(decoded);
                if tokens > 0 {
                    splicer.replace_bytes(s.span.clone(), &masked, tokens);
                }
            }
            return;
        };
        let (mut masked, mut tokens) = (Cow::Borrowed(decoded), 0);
        if !candidates.is_empty() {
            let mut found = self.found(decoded, candidates);
            let settled = if path_rule.is_none() { self.settle(decoded, &mut found) } else { None };
            masked = settled.map_or_else(|| splice(decoded, &found), Cow::Owned);
            tokens = found.len();
        }
        if let Some((again, more)) = encoded.then(|| self.mask_encoded(&masked)).flatten() {
            (masked, tokens) = (Cow::Owned(again), tokens + more);
        }
        if tokens > 0 {
            splicer.replace(s.span.clone(), &masked, tokens);
        }
    }
}

/// The byte spans (quotes included) of every quoted run in `raw` that could be a JSON string
/// (no raw control characters): the fallback for bytes that are not JSON, and the strings of a
/// stream event's data. The scan is lexical: balanced quotes, no valid document needed.
pub(crate) fn string_spans(raw: &[u8]) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'"' {
            i += 1;
            continue;
        }
        let start = i;
        i += 1;
        while i < raw.len() && raw[i] != b'"' {
            i += if raw[i] == b'\\' { 2 } else { 1 };
        }
        if i >= raw.len() {
            break;
        }
        i += 1;
        if !raw[start..i].iter().any(|b| *b < 0x20) {
            spans.push(start..i);
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::{contains_token, token_len_at, MaskKey, MaskRule, MaskRules, ReplayAs, RuleMatch};

    fn key() -> MaskKey {
        MaskKey::from_bytes([7; 32])
    }

    fn masker(value: &str) -> Masker {
        let rules = MaskRules {
            rules: vec![MaskRule {
                name: "canary".into(),
                kind: "secret".into(),
                matcher: RuleMatch::Literal { value: value.into() },
                replay: ReplayAs::Token,
            }],
        };
        Masker::new(rules, Some(key())).unwrap()
    }

    #[test]
    fn would_mask_value_agrees_with_mask_json() {
        let m = Masker::new(MaskRules::defaults(), Some(key())).unwrap();
        let cases = [
            serde_json::json!({"q": "select 1", "n": 4111111111111111u64, "tags": ["a", "b"]}),
            serde_json::json!({"to": "ada@example.com"}),
            serde_json::json!({"ada@example.com": 1}),
            serde_json::json!([{"deep": [{"k": "Bearer abcdef0123456789"}]}]),
            serde_json::json!("line\nsk-proj-abcdefghij0123456789abcdefghij"),
            serde_json::json!({"card": "4111 1111 1111 1111", "short": "x"}),
        ];
        for value in cases {
            let canonical = crate::canonical::canonical_value(&value).unwrap();
            assert_eq!(m.would_mask_value(&value), m.mask_json(&canonical).tokens > 0, "{value}");
        }
        assert!(!Masker::empty().would_mask_value(&serde_json::json!({"to": "ada@example.com"})));
    }

    #[test]
    fn empty_rules_borrow_the_input() {
        let raw = br#"{"a": "sk-123"}"#;
        let m = Masker::empty().mask_json(raw);
        assert!(matches!(m.bytes, Cow::Borrowed(_)));
        assert_eq!(m.tokens, 0);
    }

    #[test]
    fn tokens_have_the_contract_shape_and_are_stable() {
        let t = key().token("email", "a@b.c");
        assert_eq!(token_len_at(&t), Some(t.len()));
        assert!(t.starts_with("rtk_email_"));
        assert_eq!(t.len(), "rtk_email_".len() + 26);
        assert_eq!(t, key().token("email", "a@b.c"));
        assert_ne!(t, MaskKey::from_bytes([8; 32]).token("email", "a@b.c"));
    }

    #[test]
    fn a_match_is_spliced_and_other_bytes_stay() {
        let raw = br#"{ "k" : "x sk-123 y",  "n": 1 }"#;
        let m = masker("sk-123").mask_json(raw);
        let text = String::from_utf8(m.bytes.to_vec()).unwrap();
        let token = key().token("secret", "sk-123");
        assert_eq!(text, format!(r#"{{ "k" : "x {token} y",  "n": 1 }}"#));
        assert_eq!(m.tokens, 1);
    }

    #[test]
    fn escaped_secrets_are_found_and_masking_is_idempotent() {
        let raw = br#"{"k":"sk\u002d123"}"#;
        let once = masker("sk-123").mask_json(raw).bytes.into_owned();
        assert!(!String::from_utf8_lossy(&once).contains("sk"));
        let twice = masker("sk-123").mask_json(&once).bytes.into_owned();
        assert_eq!(once, twice);
        assert!(contains_token(&once));
    }

    #[test]
    fn a_json_path_rule_masks_a_number_at_its_path_into_a_token_string() {
        let rules = MaskRules {
            rules: vec![MaskRule {
                name: "card".into(),
                kind: "card".into(),
                matcher: RuleMatch::JsonPath { json_path: "$..card".into() },
                replay: ReplayAs::Token,
            }],
        };
        let m = Masker::new(rules, Some(key())).unwrap();
        let raw = br#"{"card": 4111111111111111, "n": 4111111111111111, "more": {"card": [-1.5e3, true]}}"#;
        let once = m.mask_json(raw);
        let text = String::from_utf8(once.bytes.to_vec()).unwrap();
        let (card, small) = (key().token("card", "4111111111111111"), key().token("card", "-1.5e3"));
        assert_eq!(
            text,
            format!(r#"{{"card": "{card}", "n": 4111111111111111, "more": {{"card": ["{small}", true]}}}}"#)
        );
        assert_eq!(once.tokens, 2);
        assert_eq!(m.mask_json(text.as_bytes()).tokens, 0, "masking twice equals once");
        // Without a path rule a number is never looked at, whatever detector it would match.
        let defaults = Masker::new(MaskRules::defaults(), Some(key())).unwrap();
        assert_eq!(defaults.mask_json(br#"{"card": 4111111111111111}"#).tokens, 0);
    }

    #[test]
    fn never_matches_inside_a_token() {
        let token = key().token("secret", "whatever");
        let tail = &token[token.len() - 5..];
        let raw = format!(r#"{{"k":"{token}"}}"#);
        let m = masker(tail).mask_json(raw.as_bytes());
        assert_eq!(m.tokens, 0);
    }
}
