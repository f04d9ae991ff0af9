//! Fork edits (SPEC §4), parsed from their command-line form:
//! `swap:A,B`, `message:SEQ=@FILE`, `tool-output:SEQ=@FILE`, `model-output:SEQ=@FILE`,
//! `prompt:AGENT=VERSION`, `model:AGENT=NAME[@SNAPSHOT]`, `param:AGENT.NAME=VALUE`.
//!
//! Parsing is pure: `@FILE` stays a path here; the caller reads, masks and stores the file and
//! keeps the edit with the file's blob digest (`@sha256:…`), so a fork can be replayed anywhere.
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why `name` can't be set with `param:`, if it can't: the request fields that say which model
/// answers, what it is asked, or how the program reads the reply have edits of their own or
/// none, since the program would get a reply of another shape than it asked for.
fn not_a_param(name: &str) -> Option<&'static str> {
    match name {
        "model" => Some("use model:AGENT=NAME[@SNAPSHOT], which keeps the agent's provider"),
        "messages" | "input" | "system" | "prompt" | "instructions" => Some(
            "what the model is asked changes with message:, model-output: or prompt: edits, or by \
             the program itself",
        ),
        "stream" | "stream_options" => {
            Some("the program reads the reply as it asked for it: a stream can't be switched under it")
        }
        _ => None,
    }
}

/// Where an edit's replacement content comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Content {
    /// A file to read (as typed).
    File(String),
    /// A stored blob (after the CLI read, masked and stored the file).
    Blob(crate::Digest),
}

impl fmt::Display for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Content::File(p) => write!(f, "@{p}"),
            Content::Blob(d) => write!(f, "@{d}"),
        }
    }
}

/// One fork edit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Edit {
    /// Deliveries `a < b` to the same agent trade messages.
    Swap {
        /// The earlier delivery.
        a: u64,
        /// The later delivery.
        b: u64,
    },
    /// Replace the body of the message sent (or delivered) at `seq`.
    Message {
        /// A `send` or `deliver` seq.
        seq: u64,
        /// The new body (JSON).
        content: Content,
    },
    /// Replace the recorded output of the tool call at `seq`.
    ToolOutput {
        /// A `tool_call` seq.
        seq: u64,
        /// The new output (JSON).
        content: Content,
    },
    /// Replace the recorded output of the model call at `seq`.
    ModelOutput {
        /// A `model_call` seq.
        seq: u64,
        /// The new response body (JSON).
        content: Content,
    },
    /// `template()` hands `agent` this version's text.
    Prompt {
        /// The agent.
        agent: String,
        /// The template version (`v15`).
        version: String,
    },
    /// Rewrite `agent`'s model requests to this model.
    Model {
        /// The agent.
        agent: String,
        /// The model name.
        name: String,
        /// A pinned snapshot.
        snapshot: Option<String>,
    },
    /// Set a request parameter of `agent`'s model calls.
    Param {
        /// The agent.
        agent: String,
        /// The parameter (`temperature`).
        name: String,
        /// Its value, as JSON (a bare word is a string).
        value: serde_json::Value,
    },
}

/// An edit that doesn't parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad edit {input:?}: {why}")]
pub struct EditError {
    /// The edit as typed.
    pub input: String,
    /// What is wrong.
    pub why: String,
}

impl Edit {
    /// The source seqs this edit names.
    pub fn seqs(&self) -> Vec<u64> {
        match self {
            Edit::Swap { a, b } => vec![*a, *b],
            Edit::Message { seq, .. } | Edit::ToolOutput { seq, .. } | Edit::ModelOutput { seq, .. } => {
                vec![*seq]
            }
            _ => Vec::new(),
        }
    }

    /// What this edit changes, for telling two edits of the same thing apart: `output:SEQ`,
    /// `message:SEQ`, `prompt:AGENT`, `model:AGENT`, `param:AGENT.NAME`; none for a swap.
    pub fn target(&self) -> Option<String> {
        match self {
            Edit::Swap { .. } => None,
            Edit::Message { seq, .. } => Some(format!("message:{seq}")),
            Edit::ToolOutput { seq, .. } | Edit::ModelOutput { seq, .. } => Some(format!("output:{seq}")),
            Edit::Prompt { agent, .. } => Some(format!("prompt:{agent}")),
            Edit::Model { agent, .. } => Some(format!("model:{agent}")),
            Edit::Param { agent, name, .. } => Some(format!("param:{agent}.{name}")),
        }
    }

    /// The agent this edit names, for agent-level edits.
    pub fn agent(&self) -> Option<&str> {
        match self {
            Edit::Prompt { agent, .. } | Edit::Model { agent, .. } | Edit::Param { agent, .. } => Some(agent),
            _ => None,
        }
    }

