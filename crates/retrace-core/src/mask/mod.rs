//! The masking stage: every request, output, message body and env value passes through here
//! before a byte is persisted, and keys are computed on what comes out.
//!
//! A masked secret becomes a token `rtk_<kind>_<26 base32 chars>`: a keyed HMAC-SHA256 of the
//! secret under the mask key, so equal secrets give equal tokens and keys still match on any
//! machine holding the same key. Matchers run on decoded JSON string values (escapes resolved);
//! a match is replaced by splicing the JSON-escaped token into the raw bytes at that string's span,
//! so every byte outside masked strings stays as received. Masking never matches inside a token,
//! so masking twice equals masking once.
//!
//! The rule set is recorded with each run. Today's matcher kind is `literal` (known secret
//! values); header, pattern and JSON-path rules extend [`RuleMatch`].
use std::borrow::Cow;

pub mod detect;
mod header;
mod key;
mod rules;
mod token;

pub use detect::Detector;
pub use key::{BadMaskKey, MaskKey};
pub use rules::{MaskRule, MaskRules, ReplayAs, RuleMatch, DEFAULT_HEADERS};
use token::token_spans;
pub use token::{contains_token, token_len_at, TOKEN_PREFIX, TOKEN_TAIL_LEN};

/// The masking stage could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaskError {
    /// Rules are set but there is no key to make tokens with.
    #[error("masking rules are set but no mask key is available (set RETRACE_MASK_KEY)")]
    NoKey,
    /// A rule's kind is not `[a-z0-9]+`.
    #[error("masking rule {0:?}: kind must be lower-case letters and digits")]
    BadKind(String),
}

/// The output of the masking stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Masked<'a> {
    /// The bytes to persist and hash.
    pub bytes: Cow<'a, [u8]>,
    /// How many secrets were replaced by tokens.
    pub tokens: usize,
}

/// The masking stage: a rule set and the key tokens are made with.
#[derive(Clone, Debug, Default)]
pub struct Masker {
    rules: MaskRules,
    key: Option<MaskKey>,
}

impl Masker {
    /// A stage that masks nothing.
    pub fn empty() -> Masker {
        Masker::default()
    }

    /// A stage with `rules`, making tokens under `key`.
    pub fn new(rules: MaskRules, key: Option<MaskKey>) -> Result<Masker, MaskError> {
        for rule in &rules.rules {
            if rule.kind.is_empty()
                || !rule.kind.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            {
                return Err(MaskError::BadKind(rule.name.clone()));
            }
        }
        if !rules.is_empty() && key.is_none() {
            return Err(MaskError::NoKey);
        }
        Ok(Masker { rules, key })
    }

    /// The rule set.
    pub fn rules(&self) -> &MaskRules {
        &self.rules
    }

    /// The key's fingerprint, if a key is set.
    pub fn key_fingerprint(&self) -> Option<String> {
        self.key.as_ref().map(MaskKey::fingerprint)
    }

    /// Masks every string (keys and values) of a JSON document, splicing tokens into the raw bytes.
    /// Bytes that are not a JSON document are masked as text.
    pub fn mask_json<'a>(&self, raw: &'a [u8]) -> Masked<'a> {
        if self.rules.is_empty() {
            return Masked { bytes: Cow::Borrowed(raw), tokens: 0 };
        }
        let mut out: Option<Vec<u8>> = None;
        let mut copied = 0;
        let mut tokens = 0;
        for span in string_spans(raw) {
            let inner = &raw[span.start + 1..span.end - 1];
            let decoded: Cow<'_, str> = if inner.contains(&b'\\') {
                match serde_json::from_slice::<String>(&raw[span.clone()]) {
                    Ok(s) => Cow::Owned(s),
                    Err(_) => continue,
                }
            } else {
                match std::str::from_utf8(inner) {
                    Ok(s) => Cow::Borrowed(s),
                    Err(_) => continue,
                }
            };
            let (masked, n) = self.mask_str(&decoded);
            if n == 0 {
                continue;
            }
            tokens += n;
            let buf = out.get_or_insert_with(|| Vec::with_capacity(raw.len()));
            buf.extend_from_slice(&raw[copied..span.start]);
            serde_json::to_writer(&mut *buf, masked.as_ref()).expect("writing to a vec");
            copied = span.end;
        }
        match out {
            None => Masked { bytes: Cow::Borrowed(raw), tokens: 0 },
            Some(mut buf) => {
                buf.extend_from_slice(&raw[copied..]);
                Masked { bytes: Cow::Owned(buf), tokens }
            }
        }
    }

    /// Masks free text (log lines, error messages, env values).
    pub fn mask_text<'a>(&self, text: &'a str) -> (Cow<'a, str>, usize) {
        if self.rules.is_empty() {
            return (Cow::Borrowed(text), 0);
        }
        self.mask_str(text)
    }

    fn mask_str<'a>(&self, text: &'a str) -> (Cow<'a, str>, usize) {
        let found = self.find(text);
        if found.is_empty() {
            return (Cow::Borrowed(text), 0);
        }
        let mut out = String::with_capacity(text.len());
        let mut copied = 0;
        for m in &found {
            out.push_str(&text[copied..m.range.start]);
            out.push_str(&m.token);
            copied = m.range.end;
        }
        out.push_str(&text[copied..]);
        (Cow::Owned(out), found.len())
    }

    /// Every secret the rules find in `text` (a decoded string value or free text): sorted,
    /// non-overlapping byte ranges with the token each becomes. Never a range inside a token.
    /// The stream masker maps these ranges back onto the chunks that carried them.
    pub fn find(&self, text: &str) -> Vec<Found> {
        let Some(key) = &self.key else {
            return Vec::new();
        };
        let mut found: Vec<Found> = Vec::new();
        let mut protected: Option<Vec<std::ops::Range<usize>>> = None;
        for rule in &self.rules.rules {
            let RuleMatch::Literal { value } = &rule.matcher else {
                continue;
            };
            if value.is_empty() || !text.contains(value.as_str()) {
                continue;
            }
            let protected = protected.get_or_insert_with(|| token_spans(text));
            for (pos, _) in text.match_indices(value.as_str()) {
                let range = pos..pos + value.len();
                let overlaps = |r: &std::ops::Range<usize>| r.start < range.end && range.start < r.end;
                if protected.iter().any(overlaps) || found.iter().any(|f| overlaps(&f.range)) {
                    continue;
                }
                found.push(Found { range, token: key.token(&rule.kind, value), rule: rule.name.clone() });
            }
        }
        found.sort_by_key(|f| f.range.start);
        found
    }
}

/// One secret found in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its byte range in the text.
    pub range: std::ops::Range<usize>,
    /// The token that replaces it.
    pub token: String,
    /// The name of the rule that found it.
    pub rule: String,
}

/// The byte spans (quotes included) of every JSON string token in `raw`, keys and values alike.
/// The scan is lexical: it needs no valid document, only balanced quotes.
fn string_spans(raw: &[u8]) -> Vec<std::ops::Range<usize>> {
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
        spans.push(start..i);
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn never_matches_inside_a_token() {
        let token = key().token("secret", "whatever");
        let tail = &token[token.len() - 5..];
        let raw = format!(r#"{{"k":"{token}"}}"#);
        let m = masker(tail).mask_json(raw.as_bytes());
        assert_eq!(m.tokens, 0);
    }
}
