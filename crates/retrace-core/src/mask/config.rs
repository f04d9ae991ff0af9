//! The `[mask]` table of `retrace.toml`, read into a [`MaskRules`].
//!
//! ```toml
//! [mask]
//! defaults = true              # default true: MaskRules::defaults() first, then these rules
//! rules_off = ["email"]        # drop default rules by name
//!
//! [[mask.rules]]
//! name = "db password"
//! kind = "password"            # token kind, [a-z0-9]+; default: the detector's kind, else "secret"
//! json_path = "$..password"    # exactly one of: pattern, regex, literal, header, query, json_path
//! replay = "token"             # or "original" (from the vault)
//! ```
//!
//! Other tables of the file are not read here. A file without `[mask]` gives the defaults.
use regex::Regex;
use toml::{Table, Value};

use super::detect::Detector;
use super::jsonpath::JsonPath;
use super::rules::{MaskRule, MaskRules, ReplayAs, RuleMatch};

/// The token kind of a rule that names none and has no detector to take it from.
pub const DEFAULT_KIND: &str = "secret";

/// The `[mask]` table could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaskConfigError {
    /// The file is not TOML.
    #[error("retrace.toml is not valid TOML: {0}")]
    Toml(String),
    /// A key of `[mask]` itself is unknown or of the wrong type.
    #[error("[mask]: {0}")]
    Table(String),
    /// One `[[mask.rules]]` entry is wrong; `rule` is its name, or `#N` (from 1) without one.
    #[error("[[mask.rules]] {rule}: {problem}")]
    Rule {
        /// The rule's name or position.
        rule: String,
        /// What is wrong.
        problem: String,
    },
    /// `rules_off` names a rule the defaults don't have.
    #[error("[mask] rules_off: {0:?} is not a default rule (they are: {1})")]
    UnknownRuleOff(String, String),
    /// Two rules share a name.
    #[error("[mask]: two rules are named {0:?}; names must be unique")]
    DuplicateName(String),
}

const MATCHERS: &[&str] = &["pattern", "regex", "literal", "header", "query", "json_path"];

/// Reads the `[mask]` table of `retrace.toml` text (other tables are ignored).
pub fn parse_toml(text: &str) -> Result<MaskRules, MaskConfigError> {
    let file: Table =
        text.parse().map_err(|e: toml::de::Error| MaskConfigError::Toml(e.message().to_owned()))?;
    let empty = Table::new();
    let mask = match file.get("mask") {
        None => &empty,
        Some(Value::Table(t)) => t,
        Some(_) => return Err(MaskConfigError::Table("`mask` must be a table".into())),
    };
    for key in mask.keys() {
        if !["defaults", "rules_off", "rules"].contains(&key.as_str()) {
            return Err(MaskConfigError::Table(format!(
                "unknown key {key:?} (known: defaults, rules_off, rules)"
            )));
        }
    }
    let defaults = match mask.get("defaults") {
        None => true,
        Some(Value::Boolean(b)) => *b,
        Some(_) => return Err(MaskConfigError::Table("`defaults` must be true or false".into())),
    };
    let rules_off = strings(mask.get("rules_off"))
        .ok_or_else(|| MaskConfigError::Table("`rules_off` must be a list of rule names".into()))?;
    let mut rules = if defaults { MaskRules::defaults().rules } else { Vec::new() };
    for off in &rules_off {
        if !rules.iter().any(|r| &r.name == off) {
            let known =
                MaskRules::defaults().rules.into_iter().map(|r| r.name).collect::<Vec<_>>().join(", ");
            let known = if defaults { known } else { "none: defaults = false".to_owned() };
            return Err(MaskConfigError::UnknownRuleOff(off.clone(), known));
        }
    }
    rules.retain(|r| !rules_off.contains(&r.name));
    let entries = match mask.get("rules") {
        None => Vec::new(),
        Some(Value::Array(entries)) => entries.clone(),
        Some(_) => {
            return Err(MaskConfigError::Table("`rules` must be an array of tables ([[mask.rules]])".into()))
        }
    };
    for (index, entry) in entries.iter().enumerate() {
        let Value::Table(entry) = entry else {
            return Err(MaskConfigError::Table("`rules` must be an array of tables ([[mask.rules]])".into()));
        };
        rules.push(rule(index, entry)?);
    }
    let mut names = std::collections::BTreeSet::new();
    for rule in &rules {
        if !names.insert(rule.name.as_str()) {
            return Err(MaskConfigError::DuplicateName(rule.name.clone()));
        }
    }
    Ok(MaskRules { rules })
}

