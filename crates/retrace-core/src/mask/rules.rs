//! Masking rules: what a rule matches, what replay hands back, and the default rule set.
use serde::{Deserialize, Serialize};

use super::detect::Detector;
use super::key::MaskKey;
use crate::digest::Digest;

/// The digest a run records for a literal rule's `value`: keyed by the mask key, so a short
/// secret can't be guessed from it without the key (`sha256:` of it when there is no key).
pub fn literal_digest(key: Option<&MaskKey>, value: &str) -> String {
    match key {
        Some(key) => key.token("literalrule", value),
        None => Digest::of(value.as_bytes()).to_string(),
    }
}

/// What a rule matches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "match", rename_all = "snake_case")]
pub enum RuleMatch {
    /// An exact secret value, wherever it occurs inside a string.
    Literal {
        /// The value to mask.
        value: String,
    },
    /// A built-in detector ([`Detector`]): provider API keys, bearer credentials, JWTs, private
    /// keys, emails, card numbers (Luhn-checked), IBANs (mod-97-checked).
    Pattern {
        /// The detector.
        pattern: Detector,
    },
    /// A user regular expression (the `regex` crate's syntax); every match is masked.
    Regex {
        /// The expression.
        regex: String,
    },
    /// A [`RuleMatch::Literal`] as a run records it (in the store and the export header): the
    /// value's digest, keyed by the mask key ([`literal_digest`]), never the value, which is
    /// the secret the rule exists to keep out of the log. Masking with it needs the value again,
    /// from today's `retrace.toml` ([`MaskRules::with_literals`]); unresolved, it is refused.
    LiteralDigest {
        /// [`literal_digest`] of the value.
        literal_digest: String,
    },
    /// An HTTP header, by name (case-insensitive); see [`super::Masker::mask_header`]. Header
    /// rules never match inside bodies.
    Header {
        /// The header name.
        header: String,
    },
    /// A URL query parameter, by name (case-insensitive): its value is masked wherever a URL is
    /// persisted or quoted (a proxied call's step name, an upstream URL, a body echoing the
    /// request): after `?` or `&`, `NAME=` and the value up to the next `&`, `#`, quote,
    /// bracket, comma, semicolon or space.
    Query {
        /// The parameter's name.
        query: String,
    },
    /// The string values at a JSON path (`$.a.b`, `$.items[*].c`, `$.a[0]`, `$..password`),
    /// each masked whole; see [`super::jsonpath`].
    JsonPath {
        /// The path.
        json_path: String,
    },
}

/// What replay hands the program where a secret was (SPEC §7).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayAs {
    /// The token.
    #[default]
    Token,
    /// The original, from the vault.
    Original,
}

/// One masking rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaskRule {
    /// The rule's name, for reports and `rules_off`.
    pub name: String,
    /// The token kind it produces (`[a-z0-9]+`).
    pub kind: String,
    /// What it matches.
    #[serde(flatten)]
    pub matcher: RuleMatch,
    /// What replay hands the program.
    #[serde(default)]
    pub replay: ReplayAs,
}

/// The header rules of [`MaskRules::defaults`]: header name and token kind.
pub const DEFAULT_HEADERS: &[(&str, &str)] = &[
    ("authorization", "bearer"),
    ("proxy-authorization", "bearer"),
    ("x-api-key", "apikey"),
    ("api-key", "apikey"),
    ("cookie", "cookie"),
    ("set-cookie", "cookie"),
];

/// The query parameter rules of [`MaskRules::defaults`]: names under which URLs carry
/// credentials (Azure's `api-key`, OAuth's `access_token`, signed URLs' `sig`...). Each is a
/// rule named `param-` and the name, of kind `apikey`.
pub const DEFAULT_QUERY_PARAMS: &[&str] = &[
    "api-key",
    "api_key",
    "apikey",
    "key",
    "access_token",
    "token",
    "client_secret",
    "password",
    "secret",
    "sig",
    "signature",
];

/// A run's masking rule set, recorded with the run and in its export header.
///
/// `MaskRules::default()` is the empty set (it serializes as `{"rules":[]}`, which golden digests
/// pin); [`MaskRules::defaults`] is the recommended set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaskRules {
    /// The rules, applied in order: where two matches overlap, the earlier rule's wins.
    pub rules: Vec<MaskRule>,
}

impl MaskRules {
    /// True when no rule is set.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The names of the rules whose tokens replay as the originals (from the vault).
    pub fn replaying_originals(&self) -> Vec<&str> {
        self.rules.iter().filter(|r| r.replay == ReplayAs::Original).map(|r| r.name.as_str()).collect()
    }

