//! The price table: what a model's tokens cost, so every model event can carry an estimated
//! `usage.cost_usd` and runs and forks can sum dollars as well as tokens.
//!
//! Prices are US dollars per million input (prompt) and output (completion) tokens, and
//! optionally per million prompt tokens read from the provider's prompt cache (`cache_read`) and
//! written to it (`cache_write`); a price without them prices cached tokens as any input token.
//! [`Usage::input_tokens`] counts cached tokens among the prompt's (see
//! [`crate::provider_usage`]), so a call costs `(input − read − written) × input + read ×
//! cache_read + written × cache_write + output × output`. A name
//! matches a model exactly, or as a prefix: `gpt-4o` also prices the dated snapshot
//! `gpt-4o-2024-08-06` (the name is followed by `-`, `@`, `:` or `/`), and a name ending in `*`
//! prices anything that starts with the rest (`retrace-sim-1*`). The longest matching name wins,
//! so `gpt-4o-mini` is not priced as `gpt-4o`.
//!
//! [`PriceTable::builtin`] holds list prices of a few well-known models and of the demos'
//! simulator; `[prices]` in `retrace.toml` adds to or overrides them ([`PriceTable::parse_toml`]
//! reads that one table, in either of its two TOML spellings):
//!
//! ```toml
//! [prices]
//! "gpt-4o" = { input = 2.5, output = 10.0 }
//! "my-model*" = { input = 0.2, output = 0.8, cache_read = 0.05 }
//!
//! [prices."claude-sonnet-4"]
//! input = 3
//! output = 15
//! cache_read = 0.3
//! cache_write = 3.75
//! ```
//!
//! ```
//! use retrace_core::envelope::Usage;
//! use retrace_core::prices::PriceTable;
//!
//! let mut table = PriceTable::builtin();
//! table.merge(PriceTable::parse_toml("[prices]\n\"in-house-7b\" = { input = 0.1, output = 0.1 }\n")?);
//! let usage = Usage { input_tokens: 1_000_000, output_tokens: 500_000, cost_usd: None, ..Default::default() };
//! assert_eq!(table.cost("gpt-4o-2024-08-06", &usage), Some(2.5 + 5.0));
//! assert_eq!(table.cost("in-house-7b", &usage), Some(0.15));
//! assert_eq!(table.cost("unknown-model", &usage), None);
//! # Ok::<(), retrace_core::prices::PriceError>(())
//! ```
use std::collections::BTreeMap;

use crate::envelope::Usage;

/// What a million tokens of one model cost, in US dollars.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Price {
    /// Per million input (prompt) tokens.
    pub input: f64,
    /// Per million output (completion) tokens.
    pub output: f64,
    /// Per million prompt tokens read from the provider's prompt cache; `None`: as `input`.
    pub cache_read: Option<f64>,
    /// Per million prompt tokens written to the provider's prompt cache; `None`: as `input`.
    pub cache_write: Option<f64>,
}

impl Price {
    /// A price with no cache rates of its own: cached tokens cost as any input token.
    pub fn new(input: f64, output: f64) -> Price {
        Price { input, output, cache_read: None, cache_write: None }
    }
}

/// Prices by model name (exact, prefix, or `prefix*`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PriceTable {
    prices: BTreeMap<String, Price>,
}

/// A `[prices]` table that doesn't parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("retrace.toml line {line}: {why}")]
pub struct PriceError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub why: String,
}

/// List prices (USD per million tokens) the table starts from: input, output, cache read, cache
/// write (OpenAI doesn't charge more for writing its cache; Anthropic's 5-minute writes cost 1.25×
/// the input price, its reads 0.1×).
const BUILTIN: &[(&str, Price)] = &[
    ("gpt-4o", p(2.5, 10.0, Some(1.25), None)),
    ("gpt-4o-mini", p(0.15, 0.6, Some(0.075), None)),
    ("gpt-4.1", p(2.0, 8.0, Some(0.5), None)),
    ("gpt-4.1-mini", p(0.4, 1.6, Some(0.1), None)),
    ("gpt-4.1-nano", p(0.1, 0.4, Some(0.025), None)),
    ("o3", p(2.0, 8.0, Some(0.5), None)),
    ("o3-mini", p(1.1, 4.4, Some(0.55), None)),
    ("o4-mini", p(1.1, 4.4, Some(0.275), None)),
    ("gpt-5", p(1.25, 10.0, Some(0.125), None)),
    ("gpt-5-mini", p(0.25, 2.0, Some(0.025), None)),
    ("gpt-5-nano", p(0.05, 0.4, Some(0.005), None)),
    ("gpt-5-pro", p(15.0, 120.0, None, None)),
    // Embeddings: input tokens only.
    ("text-embedding-3-small", p(0.02, 0.0, None, None)),
    ("text-embedding-3-large", p(0.13, 0.0, None, None)),
    ("text-embedding-ada-002", p(0.1, 0.0, None, None)),
    ("claude-3-5-haiku", p(0.8, 4.0, Some(0.08), Some(1.0))),
    ("claude-3-5-sonnet", p(3.0, 15.0, Some(0.3), Some(3.75))),
    ("claude-sonnet-4", p(3.0, 15.0, Some(0.3), Some(3.75))),
    ("claude-opus-4", p(15.0, 75.0, Some(1.5), Some(18.75))),
    ("claude-opus-4-5", p(5.0, 25.0, Some(0.5), Some(6.25))),
    ("claude-haiku-4-5", p(1.0, 5.0, Some(0.1), Some(1.25))),
    // The demos' model simulator, priced like a cheap hosted model so the demos show dollars.
    ("retrace-sim-1*", p(0.15, 0.6, Some(0.075), None)),
    ("sim-1", p(0.15, 0.6, Some(0.075), None)),
];

