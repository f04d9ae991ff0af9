//! The demo's model simulator served over HTTP as an OpenAI-compatible endpoint
//! (`POST /v1/chat/completions`), so the demo's agents call a model the way real ones do.
//! Latency grows with `max_tokens`, and answers vary from call to call.
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use rand::Rng;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::simulator::Simulator;

struct Shared {
    model: Simulator,
    requests: AtomicUsize,
    ms_per_token: f64,
}

/// A running simulator; stopped when dropped or by [`SimServer::stop`].
pub struct SimServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for SimServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimServer").field("addr", &self.addr).finish()
    }
}

impl SimServer {
    /// Starts the simulator on a free loopback port.
    pub async fn start(seed: u64) -> std::io::Result<SimServer> {
        let shared = Arc::new(Shared {
            model: Simulator::new(seed),
            requests: AtomicUsize::new(0),
            ms_per_token: 0.25,
        });
        let app = Router::new().route("/v1/chat/completions", post(chat)).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(SimServer { addr, shared, shutdown: Some(tx), task: Some(task) })
    }

    /// The base URL to give an OpenAI client: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Requests served so far.
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Stops serving; later connections are refused.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

async fn chat(State(shared): State<Arc<Shared>>, Json(request): Json<Value>) -> Json<Value> {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    let tokens = request["max_tokens"].as_u64().unwrap_or(32) as f64;
    let jitter = rand::thread_rng().gen_range(0.8..1.2);
    let delay = Duration::from_micros((1000.0 + tokens * shared.ms_per_token * 1000.0 * jitter) as u64);
    tokio::time::sleep(delay).await;
    Json(shared.model.chat(&request).body)
}
