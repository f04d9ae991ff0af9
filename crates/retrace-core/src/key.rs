//! Step keys: the digest of the canonical form of what a step asked for.
//!
//! A key is `sha256(canonical({"name":…, "request":…, "type":…, "version":…}))`, computed on the
//! *masked* request after removing volatile fields. The request is whatever JSON the step carries
//! (tool arguments, a model request body, a message body, a variable name...); `name` is the tool
//! name, model endpoint or recipient; `version` is the tool version (part of the key).
//!
//! Volatile fields are given as dotted paths: `timestamp` strips the top-level field only,
//! `**.request_id` strips a field of that name at any depth (through arrays too). The defaults are
//! [`DEFAULT_VOLATILE`]; `[keys] strip = [...]` in `retrace.toml` replaces them.
use crate::canonical::{write_canonical, CanonError};
use crate::digest::Digest;
use crate::envelope::EventType;
use crate::json::Json;

/// Fields stripped from every request before its key is computed, unless configured otherwise.
pub const DEFAULT_VOLATILE: &[&str] =
    &["**.request_id", "**.idempotency_key", "**.retry_count", "**.run_id", "timestamp", "created_at"];

/// Which fields keys ignore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyConfig {
    patterns: Vec<Vec<String>>,
}

impl Default for KeyConfig {
    fn default() -> Self {
        KeyConfig::new(DEFAULT_VOLATILE.iter().copied())
    }
}

impl KeyConfig {
    /// Keys that strip the fields named by `patterns` (see the module docs).
    pub fn new<S: AsRef<str>>(patterns: impl IntoIterator<Item = S>) -> KeyConfig {
        KeyConfig {
            patterns: patterns
                .into_iter()
                .map(|p| p.as_ref().split('.').map(str::to_owned).collect())
                .collect(),
        }
    }

    /// Keys that strip nothing.
    pub fn strip_nothing() -> KeyConfig {
        KeyConfig { patterns: Vec::new() }
    }

    /// A copy of `request` without its volatile fields, or `None` when it has none.
    pub fn strip(&self, request: &Json) -> Option<Json> {
        if !self.patterns.iter().any(|p| matches_any(request, p)) {
            return None;
        }
        let mut copy = request.clone();
        for p in &self.patterns {
            remove(&mut copy, p);
        }
        Some(copy)
    }

    /// The key of a step.
    pub fn key(
        &self,
        kind: EventType,
        name: Option<&str>,
        version: Option<&str>,
        request: &Json,
    ) -> Result<Digest, CanonError> {
        let stripped = self.strip(request);
        let request = stripped.as_ref().unwrap_or(request);
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"{\"name\":");
        write_opt_str(&mut out, name);
        out.extend_from_slice(b",\"request\":");
        write_canonical(request, &mut out)?;
        out.extend_from_slice(b",\"type\":\"");
        out.extend_from_slice(kind.as_str().as_bytes());
        out.extend_from_slice(b"\",\"version\":");
        write_opt_str(&mut out, version);
        out.push(b'}');
        Ok(Digest::of(&out))
    }
}

fn write_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => write_canonical(&Json::String(s.to_owned()), out).expect("strings are canonical"),
        None => out.extend_from_slice(b"null"),
    }
}

fn matches_any(j: &Json, pattern: &[String]) -> bool {
    match (pattern.first().map(String::as_str), j) {
        (None, _) => false,
        (Some("**"), Json::Object(fields)) => {
            matches_any(j, &pattern[1..]) || fields.iter().any(|(_, v)| matches_any(v, pattern))
        }
        (Some("**"), Json::Array(items)) => items.iter().any(|v| matches_any(v, pattern)),
        (Some(head), Json::Object(fields)) => {
            fields.iter().any(|(k, v)| k == head && (pattern.len() == 1 || matches_any(v, &pattern[1..])))
        }
        _ => false,
    }
}

fn remove(j: &mut Json, pattern: &[String]) {
    match (pattern.first().map(String::as_str), j) {
        (None, _) => {}
        (Some("**"), Json::Object(fields)) => {
            remove_here(fields, &pattern[1..]);
            for (_, v) in fields.iter_mut() {
                remove(v, pattern);
            }
        }
        (Some("**"), Json::Array(items)) => items.iter_mut().for_each(|v| remove(v, pattern)),
        (Some(_), Json::Object(fields)) => remove_here(fields, pattern),
        _ => {}
    }
}

fn remove_here(fields: &mut Vec<(String, Json)>, pattern: &[String]) {
    let Some(head) = pattern.first() else { return };
    if head == "**" {
        return;
    }
    if pattern.len() == 1 {
        fields.retain(|(k, _)| k != head);
    } else {
        for (k, v) in fields.iter_mut() {
            if k == head {
                remove(v, &pattern[1..]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::parse;

    fn key(cfg: &KeyConfig, text: &str) -> Digest {
        cfg.key(EventType::ToolCall, Some("sql.query"), Some("2"), &parse(text.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn volatile_fields_do_not_change_the_key() {
        let cfg = KeyConfig::default();
        let base = key(&cfg, r#"{"q":"select 1"}"#);
        assert_eq!(base, key(&cfg, r#"{"q":"select 1","timestamp":12}"#));
        assert_eq!(base, key(&cfg, r#"{ "request_id":"a", "q" : "select 1"}"#));
        assert_ne!(
            key(&cfg, r#"{"q":"select 1","meta":{"x":1}}"#),
            key(&cfg, r#"{"q":"select 1","meta":{"x":2}}"#)
        );
        assert_eq!(
            key(&cfg, r#"{"q":"select 1","meta":[{"retry_count":1}]}"#),
            key(&cfg, r#"{"q":"select 1","meta":[{"retry_count":7}]}"#)
        );
        // `timestamp` is stripped only at the top level.
        assert_ne!(key(&cfg, r#"{"a":{"timestamp":1}}"#), key(&cfg, r#"{"a":{"timestamp":2}}"#));
        assert_ne!(base, key(&KeyConfig::strip_nothing(), r#"{"q":"select 1","timestamp":12}"#));
    }

    #[test]
    fn name_type_and_version_are_part_of_the_key() {
        let cfg = KeyConfig::default();
        let req = parse(b"{}").unwrap();
        let a = cfg.key(EventType::ToolCall, Some("t"), Some("1"), &req).unwrap();
        assert_ne!(a, cfg.key(EventType::ToolCall, Some("t"), Some("2"), &req).unwrap());
        assert_ne!(a, cfg.key(EventType::ToolCall, Some("u"), Some("1"), &req).unwrap());
        assert_ne!(a, cfg.key(EventType::ModelCall, Some("t"), Some("1"), &req).unwrap());
    }
}
