//! Killing the daemon (`retrace serve`, SIGKILL) mid-recording loses no call whose response
//! the client received, and what is stored verifies.
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use retrace_demo::providers::Providers;
use retrace_server::proxy::document::{Recorded, RecordedBody};
use retrace_store::{open_store, StoreConfig};

#[test]
fn killing_the_daemon_loses_no_answered_call() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let providers = runtime.block_on(Providers::start("127.0.0.1:0")).unwrap();
    for round in 0..3 {
        let home = tempfile::tempdir().unwrap();
        let mut daemon = Command::new(env!("CARGO_BIN_EXE_retrace"))
            .args(["serve", "--addr", "127.0.0.1:0", "--upstream-openai", &providers.openai_url()])
            .env("RETRACE_HOME", home.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Its URL, alone on standard output once it listens (QA37 S1).
        let mut lines = BufReader::new(daemon.stdout.take().unwrap()).lines();
        let base = lines.next().expect("the daemon says where it serves").unwrap();
        assert!(base.starts_with("http://127.0.0.1:"), "{base}");
        std::thread::spawn(move || lines.for_each(drop));
        let answered: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        runtime.block_on(async {
            let client = reqwest::Client::new();
            let run: serde_json::Value =
                client.post(format!("{base}/api/runs")).send().await.unwrap().json().await.unwrap();
            let run = run["run_id"].as_str().unwrap().to_owned();
            let workers: Vec<_> = (0..8)
                .map(|w| {
                    let (client, base, run, answered) =
                        (client.clone(), base.clone(), run.clone(), answered.clone());
                    tokio::spawn(async move {
                        for i in 0.. {
                            let stream = (w + i) % 2 == 0;
                            let body = serde_json::json!({"model": "gpt-sim", "stream": stream,
                                "messages": [{"role": "user", "content": format!("worker {w} call {i}")}]});
                            let sent = client
                                .post(format!("{base}/proxy/openai/v1/chat/completions"))
                                .header("x-retrace-run", &run)
                                .json(&body)
                                .send()
                                .await;
                            let Ok(response) = sent else { return };
                            if response.status() != 200 {
                                return;
                            }
                            // A stream counts as received only once its terminal event arrived.
                            match response.bytes().await {
                                Ok(b) if !stream || b.windows(6).any(|w| w == b"[DONE]") => {
                                    answered.lock().unwrap().push(b.to_vec())
                                }
                                _ => return,
                            }
                        }
                    })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(400 + 150 * round)).await;
            daemon.kill().unwrap();
            for w in workers {
                let _ = w.await;
            }
        });
        let _ = daemon.wait();
        let answered = answered.lock().unwrap().clone();
        assert!(answered.len() > 5, "round {round}: the daemon answered only {} calls", answered.len());
        let store = open_store(&StoreConfig::in_home(home.path())).unwrap();
        let run = store.runs().unwrap().pop().unwrap();
        let mut stored = Vec::new();
        for e in store.events(&run.id, 1, 100_000).unwrap() {
            let doc = Recorded::decode(&store.get_blob(&e.output_ref.unwrap()).unwrap()).unwrap();
            stored.push(match doc.body {
                RecordedBody::Whole(b) => b.to_vec(),
                RecordedBody::Stream { chunks, .. } => chunks.iter().flat_map(|(_, c)| c.to_vec()).collect(),
            });
        }
        for body in &answered {
            assert!(stored.contains(body), "round {round}: an answered call is missing from the log");
        }
        let verify = Command::new(env!("CARGO_BIN_EXE_retrace"))
            .args(["verify", &run.id])
            .env("RETRACE_HOME", home.path())
            .output()
            .unwrap();
        assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stderr));
        eprintln!("round {round}: {} answered, {} stored", answered.len(), stored.len());
    }
}
