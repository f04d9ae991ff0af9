//! Unmasking after masking gives back what was masked, in each shape a recorded value takes.
use std::collections::HashMap;
use std::convert::Infallible;

use crate::http_doc::{layout, BodySpan};
use crate::mask::{Detector, MaskKey, MaskRule, MaskRules, Masker, OriginalsSink, ReplayAs, RuleMatch};

use super::{token_kind, unmask};

/// A secret with every character JSON escapes: a quote, a backslash, a newline, a tab.
const NASTY: &str = "pa\"ss\\wo\nrd\t-Zq7/Wx";
/// A PEM private key: newlines inside.
const PEM: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----";
/// A secret whose rule hands back the token.
const KEPT: &str = "kept-Vq9Jk.io";

fn rule(kind: &str, matcher: RuleMatch) -> MaskRule {
    MaskRule { name: kind.into(), kind: kind.into(), matcher, replay: ReplayAs::Token }
}

/// The masker and the originals it reported, by token.
struct Setup {
    masker: Masker,
    sink: OriginalsSink,
}

fn setup() -> Setup {
    let rules = MaskRules {
        rules: vec![
            rule("nasty", RuleMatch::Literal { value: NASTY.into() }),
            rule("privkey", RuleMatch::Pattern { pattern: Detector::PrivateKey }),
            rule("kept", RuleMatch::Literal { value: KEPT.into() }),
            rule("apikey", RuleMatch::Header { header: "x-api-key".into() }),
        ],
    };
    let sink = OriginalsSink::new();
    let masker = Masker::new(rules, Some(MaskKey::from_bytes([7; 32]))).unwrap().with_sink(sink.clone());
    Setup { masker, sink }
}

impl Setup {
    /// Masks `doc` (a document or JSON), unmasks it with every kind but `kept` revealed, and
    /// returns (masked, unmasked).
    fn round_trip(&self, doc: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let masked = self.masker.mask_output(doc);
        assert!(masked.tokens > 0, "nothing masked in {}", String::from_utf8_lossy(doc));
        let masked = masked.bytes.into_owned();
        let text = String::from_utf8_lossy(&masked);
        for fragment in ["ss\\", "wo\\", "MIIEvQ", "BKcwgg"] {
            assert!(!text.contains(fragment), "{fragment:?} survived masking: {text}");
        }
        let originals: HashMap<String, String> = self.sink.take().into_iter().collect();
        let mut lookup = |token: &str| -> Result<Option<String>, Infallible> {
            Ok(match token_kind(token) {
                Some("kept") => None,
                _ => originals.get(token).cloned(),
            })
        };
        let unmasked = unmask(&masked, &mut lookup).unwrap().into_owned();
        (masked, unmasked)
    }
}

/// A document as the server's encoder writes it, with `body` (after the headers) as given.
fn doc(headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    format!(
        "{{\"format\":\"retrace-http/1\",\"status\":200,\"headers\":{}{body}}}",
        serde_json::to_string(headers).unwrap()
    )
    .into_bytes()
}

/// A stream document of `events`, cut at each event boundary and at `cuts` (byte offsets into
/// the stream), the chunks written as the server's encoder writes them.
fn stream_doc(events: &[String], cuts: &[usize]) -> Vec<u8> {
    let stream = events.concat();
    let mut at: Vec<usize> = events.iter().scan(0, |n, e| Some(std::mem::replace(n, *n + e.len()))).collect();
    at.extend(cuts);
    at.push(stream.len());
    at.sort();
    at.dedup();
    let chunks: Vec<String> = at
        .windows(2)
        .enumerate()
        .map(|(i, w)| format!("[{},{}]", i * 5, serde_json::to_string(&stream[w[0]..w[1]]).unwrap()))
        .collect();
    doc(
        &[("content-type", "text/event-stream")],
        &format!(",\"stream\":[{}],\"end\":\"complete\"", chunks.join(",")),
    )
}

/// The stream a stream document holds, chunks joined.
fn stream_of(doc: &[u8]) -> String {
    let Some(BodySpan::Stream(chunks)) = layout(doc).unwrap().body else { panic!("a stream") };
    String::from_utf8(chunks.into_iter().flat_map(|c| c.bytes).collect()).unwrap()
}