    /// The file content this edit names, if any.
    pub fn content(&self) -> Option<&Content> {
        match self {
            Edit::Message { content, .. }
            | Edit::ToolOutput { content, .. }
            | Edit::ModelOutput { content, .. } => Some(content),
            _ => None,
        }
    }

    /// This edit with its content replaced.
    pub fn with_content(&self, new: Content) -> Edit {
        let mut e = self.clone();
        if let Edit::Message { content, .. }
        | Edit::ToolOutput { content, .. }
        | Edit::ModelOutput { content, .. } = &mut e
        {
            *content = new;
        }
        e
    }
}

impl fmt::Display for Edit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Edit::Swap { a, b } => write!(f, "swap:{a},{b}"),
            Edit::Message { seq, content } => write!(f, "message:{seq}={content}"),
            Edit::ToolOutput { seq, content } => write!(f, "tool-output:{seq}={content}"),
            Edit::ModelOutput { seq, content } => write!(f, "model-output:{seq}={content}"),
            Edit::Prompt { agent, version } => write!(f, "prompt:{agent}={version}"),
            Edit::Model { agent, name, snapshot: Some(s) } => write!(f, "model:{agent}={name}@{s}"),
            Edit::Model { agent, name, snapshot: None } => write!(f, "model:{agent}={name}"),
            Edit::Param { agent, name, value } => match value {
                serde_json::Value::String(s) => write!(f, "param:{agent}.{name}={s}"),
                other => write!(f, "param:{agent}.{name}={other}"),
            },
        }
    }
}

impl FromStr for Edit {
    type Err = EditError;
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| EditError { input: input.to_owned(), why: why.to_owned() };
        let (kind, rest) = input.split_once(':').ok_or_else(|| {
            bad("want KIND:..., KIND one of swap, message, tool-output, model-output, prompt, model, param")
        })?;
        let seq = |s: &str| {
            s.trim().parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| bad("a seq is a positive integer"))
        };
        let content = |s: &str| {
            s.strip_prefix('@')
                .filter(|p| !p.is_empty())
                .map(|p| match p.parse::<crate::Digest>() {
                    Ok(d) => Content::Blob(d),
                    Err(_) => Content::File(p.to_owned()),
                })
                .ok_or_else(|| bad("the replacement is a file: SEQ=@FILE"))
        };
        let agent_ok = |a: &str| !a.is_empty() && !a.contains(['=', ' ']);
        match kind {
            "swap" => {
                let (a, b) = rest.split_once(',').ok_or_else(|| bad("want swap:A,B"))?;
                let (a, b) = (seq(a)?, seq(b)?);
                if a >= b {
                    return Err(bad("swap:A,B needs A < B"));
                }
                Ok(Edit::Swap { a, b })
            }
            "message" | "tool-output" | "model-output" => {
                let (s, file) = rest.split_once('=').ok_or_else(|| bad("want SEQ=@FILE"))?;
                let (seq, content) = (seq(s)?, content(file)?);
                Ok(match kind {
                    "message" => Edit::Message { seq, content },
                    "tool-output" => Edit::ToolOutput { seq, content },
                    _ => Edit::ModelOutput { seq, content },
                })
            }
            "prompt" => {
                let (agent, version) =
                    rest.split_once('=').ok_or_else(|| bad("want prompt:AGENT=VERSION"))?;
                if !agent_ok(agent) || version.is_empty() {
                    return Err(bad("want prompt:AGENT=VERSION"));
                }
                Ok(Edit::Prompt { agent: agent.into(), version: version.into() })
            }
            "model" => {
                let (agent, model) =
                    rest.split_once('=').ok_or_else(|| bad("want model:AGENT=NAME[@SNAPSHOT]"))?;
                if !agent_ok(agent) || model.is_empty() {
                    return Err(bad("want model:AGENT=NAME[@SNAPSHOT]"));
                }
                let (name, snapshot) = match model.split_once('@') {
                    Some((n, s)) => (n.to_owned(), Some(s.to_owned())),
                    None => (model.to_owned(), None),
                };
                if name.is_empty() || snapshot.as_deref().is_some_and(str::is_empty) {
                    return Err(bad("want model:AGENT=NAME[@SNAPSHOT], with neither part empty"));
                }
                // The request names the snapshot when one is given: one of another model would
                // silently drop NAME.
                if let Some(snapshot) = snapshot.as_deref().filter(|s| !s.starts_with(name.as_str())) {
                    return Err(bad(&format!(
                        "snapshot {snapshot:?} is not one of model {name:?} (a snapshot is the model's name \
                         and a date, such as gpt-4o@gpt-4o-2024-08-06): name the snapshot alone, \
                         model:{agent}={snapshot}"
                    )));
                }
                Ok(Edit::Model { agent: agent.into(), name, snapshot })
            }
            "param" => {
                let (target, value) =
                    rest.split_once('=').ok_or_else(|| bad("want param:AGENT.NAME=VALUE"))?;
                let (agent, name) =
                    target.rsplit_once('.').ok_or_else(|| bad("want param:AGENT.NAME=VALUE"))?;
                if !agent_ok(agent) || name.is_empty() {
                    return Err(bad("want param:AGENT.NAME=VALUE"));
                }
                if let Some(why) = not_a_param(name) {
                    return Err(bad(&format!("{name} is not a sampling parameter: {why}")));
                }
                let typed = value;
                let value = serde_json::from_str(typed)
                    .unwrap_or_else(|_| serde_json::Value::String(typed.to_owned()));
                if let Some(want) = param_type(name).filter(|want| !want.fits(&value)) {
                    // Said as typed: a number too wide for 64 bits parses as a float (1e+20).
                    let shown = match value {
                        serde_json::Value::String(_) => value.to_string(),
                        _ => typed.to_owned(),
                    };
                    return Err(bad(&format!("{name} takes {}, not {shown}", want.name())));
                }
                Ok(Edit::Param { agent: agent.into(), name: name.into(), value })
            }
            _ => Err(bad(
                "unknown kind; want swap, message, tool-output, model-output, prompt, model or param",
            )),
        }
    }
}

