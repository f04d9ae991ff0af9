//! Prompt templates (SPEC §6 `template()`): an agent's prompt is the text of a named, versioned
//! template (`prompts/<name>/<version>.txt`), recorded with its digest on the agent's model
//! calls. A fork's `prompt:AGENT=VERSION` edit hands the agent another version from the fork
//! point on.
use std::path::PathBuf;

use retrace_core::envelope::PromptRef;
use retrace_core::Digest;
use serde_json::{json, Value};

use crate::agent::Agent;
use crate::error::{RuntimeError, RuntimeResult};

/// Where template files live: `RETRACE_PROMPTS`, else `./prompts`.
pub fn default_prompts_dir() -> PathBuf {
    std::env::var_os("RETRACE_PROMPTS").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("prompts"))
}

impl Agent {
    /// Sets the agent's prompt template, `name@version` (e.g. `planner@v3`).
    pub fn with_prompt_template(self, id: &str) -> Agent {
        self.state.lock().template = Some(id.to_owned());
        self
    }

    /// The text of the agent's prompt template with `{name}` placeholders filled from `vars`
    /// (a JSON object; strings are inserted as they are, other values as JSON). Its digest is
    /// recorded on the agent's following model calls.
    pub fn template(&self, vars: &Value) -> RuntimeResult<String> {
        self.template_in(vars, &self.session.inner.prompts_dir.clone())
    }

    /// [`Agent::template`] with the template files under `prompts_dir` (the daemon reads a
    /// remote program's own folder this way).
    pub fn template_in(&self, vars: &Value, prompts_dir: &std::path::Path) -> RuntimeResult<String> {
        let id = self.state.lock().template.clone().ok_or_else(|| {
            RuntimeError::Usage(format!(
                "agent {:?} has no prompt template; set one with with_prompt_template",
                self.id
            ))
        })?;
        if let Some(remote) = self.remote() {
            // The daemon reads the file and stamps the agent's following model calls; a daemon
            // without tokens (loopback, the same user: the one `record`, `replay`, `fork` and
            // `gate` embed) reads it in the program's own prompts folder.
            let dir = std::path::absolute(prompts_dir).unwrap_or_else(|_| prompts_dir.to_owned());
            let body = json!({ "template": id, "vars": vars, "prompts_dir": dir });
            let answer = remote.post_blocking(&self.id, "template", &body)?;
            return answer.get("text").and_then(Value::as_str).map(str::to_owned).ok_or_else(|| {
                RuntimeError::Decode {
                    agent: self.id.clone(),
                    step: format!("template {id}"),
                    message: format!("the daemon's answer has no text: {answer}"),
                }
            });
        }
        let (name, mut version) = id
            .split_once('@')
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .ok_or_else(|| RuntimeError::Usage(format!("prompt template {id:?}: want name@version")))?;
        let inner = &self.session.inner;
        if let (Some(plan), Some(scheduler)) = (&inner.plan, &inner.scheduler) {
            if let Some(edited) = plan.prompts.get(&self.id) {
                if scheduler.past(&self.id, plan.at) {
                    version = edited.clone();
                }
            }
        }
        let path = prompts_dir.join(&name).join(format!("{version}.txt"));
        let text = std::fs::read_to_string(&path).map_err(|e| {
            RuntimeError::Usage(format!("prompt template {name}@{version}: reading {}: {e}", path.display()))
        })?;
        self.state.lock().prompt =
            Some(PromptRef { id: format!("{name}@{version}"), digest: Digest::of(text.as_bytes()) });
        Ok(render(&text, vars))
    }
}

/// Fills `{key}` placeholders; unknown ones stay as they are.
pub fn render(text: &str, vars: &Value) -> String {
    let Some(map) = vars.as_object() else { return text.to_owned() };
    let mut out = text.to_owned();
    for (k, v) in map {
        let value = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        out = out.replace(&format!("{{{k}}}"), &value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_filled() {
        let vars = serde_json::json!({"table": "users", "n": 3});
        assert_eq!(
            render("Backfill {table} in {n} steps; keep {other}", &vars),
            "Backfill users in 3 steps; keep {other}"
        );
    }
}
