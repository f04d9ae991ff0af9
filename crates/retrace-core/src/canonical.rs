//! Canonical JSON: the one byte form of a JSON value that Retrace hashes.
//!
//! Digests of recorded requests depend on these bytes forever, so this form is
//! pinned: changing any rule below changes every stored key.
//!
//! The form is RFC 8785, the JSON Canonicalization Scheme (JCS), with one
//! exception for integer literals:
//!
//! - **No whitespace** anywhere outside strings.
//! - **Literals** are `null`, `true` and `false`.
//! - **Strings** are written between `"` with only three kinds of escapes:
//!   `\"`, `\\`, and the control characters U+0000..U+001F, which use `\b`,
//!   `\t`, `\n`, `\f` and `\r` where those exist and `\u00xx` (lower-case hex)
//!   otherwise. Every other character, `/` and U+007F included, is its literal
//!   UTF-8. Escapes in the source are decoded first, so `"\u0041"` becomes `"A"`.
//! - **Objects** have their members sorted by key, comparing the keys (unescaped)
//!   as sequences of UTF-16 code units. This equals byte order on UTF-8 except
//!   that a character above U+FFFF sorts before one in U+E000..U+FFFF. Keys are
//!   unique: the parser rejects duplicates and the writer refuses them.
//! - **Arrays** keep their order.
//! - **Integer literals**, numbers written with neither a fraction nor an
//!   exponent, keep their exact decimal digits whatever their size, and `-0`
//!   becomes `0`. *This is the exception to RFC 8785*, which would round them
//!   through a double: here `9007199254740993` and `9007199254740992` stay
//!   different, and `100000000000000000000000` is not shortened to `1e+23`.
//!   Below 10^21 in magnitude and exact as a double, an integer prints the same
//!   either way.
//! - **Every other number** (with a `.` or an exponent) is read as the nearest
//!   IEEE-754 double and printed as ECMAScript's `Number.prototype.toString`
//!   does, as RFC 8785 prescribes: `1.0` → `1`, `1.50` → `1.5`, `-0.0` → `0`,
//!   `1e20` → `100000000000000000000`, `1e21` → `1e+21`, `1e-6` → `0.000001`,
//!   `1e-7` → `1e-7`. A number beyond the double range (`1e400`) is an error,
//!   [`CanonError::NonFinite`]; one that underflows (`1e-400`) becomes `0`.
//!
//! So `1` and `1.0` are the same number here, while `1e22` (`1e+22`) and
//! `10000000000000000000000` are not.
//!
//! Values built by serde_json follow the same rules: `u64` and `i64` are integer
//! literals, and an `f64` is printed from its double, so [`canonical_value`] of a
//! value equals [`canonicalize`] of its serialization.

use std::cmp::Ordering;

use serde_json::Value;

mod serializer;
pub(crate) use serializer::write_serialized;

use crate::json::{self, render_path, Json, JsonError, Number, PathSeg};

/// Why a value has no canonical form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CanonError {
    /// The input was not acceptable JSON.
    #[error(transparent)]
    Parse(#[from] JsonError),
    /// A number is beyond the range of a double, such as `1e400`.
    #[error("number at {path} is out of the range of a double")]
    NonFinite {
        /// JSON path of the number, such as `$.a[2]`.
        path: String,
    },
    /// A hand-built object repeats a key.
    #[error("duplicate key at {path}")]
    DuplicateKey {
        /// JSON path of the repeated key.
        path: String,
    },
}

/// Parses `bytes` strictly and returns their canonical form.
pub fn canonicalize(bytes: &[u8]) -> Result<Vec<u8>, CanonError> {
    let json = json::parse(bytes)?;
    let mut out = Vec::with_capacity(bytes.len());
    write_canonical(&json, &mut out)?;
    Ok(out)
}

/// Returns the canonical form of a parsed value.
pub fn to_canonical(j: &Json) -> Result<Vec<u8>, CanonError> {
    let mut out = Vec::new();
    write_canonical(j, &mut out)?;
    Ok(out)
}

/// Appends the canonical form of a parsed value to `out`.
///
/// On error `out` holds a partial write.
pub fn write_canonical(j: &Json, out: &mut Vec<u8>) -> Result<(), CanonError> {
    write_json(j, out).map_err(Bad::finish)
}

/// Returns the canonical form of a `serde_json::Value`, without converting it first.
pub fn canonical_value(v: &Value) -> Result<Vec<u8>, CanonError> {
    // Room for a typical step's request or output, so the buffer is not regrown eight times.
    let mut out = Vec::with_capacity(512);
    write_canonical_value(v, &mut out)?;
    Ok(out)
}

