//! The `retrace-http/1` document, the recorded output of a proxied model call, as far as it is
//! pure: its format tag, which response headers it keeps, and where each of its parts lies in
//! its bytes ([`layout`]), so the masking stage can splice into them without re-serializing.
//!
//! The document is one JSON object: `format`, `status`, `headers` (`[[name, value], ...]`), and
//! either `body` (a JSON body embedded as it is), `body_text` (a string), `body_b64` (base64),
//! or `stream` (`[[t_ms, "text"] | [t_ms, {"b64": "..."}], ...]`) with `end` and an optional
//! `error`. The server's `proxy::document` encodes and decodes it.
use std::ops::Range;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The format tag of a recorded response document.
pub const FORMAT: &str = "retrace-http/1";

/// Response headers that are never recorded nor replayed.
const DROPPED_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "content-encoding",
    "set-cookie",
    "proxy-connection",
    "upgrade",
    "trailer",
];

/// Whether a response header is recorded.
pub fn keeps_header(name: &str) -> bool {
    !DROPPED_HEADERS.iter().any(|d| name.eq_ignore_ascii_case(d))
}

/// Where a document's parts lie in its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Each header's name, decoded value, and the span of its value string (quotes included).
    pub headers: Vec<HeaderSpan>,
    /// The body, if any.
    pub body: Option<BodySpan>,
    /// The span of the `error` string of a truncated stream.
    pub error: Option<Range<usize>>,
}

/// One recorded header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderSpan {
    /// Its name.
    pub name: String,
    /// Its value.
    pub value: String,
    /// The span of the value's JSON string.
    pub span: Range<usize>,
}

/// Where the body lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodySpan {
    /// `body`: the span of the embedded JSON value.
    Json(Range<usize>),
    /// `body_text`: the span of the JSON string.
    Text(Range<usize>),
    /// `body_b64`: the span of the JSON string.
    Base64(Range<usize>),
    /// `stream`: its chunks.
    Stream(Vec<ChunkSpan>),
}

/// One stream chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkSpan {
    /// Milliseconds since the response head.
    pub t_ms: u64,
    /// The chunk's bytes, decoded.
    pub bytes: Vec<u8>,
    /// Whether it is written `{"b64": ...}`.
    pub b64: bool,
    /// The span of its JSON value (the string, or the `{"b64": ...}` object).
    pub span: Range<usize>,
}

/// Bytes that are not a `retrace-http/1` document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// Not a JSON object of the document's shape.
    #[error("not a recorded response document: {0}")]
    Shape(String),
    /// Another format tag.
    #[error("unknown format {0:?} (want {FORMAT})")]
    Format(String),
    /// A stream chunk's base64 does not decode.
    #[error("stream chunk {0}: bad base64")]
    Base64(usize),
}