    /// The rule set as a run records it: each literal's value replaced by its digest
    /// ([`RuleMatch::LiteralDigest`]).
    pub fn sealed(&self, key: Option<&MaskKey>) -> MaskRules {
        let rules = self.rules.iter().map(|rule| match &rule.matcher {
            RuleMatch::Literal { value } => MaskRule {
                matcher: RuleMatch::LiteralDigest { literal_digest: literal_digest(key, value) },
                ..rule.clone()
            },
            _ => rule.clone(),
        });
        MaskRules { rules: rules.collect() }
    }

    /// The rule set with each [`RuleMatch::LiteralDigest`] given its value back from `today`'s
    /// literal rules, where one has that digest; the others are left as they are (and a masker
    /// refuses them, naming the rule).
    pub fn with_literals(&self, today: &MaskRules, key: Option<&MaskKey>) -> MaskRules {
        let rules = self.rules.iter().map(|rule| match &rule.matcher {
            RuleMatch::LiteralDigest { literal_digest: digest } => today
                .rules
                .iter()
                .find_map(|r| match &r.matcher {
                    RuleMatch::Literal { value } if literal_digest(key, value) == *digest => {
                        Some(MaskRule { matcher: r.matcher.clone(), ..rule.clone() })
                    }
                    _ => None,
                })
                .unwrap_or_else(|| rule.clone()),
            _ => rule.clone(),
        });
        MaskRules { rules: rules.collect() }
    }

    /// Whether `rule` (of today's rules) is in this recorded set, a literal as its digest.
    pub fn holds(&self, rule: &MaskRule) -> bool {
        self.rules.iter().any(|r| {
            r == rule
                || (matches!(rule.matcher, RuleMatch::Literal { .. })
                    && matches!(r.matcher, RuleMatch::LiteralDigest { .. })
                    && (&r.name, &r.kind, r.replay) == (&rule.name, &rule.kind, rule.replay))
        })
    }

    /// Digest of the canonical rule set.
    pub fn digest(&self) -> Digest {
        let value = serde_json::to_value(self).expect("rules serialize");
        Digest::of(&crate::canonical::canonical_value(&value).expect("rules are canonical JSON"))
    }

    /// The recommended rule set: a header rule for each of [`DEFAULT_HEADERS`] (named after the
    /// header), a query rule for each of [`DEFAULT_QUERY_PARAMS`] (`param-NAME`), then every
    /// built-in detector (named after it, in [`Detector::ALL`] order).
    pub fn defaults() -> MaskRules {
        let headers = DEFAULT_HEADERS.iter().map(|(header, kind)| MaskRule {
            name: (*header).to_owned(),
            kind: (*kind).to_owned(),
            matcher: RuleMatch::Header { header: (*header).to_owned() },
            replay: ReplayAs::Token,
        });
        let params = DEFAULT_QUERY_PARAMS.iter().map(|param| MaskRule {
            name: format!("param-{param}"),
            kind: "apikey".to_owned(),
            matcher: RuleMatch::Query { query: (*param).to_owned() },
            replay: ReplayAs::Token,
        });
        let patterns = Detector::ALL.iter().map(|d| MaskRule {
            name: d.name().to_owned(),
            kind: d.kind().to_owned(),
            matcher: RuleMatch::Pattern { pattern: *d },
            replay: ReplayAs::Token,
        });
        MaskRules { rules: headers.chain(params).chain(patterns).collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_empty_set_serializes_as_before() {
        assert_eq!(serde_json::to_string(&MaskRules::default()).unwrap(), r#"{"rules":[]}"#);
    }

    #[test]
    fn rules_round_trip_through_json() {
        let rules = MaskRules::defaults();
        let text = serde_json::to_string(&rules).unwrap();
        assert!(text.contains(r#""match":"pattern","pattern":"email""#), "{text}");
        assert!(text.contains(r#""match":"header","header":"authorization""#), "{text}");
        assert_eq!(serde_json::from_str::<MaskRules>(&text).unwrap(), rules);
        let literal = r#"{"rules":[{"name":"n","kind":"secret","match":"literal","value":"v"}]}"#;
        let parsed: MaskRules = serde_json::from_str(literal).unwrap();
        assert_eq!(parsed.rules[0].matcher, RuleMatch::Literal { value: "v".into() });
        assert_eq!(parsed.rules[0].replay, ReplayAs::Token);
    }
}
