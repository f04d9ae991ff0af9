//! Whether two model calls asked the same got the same answer, though their outputs differ in
//! bytes: a provider stamps every response with fields that differ each time (ids, creation
//! times, a `date` header, a stream's chunk timings), so two recordings of one unchanged answer
//! never have equal output hashes. Read only for pairs with equal keys and unequal outputs.
//!
//! The answer of an output is its status and its body: a recorded HTTP document
//! (`retrace-http/1`) without its headers and timings, the stream as its lines; a plain output
//! (an in-process model call) as it is. JSON anywhere in it (the body, each stream `data:` line)
//! is compared without [`VOLATILE`] members, at any depth but inside a tool call's arguments.
use retrace_core::http_doc::{layout, BodySpan};
use retrace_core::Digest;
use serde_json::Value;

use crate::Store;

/// Members a provider sets anew on every response: ids of the response, its messages and its
/// tool calls, creation times, the serving backend's fingerprint.
const VOLATILE: &[&str] = &["id", "created", "created_at", "system_fingerprint", "request_id"];

/// Whether the outputs `a` and `b` hold the same answer (`false` when either can't be read).
pub(super) fn same_answer(store: &dyn Store, a: &Digest, b: &Digest) -> bool {
    match (store.get_blob(a), store.get_blob(b)) {
        (Ok(a), Ok(b)) => answer(&a) == answer(&b),
        _ => false,
    }
}

/// An output's answer, in a form that compares.
#[derive(Debug, PartialEq)]
enum Answer {
    /// A recorded HTTP response: its status and body.
    Http { status: u16, body: Body },
    /// A plain JSON output.
    Json(Value),
    /// Anything else, as it is.
    Bytes(Vec<u8>),
}

/// A response body.
#[derive(Debug, PartialEq)]
enum Body {
    None,
    Json(Value),
    Text(String),
    Bytes(Vec<u8>),
    /// A stream's lines, each `data:` line's JSON in [`steady`] form.
    Lines(Vec<String>),
}

fn answer(output: &[u8]) -> Answer {
    #[derive(serde::Deserialize)]
    struct Status {
        status: u16,
    }
    if let (Ok(layout), Ok(Status { status })) = (layout(output), serde_json::from_slice::<Status>(output)) {
        let body = match layout.body {
            None => Body::None,
            Some(BodySpan::Json(span)) => {
                serde_json::from_slice(&output[span]).map(|v| Body::Json(steady(v))).unwrap_or(Body::None)
            }
            Some(BodySpan::Text(span)) => {
                let text: String = serde_json::from_slice(&output[span]).unwrap_or_default();
                match serde_json::from_str::<Value>(&text) {
                    Ok(v) => Body::Json(steady(v)),
                    Err(_) => Body::Text(text),
                }
            }
            Some(BodySpan::Base64(span)) => Body::Bytes(output[span].to_vec()),
            Some(BodySpan::Stream(chunks)) => {
                let bytes: Vec<u8> = chunks.into_iter().flat_map(|c| c.bytes).collect();
                Body::Lines(stream_lines(&String::from_utf8_lossy(&bytes)))
            }
        };
        return Answer::Http { status, body };
    }
    match serde_json::from_slice::<Value>(output) {
        Ok(v) => Answer::Json(steady(v)),
        Err(_) => Answer::Bytes(output.to_vec()),
    }
}

/// A stream's non-empty lines, each `data:` line holding JSON written without its volatile
/// members (chunk boundaries and timings don't matter).
fn stream_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .map(|line| match line.strip_prefix("data:").map(|d| serde_json::from_str::<Value>(d.trim())) {
            Some(Ok(v)) => format!("data: {}", steady(v)),
            _ => line.to_owned(),
        })
        .collect()
}

/// `v` without [`VOLATILE`] members, at any depth but inside a tool call's `input` (the
/// arguments the model wrote, where an `id` is data). serde_json's objects keep keys sorted, so
/// equal values compare equal.
fn steady(v: Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(k, _)| !VOLATILE.contains(&k.as_str()))
                .map(|(k, v)| if k == "input" { (k, v) } else { (k, steady(v)) })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(steady).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(headers: &str, body: &str) -> Vec<u8> {
        format!(r#"{{"format":"retrace-http/1","status":200,"headers":[{headers}],{body}}}"#).into_bytes()
    }

    #[test]
    fn headers_ids_and_times_are_not_the_answer() {
        let a = doc(
            r#"["date","Sat, 05 Dec 2026 23:01:00 GMT"]"#,
            r#""body":{"id":"chatcmpl-1","created":1,"choices":[{"message":{"content":"hi","tool_calls":[{"id":"call_a","function":{"name":"f"}}]}}]}"#,
        );
        let b = doc(
            r#"["date","Sat, 05 Dec 2026 23:02:00 GMT"]"#,
            r#""body":{"created":2,"id":"chatcmpl-2","choices":[{"message":{"content":"hi","tool_calls":[{"id":"call_b","function":{"name":"f"}}]}}]}"#,
        );
        assert_eq!(answer(&a), answer(&b));
        let other = doc("", r#""body":{"id":"x","choices":[{"message":{"content":"bye"}}]}"#);
        assert_ne!(answer(&a), answer(&other));
        let failed = String::from_utf8(a.clone()).unwrap().replace("\"status\":200", "\"status\":500");
        assert_ne!(answer(&a), answer(failed.as_bytes()), "the status is part of the answer");
    }

    #[test]
    fn a_stream_is_its_lines_whatever_its_chunks_and_timings() {
        let a = doc(
            "",
            r#""stream":[[0,"data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"h\"}}]}\n\n"],[5,"data: [DONE]\n\n"]],"end":"complete""#,
        );
        let b = doc(
            "",
            r#""stream":[[0,"data: {\"id\":\"c2\",\"choices\":[{\"delta\":"],[9,"{\"content\":\"h\"}}]}\n\ndata: [DONE]\n\n"]],"end":"complete""#,
        );
        assert_eq!(answer(&a), answer(&b));
        let c = String::from_utf8(b.clone()).unwrap().replace(r#"\"h\""#, r#"\"k\""#);
        assert_ne!(answer(&a), answer(c.as_bytes()));
    }

    #[test]
    fn plain_outputs_compare_as_json_without_their_ids() {
        assert_eq!(answer(br#"{"id":"a","text":"x"}"#), answer(br#"{"text":"x","id":"b"}"#));
        assert_ne!(answer(br#"{"text":"x"}"#), answer(br#"{"text":"y"}"#));
        assert_ne!(answer(b"not json"), answer(b"not json either"));
        let tool_use = |id: u32| format!(r#"{{"id":"toolu_{id}","input":{{"id":{id}}}}}"#);
        assert_ne!(
            answer(tool_use(1).as_bytes()),
            answer(tool_use(2).as_bytes()),
            "an argument named id is data"
        );
    }
}
