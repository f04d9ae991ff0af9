//! The recorded response of a proxied call: the step's output document.
//!
//! One JSON object, `"format": "retrace-http/1"`, with the upstream's `status`, its response
//! headers (in order, minus hop-by-hop ones, `content-length`, `content-encoding` and
//! `set-cookie`), and either
//! - `body`: the body bytes exactly. A body that is one JSON value with no surrounding
//!   whitespace is embedded as it is (so masking splices into its strings and diffs see its
//!   structure); any other body is a string (`body_text`) or, when not UTF-8, base64
//!   (`body_b64`); or
//! - `stream`: the chunks as they arrived, each `[t_ms, "text"]` (milliseconds since the
//!   response head) or `[t_ms, {"b64": "..."}]` for a chunk that splits a UTF-8 character, and
//!   `end`: `complete` or `truncated` (the upstream broke off; `error` says how).
//!
//! A call whose client left says so in `client_gone` ([`ClientGone`]): `{"left_ms": T}` when the
//! client left before the upstream answered (a client timeout: the call stops there, and the
//! document is the proxy's own 504 saying so), `{"answered_ms": L, "left_ms": T}` when it left
//! in the middle of the stream (a read timeout between two chunks: the stream is still recorded
//! whole): milliseconds from the call to the upstream's head and to the client leaving. Replay
//! holds such an answer back past where the client left, and sends a stream's chunks at their
//! recorded times, so a client that gives up as it did in record gives up again.
//!
//! Bodies are never re-serialized: decoding gives back the recorded bytes. The format tag, the
//! header policy and the document's span view (for masking) are `retrace_core::http_doc`.
use base64::Engine;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

/// The format and its header policy live in core, beside the masker that reads the document.
pub use retrace_core::http_doc::{keeps_header, FORMAT};

/// How a stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamEnd {
    /// The upstream closed the stream normally.
    Complete,
    /// The upstream broke off mid-stream.
    Truncated,
}

/// A recorded response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// HTTP status.
    pub status: u16,
    /// Response headers (lowercase names), in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: RecordedBody,
}

/// A recorded body: whole, or a stream of chunks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordedBody {
    /// The whole body.
    Whole(Bytes),
    /// Chunks with their times, and how the stream ended.
    Stream {
        /// `(ms since the response head, bytes)`.
        chunks: Vec<(u64, Bytes)>,
        /// How it ended.
        end: StreamEnd,
        /// Why it was truncated.
        error: Option<String>,
    },
}

/// The client left before the upstream answered (a client timeout: the proxy stops the call
/// there, as the client did), or in the middle of its stream (a read timeout between two chunks:
/// the stream is still recorded whole). Replay holds the answer back so that a client that gave
/// up in record gives up again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct ClientGone {
    /// From the call to the upstream's answer (its response head); `None` when the client left
    /// first, and the document is the proxy's own 504 saying so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_ms: Option<u64>,
    /// From the call to the client leaving (mid-stream: to the first chunk it didn't take).
    pub left_ms: u64,
}

impl ClientGone {
    /// How long replay waits, past where the client left in record, before it gives up holding:
    /// twice the time the client waited, and a second, so the client's own timeout comes first.
    pub fn grace_ms(waited_ms: u64) -> u64 {
        waited_ms.saturating_mul(2).saturating_add(1000)
    }

    /// `document` (a whole encoded document) with this member added at its end.
    pub fn add_to(&self, mut document: Vec<u8>) -> Vec<u8> {
        debug_assert_eq!(document.last(), Some(&b'}'));
        document.pop();
        document.extend_from_slice(b",\"client_gone\":");
        serde_json::to_writer(&mut document, self).expect("writing to a vec");
        document.push(b'}');
        document
    }

    /// The member of `document`, if it has one: found at its end, where [`ClientGone::add_to`]
    /// puts it, without reading the rest (replay asks this of every document it serves).
    pub fn of(document: &[u8]) -> Option<ClientGone> {
        const MEMBER: &[u8] = b",\"client_gone\":";
        let inner = document.strip_suffix(b"}")?;
        let tail = &inner[inner.len().saturating_sub(96)..];
        let at = tail.windows(MEMBER.len()).rposition(|w| w == MEMBER)?;
        // Exactly the member's object, then the document's end: a body's own member of that
        // name would be followed by the body's closing brace too.
        serde_json::from_slice(&tail[at + MEMBER.len()..]).ok()
    }
}

/// A document that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("recorded response document: {0}")]
pub struct BadDocument(String);

