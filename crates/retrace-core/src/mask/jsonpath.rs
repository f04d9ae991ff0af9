//! The JSON paths of `json_path` rules: a small subset of JSONPath.
//!
//! `$` is the document; `.name` or `['name']` an object member; `[3]` an array element; `.*` or
//! `[*]` any member or element; `..name` (also `..*`, `..[0]`) that selector at any depth below.
//! A rule masks every string value at a node the path selects, or anywhere inside it, each
//! string whole. Object keys, numbers, booleans and null are left as they are: a number is not
//! a string, and turning it into one would change the document's shape.
use std::borrow::Cow;

/// A parsed JSON path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonPath {
    segments: Vec<Segment>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    /// The selector applied to the current node's children.
    Child(Selector),
    /// The selector applied to any descendant.
    Descend(Selector),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Selector {
    Name(String),
    Index(usize),
    Any,
}

/// One step of a string value's location: an object member or an array element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// An object member, by its decoded key.
    Key(Cow<'a, str>),
    /// An array element, by its index.
    Index(usize),
}

/// A JSON path that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad JSON path {path:?}: {why}")]
pub struct BadJsonPath {
    /// The path as written.
    pub path: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl JsonPath {
    /// Parses `$.a.b`, `$.items[*].c`, `$.a[0]`, `$..password`, `$['a b']`.
    pub fn parse(path: &str) -> Result<JsonPath, BadJsonPath> {
        let bad = |why| BadJsonPath { path: path.to_owned(), why };
        let mut rest = path.trim().strip_prefix('$').ok_or_else(|| bad("it must start with `$`"))?;
        let mut segments = Vec::new();
        while !rest.is_empty() {
            let descend = rest.starts_with("..");
            if descend {
                rest = &rest[2..];
            } else if let Some(r) = rest.strip_prefix('.') {
                rest = r;
            } else if !rest.starts_with('[') {
                return Err(bad("expected `.`, `..` or `[` after a step"));
            }
            let selector;
            if let Some(r) = rest.strip_prefix('[') {
                let close = r.find(']').ok_or_else(|| bad("`[` without `]`"))?;
                selector =
                    bracket(&r[..close]).ok_or_else(|| bad("`[…]` holds `*`, an index or a quoted name"))?;
                rest = &r[close + 1..];
            } else {
                let end = rest.find(['.', '[']).unwrap_or(rest.len());
                let name = &rest[..end];
                if name.is_empty() {
                    return Err(bad("a step has no name"));
                }
                selector = if name == "*" { Selector::Any } else { Selector::Name(name.to_owned()) };
                rest = &rest[end..];
            }
            segments.push(if descend { Segment::Descend(selector) } else { Segment::Child(selector) });
        }
        if segments.is_empty() {
            return Err(bad("`$` alone would mask every string; name at least one step"));
        }
        Ok(JsonPath { segments })
    }

    /// True when the node at `location` is selected by the path or lies inside a selected node.
    pub fn covers(&self, location: &[Step<'_>]) -> bool {
        covers(&self.segments, location)
    }
}

fn bracket(inner: &str) -> Option<Selector> {
    let inner = inner.trim();
    if inner == "*" {
        return Some(Selector::Any);
    }
    if let Ok(index) = inner.parse::<usize>() {
        return Some(Selector::Index(index));
    }
    let quoted = inner
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .or_else(|| inner.strip_prefix('"').and_then(|s| s.strip_suffix('"')))?;
    Some(Selector::Name(quoted.to_owned()))
}

fn covers(segments: &[Segment], location: &[Step<'_>]) -> bool {
    match segments.split_first() {
        None => true,
        Some((Segment::Child(sel), rest)) => {
            location.split_first().is_some_and(|(step, below)| sel.selects(step) && covers(rest, below))
        }
        Some((Segment::Descend(sel), rest)) => {
            (0..location.len()).any(|at| sel.selects(&location[at]) && covers(rest, &location[at + 1..]))
        }
    }
}

impl Selector {
    fn selects(&self, step: &Step<'_>) -> bool {
        match (self, step) {
            (Selector::Any, _) => true,
            (Selector::Name(name), Step::Key(key)) => name == key,
            (Selector::Index(index), Step::Index(at)) => index == at,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(path: &[&str]) -> Vec<Step<'static>> {
        path.iter()
            .map(|s| match s.parse::<usize>() {
                Ok(i) => Step::Index(i),
                Err(_) => Step::Key(Cow::Owned((*s).to_owned())),
            })
            .collect()
    }

    #[test]
    fn paths_select_what_they_say() {
        let cases: &[(&str, &[&str], bool)] = &[
            ("$.a.b", &["a", "b"], true),
            ("$.a.b", &["a", "c"], false),
            ("$.a.b", &["a"], false),
            ("$.a", &["a", "b", "0"], true),
            ("$.items[*].c", &["items", "3", "c"], true),
            ("$.items[*].c", &["items", "x", "c"], true),
            ("$.a[0]", &["a", "0"], true),
            ("$.a[0]", &["a", "1"], false),
            ("$..password", &["password"], true),
            ("$..password", &["users", "2", "password"], true),
            ("$..password", &["users", "2", "name"], false),
            ("$['a b'].c", &["a b", "c"], true),
            ("$..[1]", &["x", "y", "1"], true),
            ("$.a..b.c", &["a", "x", "b", "c"], true),
        ];
        for (path, location, want) in cases {
            assert_eq!(
                JsonPath::parse(path).unwrap().covers(&loc(location)),
                *want,
                "{path} at {location:?}"
            );
        }
    }

    #[test]
    fn bad_paths_say_why() {
        for path in ["a.b", "$", "$.", "$.a[", "$.a[x]", "$a"] {
            assert!(JsonPath::parse(path).is_err(), "{path}");
        }
        let err = JsonPath::parse("a.b").unwrap_err();
        assert_eq!(err.to_string(), "bad JSON path \"a.b\": it must start with `$`");
    }
}
