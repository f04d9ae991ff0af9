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
//! The rule set is recorded with each run. Rules ([`RuleMatch`]) are `literal` (known secret
//! values), `pattern` (a built-in [`Detector`]), `regex`, `header` ([`Masker::mask_header`]) and
//! `json_path` ([`jsonpath`]); [`MaskRules::defaults`] is the recommended set and
//! [`config::parse_toml`] reads the `[mask]` table of `retrace.toml`.
//!
//! ```
//! use retrace_core::mask::{MaskKey, MaskRules, Masker};
//!
//! let masker = Masker::new(MaskRules::defaults(), Some(MaskKey::from_bytes([7; 32])))?;
//! let masked = masker.mask_json(br#"{"to": "ada@example.com", "n": 1}"#);
//! assert_eq!(masked.tokens, 1);
//! assert!(std::str::from_utf8(&masked.bytes)?.starts_with(r#"{"to": "rtk_email_"#));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

pub mod config;
pub mod detect;
mod detect_keys;
mod detect_pii;
mod engine;
mod header;
mod json;
pub mod jsonpath;
mod key;
mod originals;
mod rules;
mod scan;
mod token;
mod unescape;
mod url;

pub use config::MaskConfigError;
pub use detect::Detector;
pub(crate) use json::string_spans;
pub use key::{BadMaskKey, MaskKey};
pub use originals::OriginalsSink;
pub use rules::{
    literal_digest, MaskRule, MaskRules, ReplayAs, RuleMatch, DEFAULT_HEADERS, DEFAULT_QUERY_PARAMS,
};
pub(crate) use token::token_prefix_len;
pub use token::{contains_token, token_len_at, TOKEN_PREFIX, TOKEN_TAIL_LEN};

use engine::{Candidate, Engine};

/// The masking stage could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaskError {
    /// Rules are set but there is no key to make tokens with.
    #[error("masking rules are set but no mask key is available (set RETRACE_MASK_KEY)")]
    NoKey,
    /// A rule's kind is not `[a-z0-9]+`.
    #[error("masking rule {0:?}: kind must be lower-case letters and digits")]
    BadKind(String),
    /// A `regex` rule's expression does not compile.
    #[error("masking rule {rule:?}: bad regex: {error}")]
    BadRegex {
        /// The rule's name.
        rule: String,
        /// What the regex compiler said.
        error: String,
    },
    /// A `json_path` rule's path does not parse.
    #[error("masking rule {rule:?}: {error}")]
    BadPath {
        /// The rule's name.
        rule: String,
        /// What is wrong with the path.
        error: String,
    },
    /// A `literal` rule with an empty value would match everywhere.
    #[error("masking rule {0:?}: the literal value is empty")]
    EmptyLiteral(String),
    /// The literal values could not be compiled into one automaton.
    #[error("masking literals: {0}")]
    BadLiteral(String),
    /// A run's `literal` rule, recorded as its value's digest (never the value), whose value
    /// today's `retrace.toml` doesn't hold.
    #[error(
        "masking rule {0:?} masks a literal value that the run records only as a digest, and no \
         literal rule of today's retrace.toml has that value: put the rule back in retrace.toml \
         (literal = \"...\") to replay or fork this run"
    )]
    LiteralNotGiven(String),
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
    engine: Engine,
    /// Each rule's name, shared by everything it finds.
    names: Vec<Arc<str>>,
    sink: Option<OriginalsSink>,
}

/// One secret found in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its byte range in the text.
    pub range: std::ops::Range<usize>,
    /// The token that replaces it.
    pub token: String,
    /// The name of the rule that found it.
    pub rule: Arc<str>,
}

impl Masker {
    /// A stage that masks nothing.
    pub fn empty() -> Masker {
        Masker::default()
    }

    /// A stage with `rules`, making tokens under `key`. Regexes and JSON paths are compiled
    /// here, so a bad one is an error now rather than a miss later.
    pub fn new(rules: MaskRules, key: Option<MaskKey>) -> Result<Masker, MaskError> {
        for rule in &rules.rules {
            if rule.kind.is_empty()
                || !rule.kind.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            {
                return Err(MaskError::BadKind(rule.name.clone()));
            }
        }
        let engine = Engine::compile(&rules)?;
        if !rules.is_empty() && key.is_none() {
            return Err(MaskError::NoKey);
        }
        let names = rules.rules.iter().map(|r| Arc::from(r.name.as_str())).collect();
        Ok(Masker { rules, key, engine, names, sink: None })
    }

