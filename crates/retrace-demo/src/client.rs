//! A minimal OpenAI-compatible chat client for the demos (reqwest over HTTP). It prices each
//! reply's tokens from a [`PriceTable`], so every model event carries an estimated cost.
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::Context;
use retrace_core::envelope::Usage;
use retrace_core::prices::PriceTable;
use retrace_core::provider_usage::usage_of;
use retrace_runtime::ModelReply;
use serde_json::Value;

/// Talks to `POST {base_url}/chat/completions`.
#[derive(Debug, Clone)]
pub struct ChatClient {
    base_url: String,
    http: reqwest::Client,
    calls: Arc<AtomicUsize>,
    prices: Arc<PriceTable>,
}

impl ChatClient {
    /// A client for an OpenAI-compatible server at `base_url` (e.g. `http://127.0.0.1:8080/v1`),
    /// pricing tokens with the built-in price table.
    pub fn new(base_url: &str) -> ChatClient {
        ChatClient {
            base_url: base_url.trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
            calls: Arc::default(),
            prices: Arc::new(PriceTable::builtin()),
        }
    }

    /// Prices tokens with `prices` instead (see [`prices_from_config`]).
    pub fn with_prices(mut self, prices: PriceTable) -> ChatClient {
        self.prices = Arc::new(prices);
        self
    }

    /// HTTP calls this client made (zero in replay).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Sends one chat request and returns the response as a [`ModelReply`], its usage priced.
    pub async fn chat(&self, request: &Value) -> Result<ModelReply, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let url = format!("{}/chat/completions", self.base_url);
        let mut http = self.http.post(&url).json(request);
        if let Ok(key) = std::env::var("OPENAI_API_KEY") {
            http = http.bearer_auth(key);
        }
        let response = http.send().await.map_err(|e| format!("calling {url}: {e}"))?;
        let status = response.status();
        let body: Value = response.json().await.map_err(|e| format!("reading {url}: {e}"))?;
        if !status.is_success() {
            return Err(format!("{url} answered {status}: {body}"));
        }
        let snapshot = body["model"].as_str().map(str::to_owned);
        let usage = body.get("usage").and_then(usage_of).map(|mut usage| {
            usage.cost_usd = self.cost(snapshot.as_deref(), request, &usage);
            usage
        });
        Ok(ModelReply { body, snapshot, usage })
    }

    /// The price of `usage`: by the snapshot the server reported, else by the model asked for.
    fn cost(&self, snapshot: Option<&str>, request: &Value, usage: &Usage) -> Option<f64> {
        let asked = request.get("model").and_then(Value::as_str);
        snapshot
            .and_then(|m| self.prices.cost(m, usage))
            .or_else(|| asked.and_then(|m| self.prices.cost(m, usage)))
    }
}

/// The built-in price table with `[prices]` of the `retrace.toml` at `path` on top, when that
/// file exists.
pub fn prices_from_config(path: &Path) -> anyhow::Result<PriceTable> {
    let mut table = PriceTable::builtin();
    match std::fs::read_to_string(path) {
        Ok(text) => {
            table.merge(PriceTable::parse_toml(&text).with_context(|| format!("{}", path.display()))?)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    Ok(table)
}