/// What a well-known sampling parameter takes (the providers refuse anything else).
#[derive(Clone, Copy)]
enum ParamType {
    Number,
    Integer,
}

impl ParamType {
    fn fits(self, value: &serde_json::Value) -> bool {
        match self {
            ParamType::Number => value.is_number(),
            ParamType::Integer => value.is_u64() || value.is_i64(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            ParamType::Number => "a number",
            ParamType::Integer => "an integer",
        }
    }
}

fn param_type(name: &str) -> Option<ParamType> {
    match name {
        "temperature" | "top_p" | "frequency_penalty" | "presence_penalty" => Some(ParamType::Number),
        "max_tokens" | "max_completion_tokens" | "max_output_tokens" | "seed" | "n" | "top_k" => {
            Some(ParamType::Integer)
        }
        _ => None,
    }
}

/// `--at` when none is given: the smallest seq an edit names, or 1.
pub fn default_fork_point(edits: &[Edit]) -> u64 {
    edits.iter().flat_map(Edit::seqs).min().unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_text() {
        for text in [
            "swap:3,5",
            "message:4=@msg.json",
            "tool-output:12=@out.json",
            "model-output:9=@reply.json",
            "prompt:reviewer=v15",
            "model:reviewer=gpt-4o@gpt-4o-2024-08-06",
            "model:planner=sim-2",
            "param:reviewer.temperature=0.7",
            "param:reviewer.stop=END",
        ] {
            let edit: Edit = text.parse().unwrap();
            assert_eq!(edit.to_string(), text);
        }
        assert_eq!(default_fork_point(&["swap:3,5".parse().unwrap(), "prompt:a=v2".parse().unwrap()]), 3);
        assert_eq!(default_fork_point(&["prompt:a=v2".parse().unwrap()]), 1);
    }

    #[test]
    fn bad_edits_say_why() {
        for (text, why) in [
            ("swap:5,3", "A < B"),
            ("swap:0,3", "positive"),
            ("tool-output:3=out.json", "@FILE"),
            ("frob:1", "unknown kind"),
            ("nocolon", "KIND:"),
            ("param:reviewer=1", "AGENT.NAME"),
            ("param:reviewer.temperature=hot", "temperature takes a number, not \"hot\""),
            ("param:reviewer.max_tokens=1.5", "max_tokens takes an integer, not 1.5"),
            ("param:writer.seed=99999999999999999999", "seed takes an integer, not 99999999999999999999"),
            (
                "param:critic.model=gpt-4o",
                "use model:AGENT=NAME[@SNAPSHOT], which keeps the agent's provider",
            ),
            ("param:writer.messages=[]", "not a sampling parameter: what the model is asked"),
            ("param:writer.stream=true", "a stream can't be switched"),
            ("model:writer=gpt-4o@", "neither part empty"),
            ("model:writer=@gpt-4o-2024-08-06", "neither part empty"),
            (
                "model:writer=gpt-4o-mini@gpt-4o-2024-08-06",
                "snapshot \"gpt-4o-2024-08-06\" is not one of model \"gpt-4o-mini\"",
            ),
        ] {
            let err = text.parse::<Edit>().unwrap_err();
            assert!(err.to_string().contains(why), "{text}: {err}");
        }
    }
}