/// Whether decoding the canonical form of `v` gives `v` back: true unless it holds a double
/// (`f64`) with an integral value, which prints as an integer literal (`1.0` -> `1`, `-0.0` ->
/// `0`) and decodes as one. Strings and integers print and parse back exactly, and object
/// members decode into the same sorted map whatever order the canonical form writes them in. A
/// double with a fraction prints as the shortest decimal that reads back as the same double,
/// with a point or an exponent, and decodes as that double (the workspace builds `serde_json`
/// with `float_roundtrip`, whose parsing is correctly rounded).
pub fn decodes_to_itself(v: &Value) -> bool {
    match v {
        Value::Number(n) => !n.is_f64() || n.as_f64().is_some_and(|f| f.is_finite() && f.fract() != 0.0),
        Value::Array(items) => items.iter().all(decodes_to_itself),
        Value::Object(members) => members.values().all(decodes_to_itself),
        _ => true,
    }
}

/// Appends the canonical form of a `serde_json::Value` to `out`.
///
/// On error `out` holds a partial write.
pub fn write_canonical_value(v: &Value, out: &mut Vec<u8>) -> Result<(), CanonError> {
    write_value(v, out).map_err(Bad::finish)
}

/// Orders object keys by their UTF-16 code units.
///
/// UTF-8 byte order agrees with UTF-16 order except where, at the first differing
/// byte, one key has a four-byte sequence (above U+FFFF, a surrogate pair in UTF-16)
/// and the other a three-byte one starting `0xEE` or `0xEF` (U+E000..U+FFFF).
pub(crate) fn key_order(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let Some(i) = a.iter().zip(b).position(|(x, y)| x != y) else {
        return a.len().cmp(&b.len());
    };
    match (a[i], b[i]) {
        (0xF0.., 0xEE | 0xEF) => Ordering::Less,
        (0xEE | 0xEF, 0xF0..) => Ordering::Greater,
        (x, y) => x.cmp(&y),
    }
}

/// Appends the canonical text of a number; `Err` when it is beyond the double range.
pub(crate) fn write_number(n: &Number, out: &mut Vec<u8>) -> Result<(), ()> {
    match n.as_str() {
        "-0" => out.push(b'0'),
        text if n.is_integer() => out.extend_from_slice(text.as_bytes()),
        _ => return write_f64(n.as_f64(), out),
    }
    Ok(())
}

fn write_f64(f: f64, out: &mut Vec<u8>) -> Result<(), ()> {
    if !f.is_finite() {
        return Err(());
    }
    // ryu-js follows ECMAScript, which prints both zeros as "0".
    out.extend_from_slice(ryu_js::Buffer::new().format_finite(f).as_bytes());
    Ok(())
}

pub(crate) fn write_u64(mut n: u64, out: &mut Vec<u8>) {
    let mut buf = [0u8; 20];
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[start..]);
}

/// A failure while writing, collecting its path innermost first as it unwinds.
struct Bad {
    duplicate: bool,
    path: Vec<PathSeg>,
}

impl Bad {
    fn non_finite() -> Bad {
        Bad { duplicate: false, path: Vec::new() }
    }

    fn duplicate(key: &str) -> Bad {
        Bad { duplicate: true, path: vec![PathSeg::Key(key.to_owned())] }
    }

    fn within(mut self, seg: PathSeg) -> Bad {
        self.path.push(seg);
        self
    }

    fn finish(self) -> CanonError {
        let path = render_path(&self.path);
        match self.duplicate {
            true => CanonError::DuplicateKey { path },
            false => CanonError::NonFinite { path },
        }
    }
}

/// Where escaped text goes: the canonical writer's bytes or a path string.
pub(crate) trait Sink {
    fn push_text(&mut self, s: &str);
}

impl Sink for Vec<u8> {
    fn push_text(&mut self, s: &str) {
        self.extend_from_slice(s.as_bytes());
    }
}

impl Sink for String {
    fn push_text(&mut self, s: &str) {
        self.push_str(s);
    }
}

const CONTROL_ESCAPES: [&str; 32] = [
    "\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005", "\\u0006", "\\u0007", "\\b", "\\t",
    "\\n", "\\u000b", "\\f", "\\r", "\\u000e", "\\u000f", "\\u0010", "\\u0011", "\\u0012", "\\u0013",
    "\\u0014", "\\u0015", "\\u0016", "\\u0017", "\\u0018", "\\u0019", "\\u001a", "\\u001b", "\\u001c",
    "\\u001d", "\\u001e", "\\u001f",
];

