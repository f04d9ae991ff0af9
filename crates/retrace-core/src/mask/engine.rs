//! The compiled rule set: literal prefilters in front of every detector, then overlap
//! resolution. This is the hot path of masking; most strings leave it after one prefilter pass
//! without allocating.
//!
//! One pass over each string, eight bytes at a time through a byte-class table, stops only at
//! bytes that can start a detector's work: the trigger bytes of the credential anchors (`-`,
//! `_`, `J`, `A`, `B`; see [`detect_keys::TRIGGERS`]), `@` (emails) and the first digit of a run
//! (cards, IBANs). A detector runs only where its anchor occurs. Literal rules share one
//! Aho-Corasick automaton; user regexes run on their own (the `regex` crate has its own literal
//! prefilters). Strings shorter than the shortest possible secret are skipped.
use std::collections::BTreeMap;
use std::ops::Range;

use aho_corasick::AhoCorasick;
use regex::bytes::Regex;

use super::detect::Detector;
use super::jsonpath::{JsonPath, Step};
use super::rules::{MaskRules, RuleMatch};
use super::token::{token_len_at_bytes, token_prefix_len, token_spans, TOKEN_PREFIX};
use super::{detect_keys, detect_pii, MaskError};

/// A match before overlaps are resolved: its range and the index of its rule.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    pub range: Range<usize>,
    pub rule: usize,
}

const NONE: u8 = 0;
const TRIGGER: u8 = 1;
const DIGIT: u8 = 2;
const AT: u8 = 3;
const EQUALS: u8 = 4;

#[derive(Clone)]
struct ByteClasses([u8; 256]);

impl Default for ByteClasses {
    fn default() -> Self {
        ByteClasses([NONE; 256])
    }
}

