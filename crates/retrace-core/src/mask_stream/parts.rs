//! The delta strings of one stream event, each named by the output part it extends:
//! - OpenAI Chat Completions: `choices[i].delta.content`, `.refusal`, `.reasoning_content`,
//!   `.function_call.arguments` (part: choice and field) and
//!   `choices[i].delta.tool_calls[j].function.arguments` (part: choice and tool index);
//! - OpenAI Responses: any `response.*.delta` event whose `delta` is a string
//!   (`output_text`, `refusal`, `function_call_arguments`, `reasoning_summary_text`, ...;
//!   part: event type, `output_index`, `content_index`, `summary_index`);
//! - Anthropic: `content_block_delta`'s `delta.text`, `.partial_json`, `.thinking` (part:
//!   `index`).
//!
//! Spans are found by deserializing into borrowed [`RawValue`]s, whose text is a slice of the
//! event's data, so each delta's byte range is exact.
use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;

/// An output part: the text its deltas add up to is masked as one string.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct PartKey {
    kind: String,
    at: [Option<u64>; 3],
}

/// One delta string of an event.
#[derive(Debug)]
pub(super) struct Delta {
    /// The part it extends.
    pub part: PartKey,
    /// Its span in the event's data, quotes included.
    pub span: Range<usize>,
    /// Its decoded text.
    pub text: String,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(borrow, default)]
    choices: Option<Vec<Choice<'a>>>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    output_index: Option<u64>,
    #[serde(default)]
    content_index: Option<u64>,
    #[serde(default)]
    summary_index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<ChatDelta<'a>>,
}

#[derive(Deserialize)]
struct ChatDelta<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    refusal: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    function_call: Option<Function<'a>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<ToolCall<'a>>>,
}

#[derive(Deserialize)]
struct ToolCall<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    function: Option<Function<'a>>,
}

#[derive(Deserialize)]
struct Function<'a> {
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct AnthropicDelta<'a> {
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    partial_json: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<&'a RawValue>,
}

/// The delta strings of one event's data, in order; none when the data is not one of the
/// shapes above (its strings are then masked one by one).
pub(super) fn deltas(data: &[u8]) -> Vec<Delta> {
    let mut out = Vec::new();
    if data.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return out;
    }
    let Ok(event) = serde_json::from_slice::<Event<'_>>(data) else { return out };
    let mut push = |kind: &str, at: [Option<u64>; 3], raw: Option<&RawValue>| {
        if let Some(delta) = raw.and_then(|raw| delta_of(data, raw)) {
            let (span, text) = delta;
            out.push(Delta { part: PartKey { kind: kind.to_owned(), at }, span, text });
        }
    };
    for (n, choice) in event.choices.iter().flatten().enumerate() {
        let Some(delta) = &choice.delta else { continue };
        let i = Some(choice.index.unwrap_or(n as u64));
        push("chat.content", [i, None, None], delta.content);
        push("chat.refusal", [i, None, None], delta.refusal);
        push("chat.reasoning_content", [i, None, None], delta.reasoning_content);
        push("chat.function_call", [i, None, None], delta.function_call.as_ref().and_then(|f| f.arguments));
        for (m, call) in delta.tool_calls.iter().flatten().enumerate() {
            let j = Some(call.index.unwrap_or(m as u64));
            push("chat.tool_call", [i, j, None], call.function.as_ref().and_then(|f| f.arguments));
        }
    }
    let Some(kind) = event.kind.as_deref() else { return out };
    if kind == "content_block_delta" {
        let parsed = event.delta.and_then(|d| serde_json::from_str::<AnthropicDelta<'_>>(d.get()).ok());
        if let Some(delta) = parsed {
            let at = [event.index, None, None];
            for raw in [delta.text, delta.partial_json, delta.thinking] {
                push("anthropic", at, raw);
            }
        }
    } else if kind.starts_with("response.") && kind.ends_with(".delta") {
        let at = [event.output_index, event.content_index, event.summary_index];
        push(kind, at, event.delta);
    }
    out
}

/// A string's span in `data` (which `raw` borrows from) and its decoded text.
fn delta_of(data: &[u8], raw: &RawValue) -> Option<(Range<usize>, String)> {
    let text = raw.get();
    if !text.starts_with('"') {
        return None;
    }
    let start = (text.as_ptr() as usize).checked_sub(data.as_ptr() as usize)?;
    let span = start..start + text.len();
    if span.end > data.len() || data[span.clone()] != *text.as_bytes() {
        return None;
    }
    let decoded = serde_json::from_str::<String>(text).ok()?;
    Some((span, decoded))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(data: &str) -> Vec<(String, String)> {
        deltas(data.as_bytes())
            .into_iter()
            .map(|d| {
                assert_eq!(serde_json::from_str::<String>(&data[d.span.clone()]).unwrap(), d.text);
                (d.part.kind, d.text)
            })
            .collect()
    }

    #[test]
    fn each_shape_names_its_deltas() {
        let chat = r#"{"choices":[{"index":0,"delta":{"content":"a\/b","tool_calls":[{"index":2,"function":{"arguments":"{\""}}]}}]}"#;
        assert_eq!(
            texts(chat),
            [("chat.content".into(), "a/b".into()), ("chat.tool_call".into(), "{\"".into())]
        );
        let responses =
            r#"{"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":"hi"}"#;
        assert_eq!(texts(responses), [("response.output_text.delta".into(), "hi".into())]);
        let anthropic = r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"x"}}"#;
        assert_eq!(texts(anthropic), [("anthropic".into(), "{\"x".into())]);
    }

    #[test]
    fn every_listed_field_is_a_part() {
        let chat = r#"{"choices":[{"index":1,"delta":{"refusal":"r","reasoning_content":"t","function_call":{"arguments":"a"}}}]}"#;
        let kinds: Vec<String> = deltas(chat.as_bytes()).into_iter().map(|d| d.part.kind).collect();
        assert_eq!(kinds, ["chat.refusal", "chat.reasoning_content", "chat.function_call"]);
        for (kind, extra) in [
            ("response.refusal.delta", r#""content_index":0"#),
            ("response.function_call_arguments.delta", r#""item_id":"fc_1""#),
            ("response.reasoning_summary_text.delta", r#""summary_index":2"#),
        ] {
            let data = format!(r#"{{"type":"{kind}","output_index":3,{extra},"delta":"x"}}"#);
            assert_eq!(texts(&data), [(kind.to_owned(), "x".to_owned())]);
        }
        let thinking =
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}"#;
        assert_eq!(texts(thinking), [("anthropic".into(), "hm".into())]);
        let a = deltas(
            br#"{"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":"x"}"#,
        );
        let b = deltas(
            br#"{"type":"response.output_text.delta","output_index":0,"content_index":1,"delta":"x"}"#,
        );
        assert_ne!(a[0].part, b[0].part, "content parts are separate parts");
    }

    #[test]
    fn other_shapes_have_none() {
        for data in [
            "[DONE]",
            r#"{"type": "ping"}"#,
            r#"{"type":"response.completed","response":{"output":[]}}"#,
            r#"{"choices":"odd"}"#,
            r#"["response.output_text.delta"]"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"s"}}"#,
        ] {
            assert!(deltas(data.as_bytes()).is_empty(), "{data}");
        }
    }
}
