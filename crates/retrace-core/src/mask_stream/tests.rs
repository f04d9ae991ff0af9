//! Stream masking over the three providers' stream shapes.
use proptest::prelude::*;

use crate::mask::{MaskKey, MaskRule, MaskRules, Masker, ReplayAs, RuleMatch};

/// The secret; its JSON-escaped forms below split it across chunks and deltas.
const SECRET: &str = "sk-Zq7/Wx@Vq9Jk.io";
/// Pieces of the secret that must not survive masking.
const FRAGMENTS: &[&str] = &["Zq7", "Wx", "Vq9", "9Jk", "Jk.io"];

fn masker() -> Masker {
    let rules = MaskRules {
        rules: vec![MaskRule {
            name: "canary".into(),
            kind: "secret".into(),
            matcher: RuleMatch::Literal { value: SECRET.into() },
            replay: ReplayAs::Token,
        }],
    };
    Masker::new(rules, Some(MaskKey::from_bytes([7; 32]))).unwrap()
}

fn token() -> String {
    MaskKey::from_bytes([7; 32]).token("secret", SECRET)
}

/// Cuts `stream` at each of `cuts` (byte offsets).
fn cut(stream: &str, cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut from = 0;
    for &at in cuts.iter().chain([stream.len()].iter()) {
        out.push(stream.as_bytes()[from..at].to_vec());
        from = at;
    }
    out
}

fn offset_of(stream: &str, needle: &str) -> usize {
    stream.find(needle).unwrap_or_else(|| panic!("{needle:?} in stream"))
}

/// The reassembled masked stream, after the checks every masked stream passes.
fn masked(chunks: &[Vec<u8>], secrets: usize) -> String {
    let out = masker().mask_stream(chunks);
    assert_eq!(out.tokens, secrets);
    assert_eq!(out.chunks.len(), chunks.len(), "chunk count kept");
    let joined: Vec<u8> = out.chunks.iter().flat_map(|c| c.iter().copied()).collect();
    let text = String::from_utf8(joined).expect("UTF-8");
    for f in FRAGMENTS {
        assert!(!text.contains(f), "{f:?} survived in {text}");
    }
    let token = token();
    let whole = text.matches(&token).count();
    let in_chunks: usize =
        out.chunks.iter().map(|c| String::from_utf8_lossy(c).matches(&token).count()).sum();
    assert_eq!(in_chunks, whole, "no token is split across chunks");
    for line in text.lines() {
        if let Some(data) = line.strip_prefix("data: ") {
            assert!(
                data == "[DONE]" || serde_json::from_str::<serde_json::Value>(data).is_ok(),
                "valid JSON: {data}"
            );
        }
    }
    let again = masker().mask_stream(&out.chunks);
    assert_eq!(again.tokens, 0);
    assert_eq!(again.chunks, out.chunks, "masking twice equals once");
    text
}

/// The decoded text of every delta an event line's JSON carries at `path` (shared with the
/// unmasking tests).
pub(crate) fn reassembled(text: &str, path: &[&str]) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let Some(Ok(v)) = line.strip_prefix("data: ").map(serde_json::from_str::<serde_json::Value>) else {
            continue;
        };
        let mut at = &v;
        for p in path {
            at = match p.parse::<usize>() {
                Ok(i) => &at[i],
                Err(_) => &at[*p],
            };
        }
        out.push_str(at.as_str().unwrap_or(""));
    }
    out
}

fn chat_event(content: &str) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\"finish_reason\":null}}]}}\n\n"
    )
}

#[test]
fn chat_completions_secret_split_across_three_chunks() {
    let stream = [
        "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
            .to_owned(),
        chat_event("key: sk\\u002dZq"),
        chat_event("7\\/Wx\\u0040V"),
        chat_event("q9Jk.io, done"),
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n".to_owned(),
    ]
    .concat();
    // One cut inside the escape `\u0040`, one inside an SSE line between deltas.
    let cuts = [
        offset_of(&stream, "key:"),
        offset_of(&stream, "0040V") + 2,
        offset_of(&stream, "q9Jk") - 20,
        offset_of(&stream, "[DONE]"),
    ];
    let text = masked(&cut(&stream, &cuts), 1);
    let token = token();
    assert_eq!(reassembled(&text, &["choices", "0", "delta", "content"]), format!("key: {token}, done"));
    assert_eq!(text.matches(&token).count(), 1);
}

#[test]
fn chat_completions_tool_arguments_are_their_own_part() {
    let tool = |args: &str| {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":1,\"function\":{{\"arguments\":\"{args}\"}}}}]}}}}]}}\n\n")
    };
    let stream =
        [tool("{\\\"k\\\": \\\"sk-Z"), chat_event("sk-Zq"), tool("q7\\/Wx@Vq9"), tool("Jk.io\\\"}")].concat();
    let cuts = [offset_of(&stream, "q7\\/Wx") - 3, offset_of(&stream, "Jk.io\\")];
    let text = masked(&cut(&stream, &cuts), 1);
    let args = reassembled(&text, &["choices", "0", "delta", "tool_calls", "0", "function", "arguments"]);
    assert_eq!(args, format!("{{\"k\": \"{}\"}}", token()));
    // The content part held only a prefix of the secret: nothing there to mask.
    assert_eq!(reassembled(&text, &["choices", "0", "delta", "content"]), "sk-Zq");
}