impl std::fmt::Debug for ByteClasses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stops: String = (0..=255u8).filter(|b| self.0[*b as usize] != NONE).map(char::from).collect();
        write!(f, "ByteClasses({stops:?})")
    }
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Engine {
    /// What each byte starts: nothing, a trigger of an anchor, a digit run, an email.
    classes: ByteClasses,
    /// The anchors of the credential detectors in use, grouped by trigger byte (in
    /// [`detect_keys::ANCHORS`] order within a group): text, the trigger's offset, detector.
    anchors: Vec<Vec<(&'static str, usize, Detector)>>,
    /// For each byte, 1 + the index of its group in `anchors`, or 0.
    anchor_group: ByteClasses,
    /// Rule indices of each pattern detector in use.
    detector_rules: Vec<(Detector, usize)>,
    cards: Vec<usize>,
    ibans: Vec<usize>,
    /// Query rules: the parameter's name (lowercase) and the rule's index.
    queries: Vec<(String, usize)>,
    literals: Option<AhoCorasick>,
    literal_rules: Vec<usize>,
    regexes: Vec<(usize, Regex)>,
    paths: Vec<(usize, JsonPath)>,
    /// No string shorter than this can hold a match of a text rule.
    min_len: usize,
    /// True when any rule looks inside bodies (anything but header rules).
    pub looks_in_bodies: bool,
}

/// The shortest secret each detector can find.
fn min_len(detector: Detector) -> usize {
    match detector {
        Detector::Email => 6,
        Detector::Card => 13,
        Detector::Iban => 15,
        Detector::Bearer => 12,
        Detector::Jwt => 16,
        _ => 20,
    }
}

impl Engine {
    pub(crate) fn compile(rules: &MaskRules) -> Result<Engine, MaskError> {
        let mut engine = Engine { min_len: usize::MAX, ..Engine::default() };
        let mut literal_values = Vec::new();
        for (index, rule) in rules.rules.iter().enumerate() {
            match &rule.matcher {
                RuleMatch::Header { .. } => continue,
                RuleMatch::Query { query } => {
                    engine.queries.push((query.to_ascii_lowercase(), index));
                    engine.min_len = engine.min_len.min(query.len() + 3);
                }
                RuleMatch::Literal { value } => {
                    if value.is_empty() {
                        return Err(MaskError::EmptyLiteral(rule.name.clone()));
                    }
                    literal_values.push(value.clone());
                    engine.literal_rules.push(index);
                    engine.min_len = engine.min_len.min(value.len());
                }
                RuleMatch::LiteralDigest { .. } => return Err(MaskError::LiteralNotGiven(rule.name.clone())),
                RuleMatch::Pattern { pattern } => {
                    match pattern {
                        Detector::Card => engine.cards.push(index),
                        Detector::Iban => engine.ibans.push(index),
                        _ => engine.detector_rules.push((*pattern, index)),
                    }
                    engine.min_len = engine.min_len.min(min_len(*pattern));
                }
                RuleMatch::Regex { regex } => {
                    let compiled = Regex::new(regex)
                        .map_err(|e| MaskError::BadRegex { rule: rule.name.clone(), error: e.to_string() })?;
                    engine.regexes.push((index, compiled));
                    engine.min_len = 1;
                }
                RuleMatch::JsonPath { json_path } => {
                    let path = JsonPath::parse(json_path)
                        .map_err(|e| MaskError::BadPath { rule: rule.name.clone(), error: e.to_string() })?;
                    engine.paths.push((index, path));
                }
            }
            engine.looks_in_bodies = true;
        }
        for (anchor, detector) in detect_keys::ANCHORS {
            if engine.detector_rules.iter().any(|(d, _)| d == detector) {
                let (byte, offset) = detect_keys::trigger(anchor);
                if engine.anchor_group.0[byte as usize] == NONE {
                    engine.anchors.push(Vec::new());
                    engine.anchor_group.0[byte as usize] = engine.anchors.len() as u8;
                }
                engine.anchors[engine.anchor_group.0[byte as usize] as usize - 1]
                    .push((anchor, offset, *detector));
                engine.classes.0[byte as usize] = TRIGGER;
            }
        }
        if engine.detector_rules.iter().any(|(d, _)| *d == Detector::Email) {
            engine.classes.0[b'@' as usize] = AT;
        }
        if !engine.cards.is_empty() || !engine.ibans.is_empty() {
            for digit in b'0'..=b'9' {
                engine.classes.0[digit as usize] = DIGIT;
            }
        }
        if !engine.queries.is_empty() {
            engine.classes.0[b'=' as usize] = EQUALS;
        }
        if !literal_values.is_empty() {
            let ac = AhoCorasick::builder().build(&literal_values);
            engine.literals = Some(ac.map_err(|e| MaskError::BadLiteral(e.to_string()))?);
        }
        Ok(engine)
    }

    /// True when some `json_path` rule covers the value at `location`: its index.
    pub(crate) fn path_rule(&self, location: &[Step<'_>]) -> Option<usize> {
        self.paths.iter().find(|(_, path)| path.covers(location)).map(|(index, _)| *index)
    }

    /// No string shorter than this can hold a match of a text rule.
    pub(crate) fn min_len(&self) -> usize {
        self.min_len
    }

    pub(crate) fn has_paths(&self) -> bool {
        !self.paths.is_empty()
    }

    /// The sorted, non-overlapping matches of the text rules in `bytes` (a decoded string, not
    /// yet checked to be UTF-8: that is done only where something matched), never inside or
    /// across a token, each on character boundaries. Where matches overlap, the earlier rule
    /// wins, then the earlier start.
    pub(crate) fn find(&self, bytes: &[u8]) -> Vec<Candidate> {
        if bytes.len() < self.min_len {
            return Vec::new();
        }
        let mut found = Vec::new();
        self.prefiltered(bytes, 0, bytes.len(), &mut found);
        if let Some(ac) = &self.literals {
            for m in ac.find_overlapping_iter(bytes) {
                let rule = self.literal_rules[m.pattern().as_usize()];
                found.push(Candidate { range: m.start()..m.end(), rule });
            }
        }
        for (rule, regex) in &self.regexes {
            found.extend(regex.find_iter(bytes).map(|m| Candidate { range: m.range(), rule: *rule }));
        }
        found.retain(|c| {
            !c.range.is_empty() && char_boundary(bytes, c.range.start) && char_boundary(bytes, c.range.end)
        });
        if found.is_empty() {
            return found;
        }
        resolve(bytes, found)
    }

    /// Runs the detectors wherever the byte-class prefilter stops.
    /// Only stops at `from..to` are looked at; detectors see all of `bytes`.
    fn prefiltered(&self, bytes: &[u8], from: usize, to: usize, found: &mut Vec<Candidate>) {
        let classes = &self.classes.0;
        let class = |b: u8| classes[b as usize];
        let n = to.min(bytes.len());
        let mut i = from;
        while i < n {
            while i + 8 <= n {
                let w = &bytes[i..i + 8];
                let any = class(w[0])
                    | class(w[1])
                    | class(w[2])
                    | class(w[3])
                    | class(w[4])
                    | class(w[5])
                    | class(w[6])
                    | class(w[7]);
                if any != NONE {
                    break;
                }
                i += 8;
            }
            while i < n && class(bytes[i]) == NONE {
                i += 1;
            }
            if i >= n {
                return;
            }
            match class(bytes[i]) {
                DIGIT => {
                    self.digit_run(bytes, i, found);
                    while i < n && bytes[i].is_ascii_digit() {
                        i += 1;
                    }
                    continue;
                }
                AT => {
                    if let Some(range) = detect_pii::email_at(bytes, i) {
                        self.push(Detector::Email, range, found);
                    }
                }
                EQUALS => self.query_at(bytes, i, found),
                _ => {
                    // A token holds `_` and digits, all stops: step over it whole (tokens are
                    // never matched, and masked text is full of them when masking settles).
                    if bytes[i] == b'_' && i >= 3 && &bytes[i - 3..i] == b"rtk" {
                        if let Some(len) = token_prefix_len(&bytes[i - 3..]) {
                            i += len - 3;
                            continue;
                        }
                    }
                    self.anchor_at(bytes, i, found)
                }
            }
            i += 1;
        }
    }

    /// The cards and IBANs that start at the digit run at `at`.
    fn digit_run(&self, bytes: &[u8], at: usize, found: &mut Vec<Candidate>) {
        // The detectors' first checks, inline: a card starts 2–6 after a non-word byte, an IBAN's
        // check digits follow two letters, the first at a word's start.
        let card = (b'2'..=b'6').contains(&bytes[at]) && (at == 0 || !bytes[at - 1].is_ascii_alphanumeric());
        let iban = at >= 2
            && bytes[at - 1].is_ascii_alphabetic()
            && bytes[at - 2].is_ascii_alphabetic()
            && (at == 2 || !bytes[at - 3].is_ascii_alphanumeric());
        if card && !self.cards.is_empty() {
            if let Some(range) = detect_pii::card_at(bytes, at) {
                found.extend(self.cards.iter().map(|rule| Candidate { range: range.clone(), rule: *rule }));
            }
        }
        if iban && !self.ibans.is_empty() {
            if let Some(range) = detect_pii::iban_at(bytes, at) {
                found.extend(self.ibans.iter().map(|rule| Candidate { range: range.clone(), rule: *rule }));
            }
        }
    }

    /// The first anchor holding the trigger byte at `at`, and its detector's secret.
    fn anchor_at(&self, bytes: &[u8], at: usize, found: &mut Vec<Candidate>) {
        let group = self.anchor_group.0[bytes[at] as usize];
        let Some(anchors) = group.checked_sub(1).and_then(|g| self.anchors.get(g as usize)) else {
            return;
        };
        let hit = anchors.iter().find(|(anchor, offset, _)| {
            at >= *offset
                && bytes[at - offset] == anchor.as_bytes()[0]
                && bytes[at - offset..].starts_with(anchor.as_bytes())
        });
        if let Some((anchor, offset, detector)) = hit {
            if let Some(range) = detect_keys::find_at(*detector, bytes, at - offset, anchor.len()) {
                self.push(*detector, range, found);
            }
        }
    }

    /// The value of a query parameter a query rule names, whose `=` is at `at`: the name
    /// follows `?` or `&` (in a URL, or text quoting one), the value runs to the next `&`, `#`,
    /// quote, bracket, comma, semicolon or space.
    fn query_at(&self, bytes: &[u8], at: usize, found: &mut Vec<Candidate>) {
        let name_char = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.');
        let name_len = bytes[..at].iter().rev().take(65).take_while(|b| name_char(b)).count();
        let start = at - name_len;
        if name_len == 0 || name_len > 64 || start == 0 || !matches!(bytes[start - 1], b'?' | b'&') {
            return;
        }
        let name = &bytes[start..at];
        let Some((_, rule)) = self.queries.iter().find(|(q, _)| q.as_bytes().eq_ignore_ascii_case(name))
        else {
            return;
        };
        let value_end = |b: &u8| {
            matches!(b, b'&' | b'#' | b'"' | b'\'' | b'<' | b'>' | b'(' | b')' | b'[' | b']' | b'{' | b'}')
                || matches!(b, b',' | b';' | b'\\')
                || b.is_ascii_whitespace()
        };
        let len = bytes[at + 1..].iter().take(4096).take_while(|b| !value_end(b)).count();
        if len > 0 {
            found.push(Candidate { range: at + 1..at + 1 + len, rule: *rule });
        }
    }

    fn push(&self, detector: Detector, range: Range<usize>, found: &mut Vec<Candidate>) {
        for (_, rule) in self.detector_rules.iter().filter(|(d, _)| *d == detector) {
            found.push(Candidate { range: range.clone(), rule: *rule });
        }
    }

    /// True when settling may look again only near what changed: every text rule is a
    /// detector (see [`insulated`]). Literal and regex rules can match anything anywhere, so
    /// with them settling rescans whole strings.
    pub(crate) fn settles_locally(&self) -> bool {
        self.literals.is_none() && self.regexes.is_empty()
    }

    /// [`Engine::find`] for the detector stops inside the given windows of `bytes` only.
    pub(crate) fn find_in_windows(&self, bytes: &[u8], windows: &[Range<usize>]) -> Vec<Candidate> {
        let mut found = Vec::new();
        for w in windows {
            self.prefiltered(bytes, w.start, w.end, &mut found);
        }
        found.retain(|c| {
            !c.range.is_empty() && char_boundary(bytes, c.range.start) && char_boundary(bytes, c.range.end)
        });
        if found.is_empty() {
            return found;
        }
        resolve(bytes, found)
    }

    /// The whole of `text` as one match of path rule `rule`, unless it is empty or a token.
    pub(crate) fn whole(text: &[u8], rule: usize) -> Vec<Candidate> {
        if text.is_empty() || token_len_at_bytes(text) == Some(text.len()) {
            return Vec::new();
        }
        vec![Candidate { range: 0..text.len(), rule }]
    }
}

/// Bytes no detector reads across: a secret bounded by them can't change what a detector
/// decides outside it.
const WALLS: &[u8] = b",;\"\n\r\t()[]{}<>'|";

fn upper_or_digit(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit()
}

/// True when no built-in detector, looking from outside `range` of `text`, reads a byte of it.
/// Then turning it into a token changes no verdict outside it, and settling can skip it.
///
/// Detectors read across letters, digits and `.-_%+/=~@` (keys, emails, JWTs) and across
/// spaces only between two capitals-or-digits (card and IBAN groups, PEM labels, and a card's
/// look back at a `digit, space` before it). So a range is insulated when each side is the
/// text's end, a [`WALLS`] byte, or spaces whose far side and the range's edge are not both
/// capitals-or-digits. (`Bearer` reads across spaces too, but only into the credential, which
/// as a token it never matches.)
pub(crate) fn insulated(text: &[u8], range: &Range<usize>) -> bool {
    let left = match range.start.checked_sub(1).map(|i| text[i]) {
        None => true,
        Some(b) if WALLS.contains(&b) => true,
        Some(b' ') => {
            let far = text[..range.start].iter().rev().find(|b| **b != b' ');
            !far.is_some_and(|b| upper_or_digit(*b) && upper_or_digit(text[range.start]))
        }
        Some(_) => false,
    };
    let right = match text.get(range.end) {
        None => true,
        Some(b) if WALLS.contains(b) => true,
        Some(b' ') => {
            let far = text[range.end..].iter().find(|b| **b != b' ');
            !far.is_some_and(|b| upper_or_digit(*b) && upper_or_digit(text[range.end - 1]))
        }
        Some(_) => false,
    };
    left && right
}

/// True when some candidate overlaps some token; both are sorted by start and disjoint.
fn overlaps_any(found: &[Candidate], tokens: &[Range<usize>]) -> bool {
    let mut t = 0;
    for c in found {
        while t < tokens.len() && tokens[t].end <= c.range.start {
            t += 1;
        }
        if t < tokens.len() && tokens[t].start < c.range.end {
            return true;
        }
    }
    false
}

/// True when `at` does not split a UTF-8 sequence.
fn char_boundary(bytes: &[u8], at: usize) -> bool {
    bytes.get(at).is_none_or(|b| (*b as i8) >= -0x40)
}

/// The tokens of `text` that may overlap a candidate (`found` sorted by start), in order; others
/// may be left out. A token holds only `[a-z0-9_]`, so one that overlaps a candidate starts
/// within the run of such bytes just before it, or inside it: only those stretches are
/// searched, not the whole text (settling a long text full of tokens would otherwise look at
/// every token once per pass).
fn tokens_near(text: &[u8], found: &[Candidate]) -> Vec<Range<usize>> {
    /// A run longer than this before a candidate: search the whole text instead.
    const MAX_RUN: usize = 512;
    let token_byte = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_';
    let mut stretches: Vec<Range<usize>> = Vec::with_capacity(found.len());
    for c in found {
        let run = text[..c.range.start].iter().rev().take(MAX_RUN + 1).take_while(|b| token_byte(b)).count();
        if run > MAX_RUN {
            return token_spans(text);
        }
        // A token starting just before the end still shows its prefix past it.
        let end = (c.range.end + TOKEN_PREFIX.len() - 1).min(text.len());
        stretches.push(c.range.start - run..end);
    }
    stretches.sort_by_key(|s| s.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(stretches.len());
    for s in stretches {
        match merged.last_mut() {
            Some(last) if s.start <= last.end => last.end = last.end.max(s.end),
            _ => merged.push(s),
        }
    }
    let mut tokens = Vec::new();
    for s in merged {
        for at in memchr::memmem::find_iter(&text[s.clone()], TOKEN_PREFIX) {
            if let Some(len) = token_prefix_len(&text[s.start + at..]) {
                tokens.push(s.start + at..s.start + at + len);
            }
        }
    }
    tokens
}

/// Drops every candidate that overlaps a token or a candidate of an earlier rule (or an earlier
/// start within the same rule), and sorts the rest by position.
fn resolve(text: &[u8], mut found: Vec<Candidate>) -> Vec<Candidate> {
    // Common case first: no two candidates overlap and none touches a token.
    found.sort_by_key(|c| (c.range.start, c.rule));
    let disjoint = found.windows(2).all(|w| w[0].range.end <= w[1].range.start);
    let tokens = tokens_near(text, &found);
    if disjoint && !overlaps_any(&found, &tokens) {
        return found;
    }
    found.sort_by_key(|c| (c.rule, c.range.start, std::cmp::Reverse(c.range.end)));
    // start -> (end, rule); tokens are taken with rule usize::MAX and never reported.
    let mut taken: BTreeMap<usize, (usize, usize)> =
        tokens.into_iter().map(|r| (r.start, (r.end, usize::MAX))).collect();
    for c in found {
        let clashes =
            taken.range(..c.range.end).next_back().is_some_and(|(_, (end, _))| *end > c.range.start);
        if !clashes {
            taken.insert(c.range.start, (c.range.end, c.rule));
        }
    }
    taken
        .into_iter()
        .filter(|(_, (_, rule))| *rule != usize::MAX)
        .map(|(start, (end, rule))| Candidate { range: start..end, rule })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::insulated;

    fn check(text: &str, secret: &str) -> bool {
        let start = text.find(secret).unwrap();
        insulated(text.as_bytes(), &(start..start + secret.len()))
    }

    #[test]
    fn insulation_is_walls_or_spaces_between_words() {
        let cases: &[(&str, &str, bool)] = &[
            ("mail ada@x.io, then", "ada@x.io", true),
            ("(4111111111111111)", "4111111111111111", true),
            ("ada@x.io", "ada@x.io", true),
            ("word 4111 1111 1111 1111, ok", "4111 1111 1111 1111", true),
            ("no 2041 4111 1111 1111 1111, ok", "4111 1111 1111 1111", false),
            ("key abc123def456ghi789 4111", "abc123def456ghi789", false),
            ("x-ada@x.io", "ada@x.io", false),
            ("ada@x.io.", "ada@x.io", false),
            ("IBAN GB82WEST12345698765432 X", "GB82WEST12345698765432", false),
        ];
        for (text, secret, want) in cases {
            assert_eq!(check(text, secret), *want, "{secret} in {text}");
        }
    }
}
