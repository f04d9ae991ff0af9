//! How the providers report a model call's tokens, read into one [`Usage`].
//!
//! The providers count prompt-cache tokens differently:
//! - OpenAI (Chat Completions `usage.prompt_tokens` with `prompt_tokens_details.cached_tokens`,
//!   Responses `usage.input_tokens` with `input_tokens_details.cached_tokens`) counts cached
//!   tokens among the prompt tokens;
//! - Anthropic (`usage.input_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens`)
//!   counts them apart: `input_tokens` is only the prompt after the last cache breakpoint.
//!
//! [`Usage::input_tokens`] is always the whole prompt, so this adds Anthropic's cache counts in;
//! [`Usage::cache_read_tokens`] and [`Usage::cache_write_tokens`] say how many of those tokens the
//! cache served or took, for the price table to price at their own rates.
//!
//! A stream reports usage piecemeal (Anthropic's `message_start` carries the prompt's counts and
//! `message_delta` the cumulative output; a Chat Completions stream sends it in its last chunk):
//! [`UsageReport::read`] takes each `usage` object in turn, a later count replacing an earlier one.
//!
//! ```
//! use retrace_core::provider_usage::UsageReport;
//! use serde_json::json;
//!
//! let mut anthropic = UsageReport::default();
//! anthropic.read(&json!({"input_tokens": 20, "cache_read_input_tokens": 1800,
//!                        "cache_creation_input_tokens": 200, "output_tokens": 1}));
//! anthropic.read(&json!({"output_tokens": 90}));
//! let usage = anthropic.usage().unwrap();
//! assert_eq!((usage.input_tokens, usage.cache_read_tokens, usage.cache_write_tokens), (2020, 1800, 200));
//! assert_eq!(usage.output_tokens, 90);
//!
//! let mut openai = UsageReport::default();
//! openai.read(&json!({"prompt_tokens": 2006, "completion_tokens": 300,
//!                     "prompt_tokens_details": {"cached_tokens": 1920}}));
//! let usage = openai.usage().unwrap();
//! assert_eq!((usage.input_tokens, usage.cache_read_tokens), (2006, 1920));
//! ```
use serde_json::Value;

use crate::envelope::Usage;

/// Token counts gathered from one response body's `usage`, or from each of a stream's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageReport {
    /// `prompt_tokens` or `input_tokens`, as reported.
    input: Option<u64>,
    /// `completion_tokens` or `output_tokens`.
    output: Option<u64>,
    /// OpenAI's `*_tokens_details.cached_tokens`: already among `input`.
    cached: Option<u64>,
    /// Anthropic's `cache_read_input_tokens`: not among `input`.
    cache_read: Option<u64>,
    /// Anthropic's `cache_creation_input_tokens`: not among `input`.
    cache_write: Option<u64>,
}

impl UsageReport {
    /// Reads one `usage` object; a count it holds replaces the one read before. Anything that is
    /// not an object, and a count that is not a whole number of 0 or more, is passed over.
    pub fn read(&mut self, usage: &Value) {
        let count = |names: &[&str]| names.iter().find_map(|n| usage.get(*n).and_then(Value::as_u64));
        let keep = |slot: &mut Option<u64>, found: Option<u64>| {
            if found.is_some() {
                *slot = found;
            }
        };
        keep(&mut self.input, count(&["prompt_tokens", "input_tokens"]));
        keep(&mut self.output, count(&["completion_tokens", "output_tokens"]));
        let cached = ["prompt_tokens_details", "input_tokens_details"]
            .iter()
            .find_map(|d| usage.get(*d).and_then(|d| d.get("cached_tokens")).and_then(Value::as_u64));
        keep(&mut self.cached, cached);
        keep(&mut self.cache_read, count(&["cache_read_input_tokens"]));
        keep(&mut self.cache_write, count(&["cache_creation_input_tokens"]));
    }

    /// The usage read, or `None` when no prompt or completion count was.
    pub fn usage(&self) -> Option<Usage> {
        if self.input.is_none() && self.output.is_none() {
            return None;
        }
        let input = self.input.unwrap_or(0);
        let (read, write) = (self.cache_read.unwrap_or(0), self.cache_write.unwrap_or(0));
        let anthropic = self.cache_read.is_some() || self.cache_write.is_some();
        let (input_tokens, cache_read_tokens) = if anthropic {
            (input.saturating_add(read).saturating_add(write), read)
        } else {
            // Never more cached than the prompt holds, whatever a provider says.
            (input, self.cached.unwrap_or(0).min(input))
        };
        Some(Usage {
            input_tokens,
            output_tokens: self.output.unwrap_or(0),
            cost_usd: None,
            cache_read_tokens,
            cache_write_tokens: write,
        })
    }
}

/// The usage of a whole (not streamed) response body's `usage` object.
pub fn usage_of(usage: &Value) -> Option<Usage> {
    let mut report = UsageReport::default();
    report.read(usage);
    report.usage()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_providers_spelling_reads_as_one_usage() {
        for (usage, want) in [
            // Chat Completions without caching: as before.
            (json!({"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}), (12, 3, 0, 0)),
            // Chat Completions and Responses with cached tokens, already among the prompt's.
            (
                json!({"prompt_tokens": 2006, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0}}),
                (2006, 5, 1920, 0),
            ),
            (
                json!({"input_tokens": 1500, "output_tokens": 7, "input_tokens_details": {"cached_tokens": 1024}}),
                (1500, 7, 1024, 0),
            ),
            // Anthropic: cache reads and writes are counted apart and added in.
            (
                json!({"input_tokens": 4, "output_tokens": 9, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 0}),
                (1004, 9, 1000, 0),
            ),
            (
                json!({"input_tokens": 4, "output_tokens": 9, "cache_creation_input_tokens": 2000}),
                (2004, 9, 0, 2000),
            ),
            // Nulls (Anthropic sends them when caching is off) count as absent.
            (
                json!({"input_tokens": 4, "output_tokens": 9, "cache_read_input_tokens": null, "cache_creation_input_tokens": null}),
                (4, 9, 0, 0),
            ),
            // A provider claiming more cached tokens than the prompt holds is held to the prompt.
            (
                json!({"prompt_tokens": 10, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 99}}),
                (10, 1, 10, 0),
            ),
            // Embeddings: input only.
            (json!({"prompt_tokens": 8, "total_tokens": 8}), (8, 0, 0, 0)),
        ] {
            let u = usage_of(&usage).unwrap();
            assert_eq!(
                (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens),
                want,
                "{usage}"
            );
        }
        for nothing in [json!({}), json!({"total_tokens": 5}), json!("12"), json!({"prompt_tokens": -1})] {
            assert_eq!(usage_of(&nothing), None, "{nothing}");
        }
    }

    #[test]
    fn a_streams_later_counts_replace_earlier_ones() {
        // Anthropic: message_start, then message_delta with the cumulative output (and, in newer
        // API versions, the prompt's counts again).
        let mut r = UsageReport::default();
        r.read(&json!({"input_tokens": 3, "cache_read_input_tokens": 500, "output_tokens": 1}));
        r.read(&json!({"output_tokens": 40}));
        r.read(&json!({"input_tokens": 3, "cache_read_input_tokens": 500, "output_tokens": 41}));
        let u = r.usage().unwrap();
        assert_eq!((u.input_tokens, u.output_tokens, u.cache_read_tokens), (503, 41, 500));
        // A chunk with `usage: null` changes nothing.
        r.read(&Value::Null);
        assert_eq!(r.usage(), Some(u));
    }
}