    /// A stage with only the rules `keep` picks, under the same key and reporting to no sink:
    /// what masks the value a program is handed when some rules replay the original and others
    /// the token.
    pub fn restricted(&self, keep: impl Fn(&MaskRule) -> bool) -> Result<Masker, MaskError> {
        let rules = MaskRules { rules: self.rules.rules.iter().filter(|r| keep(r)).cloned().collect() };
        Masker::new(rules, self.key.clone())
    }

    /// This stage, reporting every secret it replaces (with its token) to `sink`.
    pub fn with_sink(mut self, sink: OriginalsSink) -> Masker {
        self.sink = Some(sink);
        self
    }

    /// Makes the token of `secret` for `kind`, reporting the pair to the sink, if any.
    pub(crate) fn mint(&self, key: &MaskKey, kind: &str, secret: &str) -> String {
        let token = key.token(kind, secret);
        if let Some(sink) = &self.sink {
            sink.push(&token, secret);
        }
        token
    }

    /// The rule set.
    pub fn rules(&self) -> &MaskRules {
        &self.rules
    }

    /// The key's fingerprint, if a key is set.
    pub fn key_fingerprint(&self) -> Option<String> {
        self.key.as_ref().map(MaskKey::fingerprint)
    }

    /// Masks free text (log lines, error messages, env values, header values, a URL): what the
    /// text rules find in it, and in its percent-encoded parts: `to=a%40b.com` is an email.
    pub fn mask_text<'a>(&self, text: &'a str) -> (Cow<'a, str>, usize) {
        let (plain, count) = self.mask_plain(text);
        match self.mask_encoded(&plain) {
            Some((masked, more)) => (Cow::Owned(masked), count + more),
            None => (plain, count),
        }
    }

    /// Masks text that is not all UTF-8 (a Latin-1 answer): each UTF-8 run as
    /// [`Masker::mask_text`] masks text, every other byte kept as it was.
    pub fn mask_bytes<'a>(&self, bytes: &'a [u8]) -> (Cow<'a, [u8]>, usize) {
        let mut out = Vec::with_capacity(bytes.len());
        let mut tokens = 0;
        let mut changed = false;
        for chunk in bytes.utf8_chunks() {
            let (masked, n) = self.mask_text(chunk.valid());
            tokens += n;
            changed |= matches!(masked, Cow::Owned(_)) && masked != chunk.valid();
            out.extend_from_slice(masked.as_bytes());
            out.extend_from_slice(chunk.invalid());
        }
        match changed {
            true => (Cow::Owned(out), tokens.max(1)),
            false => (Cow::Borrowed(bytes), 0),
        }
    }

    /// What the text rules find in `text` as it is, escapes and all.
    pub(crate) fn mask_plain<'a>(&self, text: &'a str) -> (Cow<'a, str>, usize) {
        if !self.engine.looks_in_bodies {
            return (Cow::Borrowed(text), 0);
        }
        if self.key.is_none() {
            return (Cow::Borrowed(text), 0);
        }
        let candidates = self.engine.find(text.as_bytes());
        if candidates.is_empty() {
            return (Cow::Borrowed(text), 0);
        }
        let mut found = self.found(text, candidates);
        let masked = self.settle(text, &mut found);
        let n = found.len();
        (masked.map_or_else(|| splice(text, &found), Cow::Owned), n)
    }

    /// Every secret the text rules find in `text` (a decoded string value or free text): sorted,
    /// non-overlapping byte ranges with the token each becomes. Never a range inside a token.
    /// The stream masker maps these ranges back onto the chunks that carried them.
    /// `json_path` and `header` rules do not apply to free text.
    pub fn find(&self, text: &str) -> Vec<Found> {
        if self.key.is_none() || !self.engine.looks_in_bodies {
            return Vec::new();
        }
        let candidates = self.engine.find(text.as_bytes());
        if candidates.is_empty() {
            return Vec::new();
        }
        let mut found = self.found(text, candidates);
        self.settle(text, &mut found);
        found
    }

    /// Makes masking a fixpoint. A detector's verdict may depend on the bytes next to a secret
    /// (a card number glued to a longer digit run, a boundary), and those bytes change when a
    /// neighbour becomes a token. So the text rules run again over the masked text, and what
    /// they find there (outside tokens) joins `found`, until nothing new appears.
    /// Returns the masked text when it was built for the final `found` (so callers needn't
    /// build it again).
    fn settle(&self, text: &str, found: &mut Vec<Found>) -> Option<String> {
        for _ in 0..4 {
            let again = if self.engine.settles_locally() {
                // Only the stretches between insulated secrets that hold one that isn't can
                // decide differently once masked.
                let stretches = fragile_stretches(text.as_bytes(), found);
                if stretches.is_empty() {
                    return None;
                }
                let masked = splice(text, found).into_owned();
                let windows = masked_windows(found, stretches);
                (self.engine.find_in_windows(masked.as_bytes(), &windows), masked)
            } else {
                let masked = splice(text, found).into_owned();
                (self.engine.find(masked.as_bytes()), masked)
            };
            let (again, masked) = again;
            if again.is_empty() {
                return Some(masked);
            }
            let mut added = Vec::new();
            let (mut next, mut shift) = (0, 0isize);
            for c in again {
                // Advance over our tokens that end before this candidate, tracking how far the
                // masked text has moved from the original.
                let mut overlaps = false;
                while next < found.len() {
                    let f = &found[next];
                    let start = (f.range.start as isize + shift) as usize;
                    let end = start + f.token.len();
                    if end <= c.range.start {
                        shift += f.token.len() as isize - f.range.len() as isize;
                        next += 1;
                    } else {
                        overlaps = start < c.range.end;
                        break;
                    }
                }
                if overlaps {
                    continue;
                }
                let start = (c.range.start as isize - shift) as usize;
                let range = start..start + c.range.len();
                added.extend(self.found(text, vec![Candidate { range, rule: c.rule }]));
            }
            if added.is_empty() {
                return Some(masked);
            }
            found.extend(added);
            found.sort_by_key(|f| f.range.start);
        }
        None
    }

    fn found(&self, text: &str, candidates: Vec<Candidate>) -> Vec<Found> {
        let Some(key) = &self.key else {
            return Vec::new();
        };
        candidates
            .into_iter()
            .map(|c| {
                let rule = &self.rules.rules[c.rule];
                Found {
                    token: self.mint(key, &rule.kind, &text[c.range.clone()]),
                    range: c.range,
                    rule: self.names[c.rule].clone(),
                }
            })
            .collect()
    }
}

