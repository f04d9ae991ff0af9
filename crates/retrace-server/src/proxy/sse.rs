//! What the proxy reads out of a server-sent event stream as it passes: where its terminal event
//! begins (SPEC §1: `data: [DONE]`; `response.completed`, `response.failed`,
//! `response.incomplete`, `error`; `message_stop`), and the model and token counts it reports.
//! The bytes themselves pass through untouched.
use std::borrow::Cow;

use retrace_core::envelope::Usage;
use retrace_core::provider_usage::{usage_of, UsageReport};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// Event types that end a stream.
const TERMINAL: &[&str] = &[
    "message_stop",
    "response.completed",
    "response.failed",
    "response.incomplete",
    "response.done",
    "error",
];

/// Scans a stream's lines as its chunks arrive.
#[derive(Debug, Default)]
pub struct SseScanner {
    partial: Vec<u8>,
    terminal: bool,
    /// The `model` the stream reported first.
    pub model: Option<String>,
    usage: UsageReport,
}

impl SseScanner {
    /// Feeds one chunk; returns whether a terminal event has begun by the end of it.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        let mut partial = std::mem::take(&mut self.partial);
        partial.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(nl) = partial[start..].iter().position(|&b| b == b'\n') {
            let end = start + nl;
            let line = partial[start..end].strip_suffix(b"\r").unwrap_or(&partial[start..end]);
            self.line(&String::from_utf8_lossy(line));
            start = end + 1;
        }
        partial.drain(..start);
        self.partial = partial;
        self.terminal
    }

    fn line(&mut self, line: &str) {
        if let Some(name) = line.strip_prefix("event:") {
            if TERMINAL.contains(&name.trim()) {
                self.terminal = true;
            }
            return;
        }
        let Some(data) = line.strip_prefix("data:") else { return };
        let data = data.trim();
        if data.starts_with("[DONE]") {
            self.terminal = true;
            return;
        }
        // One pass over the event, borrowing: only the few fields read below are looked at.
        let patched;
        let event = match Fields::parse(data) {
            Some(event) => event,
            None => match surrogates_replaced(data.as_bytes()) {
                Some(bytes) => {
                    patched = String::from_utf8(bytes).expect("only ASCII escapes were replaced");
                    let Some(event) = Fields::parse(&patched) else { return };
                    event
                }
                None => return,
            },
        };
        if event.kind.and_then(as_str).is_some_and(|kind| TERMINAL.contains(&kind.as_ref())) {
            self.terminal = true;
        }
        // Chat Completions chunks carry `model` and, last, `usage`; Responses events nest the
        // response; Anthropic's `message_start` nests the message and `message_delta` carries
        // cumulative output tokens.
        let nested = event.response.or(event.message).map(Fields::of);
        let holder = nested.as_ref().unwrap_or(&event);
        if self.model.is_none() {
            self.model = holder.model.and_then(as_str).map(Cow::into_owned);
        }
        // A usage object comes once or twice a stream: read whole, prompt-cache counts and all.
        for usage in [holder.usage, event.usage].into_iter().flatten() {
            if let Some(usage) = object::<Value>(usage.get()) {
                self.usage.read(&usage);
            }
        }
    }

    /// Whether a terminal event has begun.
    pub fn terminal(&self) -> bool {
        self.terminal
    }

    /// The token counts the stream reported, if any.
    pub fn usage(&self) -> Option<Usage> {
        self.usage.usage()
    }
}

/// The fields of an event the scanner reads, each kept as its raw JSON. A field that is present
/// is `Some` even when it is `null` (as `Value::get` would find it); an event that is not an
/// object gives no fields.
#[derive(Debug, Default, Deserialize)]
struct Fields<'a> {
    #[serde(borrow, rename = "type", default, deserialize_with = "present")]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    model: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    usage: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    response: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    message: Option<&'a RawValue>,
}