impl Recorded {
    /// The document's bytes.
    pub fn encode(&self) -> Vec<u8> {
        match &self.body {
            RecordedBody::Whole(body) => {
                let mut out = Vec::with_capacity(256 + body.len());
                write_head(&mut out, self.status, &self.headers);
                if is_bare_json(body) {
                    out.extend_from_slice(b",\"body\":");
                    out.extend_from_slice(body);
                } else if let Ok(text) = std::str::from_utf8(body) {
                    out.extend_from_slice(b",\"body_text\":");
                    serde_json::to_writer(&mut out, text).expect("writing to a vec");
                } else {
                    out.extend_from_slice(b",\"body_b64\":");
                    serde_json::to_writer(&mut out, &b64(body)).expect("writing to a vec");
                }
                out.push(b'}');
                out
            }
            RecordedBody::Stream { chunks, end, error } => {
                let mut doc = StreamDocument::with_capacity(self.status, &self.headers, self.body_len());
                for (t, chunk) in chunks {
                    doc.push(*t, chunk);
                }
                doc.finish(*end, error.as_deref())
            }
        }
    }

    /// Decodes a document, giving back the recorded bytes exactly.
    pub fn decode(bytes: &[u8]) -> Result<Recorded, BadDocument> {
        #[derive(Deserialize)]
        struct Doc<'a> {
            format: String,
            status: u16,
            headers: Vec<(String, String)>,
            #[serde(borrow, default)]
            body: Option<&'a RawValue>,
            #[serde(default)]
            body_text: Option<String>,
            #[serde(default)]
            body_b64: Option<String>,
            #[serde(default)]
            stream: Option<Vec<(u64, Chunk)>>,
            #[serde(default)]
            end: Option<String>,
            #[serde(default)]
            error: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Chunk {
            Text(String),
            Binary { b64: String },
        }
        let doc: Doc<'_> = serde_json::from_slice(bytes).map_err(|e| BadDocument(e.to_string()))?;
        if doc.format != FORMAT {
            return Err(BadDocument(format!("unknown format {:?} (want {FORMAT})", doc.format)));
        }
        let unb64 = |s: &str| {
            base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| BadDocument(e.to_string()))
        };
        let body = if let Some(chunks) = doc.stream {
            let chunks = chunks
                .into_iter()
                .map(|(t, c)| {
                    Ok((
                        t,
                        match c {
                            Chunk::Text(s) => Bytes::from(s),
                            Chunk::Binary { b64 } => Bytes::from(unb64(&b64)?),
                        },
                    ))
                })
                .collect::<Result<Vec<_>, BadDocument>>()?;
            let end = match doc.end.as_deref() {
                Some("complete") => StreamEnd::Complete,
                Some("truncated") => StreamEnd::Truncated,
                other => return Err(BadDocument(format!("stream end {other:?}"))),
            };
            RecordedBody::Stream { chunks, end, error: doc.error }
        } else if let Some(raw) = doc.body {
            RecordedBody::Whole(Bytes::copy_from_slice(raw.get().as_bytes()))
        } else if let Some(text) = doc.body_text {
            RecordedBody::Whole(Bytes::from(text))
        } else if let Some(b) = doc.body_b64 {
            RecordedBody::Whole(Bytes::from(unb64(&b)?))
        } else {
            RecordedBody::Whole(Bytes::new())
        };
        Ok(Recorded { status: doc.status, headers: doc.headers, body })
    }

    fn body_len(&self) -> usize {
        match &self.body {
            RecordedBody::Whole(b) => b.len(),
            RecordedBody::Stream { chunks, .. } => chunks.iter().map(|(_, c)| c.len() + 16).sum(),
        }
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// A stream's document written as its chunks arrive, so that when the stream ends only its
/// end is left to write. Its bytes are [`Recorded::encode`]'s for the same stream (which writes
/// through it).
#[derive(Debug)]
pub struct StreamDocument {
    out: Vec<u8>,
    chunks: usize,
}

impl StreamDocument {
    /// A stream's document, up to its first chunk.
    pub fn new(status: u16, headers: &[(String, String)]) -> StreamDocument {
        StreamDocument::with_capacity(status, headers, 4096)
    }

    fn with_capacity(status: u16, headers: &[(String, String)], body: usize) -> StreamDocument {
        let mut out = Vec::with_capacity(256 + body);
        write_head(&mut out, status, headers);
        out.extend_from_slice(b",\"stream\":[");
        StreamDocument { out, chunks: 0 }
    }

    /// Appends a chunk that arrived `t_ms` after the response head.
    pub fn push(&mut self, t_ms: u64, chunk: &[u8]) {
        let out = &mut self.out;
        if self.chunks > 0 {
            out.push(b',');
        }
        self.chunks += 1;
        out.push(b'[');
        out.extend_from_slice(t_ms.to_string().as_bytes());
        out.push(b',');
        match std::str::from_utf8(chunk) {
            Ok(text) => serde_json::to_writer(&mut *out, text).expect("writing to a vec"),
            Err(_) => serde_json::to_writer(&mut *out, &serde_json::json!({ "b64": b64(chunk) }))
                .expect("writing to a vec"),
        }
        out.push(b']');
    }

    /// The whole document: the chunks so far, then how the stream ended.
    pub fn finish(mut self, end: StreamEnd, error: Option<&str>) -> Vec<u8> {
        let out = &mut self.out;
        out.extend_from_slice(b"],\"end\":");
        out.extend_from_slice(match end {
            StreamEnd::Complete => b"\"complete\"",
            StreamEnd::Truncated => b"\"truncated\"",
        });
        if let Some(e) = error {
            out.extend_from_slice(b",\"error\":");
            serde_json::to_writer(&mut *out, e).expect("writing to a vec");
        }
        out.push(b'}');
        self.out
    }
}

/// `{"format":...,"status":...,"headers":[...]`: what every document begins with.
fn write_head(out: &mut Vec<u8>, status: u16, headers: &[(String, String)]) {
    out.extend_from_slice(b"{\"format\":\"");
    out.extend_from_slice(FORMAT.as_bytes());
    out.extend_from_slice(b"\",\"status\":");
    out.extend_from_slice(status.to_string().as_bytes());
    out.extend_from_slice(b",\"headers\":");
    serde_json::to_writer(&mut *out, headers).expect("writing to a vec");
}

/// Whether `body` is exactly one JSON value with nothing around it.
fn is_bare_json(body: &[u8]) -> bool {
    match serde_json::from_slice::<&RawValue>(body) {
        Ok(raw) => raw.get().len() == body.len(),
        Err(_) => false,
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(r: &Recorded) {
        let bytes = r.encode();
        assert!(serde_json::from_slice::<serde_json::Value>(&bytes).is_ok(), "valid JSON");
        assert_eq!(&Recorded::decode(&bytes).unwrap(), r);
    }

    #[test]
    fn bodies_come_back_byte_for_byte() {
        let headers = vec![("content-type".to_owned(), "application/json".to_owned())];
        for body in [
            &br#"{"id":"x","n":1.50,"s":"\u00e9"}"#[..],
            b"{\"a\": 1}\n",
            b"  [1, 2]",
            b"not json at all",
            b"",
            &[0xff, 0xfe, 0x00][..],
        ] {
            let r = Recorded {
                status: 200,
                headers: headers.clone(),
                body: RecordedBody::Whole(Bytes::copy_from_slice(body)),
            };
            roundtrip(&r);
        }
    }

    #[test]
    fn json_bodies_are_embedded_as_they_are() {
        let r = Recorded {
            status: 200,
            headers: vec![],
            body: RecordedBody::Whole(Bytes::from_static(b"{\"b\":1.0,\"a\":2}")),
        };
        let bytes = r.encode();
        assert!(
            bytes.windows(15).any(|w| w == b"{\"b\":1.0,\"a\":2}"),
            "{}",
            String::from_utf8_lossy(&bytes)
        );
    }

    #[test]
    fn streams_keep_chunks_times_and_ending() {
        let split = "é".as_bytes();
        let r = Recorded {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: RecordedBody::Stream {
                chunks: vec![
                    (0, Bytes::from_static(b"data: {\"x\":1}\n\n")),
                    (3, Bytes::copy_from_slice(&split[..1])),
                    (4, Bytes::copy_from_slice(&split[1..])),
                    (9, Bytes::from_static(b"data: [DONE]\n\n")),
                ],
                end: StreamEnd::Truncated,
                error: Some("connection reset".into()),
            },
        };
        roundtrip(&r);
    }

    #[test]
    fn a_stream_written_as_it_arrives_is_the_encoded_document() {
        let headers = vec![("content-type".to_owned(), "text/event-stream".to_owned())];
        let chunks: Vec<(u64, Bytes)> = vec![
            (0, Bytes::from_static(b"data: {\"x\":\"\\u00e9\"}\n\n")),
            (2, Bytes::from_static(&[0xc3])),
            (7, Bytes::from_static(b"data: [DONE]\n\n")),
        ];
        let mut doc = StreamDocument::new(200, &headers);
        for (t, c) in &chunks {
            doc.push(*t, c);
        }
        let written = doc.finish(StreamEnd::Truncated, Some("reset"));
        let encoded = Recorded {
            status: 200,
            headers,
            body: RecordedBody::Stream { chunks, end: StreamEnd::Truncated, error: Some("reset".into()) },
        }
        .encode();
        assert_eq!(written, encoded);
        // The bytes stored for a stream (golden traces hold them): pinned.
        let want = r#"{"format":"retrace-http/1","status":200,"headers":[["content-type","text/event-stream"]],"stream":[[0,"data: {\"x\":\"\\u00e9\"}\n\n"],[2,{"b64":"ww=="}],[7,"data: [DONE]\n\n"]],"end":"truncated","error":"reset"}"#;
        assert_eq!(String::from_utf8(written).unwrap(), want);
        let empty = StreamDocument::new(200, &[]).finish(StreamEnd::Complete, None);
        assert_eq!(
            empty,
            br#"{"format":"retrace-http/1","status":200,"headers":[],"stream":[],"end":"complete"}"#
        );
    }

    #[test]
    fn a_client_that_left_is_said_at_the_end_and_changes_nothing_else() {
        let r = Recorded {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body: RecordedBody::Whole(Bytes::from_static(br#"{"ok":true}"#)),
        };
        let gone = ClientGone { answered_ms: Some(1000), left_ms: 300 };
        let doc = gone.add_to(r.encode());
        assert!(doc.ends_with(br#","client_gone":{"answered_ms":1000,"left_ms":300}}"#));
        let first = ClientGone { answered_ms: None, left_ms: 300 };
        assert_eq!(ClientGone::of(&first.add_to(r.encode())), Some(first));
        assert_eq!(Recorded::decode(&doc).unwrap(), r);
        assert_eq!(ClientGone::of(&doc), Some(gone));
        assert_eq!(ClientGone::of(&r.encode()), None);
        let body_member = Recorded {
            body: RecordedBody::Whole(Bytes::from_static(
                br#"{"client_gone":{"answered_ms":1,"left_ms":0}}"#,
            )),
            ..r.clone()
        };
        assert_eq!(ClientGone::of(&body_member.encode()), None, "a body's own member is not the document's");
        let layout = retrace_core::http_doc::layout(&doc).expect("the masker reads it as a document");
        assert_eq!(layout.headers.len(), 1);
    }

    #[test]
    fn mask_output_masks_what_this_encoder_writes() {
        use retrace_core::mask::{MaskKey, MaskRule, MaskRules, Masker, ReplayAs, RuleMatch};
        let secret = "sk-Zq7/Wx@Vq9Jk.io";
        let rule = |name: &str, matcher| MaskRule {
            name: name.into(),
            kind: "secret".into(),
            matcher,
            replay: ReplayAs::Token,
        };
        let rules = MaskRules {
            rules: vec![
                rule("x-api-key", RuleMatch::Header { header: "x-api-key".into() }),
                rule("canary", RuleMatch::Literal { value: secret.into() }),
            ],
        };
        let key = MaskKey::from_bytes([9; 32]);
        let masker = Masker::new(rules, Some(key.clone())).unwrap();
        let event = |c: &str| {
            format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{c}\"}}}}]}}\n\n")
        };
        let stream =
            [event("é sk\\u002dZq"), event("7\\/Wx\\u0040V"), event("q9Jk.io"), "data: [DONE]\n\n".into()]
                .concat();
        let split = stream.find('é').unwrap() + 1;
        let cuts = [0, split, split + 40, split + 90, stream.len() - 14, stream.len()];
        let chunks: Vec<(u64, Bytes)> = cuts
            .windows(2)
            .enumerate()
            .map(|(i, w)| (i as u64 * 3, Bytes::copy_from_slice(&stream.as_bytes()[w[0]..w[1]])))
            .collect();
        let recorded = Recorded {
            status: 200,
            headers: vec![
                ("content-type".into(), "text/event-stream".into()),
                ("x-api-key".into(), "k-1".into()),
            ],
            body: RecordedBody::Stream { chunks: chunks.clone(), end: StreamEnd::Complete, error: None },
        };
        let encoded = recorded.encode();
        let masked = masker.mask_output(&encoded);
        assert_eq!(masked.tokens, 2);
        let back = Recorded::decode(&masked.bytes).unwrap();
        let token = key.token("secret", secret);
        assert_eq!(back.header("x-api-key"), Some(key.token("secret", "k-1").as_str()));
        let RecordedBody::Stream { chunks: got, end: StreamEnd::Complete, error: None } = &back.body else {
            panic!("a complete stream")
        };
        assert_eq!(got.len(), chunks.len());
        assert!(got.iter().zip(&chunks).all(|((a, _), (b, _))| a == b), "times kept");
        let text = String::from_utf8(got.iter().flat_map(|(_, c)| c.iter().copied()).collect()).unwrap();
        assert_eq!(text.matches(&token).count(), 1);
        for fragment in ["Zq7", "Wx", "Vq9", "Jk.io"] {
            assert!(!text.contains(fragment), "{fragment} in {text}");
        }
        assert_eq!(masker.mask_output(&masked.bytes).bytes, masked.bytes, "masking twice equals once");
    }
}