/// The decoded text at `path` of every `data:` line's JSON, concatenated.
fn deltas(stream: &str, path: &[&str]) -> String {
    crate::mask_stream::tests::reassembled(stream, path)
}

fn chat_event(content: &str) -> String {
    let chunk = serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]});
    format!("data: {chunk}\n\n")
}

fn anthropic_event(text: &str) -> String {
    let data = serde_json::json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": text}});
    format!("event: content_block_delta\ndata: {data}\n\n")
}

#[test]
fn an_openai_chat_stream_comes_back_byte_for_byte() {
    let events = vec![
        chat_event(""),
        chat_event("the key:\n"),
        chat_event(&format!("{PEM}\nand {NASTY}, {KEPT}")),
        chat_event(" done"),
        "data: [DONE]\n\n".to_owned(),
    ];
    // Cuts inside event lines, away from the secrets' strings.
    let stream = events.concat();
    let doc = stream_doc(&events, &[10, stream.find("the key").unwrap() + 3, stream.find(" done").unwrap()]);
    let (masked, unmasked) = setup().round_trip(&doc);
    // The token nobody reveals stays a token.
    let kept = MaskKey::from_bytes([7; 32]).token("kept", KEPT);
    assert!(stream_of(&masked).contains(&kept));
    assert_eq!(String::from_utf8_lossy(&unmasked), String::from_utf8_lossy(&doc).replace(KEPT, &kept));
}

#[test]
fn an_anthropic_stream_comes_back_byte_for_byte() {
    let events = vec![
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"content\":[]}}\n\n".to_owned(),
        "event: ping\ndata: {\"type\": \"ping\"}\n\n".to_owned(),
        anthropic_event(&format!("here: {PEM}")),
        anthropic_event(&format!(" and \"{NASTY}\"")),
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_owned(),
    ];
    let doc = stream_doc(&events, &[7, 60]);
    let (_, unmasked) = setup().round_trip(&doc);
    assert_eq!(String::from_utf8_lossy(&unmasked), String::from_utf8_lossy(&doc));
}

#[test]
fn a_responses_stream_and_its_full_texts_come_back_byte_for_byte() {
    let text = format!("use {NASTY}");
    let delta = serde_json::json!({"type": "response.output_text.delta", "sequence_number": 1,
        "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": text});
    let done = serde_json::json!({"type": "response.completed", "response": {"output": [{"type": "message",
        "content": [{"type": "output_text", "text": text}]}]}});
    let events = vec![
        format!("event: response.output_text.delta\ndata: {delta}\n\n"),
        format!("event: response.completed\ndata: {done}\n\n"),
    ];
    let doc = stream_doc(&events, &[]);
    let (_, unmasked) = setup().round_trip(&doc);
    assert_eq!(String::from_utf8_lossy(&unmasked), String::from_utf8_lossy(&doc));
}

#[test]
fn a_secret_streamed_across_deltas_comes_back_whole_in_the_first() {
    let pieces: Vec<String> = PEM.chars().collect::<Vec<_>>().chunks(7).map(|c| c.iter().collect()).collect();
    assert!(pieces.len() >= 3);
    let mut events = vec![chat_event("key: ")];
    events.extend(pieces.iter().map(|p| chat_event(p)));
    events.push("data: [DONE]\n\n".to_owned());
    let doc = stream_doc(&events, &[]);
    let (_, unmasked) = setup().round_trip(&doc);
    // The text, and every event's JSON, come back; where the deltas split the key does not
    // (the runtime keeps these bytes in the vault).
    let stream = stream_of(&unmasked);
    assert_eq!(deltas(&stream, &["choices", "0", "delta", "content"]), format!("key: {PEM}"));
    assert_ne!(unmasked, doc);
    let chunks = |d: &[u8]| match layout(d).unwrap().body {
        Some(BodySpan::Stream(c)) => c.len(),
        _ => 0,
    };
    assert_eq!(chunks(&unmasked), chunks(&doc), "chunk count kept");
}

