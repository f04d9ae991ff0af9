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
    /// (a JSON object; strings are inserted as they are, other values as JSON; see [`render`]: a
    /// placeholder without a value is [`RuntimeError::TemplateVar`]). Its digest is
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
                if scheduler.past(&self.id, plan.applies_from(&crate::fork::prompt_target(&self.id))) {
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
        render(&text, vars).map_err(|missing| RuntimeError::TemplateVar {
            template: format!("{name}@{version}"),
            path: path.display().to_string(),
            missing: Box::new(missing),
        })
    }
}

/// A placeholder of a template that the program gave no value for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("placeholder {{{name}}} on line {line} has no value (given: {given})")]
pub struct MissingVar {
    /// The placeholder's name.
    pub name: String,
    /// Its line in the template, from 1.
    pub line: usize,
    /// The names the program gave, comma-separated (`none` when it gave none).
    pub given: String,
}

/// Fills `{name}` placeholders from `vars` (a JSON object; strings as they are, other values as
/// compact JSON) in one pass, so a value that itself holds `{other}` is inserted as it is, never
/// filled again.
///
/// A placeholder is `{` + a name of ASCII letters, digits and `_` not starting with a digit +
/// `}`; one without a value is an error (a prompt sent with `{table}` in it is a bug the model
/// won't report). Every other brace is text, so JSON examples in a prompt need no escaping; a
/// literal `{word}` is written by passing `word` as `"{word}"`.
pub fn render(text: &str, vars: &Value) -> Result<String, MissingVar> {
    let empty = serde_json::Map::new();
    let map = vars.as_object().unwrap_or(&empty);
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(name) = placeholder(after) else {
            out.push('{');
            rest = after;
            continue;
        };
        match map.get(name) {
            Some(Value::String(s)) => out.push_str(s),
            Some(other) => out.push_str(&other.to_string()),
            None => {
                let given: Vec<&str> = map.keys().map(String::as_str).collect();
                return Err(MissingVar {
                    name: name.to_owned(),
                    line: text[..text.len() - rest.len() + open].matches('\n').count() + 1,
                    given: if given.is_empty() { "none".into() } else { given.join(", ") },
                });
            }
        }
        rest = &after[name.len() + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The name of the placeholder `after` starts with (what follows a `{`), if it is one.
fn placeholder(after: &str) -> Option<&str> {
    let end = after.find('}')?;
    let name = &after[..end];
    let mut chars = name.chars();
    let first = chars.next()?;
    let ok =
        (first.is_ascii_alphabetic() || first == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    ok.then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    #[test]
    fn placeholders_are_filled() {
        let vars = json!({"table": "users", "n": 3, "opts": {"b": [1, "x"], "a": null}});
        assert_eq!(
            render("Backfill {table} in {n} steps with {opts}", &vars).unwrap(),
            r#"Backfill users in 3 steps with {"a":null,"b":[1,"x"]}"#
        );
    }

    #[test]
    fn a_value_is_inserted_as_it_is_never_filled_again() {
        // Keys sort `analysis` before `topic`: filling one after the other replaced the
        // `{topic}` a model's answer happened to hold.
        let vars = json!({"analysis": "use {topic} and {missing}", "topic": "rates"});
        assert_eq!(render("{topic}: {analysis}", &vars).unwrap(), "rates: use {topic} and {missing}");
    }

    #[test]
    fn other_braces_are_text() {
        let text = r#"Answer as {"verdict": "ok"} or { } or {1x} or {a-b} or {} or a lone { or }"#;
        assert_eq!(render(text, &json!({})).unwrap(), text);
        assert_eq!(render("{{x}}", &json!({"x": 1})).unwrap(), "{1}");
        assert_eq!(render("ends with {", &json!(null)).unwrap(), "ends with {");
    }

    #[test]
    fn a_placeholder_without_a_value_is_refused_with_its_line() {
        let err = render("Plan:\n{steps}\nfor {table}", &json!({"steps": "a"})).unwrap_err();
        assert_eq!(err, MissingVar { name: "table".into(), line: 3, given: "steps".into() });
        assert_eq!(err.to_string(), "placeholder {table} on line 3 has no value (given: steps)");
        let err = render("{_x9}", &json!(null)).unwrap_err();
        assert_eq!(err.to_string(), "placeholder {_x9} on line 1 has no value (given: none)");
    }
}
