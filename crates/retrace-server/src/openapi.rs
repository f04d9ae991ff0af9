//! The API's OpenAPI document, served at `/api/openapi.json`. A test checks that it names
//! exactly the `/api` routes the router serves, so the two can't drift; schemathesis runs
//! against it in the test suite.
use serde_json::{json, Value};

fn error() -> Value {
    json!({"description": "an error: {error: {code, message}}", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
}

fn ok(description: &str, schema: Value) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema}}})
}

/// A request body; objects with listed properties take no others (the API refuses unknown
/// fields).
fn body(mut schema: Value, required: bool) -> Value {
    if schema.get("properties").is_some() {
        schema["additionalProperties"] = json!(false);
    }
    json!({"required": required, "content": {"application/json": {"schema": schema}}})
}

fn path_param(name: &str, what: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "description": what, "schema": {"type": "string"}})
}

fn op(summary: &str, params: &[&str], request: Option<Value>, success: Value) -> Value {
    let parameters: Vec<Value> = params
        .iter()
        .map(|p| match *p {
            "run" => path_param("run", "a run id (or unique prefix, where reading, retaining or deleting)"),
            "digest" => path_param("digest", "a blob digest: sha256: and 64 lowercase hex digits"),
            other => path_param(other, "an agent id"),
        })
        .collect();
    let mut o = json!({
        "summary": summary,
        "parameters": parameters,
        "responses": {
            "200": success, "400": error(), "401": error(), "403": error(), "404": error(),
            "409": error(), "413": error(), "500": error(), "503": error(),
        },
    });
    if let Some(r) = request {
        o["requestBody"] = r;
    }
    o
}

/// A `GET` with query parameters `(name, description, minimum, maximum)`.
fn get_with_query(summary: &str, params: &[&str], query: &[(&str, &str, u64, u64)], success: Value) -> Value {
    let mut o = op(summary, params, None, success);
    let list = o["parameters"].as_array_mut().expect("parameters");
    for (name, what, min, max) in query {
        list.push(json!({"name": name, "in": "query", "required": false, "description": what,
                         "schema": {"type": "integer", "minimum": min, "maximum": max}}));
    }
    o
}

/// Adds an optional string query parameter to `o`.
fn with_string_query(mut o: Value, name: &str, what: &str) -> Value {
    let list = o["parameters"].as_array_mut().expect("parameters");
    list.push(json!({"name": name, "in": "query", "required": false, "description": what, "schema": {"type": "string"}}));
    o
}

fn raw(description: &str, content_type: &str) -> Value {
    json!({"description": description, "content": {content_type: {"schema": {"type": "string", "format": "binary"}}}})
}