/// The stretches of `text` around each found secret that is not [`engine::insulated`]: from the
/// end of the insulated secret before it (or the start) to the start of the insulated secret
/// after it (or the end), merged. Outside them, no detector's verdict can change.
fn fragile_stretches(text: &[u8], found: &[Found]) -> Vec<Range<usize>> {
    let insulated: Vec<bool> = found.iter().map(|f| engine::insulated(text, &f.range)).collect();
    let mut stretches: Vec<Range<usize>> = Vec::new();
    let mut last_wall = 0;
    let mut i = 0;
    while i < found.len() {
        if insulated[i] {
            last_wall = found[i].range.end;
            i += 1;
            continue;
        }
        let mut j = i;
        while j < found.len() && !insulated[j] {
            j += 1;
        }
        let end = found.get(j).map_or(text.len(), |f| f.range.start);
        match stretches.last_mut() {
            Some(last) if last.end >= last_wall => last.end = end,
            _ => stretches.push(last_wall..end),
        }
        i = j;
    }
    stretches
}

/// The stretches (bounded by found ranges' edges or the text's ends) where they lie once each
/// found range has become its token.
fn masked_windows(found: &[Found], stretches: Vec<Range<usize>>) -> Vec<Range<usize>> {
    let (mut next, mut shift) = (0, 0isize);
    let mut at = |pos: usize| {
        while next < found.len() && found[next].range.end <= pos {
            shift += found[next].token.len() as isize - found[next].range.len() as isize;
            next += 1;
        }
        (pos as isize + shift) as usize
    };
    stretches.into_iter().map(|s| at(s.start)..at(s.end)).collect()
}

/// `text` with each found range replaced by its token; borrowed when nothing was found.
fn splice<'a>(text: &'a str, found: &[Found]) -> Cow<'a, str> {
    if found.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + found.len() * (TOKEN_PREFIX.len() + 8 + TOKEN_TAIL_LEN));
    let mut copied = 0;
    for f in found {
        out.push_str(&text[copied..f.range.start]);
        out.push_str(&f.token);
        copied = f.range.end;
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}