fn strings(value: Option<&Value>) -> Option<Vec<String>> {
    match value {
        None => Some(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(|v| v.as_str().map(str::to_owned)).collect(),
        Some(_) => None,
    }
}

/// One `[[mask.rules]]` entry (`index` from 0).
fn rule(index: usize, entry: &Table) -> Result<MaskRule, MaskConfigError> {
    let label = match entry.get("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name.clone(),
        _ => format!("#{}", index + 1),
    };
    let bad = |problem: String| MaskConfigError::Rule { rule: label.clone(), problem };
    let text = |key: &str| -> Result<Option<String>, MaskConfigError> {
        match entry.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(bad(format!("`{key}` must be a string"))),
        }
    };
    for key in entry.keys() {
        if !["name", "kind", "replay"].contains(&key.as_str()) && !MATCHERS.contains(&key.as_str()) {
            return Err(bad(format!("unknown key {key:?}")));
        }
    }
    let name = text("name")?.filter(|n| !n.trim().is_empty()).ok_or_else(|| bad("has no `name`".into()))?;
    let given: Vec<&str> = MATCHERS.iter().copied().filter(|m| entry.contains_key(*m)).collect();
    let matcher_key = match given.as_slice() {
        [one] => *one,
        [] => return Err(bad(format!("names no matcher: give one of {}", MATCHERS.join(", ")))),
        many => {
            return Err(bad(format!("has {} matchers ({}); give exactly one", many.len(), many.join(", "))))
        }
    };
    let value = text(matcher_key)?.unwrap_or_default();
    let mut default_kind = DEFAULT_KIND;
    let matcher = match matcher_key {
        "pattern" => {
            let detector = Detector::from_name(&value).ok_or_else(|| {
                let known: Vec<_> = Detector::ALL.iter().map(|d| d.name()).collect();
                bad(format!("unknown detector {value:?} (known: {})", known.join(", ")))
            })?;
            default_kind = detector.kind();
            RuleMatch::Pattern { pattern: detector }
        }
        "regex" => {
            Regex::new(&value).map_err(|e| bad(format!("bad regex: {e}")))?;
            if value.is_empty() {
                return Err(bad("the regex is empty".into()));
            }
            RuleMatch::Regex { regex: value }
        }
        "literal" if value.is_empty() => return Err(bad("the literal is empty".into())),
        "literal" => RuleMatch::Literal { value },
        "header" if value.trim().is_empty() => return Err(bad("the header name is empty".into())),
        "header" => RuleMatch::Header { header: value.trim().to_ascii_lowercase() },
        "query" if value.trim().is_empty() => return Err(bad("the query parameter name is empty".into())),
        "query" => RuleMatch::Query { query: value.trim().to_ascii_lowercase() },
        _ => {
            JsonPath::parse(&value).map_err(|e| bad(e.to_string()))?;
            RuleMatch::JsonPath { json_path: value }
        }
    };
    let kind = text("kind")?.unwrap_or_else(|| default_kind.to_owned());
    if kind.is_empty() || !kind.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        return Err(bad(format!("bad kind {kind:?}: a kind is lower-case letters and digits")));
    }
    let replay = match text("replay")?.as_deref() {
        None | Some("token") => ReplayAs::Token,
        Some("original") => ReplayAs::Original,
        Some(other) => return Err(bad(format!("bad replay {other:?}: \"token\" or \"original\""))),
    };
    Ok(MaskRule { name, kind, matcher, replay })
}