impl<'a> Fields<'a> {
    /// The fields of an event's JSON; `None` when it is not an object.
    fn parse(json: &'a str) -> Option<Fields<'a>> {
        object(json)
    }

    /// The fields of a nested value; none when it is not an object.
    fn of(raw: &'a RawValue) -> Fields<'a> {
        object(raw.get()).unwrap_or_default()
    }
}

/// `json` read as `T` when it is an object (a derived struct would also take an array).
fn object<'a, T: Deserialize<'a>>(json: &'a str) -> Option<T> {
    json.starts_with('{').then(|| serde_json::from_str(json).ok()).flatten()
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// A JSON string's text (escapes decoded); `None` for anything else.
fn as_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    match serde_json::from_str::<&str>(raw.get()) {
        Ok(text) => Some(Cow::Borrowed(text)),
        Err(_) => serde_json::from_str::<String>(raw.get()).ok().map(Cow::Owned),
    }
}

/// The model and token counts of a whole (non-streamed) JSON response body.
pub fn body_facts(body: &[u8]) -> (Option<String>, Option<Usage>) {
    let parsed = serde_json::from_slice::<Value>(body)
        .or_else(|e| surrogates_replaced(body).map_or(Err(e), |b| serde_json::from_slice(&b)));
    let Ok(json) = parsed else { return (None, None) };
    let model = json.get("model").and_then(Value::as_str).map(str::to_owned);
    (model, json.get("usage").and_then(usage_of))
}

/// `json` with every `\uD800`-`\uDFFF` escape spelled `\uFFFD` instead, when it holds one:
/// a model cut off mid-emoji can answer with a lone surrogate, which JSON parsers such as the
/// clients' accept and `serde_json` refuses (QA28 D3). Only the model and usage are read from the
/// result; the bytes stored and served are the upstream's. Always valid JSON where `json` was
/// but for those escapes (an escaped backslash before `u` stays a backslash).
fn surrogates_replaced(json: &[u8]) -> Option<Vec<u8>> {
    let is_surrogate = |at: usize| {
        json.get(at..at + 6).is_some_and(|e| {
            e[0] == b'\\'
                && e[1] == b'u'
                && e[2].eq_ignore_ascii_case(&b'd')
                && matches!(e[3].to_ascii_lowercase(), b'8'..=b'9' | b'a'..=b'f')
                && e[4..].iter().all(u8::is_ascii_hexdigit)
        })
    };
    let first = (0..json.len()).find(|&i| is_surrogate(i))?;
    let mut out = json[..first].to_vec();
    let mut i = first;
    while i < json.len() {
        if is_surrogate(i) {
            out.extend_from_slice(b"\\ufffd");
            i += 6;
        } else {
            out.push(json[i]);
            i += 1;
        }
    }
    Some(out)
}

/// The snapshot a response pins: its `model` when that names more than the alias asked for
/// (`gpt-4o` → `gpt-4o-2024-08-06`) or carries a date; `None` when only an alias is known.
pub fn snapshot_of(asked: &str, reported: Option<&str>) -> Option<String> {
    let reported = reported?.trim();
    if reported.is_empty() {
        return None;
    }
    (reported != asked || has_date(reported)).then(|| reported.to_owned())
}

/// `…-2024-08-06`, `…-20250929`, `…@20240620`.
fn has_date(name: &str) -> bool {
    let digits: Vec<&str> = name.split(['-', '@', '_']).collect();
    digits.windows(3).any(|w| {
        w[0].len() == 4
            && w[1].len() == 2
            && w[2].len() == 2
            && w.iter().all(|p| p.bytes().all(|b| b.is_ascii_digit()))
    }) || digits.iter().any(|p| p.len() == 8 && p.starts_with("20") && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_each_providers_terminal_event() {
        for (chunks, at) in [
            (vec!["data: {\"a\":1}\n\n", "data: [DONE]\n\n"], 1),
            (
                vec![
                    "event: content_block_delta\ndata: {}\n\n",
                    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
                ],
                1,
            ),
            (
                vec![
                    "event: response.output_text.delta\ndata: {}\n\n",
                    "event: response.completed\n",
                    "data: {}\n\n",
                ],
                1,
            ),
            (vec!["data: {\"type\":\"response.failed\"}\n\n"], 0),
        ] {
            let mut s = SseScanner::default();
            let first = chunks.iter().position(|c| s.feed(c.as_bytes()));
            assert_eq!(first, Some(at), "{chunks:?}");
        }
    }

    #[test]
    fn a_line_split_across_chunks_is_seen_whole() {
        let mut s = SseScanner::default();
        assert!(!s.feed(b"data: [DO"));
        assert!(s.feed(b"NE]\n\n"));
    }

    #[test]
    fn reads_model_and_usage_from_streams() {
        let mut s = SseScanner::default();
        s.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x-20250929\",\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n");
        s.feed(
            b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":30}}\n\n",
        );
        assert_eq!(s.model.as_deref(), Some("claude-x-20250929"));
        let u = s.usage().unwrap();
        assert_eq!((u.input_tokens, u.output_tokens), (12, 30));
    }

    #[test]
    fn reads_prompt_cache_counts_from_streams_and_bodies() {
        // Anthropic: the cache counts come with message_start, apart from input_tokens.
        let mut s = SseScanner::default();
        s.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-sonnet-4-20250514\",\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":2048,\"output_tokens\":1}}}\n\n");
        s.feed(
            b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":30}}\n\n",
        );
        let u = s.usage().unwrap();
        assert_eq!(
            (u.input_tokens, u.cache_read_tokens, u.cache_write_tokens, u.output_tokens),
            (2060, 2048, 0, 30)
        );
        // Chat Completions: the last chunk's usage, cached tokens among the prompt's.
        let mut s = SseScanner::default();
        s.feed(b"data: {\"model\":\"gpt-4o-2024-08-06\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n");
        s.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1500,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":1280}}}\n\ndata: [DONE]\n\n");
        let u = s.usage().unwrap();
        assert_eq!((u.input_tokens, u.cache_read_tokens, u.output_tokens), (1500, 1280, 2));
        // Responses: response.completed nests the response and its usage.
        let (_, usage) = body_facts(br#"{"model":"gpt-5","usage":{"input_tokens":900,"input_tokens_details":{"cached_tokens":512},"output_tokens":40}}"#);
        assert_eq!(usage.map(|u| (u.input_tokens, u.cache_read_tokens)), Some((900, 512)));
        let mut s = SseScanner::default();
        s.feed(b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-5\",\"usage\":{\"input_tokens\":900,\"input_tokens_details\":{\"cached_tokens\":512},\"output_tokens\":40}}}\n\n");
        assert_eq!(
            s.usage().map(|u| (u.input_tokens, u.cache_read_tokens, u.output_tokens)),
            Some((900, 512, 40))
        );
    }

    /// What the scanner read from events when it parsed each into a whole `Value`.
    fn read_as_values(events: &[&str]) -> (bool, Option<String>, Option<Usage>) {
        let (mut terminal, mut model, mut usage) = (false, None, UsageReport::default());
        for data in events {
            let Ok(json) = serde_json::from_str::<Value>(data) else { continue };
            if json.get("type").and_then(Value::as_str).is_some_and(|k| TERMINAL.contains(&k)) {
                terminal = true;
            }
            let holder = json.get("response").or_else(|| json.get("message")).unwrap_or(&json);
            if model.is_none() {
                model = holder.get("model").and_then(Value::as_str).map(str::to_owned);
            }
            for u in [holder.get("usage"), json.get("usage")].into_iter().flatten() {
                usage.read(u);
            }
        }
        (terminal, model, usage.usage())
    }

    #[test]
    fn reads_events_as_a_whole_value_would() {
        for events in [
            &["{\"type\":\"resp\\u006fnse.completed\"}"][..],
            &["{\"response\":null,\"model\":\"outer\"}"],
            &["{\"response\":\"text\",\"message\":{\"model\":\"m\"}}"],
            &["{\"message\":{\"model\":\"claude\\n\",\"usage\":{\"input_tokens\":3}}}"],
            &["{\"usage\":{\"prompt_tokens\":1.5,\"input_tokens\":7,\"output_tokens\":-1}}"],
            &["{\"usage\":{\"completion_tokens\":null,\"output_tokens\":9}}", "{\"usage\":[1]}"],
            &["[\"error\",\"m\"]", "{\"response\":[\"x\",\"m\"]}", "[1,2]", "\"model\"", "42", "{\"model\":5}", "{\"model\":\"late\"}"],
            &["{\"type\":null,\"model\":null}", "{\"type\":\"error\",\"usage\":{}}"],
            &["{\"response\":{\"model\":\"r\",\"usage\":{\"input_tokens\":2}},\"usage\":{\"output_tokens\":4}}"],
            &["{not json", "{\"model\":\"after-garbage\"}"],
            &["{\"message\":{\"usage\":{\"input_tokens\":3,\"cache_read_input_tokens\":7}}}", "{\"usage\":{\"output_tokens\":2,\"cache_creation_input_tokens\":\"x\"}}"],
            &["{\"usage\":{\"prompt_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":4}}}", "{\"usage\":{\"prompt_tokens_details\":null}}"],
        ] {
            let mut s = SseScanner::default();
            for e in events {
                s.feed(format!("data: {e}\n\n").as_bytes());
            }
            let got = (s.terminal(), s.model.clone(), s.usage());
            assert_eq!(got, read_as_values(events), "{events:?}");
        }
    }

    /// A lone surrogate in the text (a reply cut off mid-emoji) doesn't hide the usage and the
    /// model, in a whole body or a stream's events (QA28 D3).
    #[test]
    fn a_lone_surrogate_in_the_text_keeps_the_usage() {
        let body = br#"{"model":"gpt-4o-2024-08-06","choices":[{"message":{"content":"half an emoji: \ud83d, \\ud800 and \udE00"}}],"usage":{"prompt_tokens":1000,"completion_tokens":500}}"#;
        let (model, usage) = body_facts(body);
        assert_eq!(model.as_deref(), Some("gpt-4o-2024-08-06"));
        assert_eq!(usage.map(|u| (u.input_tokens, u.output_tokens)), Some((1000, 500)));
        let mut s = SseScanner::default();
        s.feed(br#"data: {"type":"response.completed","response":{"model":"gpt-5","output_text":"\ud83d","usage":{"input_tokens":9,"output_tokens":2}}}"#);
        s.feed(b"\n\n");
        assert!(s.terminal());
        assert_eq!(s.model.as_deref(), Some("gpt-5"));
        assert_eq!(s.usage().map(|u| (u.input_tokens, u.output_tokens)), Some((9, 2)));
        assert_eq!(
            surrogates_replaced(br#"{"a":"\ud83d\ude00"}"#).as_deref(),
            Some(&br#"{"a":"\ufffd\ufffd"}"#[..])
        );
        assert_eq!(surrogates_replaced(br#"{"a":"\u00e9"}"#), None);
    }

    #[test]
    fn snapshots_only_when_pinned() {
        assert_eq!(snapshot_of("gpt-4o", Some("gpt-4o-2024-08-06")).as_deref(), Some("gpt-4o-2024-08-06"));
        assert_eq!(snapshot_of("gpt-4o", Some("gpt-4o")), None);
        assert_eq!(
            snapshot_of("claude-sonnet-4-5-20250929", Some("claude-sonnet-4-5-20250929")).as_deref(),
            Some("claude-sonnet-4-5-20250929")
        );
        assert_eq!(snapshot_of("sim", None), None);
    }
}
