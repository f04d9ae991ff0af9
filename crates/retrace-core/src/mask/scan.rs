//! A positional JSON scanner: it walks raw bytes once, checks the document's structure, and
//! reports every string (and number) with its byte span and where it sits (object key or value,
//! and the chain of containers above it), without building a value.
//!
//! It accepts a sequence of top-level values (JSON Lines), checks brackets, commas and colons,
//! and is lenient inside scalars (a number or literal is any run of `[A-Za-z0-9+-.]`): the
//! masker only needs to know which bytes are strings and where they sit.
use std::borrow::Cow;
use std::ops::Range;

use super::jsonpath::Step;
use super::unescape::find_near;

/// One open container.
#[derive(Clone, Debug)]
pub(crate) struct Frame {
    array: bool,
    /// The current element's index (arrays).
    index: usize,
    /// The current member's key, quotes excluded (objects).
    key: Range<usize>,
    key_escaped: bool,
}

/// A string (or number) the scanner found.
#[derive(Clone, Debug)]
pub(crate) struct JsonString {
    /// Its span, quotes included (a number has none).
    pub span: Range<usize>,
    /// True when it holds a backslash escape.
    pub escaped: bool,
    /// True when it is an object key.
    pub is_key: bool,
    /// True when it is a number, not a string: only a `json_path` rule masks one.
    pub is_number: bool,
}

/// The bytes are not a JSON document (or sequence of documents).
#[derive(Debug)]
pub(crate) struct NotJson;

/// The location of a value inside containers `frames`, keys decoded.
pub(crate) fn location<'a>(raw: &'a [u8], frames: &[Frame]) -> Vec<Step<'a>> {
    frames
        .iter()
        .map(|f| {
            if f.array {
                return Step::Index(f.index);
            }
            let inner = &raw[f.key.clone()];
            let key = if f.key_escaped {
                let mut decoded = Vec::new();
                super::unescape::unescape(inner, &mut decoded);
                Cow::Owned(String::from_utf8_lossy(&decoded).into_owned())
            } else {
                String::from_utf8_lossy(inner)
            };
            Step::Key(key)
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// A value must come (after `:`, `,` in an array, or `[`).
    Value,
    /// A value or the end of the input (top level).
    Top,
    /// After `{`: a key or `}`.
    ObjectStart,
    /// After `[`: a value or `]`.
    ArrayStart,
    /// After `,` in an object: a key.
    Key,
    /// After a value: `,`, a closing bracket, or (top level) another value or the end.
    After,
}

/// Walks `raw`, calling `visit` for each string and number with the containers it sits in.
pub(crate) fn scan(raw: &[u8], mut visit: impl FnMut(JsonString, &[Frame])) -> Result<(), NotJson> {
    let mut frames: Vec<Frame> = Vec::new();
    let mut state = State::Top;
    let mut i = 0;
    loop {
        while i < raw.len() && matches!(raw[i], b' ' | b'\n' | b'\r' | b'\t') {
            i += 1;
        }
        let Some(&b) = raw.get(i) else {
            return if frames.is_empty() && matches!(state, State::Top | State::After) {
                Ok(())
            } else {
                Err(NotJson)
            };
        };
        match state {
            State::Value | State::Top | State::ArrayStart => {
                if state == State::ArrayStart && b == b']' {
                    frames.pop();
                    i += 1;
                    state = State::After;
                    continue;
                }
                match b {
                    b'{' => {
                        frames.push(Frame { array: false, index: 0, key: 0..0, key_escaped: false });
                        state = State::ObjectStart;
                        i += 1;
                    }
                    b'[' => {
                        frames.push(Frame { array: true, index: 0, key: 0..0, key_escaped: false });
                        state = State::ArrayStart;
                        i += 1;
                    }
                    b'"' => {
                        let (end, escaped) = string_end(raw, i)?;
                        visit(JsonString { span: i..end, escaped, is_key: false, is_number: false }, &frames);
                        i = end;
                        state = State::After;
                    }
                    b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                        let end = i + raw[i..]
                            .iter()
                            .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
                            .count();
                        if matches!(b, b'-' | b'0'..=b'9') {
                            let number =
                                JsonString { span: i..end, escaped: false, is_key: false, is_number: true };
                            visit(number, &frames);
                        }
                        i = end;
                        state = State::After;
                    }
                    _ => return Err(NotJson),
                }
            }
            State::ObjectStart | State::Key => {
                if state == State::ObjectStart && b == b'}' {
                    frames.pop();
                    i += 1;
                    state = State::After;
                    continue;
                }
                if b != b'"' {
                    return Err(NotJson);
                }
                let (end, escaped) = string_end(raw, i)?;
                visit(JsonString { span: i..end, escaped, is_key: true, is_number: false }, &frames);
                let frame = frames.last_mut().ok_or(NotJson)?;
                frame.key = i + 1..end - 1;
                frame.key_escaped = escaped;
                i = end;
                while i < raw.len() && matches!(raw[i], b' ' | b'\n' | b'\r' | b'\t') {
                    i += 1;
                }
                if raw.get(i) != Some(&b':') {
                    return Err(NotJson);
                }
                i += 1;
                state = State::Value;
            }
            State::After => match (frames.last_mut(), b) {
                (None, _) => state = State::Top,
                (Some(frame), b',') => {
                    i += 1;
                    if frame.array {
                        frame.index += 1;
                        state = State::Value;
                    } else {
                        state = State::Key;
                    }
                }
                (Some(frame), b']') if frame.array => {
                    frames.pop();
                    i += 1;
                }
                (Some(frame), b'}') if !frame.array => {
                    frames.pop();
                    i += 1;
                }
                _ => return Err(NotJson),
            },
        }
    }
}

