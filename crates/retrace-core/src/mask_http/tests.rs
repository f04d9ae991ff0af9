//! Masking recorded response documents.
use base64::Engine as _;

use crate::http_doc::{layout, BodySpan};
use crate::mask::{MaskKey, MaskRule, MaskRules, Masker, ReplayAs, RuleMatch};

const SECRET: &str = "sk-Zq7/Wx@Vq9Jk.io";
const FRAGMENTS: &[&str] = &["Zq7", "Wx", "Vq9", "9Jk", "Jk.io"];

fn key() -> MaskKey {
    MaskKey::from_bytes([7; 32])
}

fn masker() -> Masker {
    let rule = |name: &str, kind: &str, matcher| MaskRule {
        name: name.into(),
        kind: kind.into(),
        matcher,
        replay: ReplayAs::Token,
    };
    let rules = MaskRules {
        rules: vec![
            rule("x-api-key", "apikey", RuleMatch::Header { header: "x-api-key".into() }),
            rule("canary", "secret", RuleMatch::Literal { value: SECRET.into() }),
        ],
    };
    Masker::new(rules, Some(key())).unwrap()
}

fn token() -> String {
    key().token("secret", SECRET)
}

/// A document as the server's encoder writes it.
fn stream_doc(headers: &[(&str, &str)], chunks: &[(u64, &[u8])]) -> Vec<u8> {
    let mut out = format!(
        "{{\"format\":\"retrace-http/1\",\"status\":200,\"headers\":{},\"stream\":[",
        serde_json::to_string(headers).unwrap()
    );
    for (i, (t, c)) in chunks.iter().enumerate() {
        let chunk = match std::str::from_utf8(c) {
            Ok(text) => serde_json::to_string(text).unwrap(),
            Err(_) => format!("{{\"b64\":\"{}\"}}", base64::engine::general_purpose::STANDARD.encode(c)),
        };
        out.push_str(&format!("{}[{t},{chunk}]", if i > 0 { "," } else { "" }));
    }
    out.push_str("],\"end\":\"complete\"}");
    out.into_bytes()
}

/// Masks `doc` and checks what every masked document keeps; returns the masked bytes.
fn masked(doc: &[u8], tokens: usize) -> Vec<u8> {
    let out = masker().mask_output(doc);
    assert_eq!(out.tokens, tokens);
    let bytes = out.bytes.into_owned();
    serde_json::from_slice::<serde_json::Value>(&bytes).expect("valid JSON");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let before = layout(doc).unwrap();
    let after = layout(&bytes).unwrap();
    let reassembled = match (&before.body, &after.body) {
        (Some(BodySpan::Stream(a)), Some(BodySpan::Stream(b))) => {
            assert_eq!(a.len(), b.len(), "chunk count kept");
            for (x, y) in a.iter().zip(b) {
                assert_eq!((x.t_ms, x.b64), (y.t_ms, y.b64), "times and chunk encodings kept");
            }
            String::from_utf8(b.iter().flat_map(|c| c.bytes.iter().copied()).collect()).unwrap()
        }
        _ => text.clone(),
    };
    for f in FRAGMENTS {
        assert!(!text.contains(f) && !reassembled.contains(f), "{f:?} survived: {reassembled}");
    }
    let again = masker().mask_output(&bytes);
    assert_eq!((again.tokens, again.bytes.as_ref()), (0, &bytes[..]), "masking twice equals once");
    bytes
}

fn chunks_of(doc: &[u8]) -> Vec<(u64, Vec<u8>)> {
    match layout(doc).unwrap().body {
        Some(BodySpan::Stream(chunks)) => chunks.into_iter().map(|c| (c.t_ms, c.bytes)).collect(),
        other => panic!("a stream, not {other:?}"),
    }
}

