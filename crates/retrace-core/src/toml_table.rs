//! One table of `retrace.toml` (`[retention]`, `[autonomy]`, `[project]`), read with a TOML
//! parser: the same settings written as dotted keys (`retention.routine_days = 365`) or an
//! inline table (`retention = { routine_days = 365 }`) mean what TOML says they mean, and a
//! file that is not TOML (two `[retention]` headers) is refused, naming its line, rather than
//! half read. Each key comes with the line it is on, for errors that name it.
use toml::{Table, Value};

/// One key of a table: the 1-based line it is written on (that of the table's header, or 1,
/// when it can't be told), its name and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// 1-based line.
    pub line: usize,
    /// The key.
    pub key: String,
    /// Its value.
    pub value: Value,
}

/// A `retrace.toml` that is not TOML, or whose table `name` is not a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TomlError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub why: String,
}

/// The keys of table `name` in `text` (a whole `retrace.toml`), in the order they are written;
/// `None` when the file has no such table.
pub fn table(text: &str, name: &str) -> Result<Option<Vec<Entry>>, TomlError> {
    let parsed: Table = text.parse().map_err(|e: toml::de::Error| {
        let message = e.message().trim();
        TomlError {
            line: e.span().map_or(1, |span| line_at(text, span.start)),
            // TOML's integers are 64-bit: the parser's own words for a larger one name its
            // internals (QA26 D8).
            why: match message.contains("as i128") {
                true => "a number too large: TOML's whole numbers end at 9223372036854775807".to_owned(),
                false => message.to_owned(),
            },
        }
    })?;
    let Some(value) = parsed.get(name) else { return Ok(None) };
    let header = header_line(text, name);
    let Value::Table(table) = value else {
        return Err(TomlError {
            line: header.unwrap_or(1),
            why: format!("{name} must be a table ([{name}])"),
        });
    };
    let mut entries: Vec<Entry> = table
        .iter()
        .map(|(key, value)| Entry {
            line: key_line(text, name, key).or(header).unwrap_or(1),
            key: key.clone(),
            value: value.clone(),
        })
        .collect();
    entries.sort_by_key(|e| e.line);
    Ok(Some(entries))
}

/// A whole number of 0 or more, or what to say about `value`.
pub fn whole(key: &str, value: &Value) -> Result<u64, String> {
    match value.as_integer() {
        Some(n) if n >= 0 => Ok(n as u64),
        _ => Err(format!("{key} must be a whole number, not {value}")),
    }
}

/// The 1-based line of byte `at`.
fn line_at(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// The line of `[name]`.
fn header_line(text: &str, name: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            bare(l).strip_prefix('[').and_then(|r| r.strip_suffix(']')).is_some_and(|t| unquote(t) == name)
        })
        .map(|i| i + 1)
}

/// The line `key` of table `name` is written on: `key = ...` under `[name]`, or `name.key = ...`
/// (at the top, before any header), or inside `name = { ... }`.
fn key_line(text: &str, name: &str, key: &str) -> Option<usize> {
    let mut table: Option<String> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = bare(raw);
        if let Some(header) = line.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            table = Some(unquote(header).to_owned());
            continue;
        }
        let Some((lhs, rhs)) = line.split_once('=') else { continue };
        let path: Vec<&str> = lhs.split('.').map(unquote).collect();
        let found = match (table.as_deref(), path.as_slice()) {
            (Some(t), [k, ..]) if t == name => *k == key,
            (None, [t, k, ..]) if *t == name => *k == key,
            (None, [t]) if *t == name => rhs.contains(key),
            _ => false,
        };
        if found {
            return Some(i + 1);
        }
    }
    None
}

/// A line without its comment (a `#` outside quotes), trimmed.
fn bare(line: &str) -> &str {
    let mut quoted = None;
    for (i, c) in line.char_indices() {
        match (c, quoted) {
            ('"' | '\'', None) => quoted = Some(c),
            (q, Some(open)) if q == open => quoted = None,
            ('#', None) => return line[..i].trim(),
            _ => {}
        }
    }
    line.trim()
}

fn unquote(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix('"').and_then(|r| r.strip_suffix('"')).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(text: &str) -> Vec<(usize, String, i64)> {
        table(text, "retention")
            .unwrap()
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.line, e.key, e.value.as_integer().unwrap()))
            .collect()
    }

    #[test]
    fn a_table_reads_the_same_however_toml_writes_it() {
        let want = |line| vec![(line, "routine_days".to_owned(), 365)];
        assert_eq!(keys("[retention]\nroutine_days = 365 # a year\n"), want(2));
        assert_eq!(keys("# settings\nretention.routine_days = 365\n"), want(2));
        assert_eq!(keys("retention = { routine_days = 365 }\n"), want(1));
        assert_eq!(keys("[retention]\n\"routine_days\" = 365\n"), want(2));
        assert_eq!(keys("[other]\nx = 1\n"), vec![]);
        assert_eq!(table("[other]\nx = 1\n", "retention").unwrap(), None);
    }

    #[test]
    fn a_file_that_is_not_toml_is_refused_naming_its_line() {
        let twice = table("[retention]\nroutine_days = 1\n[retention]\nroutine_days = 2\n", "retention");
        let e = twice.unwrap_err();
        assert_eq!(e.line, 3, "{e:?}");
        assert!(e.why.contains("duplicate"), "{e:?}");
        let e = table("retention = 3\n", "retention").unwrap_err();
        assert_eq!((e.line, e.why.as_str()), (1, "retention must be a table ([retention])"));
        assert_eq!(
            whole("routine_days", &Value::from("soon")).unwrap_err(),
            "routine_days must be a whole number, not \"soon\""
        );
        assert_eq!(
            whole("routine_days", &Value::from(-1)).unwrap_err(),
            "routine_days must be a whole number, not -1"
        );
        // Beyond 64 bits: said so, not in the parser's internal words (QA26 D8).
        let e = table("[retention]\nroutine_days = 99999999999999999999\n", "retention").unwrap_err();
        assert_eq!(e.line, 2, "{e:?}");
        assert!(e.why.starts_with("a number too large"), "{e:?}");
    }
}
