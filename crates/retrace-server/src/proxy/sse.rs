//! What the proxy reads out of a server-sent event stream as it passes: where its terminal event
//! begins (SPEC §1: `data: [DONE]`; `response.completed`, `response.failed`,
//! `response.incomplete`, `error`; `message_stop`), and the model and token counts it reports.
//! The bytes themselves pass through untouched.
use retrace_core::envelope::Usage;
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
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

impl SseScanner {
    /// Feeds one chunk; returns whether a terminal event has begun by the end of it.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        self.partial.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(nl) = self.partial[start..].iter().position(|&b| b == b'\n') {
            let end = start + nl;
            let line = self.partial[start..end].strip_suffix(b"\r").unwrap_or(&self.partial[start..end]);
            let line = String::from_utf8_lossy(line).into_owned();
            self.line(&line);
            start = end + 1;
        }
        self.partial.drain(..start);
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
        let Ok(json) = serde_json::from_str::<Value>(data) else { return };
        if let Some(kind) = json.get("type").and_then(Value::as_str) {
            if TERMINAL.contains(&kind) {
                self.terminal = true;
            }
        }
        // Chat Completions chunks carry `model` and, last, `usage`; Responses events nest the
        // response; Anthropic's `message_start` nests the message and `message_delta` carries
        // cumulative output tokens.
        let holder = json.get("response").or_else(|| json.get("message")).unwrap_or(&json);
        if self.model.is_none() {
            self.model = holder.get("model").and_then(Value::as_str).map(str::to_owned);
        }
        for usage in [holder.get("usage"), json.get("usage")].into_iter().flatten() {
            if let Some(n) = tokens(usage, &["prompt_tokens", "input_tokens"]) {
                self.input_tokens = Some(n);
            }
            if let Some(n) = tokens(usage, &["completion_tokens", "output_tokens"]) {
                self.output_tokens = Some(n);
            }
        }
    }

    /// Whether a terminal event has begun.
    pub fn terminal(&self) -> bool {
        self.terminal
    }

    /// The token counts the stream reported, if any.
    pub fn usage(&self) -> Option<Usage> {
        usage_of(self.input_tokens, self.output_tokens)
    }
}

/// The model and token counts of a whole (non-streamed) JSON response body.
pub fn body_facts(body: &[u8]) -> (Option<String>, Option<Usage>) {
    let Ok(json) = serde_json::from_slice::<Value>(body) else { return (None, None) };
    let model = json.get("model").and_then(Value::as_str).map(str::to_owned);
    let usage = json.get("usage").and_then(|u| {
        usage_of(
            tokens(u, &["prompt_tokens", "input_tokens"]),
            tokens(u, &["completion_tokens", "output_tokens"]),
        )
    });
    (model, usage)
}

fn tokens(usage: &Value, names: &[&str]) -> Option<u64> {
    names.iter().find_map(|n| usage.get(*n).and_then(Value::as_u64))
}

fn usage_of(input: Option<u64>, output: Option<u64>) -> Option<Usage> {
    (input.is_some() || output.is_some()).then(|| Usage {
        input_tokens: input.unwrap_or(0),
        output_tokens: output.unwrap_or(0),
        cost_usd: None,
    })
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
