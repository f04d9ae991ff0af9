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
use crate::digest::{Digest, DigestWriter};
use crate::envelope::EventType;
use crate::json::Json;

/// Fields stripped from every request before its key is computed, unless configured otherwise.
pub const DEFAULT_VOLATILE: &[&str] =
    &["**.request_id", "**.idempotency_key", "**.retry_count", "**.run_id", "timestamp", "created_at"];

/// Which fields keys ignore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyConfig {
    patterns: Vec<Vec<String>>,
    /// For each pattern, its last segment as it appears as a key in canonical JSON
    /// (`"request_id":`); `None` when some pattern ends in `**` (no cheap scan: always parse).
    needles: Option<Vec<Vec<u8>>>,
}

impl Default for KeyConfig {
    fn default() -> Self {
        KeyConfig::new(DEFAULT_VOLATILE.iter().copied())
    }
}

impl KeyConfig {
    /// Keys that strip the fields named by `patterns` (see the module docs).
    pub fn new<S: AsRef<str>>(patterns: impl IntoIterator<Item = S>) -> KeyConfig {
        let patterns: Vec<Vec<String>> =
            patterns.into_iter().map(|p| p.as_ref().split('.').map(str::to_owned).collect()).collect();
        let needles = patterns.iter().map(|p| needle(p)).collect();
        KeyConfig { patterns, needles }
    }

    /// Keys that strip nothing.
    pub fn strip_nothing() -> KeyConfig {
        KeyConfig { patterns: Vec::new(), needles: Some(Vec::new()) }
    }

    /// Whether some pattern might strip a field of the request whose canonical form is
    /// `canonical`. `false` is exact: no pattern's last segment occurs as an object key. A field
    /// removed by a pattern is named by its last segment, and in canonical JSON every key is
    /// written as its canonical string followed by `:`, a sequence no string value can contain
    /// (a `"` inside a string is always escaped).
    fn may_strip(&self, canonical: &[u8]) -> bool {
        match &self.needles {
            None => true,
            // Every needle ends in `:`: look at each `:` once and compare what ends there.
            Some(needles) => canonical
                .iter()
                .enumerate()
                .any(|(i, &b)| b == b':' && needles.iter().any(|n| canonical[..=i].ends_with(n))),
        }
    }

    /// The key of a step whose request is given by its canonical bytes (as [`canonical_value`]
    /// or [`crate::canonical::canonicalize`] produce them). Equals [`KeyConfig::key`] of the
    /// parsed request; when no volatile field can occur, it hashes the bytes without parsing.
    ///
    /// [`canonical_value`]: crate::canonical::canonical_value
    pub fn key_canonical(
        &self,
        kind: EventType,
        name: Option<&str>,
        version: Option<&str>,
        canonical: &[u8],
    ) -> Result<Digest, CanonError> {
        if self.may_strip(canonical) {
            let parsed = crate::json::parse(canonical)?;
            return self.key(kind, name, version, &parsed);
        }
        let mut head = Vec::with_capacity(64);
        head.extend_from_slice(b"{\"name\":");
        write_opt_str(&mut head, name);
        head.extend_from_slice(b",\"request\":");
        let mut tail = Vec::with_capacity(64);
        tail.extend_from_slice(b",\"type\":\"");
        tail.extend_from_slice(kind.as_str().as_bytes());
        tail.extend_from_slice(b"\",\"version\":");
        write_opt_str(&mut tail, version);
        tail.push(b'}');
        let mut w = DigestWriter::new();
        w.update(&head);
        w.update(canonical);
        w.update(&tail);
        Ok(w.finish())
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

/// `"<last segment>":` in canonical form, or `None` for a pattern ending in `**` or empty.
fn needle(pattern: &[String]) -> Option<Vec<u8>> {
    let last = pattern.last()?;
    if last == "**" {
        return None;
    }
    let mut out = Vec::with_capacity(last.len() + 3);
    write_opt_str(&mut out, Some(last));
    out.push(b':');
    Some(out)
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

    mod fast_path {
        use super::*;
        use crate::canonical::to_canonical;
        use crate::json::Number;
        use proptest::collection::{btree_map, vec};
        use proptest::prelude::*;

        /// Keys and strings likely to meet the volatile patterns (as keys, inside values, escaped).
        fn arb_name() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("request_id".to_owned()),
                Just("run_id".to_owned()),
                Just("timestamp".to_owned()),
                Just("created_at".to_owned()),
                Just("retry_count".to_owned()),
                Just("idempotency_key".to_owned()),
                Just("\"request_id\":".to_owned()),
                Just("x\"timestamp\":1".to_owned()),
                Just("a\\".to_owned()),
                Just("q\u{1}\"".to_owned()),
                Just("meta".to_owned()),
                "[a-z_\"\\\\:]{0,8}",
                vec(any::<char>(), 0..5).prop_map(String::from_iter),
            ]
        }

        fn arb_json() -> impl Strategy<Value = Json> {
            let leaf = prop_oneof![
                Just(Json::Null),
                any::<bool>().prop_map(Json::Bool),
                any::<i64>().prop_map(|n| Json::Number(Number::new(&n.to_string()).unwrap())),
                (-1e6f64..1e6).prop_map(|f| Json::Number(Number::new(&format!("{f:e}")).unwrap())),
                arb_name().prop_map(Json::String),
            ];
            leaf.prop_recursive(4, 48, 6, |inner| {
                prop_oneof![
                    vec(inner.clone(), 0..5).prop_map(Json::Array),
                    btree_map(arb_name(), inner, 0..5).prop_map(|m| Json::Object(m.into_iter().collect())),
                ]
            })
        }

        fn configs() -> Vec<KeyConfig> {
            vec![
                KeyConfig::default(),
                KeyConfig::strip_nothing(),
                KeyConfig::new(["meta.request_id", "**.\"request_id\":", "a\\"]),
                KeyConfig::new(["meta.**", "timestamp"]),
                KeyConfig::new(["**"]),
                KeyConfig::new([""]),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2048))]
            #[test]
            fn key_of_canonical_bytes_equals_key_of_parsed_request(
                j in arb_json(),
                name in proptest::option::of(arb_name()),
                version in proptest::option::of(arb_name()),
            ) {
                let bytes = to_canonical(&j).unwrap();
                for cfg in configs() {
                    for kind in [EventType::ToolCall, EventType::ModelCall, EventType::Send] {
                        let slow = cfg.key(kind, name.as_deref(), version.as_deref(), &j).unwrap();
                        let fast = cfg.key_canonical(kind, name.as_deref(), version.as_deref(), &bytes).unwrap();
                        prop_assert_eq!(slow, fast);
                    }
                }
            }
        }

        #[test]
        fn scan_finds_keys_only() {
            let cfg = KeyConfig::default();
            assert!(!cfg.may_strip(br#"{"q":"\"request_id\":1"}"#));
            assert!(cfg.may_strip(br#"{"a":[{"request_id":1}]}"#));
            assert!(!cfg.may_strip(br#"{"q":"select 1"}"#));
            assert!(KeyConfig::new(["a.**"]).may_strip(b"{}"));
        }
    }
}