/// A price of [`BUILTIN`].
const fn p(input: f64, output: f64, cache_read: Option<f64>, cache_write: Option<f64>) -> Price {
    Price { input, output, cache_read, cache_write }
}

impl PriceTable {
    /// An empty table: nothing is priced.
    pub fn new() -> PriceTable {
        PriceTable::default()
    }

    /// List prices of a few well-known models and of the demos' simulator (`retrace-sim-1*`).
    pub fn builtin() -> PriceTable {
        let mut table = PriceTable::new();
        for &(name, price) in BUILTIN {
            table.insert(name, price);
        }
        table
    }

    /// Prices `name` (exact or prefix, see the module docs); replaces an earlier price.
    pub fn insert(&mut self, name: &str, price: Price) {
        self.prices.insert(name.to_owned(), price);
    }

    /// Adds `other`'s prices, which win over this table's for the same name.
    pub fn merge(&mut self, other: PriceTable) {
        self.prices.extend(other.prices);
    }

    /// The names priced, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.prices.keys().map(String::as_str)
    }

    /// The price of `model`: its exact entry, else the longest name it extends.
    pub fn price(&self, model: &str) -> Option<Price> {
        if let Some(p) = self.prices.get(model) {
            return Some(*p);
        }
        self.prices
            .iter()
            .filter(|(name, _)| extends(model, name))
            .max_by_key(|(name, _)| name.len())
            .map(|(_, p)| *p)
    }

    /// The estimated cost of `usage` on `model`, in US dollars (to a millionth of a cent); `None`
    /// when the model has no price.
    pub fn cost(&self, model: &str, usage: &Usage) -> Option<f64> {
        let p = self.price(model)?;
        // Cached counts beyond the prompt (a hand-written usage) are held to it.
        let read = usage.cache_read_tokens.min(usage.input_tokens);
        let written = usage.cache_write_tokens.min(usage.input_tokens - read);
        let plain = usage.input_tokens - read - written;
        let usd = (plain as f64 * p.input
            + read as f64 * p.cache_read.unwrap_or(p.input)
            + written as f64 * p.cache_write.unwrap_or(p.input)
            + usage.output_tokens as f64 * p.output)
            / 1_000_000.0;
        // To a millionth of a cent, so sums and JSON don't show binary noise.
        Some((usd * 1e8).round() / 1e8)
    }

    /// The prices of `retrace.toml`'s `[prices]` table (every other table is skipped): lines
    /// `"name" = { input = X, output = Y }` under `[prices]`, or `input = X` and `output = Y`
    /// under `[prices."name"]`, each optionally with `cache_read` and `cache_write`. Names are
    /// quoted (`"..."` or `'...'`) or bare (`A-Za-z0-9_-`).
    pub fn parse_toml(text: &str) -> Result<PriceTable, PriceError> {
        let mut table = PriceTable::new();
        // None: outside [prices]; Some(None): in [prices]; Some(Some(name)): in [prices."name"].
        let mut section: Option<Option<String>> = None;
        let mut pending: BTreeMap<String, (Fields, usize)> = BTreeMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line_no = i + 1;
            let err = |why: String| PriceError { line: line_no, why };
            let line = strip_comment(raw).trim();
            if line.is_empty() {
                continue;
            }
            if let Some(header) = line.strip_prefix('[') {
                let header = header.strip_suffix(']').ok_or_else(|| err("unclosed table header".into()))?;
                section = match header.trim().strip_prefix("prices") {
                    Some("") => Some(None),
                    Some(rest) if rest.starts_with('.') => {
                        let (name, tail) = key(rest[1..].trim()).map_err(err)?;
                        if !tail.trim().is_empty() {
                            return Err(err(format!("unexpected {tail:?} after the model name")));
                        }
                        pending.entry(name.clone()).or_insert((Fields::default(), line_no));
                        Some(Some(name))
                    }
                    _ => None,
                };
                continue;
            }
            let Some(current) = &section else { continue };
            let (name, rest) = key(line).map_err(err)?;
            let value =
                rest.trim_start().strip_prefix('=').ok_or_else(|| err("want `name = value`".into()))?;
            match current {
                None => {
                    let price = inline_price(value.trim()).map_err(err)?;
                    table.insert(&name, price);
                }
                Some(model) => {
                    let number = number(value.trim()).map_err(err)?;
                    let (fields, _) = pending.get_mut(model).expect("entered with its header");
                    fields.set(&name, number).map_err(err)?;
                }
            }
        }
        for (model, (fields, line)) in pending {
            let price = fields.price().map_err(|why| PriceError { line, why: format!("{model:?} {why}") })?;
            table.insert(&model, price);
        }
        Ok(table)
    }
}

