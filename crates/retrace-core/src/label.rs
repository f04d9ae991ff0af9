//! What a step is called on a timeline: one name for one step, whichever command shows it
//! (`retrace show`'s lanes, `retrace diff`'s step column).
//!
//! A model call is named by its model (`model_call gpt-4o-mini`), not by the route it took
//! (`openai/chat.completions`); a message by the other agent (`send -> reviewer`,
//! `deliver <- planner`); a decision by its action. Anything else is [`crate::Event::label`]:
//! its type and name.
use crate::envelope::{Decision, MessageRef, ModelRef};
use crate::{Event, EventType};

/// What [`step`] reads of an event: its type, name, model, message and decision.
#[derive(Clone, Copy, Debug)]
pub struct StepParts<'a> {
    /// The event's type.
    pub kind: EventType,
    /// Its name (a tool's, a route's, a message's peer).
    pub name: Option<&'a str>,
    /// A model call's model.
    pub model: Option<&'a ModelRef>,
    /// A send's or delivery's message.
    pub message: Option<&'a MessageRef>,
    /// A decision taken.
    pub decision: Option<&'a Decision>,
}

/// The step's label: `model_call gpt-4o-mini`, `send -> reviewer`, `deliver <- planner`,
/// `deliver (timed out)`, `decision approve`, `tool_call sql.query`.
pub fn step(parts: StepParts<'_>) -> String {
    let kind = parts.kind;
    let peer = |pick: fn(&MessageRef) -> Option<&String>| {
        parts.message.and_then(pick).map(String::as_str).or(parts.name).unwrap_or_default()
    };
    match kind {
        EventType::ModelCall if parts.model.is_some_and(|m| !m.name.is_empty()) => {
            format!("{kind} {}", parts.model.map_or("", |m| m.name.as_str()))
        }
        EventType::Send => format!("send -> {}", peer(|m| m.to.as_ref())),
        EventType::Deliver if parts.message.is_some_and(|m| m.timed_out) => "deliver (timed out)".to_owned(),
        EventType::Deliver => format!("deliver <- {}", peer(|m| m.from.as_ref())),
        EventType::Decision if parts.name.is_none() && parts.decision.is_some() => {
            format!("decision {}", parts.decision.map_or("", |d| d.action.as_str()))
        }
        _ => match parts.name {
            Some(name) => format!("{kind} {name}"),
            None => kind.to_string(),
        },
    }
}

/// [`step`] of a whole event.
pub fn of_event(e: &Event) -> String {
    step(StepParts {
        kind: e.kind,
        name: e.name.as_deref(),
        model: e.model.as_ref(),
        message: e.message.as_ref(),
        decision: e.decision.as_ref(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(kind: EventType) -> StepParts<'static> {
        StepParts { kind, name: None, model: None, message: None, decision: None }
    }

    #[test]
    fn each_kind_is_named_by_what_a_reader_looks_for() {
        let model = ModelRef { provider: "openai".into(), name: "gpt-4o-mini".into(), snapshot: None };
        let call = StepParts {
            name: Some("openai/chat.completions"),
            model: Some(&model),
            ..parts(EventType::ModelCall)
        };
        assert_eq!(step(call), "model_call gpt-4o-mini");
        // A proxied call whose body named no model (GET /v1/models) keeps its route.
        let bare = StepParts { name: Some("openai/GET models"), ..parts(EventType::ModelCall) };
        assert_eq!(step(bare), "model_call openai/GET models");

        let message = MessageRef {
            from: Some("planner".into()),
            to: Some("reviewer".into()),
            kind: None,
            timed_out: false,
        };
        let send = StepParts { message: Some(&message), ..parts(EventType::Send) };
        assert_eq!(step(send), "send -> reviewer");
        let deliver = StepParts { message: Some(&message), ..parts(EventType::Deliver) };
        assert_eq!(step(deliver), "deliver <- planner");
        let none = MessageRef { from: None, to: None, kind: None, timed_out: true };
        let timed_out = StepParts { message: Some(&none), ..parts(EventType::Deliver) };
        assert_eq!(step(timed_out), "deliver (timed out)");

        let decision = Decision { action: "approve".into(), target: None };
        let decided = StepParts { decision: Some(&decision), ..parts(EventType::Decision) };
        assert_eq!(step(decided), "decision approve");
        let tool = StepParts { name: Some("sql.query"), ..parts(EventType::ToolCall) };
        assert_eq!(step(tool), "tool_call sql.query");
        assert_eq!(step(parts(EventType::Clock)), "clock");
    }
}