/// Writes `s` as a quoted JSON string, escaping only `"`, `\` and U+0000..U+001F.
///
/// Text is skipped eight bytes at a time while none of them needs escaping (long blob texts and
/// prompts are mostly plain), and looked at byte by byte only around the ones that do.
pub(crate) fn write_escaped<S: Sink>(out: &mut S, s: &str) {
    out.push_text("\"");
    let bytes = s.as_bytes();
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        if let Some(chunk) = bytes.get(i..i + 8) {
            let found = escape_bytes(u64::from_le_bytes(chunk.try_into().expect("a chunk of eight bytes")));
            if found == 0 {
                i += 8;
                continue;
            }
            // The lowest flagged byte is the first that needs escaping.
            i += (found.trailing_zeros() / 8) as usize;
        }
        let escape = match bytes[i] {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b @ 0..=0x1f => CONTROL_ESCAPES[usize::from(b)],
            _ => {
                i += 1;
                continue;
            }
        };
        out.push_text(&s[start..i]);
        out.push_text(escape);
        i += 1;
        start = i;
    }
    out.push_text(&s[start..]);
    out.push_text("\"");
}

/// The high bit of each of the eight bytes of `word` (little-endian) that is `"`, `\` or below
/// U+0020, exact up to the first such byte: each test is the "some byte less than n" bit trick,
/// whose borrow can only flag bytes above one that really matched. Zero when none needs escaping.
fn escape_bytes(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let below = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGHS;
    below(word, 0x20) | below(word ^ (ONES * u64::from(b'"')), 1) | below(word ^ (ONES * u64::from(b'\\')), 1)
}

fn write_json(j: &Json, out: &mut Vec<u8>) -> Result<(), Bad> {
    match j {
        Json::Null => out.extend_from_slice(b"null"),
        Json::Bool(true) => out.extend_from_slice(b"true"),
        Json::Bool(false) => out.extend_from_slice(b"false"),
        Json::Number(n) => write_number(n, out).map_err(|()| Bad::non_finite())?,
        Json::String(s) => write_escaped(out, s),
        Json::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(item, out).map_err(|bad| bad.within(PathSeg::Index(i)))?;
            }
            out.push(b']');
        }
        Json::Object(members) => {
            let in_order = members.windows(2).all(|w| key_order(&w[0].0, &w[1].0).is_lt());
            if in_order {
                write_members(members.iter().map(|(k, v)| (k, v)), out, write_json)?;
            } else {
                let mut sorted: Vec<(&String, &Json)> = members.iter().map(|(k, v)| (k, v)).collect();
                sorted.sort_unstable_by(|a, b| key_order(a.0, b.0));
                write_members(sorted, out, write_json)?;
            }
        }
    }
    Ok(())
}

fn write_value(v: &Value, out: &mut Vec<u8>) -> Result<(), Bad> {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => write_u64(u, out),
            (None, Some(i)) => {
                out.push(b'-');
                write_u64(i.unsigned_abs(), out);
            }
            (None, None) => write_f64(n.as_f64().unwrap_or(f64::NAN), out).map_err(|()| Bad::non_finite())?,
        },
        Value::String(s) => write_escaped(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out).map_err(|bad| bad.within(PathSeg::Index(i)))?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // serde_json's map iterates in UTF-8 order (or insertion order with
            // `preserve_order`), so check before sorting.
            if map.keys().is_sorted_by(|a, b| key_order(a, b).is_lt()) {
                write_members(map.iter(), out, write_value)?;
            } else {
                let mut sorted: Vec<(&String, &Value)> = map.iter().collect();
                sorted.sort_unstable_by(|a, b| key_order(a.0, b.0));
                write_members(sorted, out, write_value)?;
            }
        }
    }
    Ok(())
}

/// Writes members already in key order, refusing a repeated key.
fn write_members<'a, T: 'a>(
    members: impl IntoIterator<Item = (&'a String, &'a T)>,
    out: &mut Vec<u8>,
    write: fn(&T, &mut Vec<u8>) -> Result<(), Bad>,
) -> Result<(), Bad> {
    out.push(b'{');
    let mut previous: Option<&str> = None;
    for (key, value) in members {
        if let Some(previous) = previous {
            if previous == key {
                return Err(Bad::duplicate(key));
            }
            out.push(b',');
        }
        write_escaped(out, key);
        out.push(b':');
        write(value, out).map_err(|bad| bad.within(PathSeg::Key(key.clone())))?;
        previous = Some(key);
    }
    out.push(b'}');
    Ok(())
}
