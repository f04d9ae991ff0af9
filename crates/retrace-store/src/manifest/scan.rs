//! A small lexical scanner that finds the message array of a model request and the byte ranges
//! of its elements, without parsing (or re-serializing) anything.
//!
//! It knows strings (with escapes), nesting and top-level object members; it doesn't validate
//! JSON. That is enough: a manifest is checked by rebuilding the exact bytes and comparing their
//! digest, so a lenient scan can never store something that doesn't come back byte for byte.
use std::ops::Range;

/// The top-level keys whose array value is a conversation: `messages` (OpenAI chat, Anthropic)
/// and `input` (OpenAI Responses).
const ARRAY_KEYS: [&[u8]; 2] = [b"messages", b"input"];

/// Where a request's message array sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Split {
    /// Index just after the array's `[`: where the elements go back in the skeleton.
    pub(crate) offset: usize,
    /// Index just after the last element (whitespace before `]` stays in the skeleton).
    pub(crate) end: usize,
    /// Each element: the exact bytes between its delimiters (`[` or `,` before, `,` after; the
    /// last one ends at `end`).
    pub(crate) elements: Vec<Range<usize>>,
}

impl Split {
    /// The request without its elements: `bytes[..offset] + bytes[end..]`.
    pub(crate) fn skeleton(&self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.offset + bytes.len() - self.end);
        out.extend_from_slice(&bytes[..self.offset]);
        out.extend_from_slice(&bytes[self.end..]);
        out
    }
}

/// The message array of `bytes` when they are an object with a non-empty array under `messages`
/// or `input` at the top level; `None` otherwise (the request is then stored flat).
pub(crate) fn split_request(b: &[u8]) -> Option<Split> {
    let (_, value) = find_member(b, skip_ws(b, 0), |key, first| first == b'[' && ARRAY_KEYS.contains(&key))?;
    split_array(b, value).filter(|split| !split.elements.is_empty())
}

/// What a model response hands back to the next request, when `bytes` are an object with, at
/// the top level, either `choices` holding exactly one choice object with an object under
/// `message` (OpenAI chat: that message is the one element) or a non-empty array under
/// `output` (OpenAI Responses: its items are the elements). A program that appends the reply
/// to its history sends these exact bytes back when its requests are canonical JSON, so stored
/// as their own blobs they are stored once. `None` otherwise (the response is stored flat).
pub(crate) fn split_response(b: &[u8]) -> Option<Split> {
    let wanted = |key: &[u8], first: u8| first == b'[' && (key == b"choices" || key == b"output");
    let (key, value) = find_member(b, skip_ws(b, 0), wanted)?;
    let split = split_array(b, value)?;
    if key == b"output" {
        return (!split.elements.is_empty()).then_some(split);
    }
    let [choice] = &split.elements[..] else { return None };
    let (_, message) =
        find_member(b, skip_ws(b, choice.start), |key, first| first == b'{' && key == b"message")?;
    let end = skip_value(b, message)?;
    #[allow(clippy::single_range_in_vec_init)] // one element: the message
    let elements = vec![message..end];
    Some(Split { offset: message, end, elements })
}

/// The first member of the object whose `{` is at `open` for which `wanted(key, first byte of
/// its value)` holds: its key and the index where its value starts. `None` when `b[open]` is not
/// `{`, no member matches, or the object doesn't scan.
fn find_member(b: &[u8], open: usize, wanted: impl Fn(&[u8], u8) -> bool) -> Option<(&[u8], usize)> {
    if b.get(open) != Some(&b'{') {
        return None;
    }
    let mut i = open + 1;
    loop {
        i = skip_ws(b, i);
        if b.get(i) != Some(&b'"') {
            return None; // `}` (nothing found) or not an object member
        }
        let key_end = skip_string(b, i)?;
        let key = &b[i + 1..key_end - 1];
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        if wanted(key, *b.get(i)?) {
            return Some((key, i));
        }
        i = skip_ws(b, skip_value(b, i)?);
        match b.get(i)? {
            b',' => i += 1,
            _ => return None,
        }
    }
}