/// The end (past the closing quote) of the string opening at `start`, and whether it holds an
/// escape.
fn string_end(raw: &[u8], start: usize) -> Result<(usize, bool), NotJson> {
    let mut i = start + 1;
    let mut escaped = false;
    loop {
        i = find_near(raw, i, b'"', b'\\').ok_or(NotJson)?;
        if raw[i] == b'"' {
            return Ok((i + 1, escaped));
        }
        escaped = true;
        i += 2;
        if i > raw.len() {
            return Err(NotJson);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(raw: &str) -> Option<Vec<(String, bool, Vec<Step<'_>>)>> {
        let mut out = Vec::new();
        scan(raw.as_bytes(), |s, frames| {
            if s.is_number {
                return;
            }
            out.push((raw[s.span].to_owned(), s.is_key, location(raw.as_bytes(), frames)));
        })
        .ok()?;
        Some(out)
    }

    #[test]
    fn strings_come_with_their_location() {
        let raw = r#"{"a": [1, "x", {"b\u0021": "y"}], "c": true, "d": {}}"#;
        let found = strings(raw).unwrap();
        let values: Vec<_> = found.iter().filter(|f| !f.1).map(|f| (f.0.as_str(), f.2.clone())).collect();
        assert_eq!(
            values,
            vec![
                (r#""x""#, vec![Step::Key("a".into()), Step::Index(1)]),
                (r#""y""#, vec![Step::Key("a".into()), Step::Index(2), Step::Key("b!".into())]),
            ]
        );
        assert_eq!(found.iter().filter(|f| f.1).count(), 4);
    }

    #[test]
    fn numbers_come_with_their_location_and_literals_do_not() {
        let raw = r#"{"a": [-1.5e3, true, null], "b": 42, "c": "7"}"#;
        let mut numbers = Vec::new();
        scan(raw.as_bytes(), |s, frames| {
            if s.is_number {
                numbers.push((raw[s.span].to_owned(), location(raw.as_bytes(), frames)));
            }
        })
        .unwrap();
        assert_eq!(
            numbers,
            vec![
                ("-1.5e3".to_owned(), vec![Step::Key("a".into()), Step::Index(0)]),
                ("42".to_owned(), vec![Step::Key("b".into())]),
            ]
        );
    }

    #[test]
    fn json_lines_are_documents_and_broken_input_is_not() {
        assert!(strings("{\"a\":\"b\"}\n{\"a\":\"c\"}\n").is_some());
        assert!(strings("  \"s\"  ").is_some());
        assert!(strings("").is_some());
        for bad in ["{\"a\" 1}", "{\"a\":1", "[1,]x", "{\"a\":\"b}", "hello", "[1 2 }", "{,}"] {
            assert!(strings(bad).is_none(), "{bad}");
        }
    }
}
