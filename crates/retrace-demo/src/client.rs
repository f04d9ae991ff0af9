//! A minimal OpenAI-compatible chat client for the demos (reqwest over HTTP).
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use retrace_core::envelope::Usage;
use retrace_runtime::ModelReply;
use serde_json::Value;

/// Talks to `POST {base_url}/chat/completions`.
#[derive(Debug, Clone)]
pub struct ChatClient {
    base_url: String,
    http: reqwest::Client,
    calls: Arc<AtomicUsize>,
}

impl ChatClient {
    /// A client for an OpenAI-compatible server at `base_url` (e.g. `http://127.0.0.1:8080/v1`).
    pub fn new(base_url: &str) -> ChatClient {
        ChatClient {
            base_url: base_url.trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
            calls: Arc::default(),
        }
    }

    /// HTTP calls this client made (zero in replay).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Sends one chat request and returns the response as a [`ModelReply`].
    pub async fn chat(&self, body: &Value) -> Result<ModelReply, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let url = format!("{}/chat/completions", self.base_url);
        let mut request = self.http.post(&url).json(body);
        if let Ok(key) = std::env::var("OPENAI_API_KEY") {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| format!("calling {url}: {e}"))?;
        let status = response.status();
        let body: Value = response.json().await.map_err(|e| format!("reading {url}: {e}"))?;
        if !status.is_success() {
            return Err(format!("{url} answered {status}: {body}"));
        }
        let usage = body.get("usage").map(|u| Usage {
            input_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
            output_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
            cost_usd: None,
        });
        let snapshot = body["model"].as_str().map(str::to_owned);
        Ok(ModelReply { body, snapshot, usage })
    }
}
