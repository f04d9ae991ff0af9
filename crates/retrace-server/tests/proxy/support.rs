//! A daemon in-process on a free port, over a SQLite store in a temp dir.
use std::sync::Arc;
use std::time::Duration;

use retrace_demo::providers::Providers;
use retrace_server::{AppState, ServerConfig};
use retrace_store::{open_store, Store, StoreConfig};
use serde_json::Value;
use tokio::sync::oneshot;

pub struct Daemon {
    pub base: String,
    pub store: Arc<dyn Store>,
    stop: Option<oneshot::Sender<()>>,
    pub _home: Option<tempfile::TempDir>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub fn sqlite() -> (Arc<dyn Store>, tempfile::TempDir) {
    let home = tempfile::tempdir().unwrap();
    (open_store(&StoreConfig::in_home(home.path())).unwrap(), home)
}

/// A daemon over a fresh SQLite store whose upstreams are `providers`.
pub async fn daemon(providers: &Providers, tweak: impl FnOnce(&mut ServerConfig)) -> Daemon {
    let (store, home) = sqlite();
    let mut d = daemon_over(store, providers.openai_url(), providers.anthropic_url(), tweak).await;
    d._home = Some(home);
    d
}

pub async fn daemon_over(
    store: Arc<dyn Store>,
    openai: String,
    anthropic: String,
    tweak: impl FnOnce(&mut ServerConfig),
) -> Daemon {
    let mut config = ServerConfig {
        upstream_openai: openai,
        upstream_anthropic: anthropic,
        stall_timeout: Duration::from_secs(5),
        ..ServerConfig::default()
    };
    tweak(&mut config);
    let state = AppState::new(store.clone(), config);
    let bound = retrace_server::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", bound.addr);
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(retrace_server::serve(bound, state.clone(), async move {
        let _ = stopped.await;
    }));
    Daemon { base, store, stop: Some(stop), _home: None }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap()
}

impl Daemon {
    pub async fn api(&self, path: &str, body: Value) -> Value {
        let r = client().post(format!("{}{path}", self.base)).json(&body).send().await.unwrap();
        let status = r.status();
        let v: Value = r.json().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {v}");
        v
    }
    pub async fn new_run(&self) -> String {
        self.api("/api/runs", serde_json::json!({})).await["run_id"].as_str().unwrap().to_owned()
    }
    pub async fn replay_of(&self, run: &str) -> String {
        self.api(&format!("/api/runs/{run}/replay"), serde_json::json!({})).await["run_id"]
            .as_str()
            .unwrap()
            .to_owned()
    }
    pub async fn finish(&self, run: &str) -> Value {
        self.api(&format!("/api/runs/{run}/finish"), serde_json::json!({"exit_status": 0})).await
    }

    /// POSTs `body` to a proxy path (`/proxy/openai/v1/chat/completions`) for `run`.
    pub async fn call(&self, run: &str, path: &str, body: &Value) -> Reply {
        self.call_with(run, path, body.to_string().into_bytes(), &[]).await
    }

    pub async fn call_with(&self, run: &str, path: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> Reply {
        let mut req = client()
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .header("authorization", "Bearer sk-test-never-stored")
            .header("x-retrace-run", run)
            .body(body);
        if path.contains("anthropic") {
            req = req.header("anthropic-version", "2023-06-01").header("x-api-key", "sk-ant-never-stored");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = req.send().await.unwrap();
        Reply::read(r).await
    }
}

/// A reply as the client saw it.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
    /// The body broke off with an error after `body`.
    pub broke_off: bool,
}

impl Reply {
    pub async fn read(mut r: reqwest::Response) -> Reply {
        let (status, headers) = (r.status().as_u16(), r.headers().clone());
        let mut body = Vec::new();
        let mut broke_off = false;
        loop {
            match r.chunk().await {
                Ok(Some(c)) => body.extend_from_slice(&c),
                Ok(None) => break,
                Err(_) => {
                    broke_off = true;
                    break;
                }
            }
        }
        Reply { status, headers, body, broke_off }
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub fn chat(prompt: &str, stream: bool) -> Value {
    serde_json::json!({"model": "gpt-sim", "stream": stream, "messages": [{"role": "user", "content": prompt}]})
}