/// Splits the array whose `[` is at `open`.
fn split_array(b: &[u8], open: usize) -> Option<Split> {
    let offset = open + 1;
    let mut elements = Vec::new();
    let mut start = offset;
    loop {
        let value = skip_ws(b, start);
        if b.get(value) == Some(&b']') && elements.is_empty() {
            return Some(Split { offset, end: offset, elements });
        }
        let value_end = skip_value(b, value)?;
        let next = skip_ws(b, value_end);
        match b.get(next)? {
            b',' => {
                elements.push(start..next);
                start = next + 1;
            }
            b']' => {
                elements.push(start..value_end);
                return Some(Split { offset, end: value_end, elements });
            }
            _ => return None,
        }
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// `b[i]` is `"`: the index just after the closing quote.
fn skip_string(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        match b.get(j)? {
            b'"' => return Some(j + 1),
            b'\\' => j += 2,
            _ => j += 1,
        }
    }
}

/// The index just after the value starting at `b[i]` (lexically: strings, brackets, scalars).
fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => skip_string(b, i),
        b'[' | b'{' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match b.get(j)? {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'[' | b'{' => depth += 1,
                    b']' | b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        b',' | b']' | b'}' | b':' => None,
        _ => {
            let mut j = i;
            while !matches!(b.get(j), None | Some(b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')) {
                j += 1;
            }
            Some(j)
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parts(text: &str) -> Option<(String, Vec<&str>)> {
        let split = split_request(text.as_bytes())?;
        let skeleton = String::from_utf8(split.skeleton(text.as_bytes())).unwrap();
        Some((skeleton, split.elements.iter().map(|r| &text[r.clone()]).collect()))
    }

    #[test]
    fn finds_the_elements_of_the_message_array() {
        let (skel, elems) = parts(r#"{"model":"m","messages":[{"a":"x,]}"},{"b":[1,2]}],"n":1}"#).unwrap();
        assert_eq!(skel, r#"{"model":"m","messages":[],"n":1}"#);
        assert_eq!(elems, vec![r#"{"a":"x,]}"}"#, r#"{"b":[1,2]}"#]);
        let (skel, elems) = parts("{ \"input\" : [\n  \"a\\\"]\",\n  2\n ] }").unwrap();
        assert_eq!(skel, "{ \"input\" : [\n ] }");
        assert_eq!(elems, vec!["\n  \"a\\\"]\"", "\n  2"]);
        let (_, elems) = parts(r#"{"input":"text","messages":[1]}"#).unwrap();
        assert_eq!(elems, vec!["1"]);
    }

    #[test]
    fn anything_else_is_flat() {
        for text in [
            r#"{"messages":[]}"#,
            r#"{"messages":[ ]}"#,
            r#"{"model":"m"}"#,
            r#"{"other":[1,2]}"#,
            r#"[{"messages":[1]}]"#,
            "not json",
            r#"{"messages":[1 2]}"#,
            r#"{"messages":[{"a":1}"#,
            r#"{"messages":["unterminated]}"#,
            r#"{"a":1 "messages":[1]}"#,
            "",
        ] {
            assert_eq!(parts(text), None, "{text}");
        }
    }

    fn response_parts(text: &str) -> Option<(String, Vec<&str>)> {
        let split = split_response(text.as_bytes())?;
        let skeleton = String::from_utf8(split.skeleton(text.as_bytes())).unwrap();
        Some((skeleton, split.elements.iter().map(|r| &text[r.clone()]).collect()))
    }

    #[test]
    fn a_response_gives_up_the_message_it_hands_back() {
        let chat =
            r#"{"id":"c","choices":[{"index":0,"message":{"content":"a}","role":"assistant"},"x":1}],"n":2}"#;
        let (skel, elems) = response_parts(chat).unwrap();
        assert_eq!(skel, r#"{"id":"c","choices":[{"index":0,"message":,"x":1}],"n":2}"#);
        assert_eq!(elems, vec![r#"{"content":"a}","role":"assistant"}"#]);
        let responses =
            r#"{"id":"r","output":[{"type":"message"}, {"type":"function_call"}],"status":"completed"}"#;
        let (skel, elems) = response_parts(responses).unwrap();
        assert_eq!(skel, r#"{"id":"r","output":[],"status":"completed"}"#);
        assert_eq!(elems, vec![r#"{"type":"message"}"#, r#" {"type":"function_call"}"#]);
        for flat in [
            r#"{"choices":[{"message":{"a":1}},{"message":{"a":2}}]}"#, // two choices: flat
            r#"{"choices":[]}"#,
            r#"{"choices":[{"index":0}]}"#,
            r#"{"choices":[{"message":"text"}]}"#,
            r#"{"output":[]}"#,
            r#"{"content":[{"type":"text","text":"hi"}],"role":"assistant"}"#, // Anthropic: flat
            r#"{"messages":[1]}"#,
            r#"{"choices":[{"message":{"a":1}"#,
            "not json",
        ] {
            assert_eq!(response_parts(flat), None, "{flat}");
        }
    }

    /// Concatenations of JSON-ish tokens, often opening with a message array.
    fn jsonish() -> impl Strategy<Value = Vec<u8>> {
        let tokens = prop::sample::select(vec![
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            " ",
            "\n",
            "1",
            "\"x\"",
            "\"a\\\"]\"",
            "\\",
            "\"messages\"",
            "\"input\"",
            "\"choices\"",
            "\"message\"",
            "\"output\"",
        ]);
        let head = prop::sample::select(vec![
            "",
            "{\"messages\":[",
            "{\"m\":1, \"input\" : [ ",
            "{\"choices\":[{\"message\":",
            "{\"id\":1,\"choices\": [ {\"index\":0, \"message\" : {",
            "{\"output\":[",
        ]);
        (head, prop::collection::vec(tokens, 0..40))
            .prop_map(|(head, tokens)| (head.to_string() + &tokens.concat()).into_bytes())
    }

    /// What a manifest of `split` rebuilds: the skeleton with the elements joined at `offset`.
    fn rebuilt(bytes: &[u8], split: &Split) -> Vec<u8> {
        let skeleton = split.skeleton(bytes);
        let elements: Vec<&[u8]> = split.elements.iter().map(|r| &bytes[r.clone()]).collect();
        let mut rebuilt = skeleton[..split.offset].to_vec();
        rebuilt.extend_from_slice(&elements.join(&b","[..]));
        rebuilt.extend_from_slice(&skeleton[split.offset..]);
        rebuilt
    }

    proptest! {
        #[test]
        fn every_split_rebuilds_its_input(bytes in jsonish()) {
            for split in [split_request(&bytes), split_response(&bytes)].into_iter().flatten() {
                prop_assert_eq!(rebuilt(&bytes, &split), bytes.clone());
            }
        }

        /// The message a chat completion hands back is the exact bytes a canonical request
        /// carrying it holds: the element the next request stores is the response's.
        #[test]
        fn a_chat_reply_is_the_next_requests_element(content in any::<String>(), pretty in any::<bool>()) {
            let message = serde_json::json!({"role": "assistant", "content": content, "refusal": null});
            let response = serde_json::json!({
                "id": "chatcmpl-1",
                "choices": [{"finish_reason": "stop", "index": 0, "logprobs": null, "message": message}],
                "usage": {"total_tokens": 3},
            });
            let text = if pretty { serde_json::to_string_pretty(&response) } else { serde_json::to_string(&response) };
            let text = text.unwrap();
            let split = split_response(text.as_bytes()).unwrap();
            prop_assert_eq!(split.elements.len(), 1);
            let element: serde_json::Value = serde_json::from_slice(&text.as_bytes()[split.elements[0].clone()]).unwrap();
            prop_assert_eq!(&element, &message);
            let request = serde_json::to_string(&serde_json::json!({"messages": [{"role": "user"}, message]})).unwrap();
            let next = split_request(request.as_bytes()).unwrap();
            if !pretty {
                prop_assert_eq!(&request.as_bytes()[next.elements[1].clone()], &text.as_bytes()[split.elements[0].clone()]);
            }
        }

        #[test]
        fn json_message_arrays_split_into_their_elements(
            messages in prop::collection::vec(any::<String>(), 1..6),
            pretty in any::<bool>(),
        ) {
            let value = serde_json::json!({ "model": "m", "messages": messages, "n": [1, {"messages": 2}] });
            let text = if pretty { serde_json::to_string_pretty(&value) } else { serde_json::to_string(&value) };
            let text = text.unwrap();
            let split = split_request(text.as_bytes()).unwrap();
            prop_assert_eq!(split.elements.len(), messages.len());
            for (range, message) in split.elements.iter().zip(&messages) {
                let element: String = serde_json::from_slice(&text.as_bytes()[range.clone()]).unwrap();
                prop_assert_eq!(&element, message);
            }
        }
    }
}