/// The document's fields. Unknown fields are refused, so a document with more in it than this
/// is masked as plain JSON (every string) rather than only where a document holds secrets.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc<'a> {
    format: String,
    #[allow(dead_code)]
    status: serde::de::IgnoredAny,
    #[allow(dead_code)]
    #[serde(default)]
    end: Option<serde::de::IgnoredAny>,
    #[serde(borrow, default)]
    headers: Vec<(String, &'a RawValue)>,
    #[serde(borrow, default)]
    body: Option<&'a RawValue>,
    #[serde(borrow, default)]
    body_text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    body_b64: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<Vec<(u64, &'a RawValue)>>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    /// The client left before the upstream answered (numbers only: nothing to mask).
    #[allow(dead_code)]
    #[serde(default)]
    client_gone: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct Binary {
    b64: String,
}

/// `doc` with each range replaced by its bytes (ranges disjoint, in any order): how masking and
/// unmasking rewrite a document's parts in place, every other byte kept.
pub(crate) fn splice(doc: &[u8], mut splices: Vec<(Range<usize>, Vec<u8>)>) -> Vec<u8> {
    splices.sort_by_key(|(range, _)| range.start);
    let mut out = Vec::with_capacity(doc.len() + splices.iter().map(|(_, b)| b.len()).sum::<usize>());
    let mut copied = 0;
    for (range, bytes) in splices {
        out.extend_from_slice(&doc[copied..range.start]);
        out.extend_from_slice(&bytes);
        copied = range.end;
    }
    out.extend_from_slice(&doc[copied..]);
    out
}

/// Where the parts of the document `doc` lie.
pub fn layout(doc: &[u8]) -> Result<Layout, LayoutError> {
    let parsed: Doc<'_> = serde_json::from_slice(doc).map_err(|e| LayoutError::Shape(e.to_string()))?;
    if parsed.format != FORMAT {
        return Err(LayoutError::Format(parsed.format));
    }
    let span = |raw: &RawValue| {
        span_of(doc, raw).ok_or_else(|| LayoutError::Shape("a value outside the document".into()))
    };
    let string = |raw: &RawValue| {
        let s = span(raw)?;
        if raw.get().starts_with('"') {
            Ok(s)
        } else {
            Err(LayoutError::Shape("expected a string".into()))
        }
    };
    let mut headers = Vec::with_capacity(parsed.headers.len());
    for (name, raw) in parsed.headers {
        let value =
            serde_json::from_str::<String>(raw.get()).map_err(|e| LayoutError::Shape(e.to_string()))?;
        headers.push(HeaderSpan { name, value, span: string(raw)? });
    }
    let bodies = [
        parsed.stream.is_some(),
        parsed.body.is_some(),
        parsed.body_text.is_some(),
        parsed.body_b64.is_some(),
    ];
    if bodies.iter().filter(|b| **b).count() > 1 {
        return Err(LayoutError::Shape("more than one body".into()));
    }
    let body = if let Some(stream) = parsed.stream {
        let mut chunks = Vec::with_capacity(stream.len());
        for (i, (t_ms, raw)) in stream.into_iter().enumerate() {
            let (bytes, b64) = if raw.get().starts_with('"') {
                let text = serde_json::from_str::<String>(raw.get())
                    .map_err(|e| LayoutError::Shape(e.to_string()))?;
                (text.into_bytes(), false)
            } else {
                let b = serde_json::from_str::<Binary>(raw.get())
                    .map_err(|e| LayoutError::Shape(e.to_string()))?;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b.b64)
                    .map_err(|_| LayoutError::Base64(i))?;
                (bytes, true)
            };
            chunks.push(ChunkSpan { t_ms, bytes, b64, span: span(raw)? });
        }
        Some(BodySpan::Stream(chunks))
    } else if let Some(raw) = parsed.body {
        Some(BodySpan::Json(span(raw)?))
    } else if let Some(raw) = parsed.body_text {
        Some(BodySpan::Text(string(raw)?))
    } else if let Some(raw) = parsed.body_b64 {
        Some(BodySpan::Base64(string(raw)?))
    } else {
        None
    };
    let error = match parsed.error {
        Some(raw) if raw.get().starts_with('"') => Some(span(raw)?),
        _ => None,
    };
    Ok(Layout { headers, body, error })
}

/// The span in `doc` of `raw`, which borrows from it.
fn span_of(doc: &[u8], raw: &RawValue) -> Option<Range<usize>> {
    let text = raw.get();
    let start = (text.as_ptr() as usize).checked_sub(doc.as_ptr() as usize)?;
    let span = start..start + text.len();
    (doc.get(span.clone())? == text.as_bytes()).then_some(span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_each_part() {
        let doc = br#"{"format":"retrace-http/1","status":200,"headers":[["x-a","v\u0031"]],"stream":[[0,"data: a"],[5,{"b64":"/w=="}]],"end":"truncated","error":"reset"}"#;
        let l = layout(doc).unwrap();
        assert_eq!(l.headers[0].value, "v1");
        assert_eq!(&doc[l.headers[0].span.clone()], br#""v\u0031""#);
        let Some(BodySpan::Stream(chunks)) = &l.body else { panic!("a stream") };
        assert_eq!((chunks[0].t_ms, chunks[0].bytes.as_slice(), chunks[0].b64), (0, &b"data: a"[..], false));
        assert_eq!((chunks[1].t_ms, chunks[1].bytes.as_slice(), chunks[1].b64), (5, &[0xff][..], true));
        assert_eq!(&doc[chunks[1].span.clone()], br#"{"b64":"/w=="}"#);
        assert_eq!(&doc[l.error.unwrap()], br#""reset""#);
    }

    #[test]
    fn bodies_and_other_documents() {
        let doc = br#"{"format":"retrace-http/1","status":200,"headers":[],"body":{"a": [1]}}"#;
        let Some(BodySpan::Json(span)) = layout(doc).unwrap().body else { panic!("a JSON body") };
        assert_eq!(&doc[span], br#"{"a": [1]}"#);
        assert!(matches!(layout(br#"{"format":"other/1","status":200}"#), Err(LayoutError::Format(_))));
        assert!(matches!(layout(br#"{"a":1}"#), Err(LayoutError::Shape(_))));
        assert!(matches!(layout(b"not json"), Err(LayoutError::Shape(_))));
        let bad = br#"{"format":"retrace-http/1","status":200,"headers":[],"stream":[[0,{"b64":"!"}]],"end":"complete"}"#;
        assert_eq!(layout(bad), Err(LayoutError::Base64(0)));
        for odd in [
            &br#"{"format":"retrace-http/1","status":200,"headers":[],"body":1,"body_text":"x"}"#[..],
            br#"{"format":"retrace-http/1","status":200,"headers":[],"note":"x"}"#,
        ] {
            assert!(matches!(layout(odd), Err(LayoutError::Shape(_))));
        }
    }
}
