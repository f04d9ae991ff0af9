//! Two Rust agents under `retrace record -- remote_agents`: `Session::from_env()` sees
//! `RETRACE_URL` and takes every step through the embedded daemon, and the planner's model call
//! goes through the daemon's proxy (`OPENAI_BASE_URL`), so the SDK steps and the model call are
//! one run with one sequencer. `retrace replay RUN` replays both with no upstream.
//!
//!   retrace record --upstream-openai http://127.0.0.1:8100/v1 -- target/release/examples/remote_agents
use std::io::{Read, Write};
use std::time::Duration;

use retrace_runtime::{Outcome, Session, ToolSpec};
use serde_json::{json, Value};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(agents())
}

async fn agents() -> Result<(), Box<dyn std::error::Error>> {
    let session = Session::from_env()?;
    let planner = session.agent("planner").with_role("planner");
    let reviewer = session.agent("reviewer").with_role("reviewer");
    let rows: Vec<u64> = planner
        .tool_async(
            "sql.query",
            &json!({"q": "select id from users"}),
            ToolSpec::deterministic("1"),
            || async { Ok::<_, String>(vec![1, 2, 3]) },
        )
        .await?;
    let now = planner.now_ms()?;
    let run = session.run_id();
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "plan a backfill"}]});
    let reply = tokio::task::spawn_blocking(move || chat(&run, "planner", &body)).await??;
    let plan = reply["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
    planner.send("reviewer", "plan", &json!({"rows": rows, "plan": plan, "at": now}), None).await?;
    let heard = reviewer.recv(Some(Duration::from_secs(10))).await?.ok_or("no plan arrived")?;
    let sent: Value =
        reviewer.tool("email.send", &json!({"to": "ops"}), ToolSpec::side_effect("1"), || {
            Ok::<_, String>(json!({"queued": true}))
        })?;
    reviewer.decide("approve", Some("step:backfill"))?;
    let report = session.finish(Outcome { exit_status: Some(0) })?;
    println!("reviewer: approve ({} rows heard, email {sent}, run {})", heard.body["rows"], report.run_id);
    Ok(())
}

/// One chat completion through the proxy at `OPENAI_BASE_URL`, as `agent` of `run`: plain
/// HTTP/1.1 so the example needs no client crate.
fn chat(run: &str, agent: &str, body: &Value) -> Result<Value, String> {
    let base = std::env::var("OPENAI_BASE_URL").map_err(|_| "OPENAI_BASE_URL is not set")?;
    let rest = base.strip_prefix("http://").ok_or("OPENAI_BASE_URL must be http://")?;
    let (authority, prefix) =
        rest.split_once('/').map(|(a, p)| (a, format!("/{p}"))).unwrap_or((rest, String::new()));
    let payload = body.to_string();
    let key = std::env::var("OPENAI_API_KEY").unwrap_or_else(|_| "sk-example".into());
    let request = format!(
        "POST {prefix}/chat/completions HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {key}\r\nX-Retrace-Run: {run}\r\nX-Retrace-Agent: {agent}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    );
    let mut stream = std::net::TcpStream::connect(authority).map_err(|e| e.to_string())?;
    stream.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP answer")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("the proxy answered {}: {body}", head.lines().next().unwrap_or_default()));
    }
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        unchunk(body)
    } else {
        body.to_owned()
    };
    serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))
}

fn unchunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}
