//! The migration trio: a planner, a schema agent and a reviewer on the bus.
//!
//! The planner asks the schema agent to rename `users.name` to `users.full_name`, then writes a
//! backfill that still reads `users.name` and tells the reviewer it is ready. The reviewer
//! approves the backfill if "backfill ready" arrives before "column renamed", and rejects it
//! (the column it reads is gone) otherwise: a real ordering bug that shows only when the
//! backfill notice wins the race.
use std::sync::Arc;
use std::time::Duration;

use retrace_runtime::{Agent, ModelCall, RuntimeError, RuntimeResult, Session, ToolSpec};
use serde_json::{json, Value};

use crate::client::ChatClient;

/// The step the reviewer decides on.
pub const TARGET: &str = "step:backfill_users";

async fn chat(agent: &Agent, client: &ChatClient, prompt: String, max_tokens: u64) -> RuntimeResult<String> {
    let body = json!({
        "model": "sim-1",
        "temperature": 0,
        "max_tokens": max_tokens,
        "messages": [
            {"role": "system", "content": format!("You are the {} of a database migration team.", agent.id())},
            {"role": "user", "content": prompt}
        ]
    });
    let call =
        ModelCall { provider: "openai".into(), endpoint: "chat.completions".into(), body: body.clone() };
    let reply = agent.model_async(&call, |body| async move { client.chat(&body).await }).await?;
    Ok(reply["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned())
}

fn missing(agent: &Agent, what: &str) -> RuntimeError {
    RuntimeError::Usage(format!("{} expected {what} but its recv timed out", agent.id()))
}

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

/// Runs the trio on `session`; returns the reviewer's decision (`approve` or `reject`).
pub async fn trio(session: &Session, client: Arc<ChatClient>) -> RuntimeResult<String> {
    let c = client.clone();
    let planner = session.spawn("planner", move |a| async move {
        let a = a.with_role("planner");
        chat(&a, &c, "Plan: rename users.name to users.full_name, then backfill display names.".into(), 40).await?;
        let rename = json!({"table": "users", "from": "name", "to": "full_name"});
        a.send("schema", "rename_column", &rename, None).await?;
        chat(&a, &c, "Write the backfill: UPDATE users SET display = name.".into(), 120).await?;
        let backfill = json!({"step": "backfill_users", "reads": "users.name", "sql": "UPDATE users SET display = name"});
        a.send("reviewer", "backfill_ready", &backfill, None).await?;
        Ok(())
    });
    let c = client.clone();
    let schema = session.spawn("schema", move |a| async move {
        let a = a.with_role("schema");
        let task = a.recv(WAIT).await?.ok_or_else(|| missing(&a, "a rename task"))?;
        let (from, to) = (task.body["from"].as_str().unwrap_or("?"), task.body["to"].as_str().unwrap_or("?"));
        chat(&a, &c, format!("Apply: ALTER TABLE users RENAME COLUMN {from} TO {to}."), 20).await?;
        let applied: Value = a.tool("db.migrate", &task.body, ToolSpec::side_effect("1"), || {
            Ok::<_, String>(
                json!({"applied": true, "statement": "ALTER TABLE users RENAME COLUMN name TO full_name"}),
            )
        })?;
        a.send(
            "reviewer",
            "column_renamed",
            &json!({"table": "users", "from": from, "to": to, "migration": applied}),
            None,
        )
        .await?;
        Ok(())
    });
    let c = client;
    let reviewer = session.spawn("reviewer", move |a| async move {
        let a = a.with_role("reviewer");
        let first = a.recv(WAIT).await?.ok_or_else(|| missing(&a, "a message"))?;
        let decision = if first.kind.as_deref() == Some("backfill_ready") {
            chat(&a, &c, format!("Review this backfill: {}", first.body["sql"]), 30).await?;
            a.decide("approve", Some(TARGET))?;
            a.recv(WAIT).await?.ok_or_else(|| missing(&a, "the rename notice"))?;
            "approve"
        } else {
            let backfill = a.recv(WAIT).await?.ok_or_else(|| missing(&a, "the backfill"))?;
            chat(&a, &c, format!("users.name was renamed; review: {}", backfill.body["sql"]), 30).await?;
            a.decide("reject", Some(TARGET))?;
            "reject"
        };
        Ok(decision.to_owned())
    });
    let joined = |r: Result<RuntimeResult<()>, tokio::task::JoinError>| match r {
        Ok(r) => r,
        Err(e) => Err(RuntimeError::Usage(format!("an agent task failed: {e}"))),
    };
    let (p, s, r) = tokio::join!(planner, schema, reviewer);
    joined(p)?;
    joined(s)?;
    match r {
        Ok(r) => r,
        Err(e) => Err(RuntimeError::Usage(format!("the reviewer task failed: {e}"))),
    }
}