#[test]
fn responses_secret_split_across_three_chunks_and_full_texts() {
    let delta = |d: &str, n: u32| {
        format!("event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"sequence_number\":{n},\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"{d}\"}}\n\n")
    };
    let stream = [
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"output\":[]}}\n\n".to_owned(),
        delta("use sk\\u002dZ", 1),
        delta("q7\\/", 2),
        delta("Wx\\u0040Vq9J", 3),
        delta("k.io", 4),
        "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"text\":\"use sk-Zq7\\/Wx@Vq9Jk.io\"}\n\n".to_owned(),
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"use sk\\u002dZq7/Wx\\u0040Vq9Jk.io\"}]}]}}\n\n".to_owned(),
    ]
    .concat();
    let cuts = [
        offset_of(&stream, "\\u002dZ") + 3,
        offset_of(&stream, "q7\\/") + 1,
        offset_of(&stream, "Wx\\u0040") + 4,
        offset_of(&stream, "event: response.output_text.done") + 9,
    ];
    let text = masked(&cut(&stream, &cuts), 3);
    let token = token();
    assert_eq!(reassembled(&text, &["delta"]), format!("use {token}"));
    assert_eq!(reassembled(&text, &["text"]), format!("use {token}"));
    assert_eq!(
        reassembled(&text, &["response", "output", "0", "content", "0", "text"]),
        format!("use {token}")
    );
    assert!(text.contains("\"sequence_number\":3"));
}

#[test]
fn anthropic_secret_split_across_three_chunks() {
    let delta = |d: &str| {
        format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{d}\"}}}}\n\n")
    };
    let stream = [
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"content\":[]}}\n\n".to_owned(),
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n".to_owned(),
        delta("sk\\u002dZ"),
        "event: ping\ndata: {\"type\": \"ping\"}\n\n".to_owned(),
        delta("q7\\/W"),
        delta("x\\u0040Vq9Jk.io!"),
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n".to_owned(),
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_owned(),
    ]
    .concat();
    let cuts = [
        offset_of(&stream, "sk\\u002dZ") + 3,
        offset_of(&stream, "event: ping") + 3,
        offset_of(&stream, "q7\\/W") + 3,
        offset_of(&stream, "x\\u0040") + 1,
    ];
    let text = masked(&cut(&stream, &cuts), 1);
    let token = token();
    assert_eq!(reassembled(&text, &["delta", "text"]), format!("{token}!"));
    assert_eq!(text.matches(&token).count(), 1);
    assert!(text.contains("event: ping\ndata: {\"type\": \"ping\"}\n\n"), "other bytes stay as received");
}

#[test]
fn bytes_outside_masked_strings_and_times_of_cuts_stay() {
    let stream = [chat_event("a"), chat_event("sk-Zq7/Wx@Vq9Jk.io"), chat_event("b")].concat();
    let chunks = cut(&stream, &[5, offset_of(&stream, "sk-Zq7") + 4, offset_of(&stream, "\"b\"")]);
    let out = masker().mask_stream(&chunks);
    assert_eq!(out.chunks[0], chunks[0], "untouched chunks are the same bytes");
    assert_eq!(out.chunks[3], chunks[3]);
    // The cut fell 5 bytes into the 20-byte string: it moved to the string's start.
    assert!(out.chunks[1].ends_with(b"\"content\":"));
    assert!(out.chunks[2].starts_with(format!("\"{}\"", token()).as_bytes()));
}

#[test]
fn unparseable_events_and_other_lines_mask_their_strings() {
    let stream = ": note \"sk-Zq7/Wx@Vq9Jk.io\"\ndata: {\"broken\": \"sk\\u002dZq7/Wx@Vq9Jk.io\", \ndata: {\"cut\":\"sk-Zq7/Wx@Vq9Jk.io";
    let chunks = cut(stream, &[3, 40]);
    let out = masker().mask_stream(&chunks);
    assert_eq!(out.tokens, 2);
    let text: Vec<u8> = out.chunks.iter().flat_map(|c| c.iter().copied()).collect();
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.ends_with("{\"cut\":\"sk-Zq7/Wx@Vq9Jk.io"),
        "an unterminated string can't be masked: {text}"
    );
    assert_eq!(text.matches(&token()).count(), 2);
}

#[test]
fn nothing_to_mask_borrows_every_chunk() {
    let chunks = cut(&chat_event("hello"), &[4, 9]);
    let out = masker().mask_stream(&chunks);
    assert_eq!(out.tokens, 0);
    assert!(out.chunks.iter().all(|c| matches!(c, std::borrow::Cow::Borrowed(_))));
}

