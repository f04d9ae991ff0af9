//! A strict JSON parser whose values keep every number exactly as it was written.
//!
//! [`parse`] accepts RFC 8259 JSON text and nothing else, with the I-JSON (RFC 7493)
//! restrictions that content addressing needs: the input is UTF-8, strings hold no
//! lone surrogates, and no object repeats a key. Numbers stay as their literal text
//! ([`Number`]) so that [`crate::canonical`] decides how they are printed and no
//! precision is lost first. Objects keep their members in source order.

use std::collections::HashSet;
use std::fmt::Write as _;

/// The byte the simple escape `\\letter` stands for in a JSON string (`letter` one of
/// `"\\/bfnrt`); `None` for any other letter, `u` included. Shared by every decoder of JSON
/// strings in the workspace (this parser, the masking scanner, import's line reader).
#[inline]
pub fn simple_escape(letter: u8) -> Option<u8> {
    Some(match letter {
        b'"' => b'"',
        b'\\' => b'\\',
        b'/' => b'/',
        b'b' => 0x08,
        b'f' => 0x0c,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        _ => return None,
    })
}

/// The value of the four hex digits of a `\\u` escape at `bytes[at..at + 4]`; `None` unless all
/// four are there and hex digits (no sign, no space).
#[inline]
pub fn hex4(bytes: &[u8], at: usize) -> Option<u16> {
    let digits = bytes.get(at..at.checked_add(4)?)?;
    digits.iter().try_fold(0u16, |acc, &d| Some(acc * 16 + char::from(d).to_digit(16)? as u16))
}

/// Arrays and objects nested deeper than this are rejected by [`parse`].
pub const MAX_DEPTH: usize = 512;

/// A parsed JSON value.
///
/// `PartialEq` is structural (`1` differs from `1.0`, member order matters); for
/// canonical equality compare canonical bytes or use [`crate::json_diff`].
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, as written.
    Number(Number),
    /// A string, unescaped.
    String(String),
    /// An array.
    Array(Vec<Json>),
    /// An object's members in source order; [`parse`] guarantees unique keys.
    Object(Vec<(String, Json)>),
}

/// A number exactly as written in the source (validated JSON number grammar).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Number(Box<str>);

/// Why [`parse`] rejected its input.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid json at byte {offset}: {message}")]
pub struct JsonError {
    /// Byte offset in the input where the problem was found.
    pub offset: usize,
    /// What is wrong, in lower case; a duplicate key names the key and its JSON path.
    pub message: String,
}

impl Number {
    /// Checks `text` against the JSON number grammar.
    pub fn new(text: &str) -> Option<Number> {
        (scan_number(text.as_bytes(), 0) == Ok(text.len())).then(|| Number(text.into()))
    }

    /// The literal text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the literal has neither a fraction nor an exponent.
    pub fn is_integer(&self) -> bool {
        !self.0.bytes().any(|b| matches!(b, b'.' | b'e' | b'E'))
    }

    /// The nearest double (infinite when the literal is beyond the double range).
    pub fn as_f64(&self) -> f64 {
        // Rust's float grammar is a superset of JSON's, so this never falls back.
        self.0.parse().unwrap_or(f64::NAN)
    }

    /// The value when the literal is an integer that fits a `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        self.is_integer().then(|| self.0.parse().ok()).flatten()
    }

    /// The value when the literal is an integer that fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        self.is_integer().then(|| self.0.parse().ok()).flatten()
    }
}

impl Json {
    /// Converts a `serde_json::Value`; floats take serde_json's shortest round-trip text.
    pub fn from_value(v: &serde_json::Value) -> Json {
        use serde_json::Value;
        match v {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Number(n) => Json::Number(Number(n.to_string().into())),
            Value::String(s) => Json::String(s.clone()),
            Value::Array(items) => Json::Array(items.iter().map(Json::from_value).collect()),
            Value::Object(map) => {
                Json::Object(map.iter().map(|(k, v)| (k.clone(), Json::from_value(v))).collect())
            }
        }
    }

    /// Converts to a `serde_json::Value`, which is lossy for some numbers.
    ///
    /// Integer literals that fit `u64` or `i64` are exact. Every other number
    /// becomes the nearest `f64`, so big integers and long fractions are rounded,
    /// and a number beyond the double range (`1e400`) becomes `null`. Duplicate
    /// keys, possible only in a hand-built value, keep the last member.
    pub fn to_value(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => Value::from(u),
                (None, Some(i)) => Value::from(i),
                (None, None) => serde_json::Number::from_f64(n.as_f64()).map_or(Value::Null, Value::Number),
            },
            Json::String(s) => Value::String(s.clone()),
            Json::Array(items) => Value::Array(items.iter().map(Json::to_value).collect()),
            Json::Object(members) => {
                Value::Object(members.iter().map(|(k, v)| (k.clone(), v.to_value())).collect())
            }
        }
    }

    /// The member `key` of an object; `None` for a missing key or a non-object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The text of a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    /// Removes the member `key` of an object, keeping the others in order.
    pub fn remove_key(&mut self, key: &str) -> Option<Json> {
        let Json::Object(members) = self else {
            return None;
        };
        let index = members.iter().position(|(k, _)| k == key)?;
        Some(members.remove(index).1)
    }
}

