//! The divergence of a step the log doesn't hold: the expected step of the same type and name,
//! the first differing JSON path (or key header, or tool version) with both values, or why no
//! step was expected.
use retrace_core::envelope::ToolRef;
use retrace_core::json::{self, Json};
use retrace_core::json_diff::first_difference_bytes;
use retrace_core::{Divergence, DivergenceCode, Event, EventType};
use retrace_store::BlobHint;

use super::Prepared;
use crate::agent::Agent;
use crate::error::RuntimeError;

impl Agent {
    /// Builds the divergence for a step the log doesn't hold, and records it.
    pub(crate) fn mismatch(
        &self,
        kind: EventType,
        event: &Event,
        prepared: &Prepared,
        label: &str,
    ) -> RuntimeError {
        let inner = &self.session.inner;
        let scheduler = inner.scheduler.as_ref().expect("replay sessions have a scheduler");
        let log = scheduler.log();
        let expected = log.expected(&self.id, kind, event.name.as_deref());
        // The log may lack the step only because the recording could not be read to its end.
        if let Some(e) = log.failure() {
            return e.into();
        }
        let interrupted = self.session.source_ended_early();
        let d = match expected {
            Some(step) => {
                let recorded = step.request_ref.and_then(|r| inner.store.get_blob(&r).ok());
                let mut path = recorded.as_ref().and_then(|r| first_difference_bytes(r, &prepared.masked));
                let mut values = match (&path, &recorded) {
                    (Some(path), Some(recorded)) => {
                        Some((value_at(recorded, path), value_at(&prepared.masked, path)))
                    }
                    _ => None,
                };
                // The same body: a proxied call may differ in a key header (`anthropic-beta`...),
                // which its event records among its params.
                if path.is_none() && kind == EventType::ModelCall {
                    let source = self.session.source_run().unwrap_or_default();
                    let difference = inner
                        .store
                        .event(&source, step.seq)
                        .ok()
                        .and_then(|recorded| crate::http_model::key_header_difference(&recorded, event));
                    if let Some(difference) = difference {
                        path = Some(format!("header {}", difference.name));
                        values = Some((difference.recorded, difference.replayed));
                    }
                }
                // The same arguments: a tool's version is part of its key too.
                if path.is_none() && kind == EventType::ToolCall {
                    let source = self.session.source_run().unwrap_or_default();
                    let recorded = inner.store.event(&source, step.seq).ok().and_then(|e| e.tool);
                    let version = |tool: Option<&ToolRef>| {
                        tool.map_or("(none)".to_owned(), |t| format!("{:?}", t.version))
                    };
                    let (was, is) = (version(recorded.as_ref()), version(event.tool.as_ref()));
                    if was != is {
                        path = Some("tool version".to_owned());
                        values = Some((was, is));
                    }
                }
                // The asked-for request (masked, like every stored byte) is kept so that the two
                // requests can be compared whole (`retrace gate`'s hygiene report); a replay
                // stores nothing else of its own.
                let got_request = inner.store.put_blob(&prepared.masked, BlobHint::Raw).ok();
                let mut d = Divergence::new(DivergenceCode::StepMismatch, self.id.clone())
                    .at(step.seq)
                    .step(label)
                    .keys(Some(step.key), Some(prepared.key))
                    .path(path.clone())
                    .got_request(got_request);
                if let (Some(path), Some((recorded, replayed))) = (path, values) {
                    d = d
                        .detail(format!("recorded {path} = {recorded}"))
                        .detail(format!("replayed {path} = {replayed}"));
                }
                d
            }
            None if log.next_of(&self.id).is_none() && interrupted => {
                crate::log_end::log_ended(self.id.clone(), log.last_seq())
                    .step(label)
                    .keys(None, Some(prepared.key))
                    .detail("the agent asked for this step after its last recorded one")
            }
            None => {
                let d = Divergence::new(DivergenceCode::UnexpectedStep, self.id.clone())
                    .step(label)
                    .keys(None, Some(prepared.key));
                // An extra step amid the agent's recorded ones is about the step it skipped to.
                match log.next_of(&self.id) {
                    Some(next) => d.at(next.seq).detail(format!(
                        "no unconsumed recorded step of the agent is a {label}; its next recorded step is \
                         seq {} ({})",
                        next.seq,
                        next.label()
                    )),
                    // Past the agent's recording: about the last step it recorded.
                    None => {
                        let d = match (log.last_of(&self.id), log.last_seq()) {
                            (Some(last), end) if end > last => d.at(last).detail(format!(
                                "the agent has no recorded steps left; its last was seq {last} (the \
                                 recording ends at seq {end})"
                            )),
                            (Some(last), _) => d.at(last).detail(format!(
                                "the agent has no recorded steps left; its last was seq {last}"
                            )),
                            (None, _) => d.detail("the agent recorded no steps"),
                        };
                        match self.source_stopped_by() {
                            Some(stopped) => d.detail(stopped),
                            None => d,
                        }
                    }
                }
            }
        };
        self.diverge(d)
    }