fn any_stream() -> String {
    [
        chat_event("x sk\\u002dZq7\\/W"),
        chat_event("x\\u0040Vq9"),
        chat_event("Jk.io y"),
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"é sk-Zq7/Wx@Vq9Jk.io\"}}\r\n\r\n".to_owned(),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat()
}

proptest! {
    #[test]
    fn any_chunking_masks_to_the_same_text(mut cuts in proptest::collection::vec(0usize..400, 0..12)) {
        let stream = any_stream();
        cuts.iter_mut().for_each(|c| *c %= stream.len() + 1);
        cuts.sort_unstable();
        let whole = [stream.as_bytes()];
        let one: Vec<u8> = masker().mask_stream(&whole).chunks.concat();
        let chunks = cut(&stream, &cuts);
        let many = masker().mask_stream(&chunks);
        prop_assert_eq!(many.chunks.len(), cuts.len() + 1);
        prop_assert_eq!(many.tokens, 2);
        prop_assert_eq!(many.chunks.concat(), one);
    }

    #[test]
    fn arbitrary_bytes_keep_their_chunk_count(
        chunks in proptest::collection::vec(proptest::collection::vec(
            prop_oneof![Just(b'"'), Just(b'\\'), Just(b'\n'), Just(b'{'), any::<u8>(), Just(b'd')], 0..40), 0..8),
    ) {
        let out = masker().mask_stream(&chunks);
        prop_assert_eq!(out.chunks.len(), chunks.len());
        prop_assert_eq!(out.tokens, 0);
        prop_assert_eq!(out.chunks.concat(), chunks.concat());
    }
}

fn path_masker(path: &str) -> Masker {
    let mut rules = masker().rules().clone();
    rules.rules.push(MaskRule {
        name: "path".into(),
        kind: "field".into(),
        matcher: RuleMatch::JsonPath { json_path: path.into() },
        replay: ReplayAs::Token,
    });
    Masker::new(rules, Some(MaskKey::from_bytes([7; 32]))).unwrap()
}

#[test]
fn json_path_rules_see_each_events_shape() {
    let stream = [
        "data: {\"type\":\"response.completed\",\"response\":{\"password\":\"hunter2\",\"text\":\"hunter2\"}}\n\n".to_owned(),
        chat_event("hunter2"),
    ]
    .concat();
    let chunks = cut(&stream, &[30]);
    let out = path_masker("$..password").mask_stream(&chunks);
    let text = String::from_utf8(out.chunks.concat()).unwrap();
    assert_eq!(out.tokens, 1);
    assert_eq!(text.matches("hunter2").count(), 2, "{text}");
    assert!(text.contains("\"password\":\"rtk_field_"));
    assert_eq!(path_masker("$..password").mask_stream(&out.chunks).tokens, 0, "masking twice equals once");
}

#[test]
fn a_json_path_rule_on_deltas_masks_each_delta_and_leaves_literals_to_parts() {
    let tool = |args: &str| {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":0,\"function\":{{\"arguments\":\"{args}\"}}}}]}}}}]}}\n\n")
    };
    let stream =
        [tool("{\\\"a\\\":1"), tool("}"), chat_event("x sk-Zq7/W"), chat_event("x@Vq9Jk.io")].concat();
    let whole = [stream.as_bytes()];
    let out = path_masker("$..arguments").mask_stream(&whole);
    let text = String::from_utf8(out.chunks.concat()).unwrap();
    assert_eq!(out.tokens, 3, "{text}");
    assert_eq!(text.matches("rtk_field_").count(), 2);
    assert_eq!(reassembled(&text, &["choices", "0", "delta", "content"]), format!("x {}", token()));
    let again = path_masker("$..arguments").mask_stream(&out.chunks);
    assert_eq!(again.tokens, 0);
    assert_eq!(again.chunks, out.chunks, "masking twice equals once");
}

#[test]
fn the_email_detector_finds_an_address_split_across_deltas() {
    let masker = Masker::new(MaskRules::defaults(), Some(MaskKey::from_bytes([7; 32]))).unwrap();
    let delta = |d: &str| {
        format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{d}\"}}}}\n\n")
    };
    let stream = [delta("write to ada.lo"), delta("velace\\u0040ana"), delta("lytical.org today")].concat();
    let chunks = cut(&stream, &[offset_of(&stream, "\\u0040") + 3, offset_of(&stream, "lytical")]);
    let out = masker.mask_stream(&chunks);
    assert_eq!((out.tokens, out.chunks.len()), (1, 3));
    let text = String::from_utf8(out.chunks.concat()).unwrap();
    let token = MaskKey::from_bytes([7; 32]).token("email", "ada.lovelace@analytical.org");
    assert_eq!(reassembled(&text, &["delta", "text"]), format!("write to {token} today"));
    for fragment in ["lovelace", "velace", "analytical", "lytical", "ada.lo"] {
        assert!(!text.contains(fragment), "{fragment} in {text}");
    }
}