/// Whether `model` is priced by entry `name` as a prefix.
fn extends(model: &str, name: &str) -> bool {
    match name.strip_suffix('*') {
        Some(prefix) => model.starts_with(prefix),
        None => model
            .strip_prefix(name)
            .and_then(|rest| rest.chars().next())
            .is_some_and(|c| matches!(c, '-' | '@' | ':' | '/')),
    }
}

/// The line without a `#` comment (a `#` inside quotes stays).
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '#') => return &line[..i],
            _ => {}
        }
    }
    line
}

/// A key at the start of `s` (quoted or bare) and what follows it.
fn key(s: &str) -> Result<(String, &str), String> {
    if let Some(q @ ('"' | '\'')) = s.chars().next() {
        let end = s[1..].find(q).ok_or_else(|| format!("unclosed quote in {s:?}"))?;
        return Ok((s[1..1 + end].to_owned(), &s[2 + end..]));
    }
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')).unwrap_or(s.len());
    if end == 0 {
        return Err(format!("want a model name at {s:?}"));
    }
    Ok((s[..end].to_owned(), &s[end..]))
}

/// A price's fields as they are read, in either spelling.
#[derive(Default)]
struct Fields {
    input: Option<f64>,
    output: Option<f64>,
    cache_read: Option<f64>,
    cache_write: Option<f64>,
}

impl Fields {
    fn set(&mut self, name: &str, value: f64) -> Result<(), String> {
        let slot = match name {
            "input" => &mut self.input,
            "output" => &mut self.output,
            "cache_read" => &mut self.cache_read,
            "cache_write" => &mut self.cache_write,
            other => {
                return Err(format!(
                    "unknown price field {other:?}; want input, output, cache_read or cache_write"
                ))
            }
        };
        *slot = Some(value);
        Ok(())
    }

    /// The price, or what is missing.
    fn price(self) -> Result<Price, String> {
        match (self.input, self.output) {
            (Some(input), Some(output)) => {
                Ok(Price { input, output, cache_read: self.cache_read, cache_write: self.cache_write })
            }
            _ => Err("needs both input and output".into()),
        }
    }
}

/// `{ input = X, output = Y }`, optionally with `cache_read` and `cache_write`.
fn inline_price(s: &str) -> Result<Price, String> {
    let body = s
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .ok_or_else(|| format!("want `{{ input = X, output = Y }}`, got {s:?}"))?;
    let mut fields = Fields::default();
    for field in body.split(',').map(str::trim).filter(|f| !f.is_empty()) {
        let (name, value) =
            field.split_once('=').ok_or_else(|| format!("want `name = number` in {field:?}"))?;
        fields.set(name.trim(), number(value.trim())?)?;
    }
    fields.price().map_err(|why| format!("{s:?} {why}"))
}

