//! Forwarding a call to its upstream: the request as the client sent it (decoded, with
//! `Accept-Encoding: identity`), and the response as it arrives. Compressed responses are
//! decoded by the HTTP client, so nothing compressed reaches the log.
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName};

use super::reply::Provider;

/// Request headers never forwarded (hop-by-hop, recomputed, or Retrace's own).
const NOT_FORWARDED: &[&str] = &[
    "host",
    "content-length",
    "content-encoding",
    "accept-encoding",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "proxy-connection",
    "proxy-authorization",
    "x-retrace-run",
    "x-retrace-agent",
    "x-retrace-role",
    "x-retrace-token",
    "x-retrace-process",
];

/// The upstreams and the client that reaches them.
#[derive(Clone, Debug)]
pub struct Upstreams {
    client: reqwest::Client,
    openai: String,
    anthropic: String,
    /// How long the upstream may take to answer, and to send each chunk.
    pub timeout: Duration,
}

impl Upstreams {
    /// `openai` as in `OPENAI_BASE_URL` (with `/v1`), `anthropic` as in `ANTHROPIC_BASE_URL`.
    pub fn new(openai: &str, anthropic: &str, timeout: Duration) -> Upstreams {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .expect("the HTTP client builds");
        Upstreams {
            client,
            openai: openai.trim_end_matches('/').to_owned(),
            anthropic: anthropic.trim_end_matches('/').to_owned(),
            timeout,
        }
    }

    /// The upstream URL of `path` (`/v1/...`).
    pub fn url(&self, provider: Provider, path: &str) -> String {
        match provider {
            // OPENAI_BASE_URL includes `/v1`; the provider path starts with it too.
            Provider::OpenAi => {
                let tail = path.strip_prefix("/v1").unwrap_or(path);
                format!("{}{tail}", self.openai)
            }
            Provider::Anthropic => format!("{}{path}", self.anthropic),
        }
    }

    /// Sends the call; resolves when the response head arrives (or the timeout passes).
    pub async fn send(
        &self,
        provider: Provider,
        path: &str,
        headers: &HeaderMap,
        body: Vec<u8>,
    ) -> Result<reqwest::Response, UpstreamError> {
        self.send_as(reqwest::Method::POST, provider, path, headers, body).await
    }

    /// [`Upstreams::send`] with another method; `path` may carry a query (`/v1/models?limit=5`).
    pub async fn send_as(
        &self,
        method: reqwest::Method,
        provider: Provider,
        path: &str,
        headers: &HeaderMap,
        body: Vec<u8>,
    ) -> Result<reqwest::Response, UpstreamError> {
        let url = self.url(provider, path);
        let mut request = self.client.request(method, &url).body(body);
        for (name, value) in headers {
            if !forwarded(name) {
                continue;
            }
            request = request.header(name.as_str(), value.as_bytes());
        }
        request = request.header("accept-encoding", "identity");
        match tokio::time::timeout(self.timeout, request.send()).await {
            Err(_) => Err(UpstreamError::Timeout { url, after: self.timeout }),
            Ok(Err(e)) if e.is_connect() => Err(UpstreamError::Connect { url, message: chain(&e) }),
            Ok(Err(e)) if e.is_timeout() => Err(UpstreamError::Timeout { url, after: self.timeout }),
            Ok(Err(e)) => Err(UpstreamError::Other { url, message: chain(&e) }),
            Ok(Ok(response)) => Ok(response),
        }
    }
}

/// Whether `url` can be an upstream's base URL: `http://` or `https://` with a host. The reason
/// when it can't.
pub fn check_base_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("its scheme is {:?}", parsed.scheme()));
    }
    match parsed.host_str().is_some_and(|h| !h.is_empty()) {
        true => Ok(()),
        false => Err("it names no host".to_owned()),
    }
}

fn forwarded(name: &HeaderName) -> bool {
    !NOT_FORWARDED.iter().any(|n| name.as_str().eq_ignore_ascii_case(n))
}

/// An error and its causes on one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// The upstream could not be reached or did not answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Connection refused, DNS failure...
    #[error("could not connect to the upstream {url}: {message}")]
    Connect {
        /// Where.
        url: String,
        /// Why.
        message: String,
    },
    /// No answer in time.
    #[error("the upstream {url} did not answer within {after:?}")]
    Timeout {
        /// Where.
        url: String,
        /// The limit.
        after: Duration,
    },
    /// Anything else.
    #[error("the upstream {url} failed: {message}")]
    Other {
        /// Where.
        url: String,
        /// Why.
        message: String,
    },
}

impl UpstreamError {
    /// The status the proxy answers with: 504 for a timeout, else 502.
    pub fn status(&self) -> u16 {
        match self {
            UpstreamError::Timeout { .. } => 504,
            _ => 502,
        }
    }
}
