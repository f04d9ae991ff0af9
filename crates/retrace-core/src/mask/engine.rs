//! The compiled rule set: literal prefilters in front of every detector, then overlap
//! resolution. This is the hot path of masking; most strings leave it after one prefilter pass
//! without allocating.
//!
//! One Aho-Corasick pass finds the anchors of the credential detectors and `@` (emails); one
//! SWAR pass finds digit runs (cards, IBANs); a detector runs only where its anchor occurs.
//! Literal rules share a second automaton; user regexes run on their own (the `regex` crate
//! has its own literal prefilters). Strings shorter than the shortest possible secret are
//! skipped.
use std::collections::BTreeMap;
use std::ops::Range;

use aho_corasick::{AhoCorasick, MatchKind};
use regex::Regex;

use super::detect::Detector;
use super::jsonpath::{JsonPath, Step};
use super::rules::{MaskRules, RuleMatch};
use super::token::{token_len_at, token_spans};
use super::{detect_keys, detect_pii, MaskError};

/// A match before overlaps are resolved: its range and the index of its rule.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    pub range: Range<usize>,
    pub rule: usize,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Engine {
    /// Anchors of the detectors in use, and for each pattern id its detector and length.
    anchors: Option<AhoCorasick>,
    anchor_of: Vec<(Detector, usize)>,
    /// Rule indices of each pattern detector in use.
    detector_rules: Vec<(Detector, usize)>,
    cards: Vec<usize>,
    ibans: Vec<usize>,
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
                RuleMatch::Literal { value } => {
                    if value.is_empty() {
                        return Err(MaskError::EmptyLiteral(rule.name.clone()));
                    }
                    literal_values.push(value.clone());
                    engine.literal_rules.push(index);
                    engine.min_len = engine.min_len.min(value.len());
                }
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
        let mut anchors = Vec::new();
        for (anchor, detector) in detect_keys::ANCHORS {
            if engine.detector_rules.iter().any(|(d, _)| d == detector) {
                anchors.push(*anchor);
                engine.anchor_of.push((*detector, anchor.len()));
            }
        }
        if engine.detector_rules.iter().any(|(d, _)| *d == Detector::Email) {
            anchors.push("@");
            engine.anchor_of.push((Detector::Email, 1));
        }
        if !anchors.is_empty() {
            let ac = AhoCorasick::builder().match_kind(MatchKind::LeftmostFirst).build(&anchors);
            engine.anchors = Some(ac.expect("the anchors are a small fixed set"));
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

    /// The sorted, non-overlapping matches of the text rules in `text`, never inside or across a
    /// token. Where matches overlap, the earlier rule wins, then the earlier start.
    pub(crate) fn find(&self, text: &str) -> Vec<Candidate> {
        if text.len() < self.min_len {
            return Vec::new();
        }
        let bytes = text.as_bytes();
        let mut found = Vec::new();
        if let Some(ac) = &self.anchors {
            for m in ac.find_iter(bytes) {
                let (detector, len) = self.anchor_of[m.pattern().as_usize()];
                let range = match detector {
                    Detector::Email => detect_pii::email_at(bytes, m.start()),
                    _ => detect_keys::find_at(detector, bytes, m.start(), len),
                };
                if let Some(range) = range {
                    for (_, rule) in self.detector_rules.iter().filter(|(d, _)| *d == detector) {
                        found.push(Candidate { range: range.clone(), rule: *rule });
                    }
                }
            }
        }
        if !self.cards.is_empty() || !self.ibans.is_empty() {
            detect_pii::digit_runs(bytes, |at| {
                if let Some(range) =
                    (!self.cards.is_empty()).then(|| detect_pii::card_at(bytes, at)).flatten()
                {
                    found.extend(
                        self.cards.iter().map(|rule| Candidate { range: range.clone(), rule: *rule }),
                    );
                }
                if let Some(range) =
                    (!self.ibans.is_empty()).then(|| detect_pii::iban_at(bytes, at)).flatten()
                {
                    found.extend(
                        self.ibans.iter().map(|rule| Candidate { range: range.clone(), rule: *rule }),
                    );
                }
            });
        }
        if let Some(ac) = &self.literals {
            for m in ac.find_overlapping_iter(bytes) {
                let rule = self.literal_rules[m.pattern().as_usize()];
                found.push(Candidate { range: m.start()..m.end(), rule });
            }
        }
        for (rule, regex) in &self.regexes {
            found.extend(regex.find_iter(text).map(|m| Candidate { range: m.range(), rule: *rule }));
        }
        found.retain(|c| {
            !c.range.is_empty() && text.is_char_boundary(c.range.start) && text.is_char_boundary(c.range.end)
        });
        if found.is_empty() {
            return found;
        }
        resolve(text, found)
    }

    /// The whole of `text` as one match of path rule `rule`, unless it is empty or a token.
    pub(crate) fn whole(text: &str, rule: usize) -> Vec<Candidate> {
        if text.is_empty() || token_len_at(text) == Some(text.len()) {
            return Vec::new();
        }
        vec![Candidate { range: 0..text.len(), rule }]
    }
}

/// Drops every candidate that overlaps a token or a candidate of an earlier rule (or an earlier
/// start within the same rule), and sorts the rest by position.
fn resolve(text: &str, mut found: Vec<Candidate>) -> Vec<Candidate> {
    found.sort_by_key(|c| (c.rule, c.range.start, std::cmp::Reverse(c.range.end)));
    // start -> (end, rule); tokens are taken with rule usize::MAX and never reported.
    let mut taken: BTreeMap<usize, (usize, usize)> =
        token_spans(text).into_iter().map(|r| (r.start, (r.end, usize::MAX))).collect();
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