/// The document.
pub fn document() -> Value {
    let obj = |props: Value| json!({"type": "object", "properties": props});
    let any = json!({});
    let run = json!({"$ref": "#/components/schemas/Run"});
    let step_answer = json!({"$ref": "#/components/schemas/StepAnswer"});
    let agent = ["run", "agent"];
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Retrace daemon API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Runs, record and replay sessions, and the SDK's steps. The LLM proxy (SPEC §5) lives under /proxy/ and speaks the providers' own APIs. A daemon started with tokens wants `Authorization: Bearer TOKEN` on every route but /api/health and /api/openapi.json: reading needs the viewer role, recording, replaying and the SDK's steps the debugger role, revealing masked values, the audit log, retention and garbage collection the admin role (401 without a known token, 403 below the role).",
        },
        "security": [{"bearer": []}],
        "paths": {
            "/api/health": {"get": {"summary": "liveness", "security": [], "responses": {"200": ok("the daemon is up", obj(json!({"ok": {"type": "boolean"}, "version": {"type": "string"}, "store": {"type": "string"}})))}}},
            "/api/openapi.json": {"get": {"summary": "this document", "security": [], "responses": {"200": ok("OpenAPI 3", any.clone())}}},
            "/api/runs": {
                "get": {"summary": "list runs", "responses": {"200": ok("runs, oldest first (by start time)", json!({"type": "array", "items": run})), "401": error(), "403": error(), "500": error()}},
                "post": op("a new run to record into", &[], Some(body(obj(json!({"name": {"type": "string", "nullable": true, "maxLength": 256, "pattern": "\\S"}, "labels": {"type": "object", "maxProperties": 64, "additionalProperties": {"type": "string", "maxLength": 1024}}})), false)), ok("the new run", obj(json!({"run_id": {"type": "string"}, "mode": {"type": "string"}})))),
            },
            "/api/runs/{run}": {"get": op("one run", &["run"], None, ok("the run", run.clone()))},
            "/api/runs/{run}/events": {"get": get_with_query(
                "the run's events in seq order (a fork's inherited ones included), one page at a time",
                &["run"],
                &[("from", "first seq (default 1)", 1, u64::MAX >> 11), ("limit", "events per page (default 100)", 1, crate::reads::MAX_PAGE)],
                ok("a page of events", obj(json!({"run_id": {"type": "string"}, "count": {"type": "integer"}, "events": {"type": "array", "items": {"type": "object"}}, "next": {"type": "integer", "nullable": true}}))),
            )},
            "/api/runs/{run}/export": {"get": op("the run as a retrace-trace/1 file (what `retrace export` writes)", &["run"], None, raw("the trace file, JSON Lines", "application/x-ndjson"))},
            "/api/blobs/{digest}": {"get": op("a blob's bytes, by digest", &["digest"], None, raw("the bytes", "application/octet-stream"))},
            "/api/runs/{run}/replay": {"post": op("a new replay run of `run`; calls naming it are answered from `run`'s log", &["run"], None, ok("the replay run", obj(json!({"run_id": {"type": "string"}, "mode": {"type": "string"}, "source_run": {"type": "string"}}))))},
            "/api/runs/{run}/finish": {"post": op("end the run's session; a replay checks leftovers, decisions and exit status; with interrupted, the run is stored interrupted, unjudged (a session dropped unfinished)", &["run"], Some(body(obj(json!({"exit_status": {"type": "integer", "format": "int32", "minimum": i32::MIN, "maximum": i32::MAX}, "interrupted": {"type": "boolean"}})), false)), ok("the finished run", run.clone()))},
            "/api/runs/{run}/agents/{agent}/steps": {"post": op(
                "one step of an agent: in record the completed step, in replay the request (answered from the log); `status: run` asks the program to run it and post `{step, output|error}`",
                &agent,
                Some(body(json!({"$ref": "#/components/schemas/Step"}), true)),
                ok("the step's answer", step_answer),
            )},
            "/api/runs/{run}/agents/{agent}/send": {"post": op("send a message", &agent, Some(body(json!({"type": "object", "required": ["to", "body"], "properties": {"to": {"type": "string", "minLength": 1, "maxLength": 256, "description": "an agent id: 1 to 256 characters, not blank, no control character"}, "kind": {"type": "string"}, "body": {}, "parent": {"type": "integer", "minimum": 1, "nullable": true, "description": "the seq of an earlier event of the run that caused this message; null: the agent's latest delivery"}}}), true)), ok("the send's seq", obj(json!({"seq": {"type": "integer"}}))))},
            "/api/runs/{run}/agents/{agent}/recv": {"post": op("take the agent's next message (replay: the recorded one, in recorded order)", &agent, Some(body(obj(json!({"timeout_s": {"type": "number", "minimum": 0, "nullable": true, "description": "seconds; null or absent waits as long as it takes"}})), false)), ok("the message, or null on a timeout", obj(json!({"message": {"nullable": true, "type": "object", "properties": {"seq": {"type": "integer"}, "sender": {"type": "string"}, "kind": {"type": "string", "nullable": true}, "body": {}, "parent": {"type": "integer", "nullable": true}}}}))))},
            "/api/runs/{run}/agents/{agent}/template": {"post": op("the text of the agent's prompt template (SPEC §6 template())", &agent, Some(body(json!({"type": "object", "required": ["template"], "additionalProperties": false, "properties": {"template": {"type": "string", "description": "name@version"}, "vars": {"type": "object"}, "prompts_dir": {"type": "string", "description": "the program's prompts folder; honoured only by a daemon without tokens"}}}), true)), ok("the filled template", obj(json!({"status": {"type": "string"}, "text": {"type": "string"}}))))},
            "/api/runs/{run}/agents/{agent}/decide": {"post": op("record a decision", &agent, Some(body(json!({"type": "object", "required": ["action"], "properties": {"action": {"type": "string", "minLength": 1}, "target": {"type": "string", "nullable": true}}}), true)), ok("done", obj(json!({"status": {"type": "string"}}))))},
            "/api/runs/{run}/agents/{agent}/exit": {"post": op("the agent takes no more steps", &agent, None, ok("done", obj(json!({"status": {"type": "string"}}))))},
            "/api/runs/{run}/agents/{agent}/claim": {"post": op("tie the agent to the calling process (X-Retrace-Process) before its first step; 409 agent_owned when another live process has it", &agent, None, ok("done", obj(json!({"status": {"type": "string"}}))))},
            "/api/runs/{run}/agents/{agent}/role": {"post": op("the role recorded on the agent's events from now on, its model calls through the proxy included (1 to 128 characters, no control characters); doesn't start the agent", &agent, Some(body(json!({"type": "object", "required": ["role"], "additionalProperties": false, "properties": {"role": {"type": "string", "minLength": 1, "maxLength": 128}}}), true)), ok("done", obj(json!({"status": {"type": "string"}}))))},
            "/api/runs/{run}/retain": {"post": op(
                "set the run's retention tier (admin; `retrace retain`); a replay run has none (400)",
                &["run"],
                Some(body(json!({"type": "object", "required": ["tier"], "properties": {"tier": {"type": "string", "enum": ["routine", "incident", "pinned"]}}}), true)),
                ok("the run's tier now and before (a run still recording keeps it when it ends)", obj(json!({"run": {"type": "string"}, "retention": {"type": "string"}, "previous": {"type": "string"}}))),
            )},
            "/api/gc": {"post": op(
                "delete expired runs, then unreferenced blobs (admin; `retrace gc`); `dry_run` reports and deletes nothing",
                &[],
                Some(body(json!({"type": "object", "required": ["dry_run"], "properties": {"dry_run": {"type": "boolean"}, "older_than_days": {"type": "integer", "nullable": true, "minimum": 0, "maximum": u32::MAX, "description": "routine runs expire after this many days (default: the daemon's [retention] routine_days)"}, "compact": {"type": "boolean", "description": "then shrink the database file (VACUUM; `retrace gc --compact`): 409 run_in_use, before anything is deleted, while any run is running"}}}), true)),
                ok("what was (or would be) deleted; with compact, compacted: {bytes_before, bytes_after} (null in a dry run)", json!({"$ref": "#/components/schemas/GcReport"})),
            )},
            "/api/runs/{run}/delete": {"post": op(
                "delete the run now, whatever its tier, with its replays, then unreferenced blobs (admin; `retrace delete`); 409 `run_in_use` while it runs or a remaining fork or running replay needs it",
                &["run"],
                Some(body(json!({"type": "object", "required": ["dry_run"], "properties": {"dry_run": {"type": "boolean"}}}), true)),
                ok("what was (or would be) deleted", json!({"$ref": "#/components/schemas/GcReport"})),
            )},
            "/api/vault/reveal": {"post": op(
                "the original of a masked value under the daemon's vault key (admin; `retrace vault reveal`); every attempt, refused or not, is in the audit log before the answer, a token below admin's included (403 forbidden after it is logged)",
                &[],
                Some(body(json!({"type": "object", "required": ["token"], "properties": {"token": {"type": "string", "description": "rtk_<kind>_<26 characters>"}, "reason": {"type": "string", "description": "why (required: a reveal without one is refused, and audited)"}}}), true)),
                ok("the original: text when it is UTF-8, else base64 with encoding: base64", obj(json!({"token": {"type": "string"}, "original": {"type": "string"}, "encoding": {"type": "string", "enum": ["base64"]}}))),
            )},
            "/api/vault/audit": {"get": with_string_query(
                with_string_query(
                    op("the audit log, oldest first (admin; `retrace vault audit --json`)", &[], None, ok("the entries", json!({"type": "array", "items": {"$ref": "#/components/schemas/AuditRecord"}}))),
                    "token",
                    "only the entries about this token",
                ),
                "run",
                "only the entries about this replay run (not with token)",
            )},
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}, "schemas": {
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object", "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "divergence": {"type": "object"}}}}},
            "Run": {"type": "object", "required": ["run_id", "mode", "status"], "properties": {
                "run_id": {"type": "string"}, "id": {"type": "string", "description": "the same as run_id, as `retrace runs --json` names it"}, "name": {"type": "string", "nullable": true}, "mode": {"type": "string"},
                "retention": {"type": "string", "enum": ["routine", "incident", "pinned"]}, "command": {"type": "object", "nullable": true},
                "fork_at": {"type": "integer", "nullable": true}, "edits": {"type": "array", "items": {"type": "string"}},
                "chaos_seed": {"type": "integer", "nullable": true}, "decisions": {"type": "array", "items": {"type": "object"}},
                "status": {"type": "string"}, "source_run": {"type": "string", "nullable": true},
                "labels": {"type": "object"}, "exit_status": {"type": "integer", "nullable": true},
                "divergence": {"type": "object", "nullable": true}, "started_at_ms": {"type": "integer"},
                "finished_at_ms": {"type": "integer", "nullable": true}, "error": {"type": "string"}}},
            "Step": {"type": "object", "additionalProperties": false, "properties": {
                "type": {"type": "string", "enum": ["tool_call", "clock", "random", "env", "model_call"]},
                "model": {"type": "object", "additionalProperties": false, "description": "model_call: provider and endpoint with the request; snapshot and usage with the outcome", "properties": {"provider": {"type": "string"}, "endpoint": {"type": "string"}, "snapshot": {"type": "string", "nullable": true}, "usage": {"type": "object", "nullable": true, "required": ["input_tokens", "output_tokens"], "properties": {"input_tokens": {"type": "integer", "minimum": 0, "description": "prompt tokens, cached ones included"}, "output_tokens": {"type": "integer", "minimum": 0}, "cost_usd": {"type": "number", "nullable": true}, "cache_read_tokens": {"type": "integer", "minimum": 0, "description": "of input_tokens, those the provider's prompt cache served"}, "cache_write_tokens": {"type": "integer", "minimum": 0, "description": "of input_tokens, those written to the provider's prompt cache"}}}}},
                "name": {"type": "string"}, "request": {},
                "tool": {"type": "object", "required": ["class"], "additionalProperties": false, "properties": {"version": {"type": "string"}, "class": {"type": "string", "enum": ["deterministic", "time_bound", "side_effect"]}, "ttl_s": {"type": "integer", "minimum": 0, "nullable": true}, "dry_run": {"type": "boolean", "description": "side_effect: the program can dry-run it; a fork asks for the dry run and records it"}}},
                "output": {}, "error": {"type": "string"}, "step": {"type": "string"},
                "latency_ms": {"type": "integer", "minimum": 0, "nullable": true, "description": "how long the program's function ran, when it ran before the step was posted"}}},
            "GcReport": {"type": "object", "required": ["dry_run", "runs_deleted", "events_deleted", "blobs_deleted", "bytes_freed"], "properties": {
                "dry_run": {"type": "boolean"}, "runs_deleted": {"type": "array", "items": {"type": "string"}},
                "events_deleted": {"type": "integer"}, "blobs_deleted": {"type": "integer"}, "bytes_freed": {"type": "integer"},
                "cache_entries_dropped": {"type": "integer"}, "routine_days": {"type": "integer"},
                "vault_originals_deleted": {"type": "integer", "description": "secrets' originals deleted from the vault with the last run holding their token"},
                "compacted": {"type": "object", "nullable": true, "properties": {"bytes_before": {"type": "integer"}, "bytes_after": {"type": "integer"}}}}},
            "AuditRecord": {"type": "object", "required": ["id", "at_ms", "who", "role", "action", "subject", "reason", "outcome"], "properties": {
                "id": {"type": "integer"}, "at_ms": {"type": "integer"}, "who": {"type": "string"}, "role": {"type": "string"},
                "action": {"type": "string", "enum": ["reveal", "reveal_refused", "replay_original", "replay_original_refused"]},
                "subject": {"type": "string", "description": "the token, or the replay run"}, "reason": {"type": "string"},
                "outcome": {"type": "string", "description": "ok, or why it was refused"}}},
            "StepAnswer": {"type": "object", "required": ["status"], "properties": {
                "status": {"type": "string", "enum": ["done", "error", "run", "dry_run", "refused", "approval_required"]},
                "output": {}, "error": {"type": "string"}, "step": {"type": "string"}, "tool": {"type": "string"}, "args": {},
                "dry_run": {"type": "boolean", "description": "run: run the program's dry run of this side effect, not the side effect"},
                "request": {"description": "run: the request the program must send (a model call a fork's edits rewrote)"},
                "approval": {"type": "string", "description": "approval_required: the id `retrace approve` takes"}}},
        }},
    })
}

#[cfg(test)]
mod tests {
    /// Every `/api` route the router serves is documented, and nothing else is.
    #[test]
    fn the_document_names_exactly_the_routes_served() {
        let source = include_str!("lib.rs");
        let mut served: Vec<String> = source
            .split(".route(\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .filter(|p| p.starts_with("/api/"))
            .map(|p| p.replace("{*", "{"))
            .collect();
        served.sort();
        let doc = super::document();
        let mut documented: Vec<String> = doc["paths"].as_object().unwrap().keys().cloned().collect();
        documented.sort();
        assert_eq!(served, documented);
    }
}