/// A non-negative, finite TOML number (underscores allowed).
fn number(s: &str) -> Result<f64, String> {
    let n: f64 = s.replace('_', "").parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !n.is_finite() || n < 0.0 {
        return Err(format!("{s:?} is not a price (want a finite number >= 0)"));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input_tokens: u64, output_tokens: u64) -> Usage {
        Usage { input_tokens, output_tokens, cost_usd: None, ..Default::default() }
    }

    #[test]
    fn longest_name_wins_and_prefixes_stop_at_a_boundary() {
        let t = PriceTable::builtin();
        let m = usage(1_000_000, 0);
        assert_eq!(t.cost("gpt-4o", &m), Some(2.5));
        assert_eq!(t.cost("gpt-4o-2024-08-06", &m), Some(2.5));
        assert_eq!(t.cost("gpt-4o-mini-2024-07-18", &m), Some(0.15));
        assert_eq!(t.cost("text-embedding-3-small", &m), Some(0.02), "embeddings are priced by their input");
        assert_eq!(t.cost("claude-opus-4-5-20251101", &m), Some(5.0), "not as claude-opus-4");
        assert_eq!(t.cost("claude-opus-4-1-20250805", &m), Some(15.0));
        assert_eq!(t.cost("gpt-5-pro-2025-10-06", &m), Some(15.0), "not as gpt-5");
        assert_eq!(t.cost("o3-mini-2025-01-31", &m), Some(1.1));
        assert_eq!(t.cost("gpt-4", &m), None, "gpt-4 is not gpt-4o");
        assert_eq!(t.cost("gpt-4.1-2025-04-14", &m), Some(2.0));
        assert_eq!(t.cost("retrace-sim-1-2026-11-01", &usage(1000, 1000)), Some(0.00075));
    }

    #[test]
    fn cached_prompt_tokens_are_priced_at_their_own_rates() {
        let t = PriceTable::builtin();
        let million = 1_000_000;
        // OpenAI: half a million of a million prompt tokens read from the cache, at half price.
        let openai = Usage { cache_read_tokens: million / 2, ..usage(million, 0) };
        assert_eq!(t.cost("gpt-4o-2024-08-06", &openai), Some(0.5 * 2.5 + 0.5 * 1.25));
        // Anthropic: reads at 0.1x, writes at 1.25x of the input price.
        let anthropic =
            Usage { cache_read_tokens: 600_000, cache_write_tokens: 300_000, ..usage(million, million) };
        assert_eq!(t.cost("claude-sonnet-4-20250514", &anthropic), Some(16.605), "0.3 + 0.18 + 1.125 + 15");
        // A price with no cache rates prices cached tokens as any input token.
        let mut plain = PriceTable::new();
        plain.insert("m", Price::new(2.0, 0.0));
        assert_eq!(plain.cost("m", &anthropic), Some(2.0));
        // Cached counts beyond the prompt are held to it, never priced below zero.
        let odd = Usage { cache_read_tokens: 5 * million, cache_write_tokens: million, ..usage(million, 0) };
        assert_eq!(t.cost("claude-sonnet-4", &odd), Some(0.3));
    }

    #[test]
    fn both_toml_spellings_parse_and_override() {
        let text = r#"
[keys]
strip = ["request_id"]   # not ours
[prices]
"gpt-4o" = { input = 1.25, output = 5 }   # a discount
my_model = { output = 2, input = 1_000, cache_read = 0.5 }
[prices.'claude-opus-4']
input = 10
output = 50 # per million
cache_write = 12.5
[prompts]
planner = "v3"
"#;
        let mut t = PriceTable::builtin();
        t.merge(PriceTable::parse_toml(text).unwrap());
        assert_eq!(t.price("gpt-4o"), Some(Price::new(1.25, 5.0)), "no cache rate: cached tokens at 1.25");
        assert_eq!(t.price("my_model"), Some(Price { cache_read: Some(0.5), ..Price::new(1000.0, 2.0) }));
        assert_eq!(
            t.price("claude-opus-4-20250514"),
            Some(Price { cache_write: Some(12.5), ..Price::new(10.0, 50.0) })
        );
        assert_eq!(t.price("planner"), None);
    }

    #[test]
    fn bad_tables_name_the_line() {
        let cases = [
            ("[prices]\n\"a\" = { input = 1 }\n", 2, "needs both input and output"),
            ("[prices]\n\"a\" = 3\n", 2, "want `{ input = X, output = Y }`"),
            ("[prices]\n\n\"a\" = { input = -1, output = 1 }\n", 3, "not a price"),
            ("[prices.\"a\"]\ninput = 1\nspeed = 2\n", 3, "unknown price field"),
            ("[prices.\"a\"]\ninput = 1\n", 1, "needs both input and output"),
            ("[prices.\"a\"]\ninput = 1\noutput = 1\ncache_read = -2\n", 4, "not a price"),
            (
                "[prices]\n\"a\" = { input = 1, output = 1, cache = 2 }\n",
                2,
                "want input, output, cache_read or cache_write",
            ),
            ("[prices\n", 1, "unclosed table header"),
        ];
        for (text, line, why) in cases {
            let e = PriceTable::parse_toml(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.why.contains(why), "{text:?}: {e}");
        }
    }
}