#[test]
fn an_openai_stream_document_with_headers() {
    let event =
        |c: &str| format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{c}\"}}}}]}}\n\n");
    let (a, b, c) = (event("é sk\\u002dZq7"), event("\\/Wx\\u0040"), event("Vq9Jk.io"));
    let e = "data: [DONE]\n\n";
    // `é` is split across the first two chunks, so both are written as base64.
    let split = a.find('é').unwrap() + 1;
    let a = a.as_bytes();
    let chunks: Vec<(u64, &[u8])> = vec![
        (0, &a[..split]),
        (7, &a[split..]),
        (9, &b.as_bytes()[..20]),
        (11, &b.as_bytes()[20..]),
        (15, c.as_bytes()),
        (16, e.as_bytes()),
    ];
    let headers = [("content-type", "text/event-stream"), ("x-api-key", "live-key-1"), ("x-echo", SECRET)];
    let doc = stream_doc(&headers, &chunks);
    let out = masked(&doc, 3);
    let l = layout(&out).unwrap();
    assert_eq!(l.headers[0].value, "text/event-stream");
    assert_eq!(l.headers[1].value, key().token("apikey", "live-key-1"));
    assert_eq!(l.headers[2].value, token());
    let text: Vec<u8> = chunks_of(&out).into_iter().flat_map(|(_, c)| c).collect();
    let text = String::from_utf8(text).unwrap();
    assert_eq!(text.matches(&token()).count(), 1);
    assert!(text.starts_with("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"é "), "{text}");
    assert!(out.starts_with(br#"{"format":"retrace-http/1","status":200,"headers":[["content-type","text/event-stream"],["x-api-key","rtk_apikey_"#));
    assert!(out.ends_with(br#"[16,"data: [DONE]\n\n"]],"end":"complete"}"#));
}

#[test]
fn an_anthropic_stream_document() {
    let delta = |d: &str| {
        format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{d}\"}}}}\n\n")
    };
    let stream = [delta("sk\\u002dZ"), delta("q7\\/Wx"), delta("\\u0040Vq9Jk.io")].concat();
    let cuts = [0, 40, 130, 200, stream.len()];
    let chunks: Vec<(u64, &[u8])> =
        cuts.windows(2).enumerate().map(|(i, w)| (i as u64 * 10, &stream.as_bytes()[w[0]..w[1]])).collect();
    let out = masked(&stream_doc(&[], &chunks), 1);
    let text: Vec<u8> = chunks_of(&out).into_iter().flat_map(|(_, c)| c).collect();
    assert_eq!(String::from_utf8(text).unwrap().matches(&token()).count(), 1);
}

#[test]
fn a_json_body_is_masked_in_place() {
    let doc = br#"{"format":"retrace-http/1","status":200,"headers":[["x-api-key","k1"]],"body":{"id": "x",  "n": 1.50, "text": "is sk\u002dZq7\/Wx\u0040Vq9Jk.io"}}"#;
    let out = masked(doc, 2);
    let want = format!(
        r#"{{"format":"retrace-http/1","status":200,"headers":[["x-api-key","{}"]],"body":{{"id": "x",  "n": 1.50, "text": "is {}"}}}}"#,
        key().token("apikey", "k1"),
        token()
    );
    assert_eq!(String::from_utf8(out).unwrap(), want);
}

#[test]
fn text_bodies_are_masked_and_binary_base64_bodies_left() {
    let doc = br#"{"format":"retrace-http/1","status":500,"headers":[],"body_text":"{\"e\": \"sk\\u002dZq7/Wx@Vq9Jk.io\"}\n plain sk-Zq7/Wx@Vq9Jk.io"}"#;
    let out = masked(doc, 2);
    assert_eq!(String::from_utf8(out).unwrap().matches(&token()).count(), 2);
    let b64 =
        br#"{"format":"retrace-http/1","status":200,"headers":[["content-type","application/octet-stream"]],"body_b64":"c2stWnE3L1d4QFZxOUprLmlv"}"#;
    let out = masker().mask_output(b64);
    assert_eq!((out.tokens, out.bytes.as_ref()), (0, &b64[..]));
}

#[test]
fn other_outputs_are_masked_as_json() {
    for raw in [
        &br#"{"answer":"sk-Zq7/Wx@Vq9Jk.io"}"#[..],
        br#"{"format":"retrace-http/2","x":"sk-Zq7/Wx@Vq9Jk.io"}"#,
    ] {
        assert_eq!(masker().mask_output(raw), masker().mask_json(raw));
        assert_eq!(masker().mask_output(raw).tokens, 1);
    }
}

#[test]
fn an_event_stream_answered_whole_is_masked_as_a_stream() {
    let event =
        |c: &str| format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{c}\"}}}}]}}\n\n");
    let text = [event("sk-Zq7"), event("/Wx@Vq9"), event("Jk.io")].concat();
    let doc = format!(
        r#"{{"format":"retrace-http/1","status":200,"headers":[],"body_text":{}}}"#,
        serde_json::to_string(&text).unwrap()
    );
    let out = masked(doc.as_bytes(), 1);
    assert_eq!(String::from_utf8(out).unwrap().matches(&token()).count(), 1);
}

#[test]
fn documents_with_more_than_the_format_are_masked_as_json() {
    let doc =
        br#"{"format":"retrace-http/1","status":200,"headers":[],"body":{},"extra":"sk-Zq7/Wx@Vq9Jk.io"}"#;
    let out = masker().mask_output(doc);
    assert_eq!(out.tokens, 1);
    assert_eq!(out, masker().mask_json(doc));
}

#[test]
fn a_header_or_text_body_echoing_an_encoded_query_is_masked() {
    let m = Masker::new(MaskRules::defaults(), Some(key())).unwrap();
    let doc = br#"{"format":"retrace-http/1","status":400,"headers":[["x-sim-query","to=ada%40example.com&card=4111+1111+1111+1111"]],"body_text":"bad request: /v1/x?to=ada%40example.com"}"#;
    let out = m.mask_output(doc);
    let text = String::from_utf8(out.bytes.to_vec()).unwrap();
    let (email, card) = (key().token("email", "ada@example.com"), key().token("card", "4111 1111 1111 1111"));
    assert_eq!(
        text,
        format!(
            r#"{{"format":"retrace-http/1","status":400,"headers":[["x-sim-query","to={email}&card={card}"]],"body_text":"bad request: /v1/x?to={email}"}}"#
        )
    );
    assert_eq!(out.tokens, 3);
    assert_eq!(m.mask_output(text.as_bytes()).tokens, 0, "masking twice equals once");
}

/// QA40 D1: a JSON answer with one byte that isn't UTF-8 (a Latin-1 `é`) is stored as
/// `body_b64`, and its secrets were kept in clear. A textual body is masked around the bytes
/// that aren't UTF-8, which stay as they were; a binary one (an image, audio) is left whole.
#[test]
fn a_text_body_that_is_not_utf8_is_masked_around_its_odd_bytes() {
    let body = [&b"{\"content\":\"caf\xe9 "[..], SECRET.as_bytes(), b"\"}"].concat();
    let encode = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let doc = |content_type: &str, b: &[u8]| {
        format!(
            r#"{{"format":"retrace-http/1","status":200,"headers":[["content-type","{content_type}"]],"body_b64":"{}"}}"#,
            encode(b)
        )
        .into_bytes()
    };
    for content_type in ["application/json", "text/plain; charset=latin1", "application/problem+json"] {
        let raw = doc(content_type, &body);
        let out = masker().mask_output(&raw);
        assert_eq!(out.tokens, 1, "{content_type}");
        let want = [&b"{\"content\":\"caf\xe9 "[..], token().as_bytes(), b"\"}"].concat();
        assert_eq!(out.bytes.as_ref(), &doc(content_type, &want)[..], "{content_type}");
        let again = masker().mask_output(&out.bytes);
        assert_eq!(again.tokens, 0, "masking twice equals once");
    }
    for content_type in ["image/png", "audio/mpeg", "application/octet-stream"] {
        let raw = doc(content_type, &body);
        let out = masker().mask_output(&raw);
        assert_eq!((out.tokens, out.bytes.as_ref()), (0, &raw[..]), "{content_type}");
    }
}

/// The same in a stream whose chunks aren't UTF-8.
#[test]
fn a_stream_that_is_not_utf8_is_masked_around_its_odd_bytes() {
    let stream =
        [&b"data: {\"content\":\"caf\xe9 "[..], SECRET.as_bytes(), b"\"}\n\ndata: [DONE]\n\n"].concat();
    let doc = stream_doc(&[("content-type", "text/event-stream")], &[(0, &stream[..20]), (5, &stream[20..])]);
    let out = masker().mask_output(&doc);
    assert_eq!(out.tokens, 1);
    let text: Vec<u8> = chunks_of(&out.bytes).into_iter().flat_map(|(_, c)| c).collect();
    let want =
        [&b"data: {\"content\":\"caf\xe9 "[..], token().as_bytes(), b"\"}\n\ndata: [DONE]\n\n"].concat();
    assert_eq!(String::from_utf8_lossy(&text), String::from_utf8_lossy(&want));
}