/// Appends `.key` to a JSON path, or `["key"]` when `key` is not identifier-like.
pub fn path_push_key(path: &mut String, key: &str) {
    let mut bytes = key.bytes();
    let identifier = matches!(bytes.next(), Some(b'a'..=b'z' | b'A'..=b'Z' | b'_' | b'$'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$');
    if identifier {
        path.push('.');
        path.push_str(key);
    } else {
        path.push('[');
        crate::canonical::write_escaped(path, key);
        path.push(']');
    }
}

/// Appends `[index]` to a JSON path.
pub fn path_push_index(path: &mut String, index: usize) {
    let _ = write!(path, "[{index}]"); // writing to a String cannot fail
}

/// One step of a JSON path, collected innermost first while an error unwinds.
#[derive(Debug)]
pub(crate) enum PathSeg {
    Key(String),
    Index(usize),
}

/// Renders segments collected innermost first as a path such as `$.a[3]`.
pub(crate) fn render_path(reversed: &[PathSeg]) -> String {
    let mut path = String::from("$");
    for seg in reversed.iter().rev() {
        match seg {
            PathSeg::Key(key) => path_push_key(&mut path, key),
            PathSeg::Index(index) => path_push_index(&mut path, *index),
        }
    }
    path
}

/// Parses one JSON text; see the module docs for what is rejected.
pub fn parse(bytes: &[u8]) -> Result<Json, JsonError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| JsonError { offset: e.valid_up_to(), message: "invalid utf-8".into() })?;
    let mut parser = Parser { text, bytes, pos: 0 };
    parser.skip_ws();
    let value = parser.value(0).map_err(Fail::finish)?;
    parser.skip_ws();
    if parser.pos != bytes.len() {
        return Err(Fail::at(parser.pos, "trailing characters").finish());
    }
    Ok(value)
}

/// A parse failure; a duplicate key also collects its path while unwinding.
struct Fail {
    offset: usize,
    message: &'static str,
    duplicate: Option<Box<(String, Vec<PathSeg>)>>,
}

impl Fail {
    fn at(offset: usize, message: &'static str) -> Fail {
        Fail { offset, message, duplicate: None }
    }

    fn duplicate(offset: usize, key: String) -> Fail {
        let duplicate = Some(Box::new((key.clone(), vec![PathSeg::Key(key)])));
        Fail { duplicate, ..Fail::at(offset, "duplicate key") }
    }

    fn within(mut self, seg: impl FnOnce() -> PathSeg) -> Fail {
        if let Some(duplicate) = &mut self.duplicate {
            duplicate.1.push(seg());
        }
        self
    }