    /// What to add to a divergence past the end of a recording whose program a signal stopped
    /// (exit 130 or 143, as a shell reports SIGINT and SIGTERM) or that failed (any other
    /// status but 0): the replayed program ran on where the recorded one had stopped.
    fn source_stopped_by(&self) -> Option<String> {
        let source = self.session.source_run()?;
        let status = self.session.inner.store.run(&source).ok()?.exit_status?;
        let how = match status {
            0 => return None,
            130 => format!("was stopped by SIGINT (exit status {status})"),
            137 => format!("was killed by SIGKILL (exit status {status})"),
            143 => format!("was stopped by SIGTERM (exit status {status})"),
            _ => format!("exited with status {status}"),
        };
        Some(format!("the recorded program {how}, so its recording ends there; this replay ran on past it"))
    }

    /// Records `d` as the replay's divergence (the first one wins) and returns it as an error.
    pub(crate) fn diverge(&self, d: Divergence) -> RuntimeError {
        let scheduler = self.session.inner.scheduler.as_ref().expect("only replay diverges");
        scheduler.diverge(d).into()
    }
}

/// The value at a `$.a[1].b` path of a JSON document, shortened for a terminal.
fn value_at(bytes: &[u8], path: &str) -> String {
    let Ok(doc) = json::parse(bytes) else { return "(not JSON)".into() };
    let mut node = &doc;
    for part in split_path(path) {
        let next = match (&part, node) {
            (PathPart::Key(k), Json::Object(fields)) => fields.iter().find(|(n, _)| n == k).map(|(_, v)| v),
            (PathPart::Index(i), Json::Array(items)) => items.get(*i),
            _ => None,
        };
        match next {
            Some(n) => node = n,
            None => return "(absent)".into(),
        }
    }
    let text = String::from_utf8(retrace_core::canonical::to_canonical(node).unwrap_or_default())
        .unwrap_or_default();
    if text.chars().count() > 120 {
        format!("{}…", text.chars().take(120).collect::<String>())
    } else {
        text
    }
}

enum PathPart {
    Key(String),
    Index(usize),
}

fn split_path(path: &str) -> Vec<PathPart> {
    let mut parts = Vec::new();
    let mut rest = path.strip_prefix('$').unwrap_or(path);
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("[\"") {
            let mut de = serde_json::Deserializer::from_str(&rest[1..]).into_iter::<String>();
            let Some(Ok(key)) = de.next() else { break };
            // The string began at the quote before `r`; one more byte closes the bracket.
            let off = de.byte_offset();
            parts.push(PathPart::Key(key));
            rest = r.get(off..).unwrap_or("");
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            parts.push(PathPart::Key(r[..end].to_owned()));
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').unwrap_or(r.len());
            match r[..end].parse() {
                Ok(i) => parts.push(PathPart::Index(i)),
                Err(_) => break,
            }
            rest = r.get(end + 1..).unwrap_or("");
        } else {
            break;
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_at_paths() {
        let doc = br#"{"a":[{"b":1},{"c d":"x"}],"q":"select 1"}"#;
        assert_eq!(value_at(doc, "$.q"), "\"select 1\"");
        assert_eq!(value_at(doc, "$.a[1][\"c d\"]"), "\"x\"");
        assert_eq!(value_at(doc, "$.a[0]"), "{\"b\":1}");
        assert_eq!(value_at(doc, "$.zz"), "(absent)");
    }
}