#[test]
fn a_json_body_comes_back_byte_for_byte() {
    let body =
        serde_json::json!({"id": "x", "content": [{"type": "text", "text": format!("{PEM} / {NASTY}")}]});
    let doc = doc(&[("x-api-key", "live-key")], &format!(",\"body\":{body}"));
    let (masked, unmasked) = setup().round_trip(&doc);
    assert_eq!(String::from_utf8_lossy(&unmasked), String::from_utf8_lossy(&doc));
    assert!(!String::from_utf8_lossy(&masked).contains("live-key"));
}

#[test]
fn a_token_in_a_json_string_of_a_text_body_is_escaped_twice() {
    // JSON with trailing whitespace is kept as text: the secret sits in a string in a string.
    let inner = format!("{}\n", serde_json::json!({"message": {"content": NASTY}, "key": PEM}));
    let doc = doc(&[], &format!(",\"body_text\":{}", serde_json::to_string(&inner).unwrap()));
    let (_, unmasked) = setup().round_trip(&doc);
    assert_eq!(String::from_utf8_lossy(&unmasked), String::from_utf8_lossy(&doc));
}

#[test]
fn a_stream_answered_as_one_text_body_comes_back_byte_for_byte() {
    let events = [anthropic_event(PEM), anthropic_event(NASTY)].concat();
    let doc = doc(&[], &format!(",\"body_text\":{}", serde_json::to_string(&events).unwrap()));
    let (_, unmasked) = setup().round_trip(&doc);
    assert_eq!(String::from_utf8_lossy(&unmasked), String::from_utf8_lossy(&doc));
}

#[test]
fn headers_and_a_truncated_streams_error_come_back_byte_for_byte() {
    let events = [chat_event("a")];
    let doc = String::from_utf8(stream_doc(&events, &[])).unwrap();
    let doc = doc.replace(
        "\"end\":\"complete\"",
        &format!(
            "\"end\":\"truncated\",\"error\":{}",
            serde_json::to_string(&format!("reset: {NASTY}")).unwrap()
        ),
    );
    let doc = doc.replace(
        "[\"content-type\"",
        &format!(
            "[\"x-note\",{}],[\"content-type\"",
            serde_json::to_string(&format!("q\"{KEPT}\\{NASTY}")).unwrap()
        ),
    );
    let (masked, unmasked) = setup().round_trip(doc.as_bytes());
    assert_eq!(
        String::from_utf8_lossy(&unmasked),
        doc.replace(KEPT, &MaskKey::from_bytes([7; 32]).token("kept", KEPT))
    );
    assert!(String::from_utf8_lossy(&masked).contains("rtk_nasty_"));
}

#[test]
fn json_values_and_text_come_back_byte_for_byte() {
    let s = setup();
    let tool_output =
        serde_json::to_vec(&serde_json::json!({"deploy_key": PEM, "note": [NASTY, 1]})).unwrap();
    let (_, unmasked) = s.round_trip(&tool_output);
    assert_eq!(unmasked, tool_output);
    // Not JSON: a token outside anything quoted holds the original as it was, one in a string
    // the original escaped.
    let text = format!("log line: {PEM} and {{\"k\": {}}}", serde_json::to_string(NASTY).unwrap());
    let (_, unmasked) = s.round_trip(text.as_bytes());
    assert_eq!(String::from_utf8(unmasked).unwrap(), text);
}

#[test]
fn tokens_nobody_reveals_and_values_without_tokens_stay_borrowed() {
    let plain = br#"{"a": "rtk_ but no token"}"#;
    let mut none = |_: &str| -> Result<Option<String>, Infallible> { Ok(None) };
    assert!(matches!(unmask(plain, &mut none).unwrap(), std::borrow::Cow::Borrowed(_)));
    let token = MaskKey::from_bytes([7; 32]).token("email", "a@b.co");
    let value = format!("{{\"to\": \"{token}\"}}");
    assert_eq!(unmask(value.as_bytes(), &mut none).unwrap().as_ref(), value.as_bytes());
    let mut refuse = |_: &str| -> Result<Option<String>, &'static str> { Err("no vault") };
    assert_eq!(unmask(value.as_bytes(), &mut refuse), Err("no vault"));
    assert_eq!(token_kind(&token), Some("email"));
    assert_eq!(token_kind("rtk_email_short"), None);
}