    fn finish(self) -> JsonError {
        let message = match self.duplicate {
            None => self.message.to_owned(),
            Some(duplicate) => {
                let mut quoted = String::new();
                crate::canonical::write_escaped(&mut quoted, &duplicate.0);
                format!("duplicate key {quoted} at {}", render_path(&duplicate.1))
            }
        };
        JsonError { offset: self.offset, message }
    }
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.bytes.get(self.pos) == Some(&byte);
        self.pos += usize::from(found);
        found
    }

    fn fail(&self, message: &'static str) -> Fail {
        let message = if self.pos >= self.bytes.len() { "unexpected end of input" } else { message };
        Fail::at(self.pos, message)
    }

    fn value(&mut self, depth: usize) -> Result<Json, Fail> {
        let rest = &self.bytes[self.pos..];
        let (json, len) = match rest.first() {
            Some(b'{' | b'[') if depth == MAX_DEPTH => return Err(self.fail("nesting deeper than 512")),
            Some(b'{') => return self.object(depth + 1),
            Some(b'[') => return self.array(depth + 1),
            Some(b'"') => return self.string().map(Json::String),
            Some(b'-' | b'0'..=b'9') => {
                let end = scan_number(self.bytes, self.pos).map_err(|(at, m)| Fail::at(at, m))?;
                let number = Number(self.text[self.pos..end].into());
                (Json::Number(number), end - self.pos)
            }
            _ if rest.starts_with(b"null") => (Json::Null, 4),
            _ if rest.starts_with(b"true") => (Json::Bool(true), 4),
            _ if rest.starts_with(b"false") => (Json::Bool(false), 5),
            _ => return Err(self.fail("expected a value")),
        };
        self.pos += len;
        Ok(json)
    }

    /// Parses the comma-separated items of an array or object up to `close`.
    fn items(
        &mut self,
        close: u8,
        expected: &'static str,
        mut item: impl FnMut(&mut Self, usize) -> Result<(), Fail>,
    ) -> Result<(), Fail> {
        self.pos += 1;
        self.skip_ws();
        if self.eat(close) {
            return Ok(());
        }
        let mut index = 0;
        loop {
            item(self, index)?;
            self.skip_ws();
            if self.eat(close) {
                return Ok(());
            }
            if !self.eat(b',') {
                return Err(self.fail(expected));
            }
            self.skip_ws();
            index += 1;
        }
    }

    fn array(&mut self, depth: usize) -> Result<Json, Fail> {
        let mut items = Vec::new();
        self.items(b']', "expected ',' or ']'", |p, index| {
            let item = p.value(depth).map_err(|f| f.within(|| PathSeg::Index(index)))?;
            items.push(item);
            Ok(())
        })?;
        Ok(Json::Array(items))
    }

    fn object(&mut self, depth: usize) -> Result<Json, Fail> {
        let mut members: Vec<(String, Json)> = Vec::new();
        let mut seen: Option<HashSet<String>> = None;
        self.items(b'}', "expected ',' or '}'", |p, _| {
            if p.bytes.get(p.pos) != Some(&b'"') {
                return Err(p.fail("expected a string key"));
            }
            let key_at = p.pos;
            let key = p.string()?;
            if is_duplicate(&members, &mut seen, &key) {
                return Err(Fail::duplicate(key_at, key));
            }
            p.skip_ws();
            if !p.eat(b':') {
                return Err(p.fail("expected ':'"));
            }
            p.skip_ws();
            let value = p.value(depth).map_err(|f| f.within(|| PathSeg::Key(key.clone())))?;
            members.push((key, value));
            Ok(())
        })?;
        Ok(Json::Object(members))
    }

    fn string(&mut self) -> Result<String, Fail> {
        self.pos += 1;
        let start = self.pos;
        let mut run = start;
        let mut out = String::new();
        loop {
            match self.bytes.get(self.pos) {
                Some(b'"') => {
                    let tail = &self.text[run..self.pos];
                    self.pos += 1;
                    if run == start {
                        return Ok(tail.to_owned());
                    }
                    out.push_str(tail);
                    return Ok(out);
                }
                Some(b'\\') => {
                    out.push_str(&self.text[run..self.pos]);
                    out.push(self.escape()?);
                    run = self.pos;
                }
                Some(0..=0x1f) => return Err(self.fail("control character in string")),
                Some(_) => self.pos += 1,
                None => return Err(self.fail("unterminated string")),
            }
        }
    }

    fn escape(&mut self) -> Result<char, Fail> {
        let at = self.pos;
        self.pos += 2;
        let letter = self.bytes.get(at + 1).copied();
        if letter == Some(b'u') {
            return self.unicode_escape(at);
        }
        letter.and_then(simple_escape).map(char::from).ok_or_else(|| Fail::at(at, "invalid escape"))
    }

    fn unicode_escape(&mut self, at: usize) -> Result<char, Fail> {
        let lone = || Fail::at(at, "lone surrogate in \\u escape");
        let high = self.hex4().ok_or_else(|| Fail::at(at, "invalid \\u escape"))?;
        let code = match high {
            0xD800..=0xDBFF if self.bytes[self.pos..].starts_with(b"\\u") => {
                self.pos += 2;
                match self.hex4() {
                    Some(low @ 0xDC00..=0xDFFF) => 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00),
                    _ => return Err(lone()),
                }
            }
            0xD800..=0xDFFF => return Err(lone()),
            _ => high,
        };
        char::from_u32(code).ok_or_else(lone)
    }

    fn hex4(&mut self) -> Option<u32> {
        let value = hex4(self.bytes, self.pos)?;
        self.pos += 4;
        Some(u32::from(value))
    }
}

/// Linear for small objects; large ones switch to a set of the keys so far.
fn is_duplicate(members: &[(String, Json)], seen: &mut Option<HashSet<String>>, key: &str) -> bool {
    const LINEAR_LIMIT: usize = 16;
    if members.len() < LINEAR_LIMIT {
        return members.iter().any(|(k, _)| k == key);
    }
    let seen = seen.get_or_insert_with(|| members.iter().map(|(k, _)| k.clone()).collect());
    !seen.insert(key.to_owned())
}

/// Scans a JSON number starting at `i`: `-? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?`.
fn scan_number(b: &[u8], mut i: usize) -> Result<usize, (usize, &'static str)> {
    let digits = |mut i: usize| {
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        (i, i > start)
    };
    i += usize::from(b.get(i) == Some(&b'-'));
    match b.get(i) {
        Some(b'0') if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
            return Err((i, "leading zero in number"))
        }
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits(i).0,
        _ => return Err((i, "expected a digit")),
    }
    if b.get(i) == Some(&b'.') {
        let (end, any) = digits(i + 1);
        if !any {
            return Err((end, "expected a digit after '.'"));
        }
        i = end;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        i += usize::from(matches!(b.get(i), Some(b'+' | b'-')));
        let (end, any) = digits(i);
        if !any {
            return Err((end, "expected a digit in exponent"));
        }
        i = end;
    }
    Ok(i)
}
