//! Fork plans: a source run, a fork point and edits (SPEC §4, §7), validated against the source
//! before anything runs, so a bad edit is a usage error that says why.
use std::collections::{BTreeMap, HashMap, HashSet};

use retrace_core::edit::{Content, Edit};
use retrace_core::{Digest, Event, EventType};
use retrace_store::export::RunEvents;
use retrace_store::{Store, StoreResult};
use serde_json::Value;

/// A fork's edits, resolved and indexed for the step pipeline and the scheduler.
#[derive(Clone, Debug, Default)]
pub struct ForkPlan {
    /// The first seq the fork numbers itself.
    pub at: u64,
    /// The edits as given.
    pub edits: Vec<Edit>,
    /// Deliveries that trade messages.
    pub swaps: Vec<(u64, u64)>,
    /// Source send seq → replacement body blob.
    pub messages: HashMap<u64, Digest>,
    /// Source step seq → replacement output blob.
    pub outputs: HashMap<u64, Digest>,
    /// Agent → template version.
    pub prompts: HashMap<String, String>,
    /// Agent → (model name, snapshot).
    pub models: HashMap<String, (String, Option<String>)>,
    /// Agent → parameters to set on its model requests.
    pub params: HashMap<String, BTreeMap<String, Value>>,
    /// Where an agent's edit inherited from the source fork starts to apply (see
    /// [`ForkPlan::inherit`]), by target (`prompt:AGENT`, `model:AGENT`, `param:AGENT.NAME`);
    /// this fork's own edits apply from [`ForkPlan::at`].
    pub since: HashMap<String, u64>,
    /// The bodies the source fork's `message:` edits put in place of its program's: the source
    /// recorded those sends with them, so the same program's send is looked up with them too.
    pub inherited_messages: Vec<Digest>,
}

/// The agent edits of `edits` that changed none of the fork's own `events` (from its fork point
/// on), each with why: an agent edit applies once its agent is past the fork point, so one
/// whose agent asked for no template, or made no model call, from there on leaves the fork as
/// its source was. A prompt edit changed something when a step of the agent was made from the
/// edited version; a model edit when a model call of the agent went to the edited model; a
/// parameter edit when a model call of the agent was not served as recorded.
pub fn unapplied(edits: &[Edit], events: &[Event]) -> Vec<String> {
    let mut out = Vec::new();
    for edit in edits {
        let Some(agent) = edit.agent() else { continue };
        let mine = || events.iter().filter(move |e| e.agent_id == agent);
        let calls = || mine().filter(|e| e.kind == EventType::ModelCall);
        let (changed, none) = match edit {
            Edit::Prompt { version, .. } => (
                mine().any(|e| {
                    e.prompt_template.as_ref().is_some_and(|p| p.id.ends_with(&format!("@{version}")))
                }),
                "no step of it was made from a template since the fork point",
            ),
            Edit::Model { name, snapshot, .. } => {
                let wanted = snapshot.as_deref().unwrap_or(name);
                (
                    calls().any(|e| e.model.as_ref().is_some_and(|m| m.name == wanted || m.name == *name)),
                    "none of its model calls since the fork point could take that model",
                )
            }
            _ => (
                calls().any(|e| e.source != retrace_core::Source::Recorded),
                "none of its model calls since the fork point changed",
            ),
        };
        if !changed {
            // Past --at with steps it could change, the edit met them and they came out the same
            // (a parameter set to the value the requests held): "fork earlier" would not help.
            let reached = match edit {
                Edit::Prompt { .. } => mine().next().is_some(),
                _ => calls().next().is_some(),
            };
            let why = match (reached, edit) {
                (false, _) => {
                    " (an agent edit applies once the agent is past --at; fork earlier to reach its steps)"
                }
                (true, Edit::Param { .. }) => {
                    " (their requests came out as recorded: they may hold that value already)"
                }
                (true, _) => "",
            };
            out.push(format!("{edit} changed nothing: agent {agent:?}: {none}{why}"));
        }
    }
    out
}

/// Refuses two edits of the same thing (the same seq's output or message, an agent's prompt,
/// model or parameter): one would silently undo the other, while the fork lists both.
pub fn check_distinct(edits: &[Edit]) -> Result<(), ForkError> {
    let mut seen: HashMap<String, &Edit> = HashMap::new();
    for edit in edits {
        // Swaps compose (swap:3,5 then swap:5,7), but the same swap twice undoes itself.
        let target = match edit {
            Edit::Swap { a, b } => Some(format!("swap:{a},{b}")),
            _ => edit.target(),
        };
        let Some(target) = target else { continue };
        if let Some(earlier) = seen.insert(target, edit) {
            return Err(ForkError::BadEdit(format!(
                "edits {earlier} and {edit} change the same thing; keep the one you mean"
            )));
        }
    }
    Ok(())
}

/// The target of a prompt edit for `agent`, as [`ForkPlan::since`] keys it.
pub(crate) fn prompt_target(agent: &str) -> String {
    format!("prompt:{agent}")
}

/// The target of a model edit for `agent`, as [`ForkPlan::since`] keys it.
pub(crate) fn model_target(agent: &str) -> String {
    format!("model:{agent}")
}

/// The target of a parameter edit, as [`ForkPlan::since`] keys it.
pub(crate) fn param_target(agent: &str, name: &str) -> String {
    format!("param:{agent}.{name}")
}

/// Why a fork can't be made.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    /// An edit that doesn't fit the source run.
    #[error("{0}")]
    BadEdit(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] retrace_store::StoreError),
}

impl ForkPlan {
    /// Indexes `edits` (whose file contents must already be blobs) for a fork at `at`.
    pub fn new(at: u64, edits: Vec<Edit>) -> Result<ForkPlan, ForkError> {
        let mut plan = ForkPlan { at, ..ForkPlan::default() };
        for edit in &edits {
            let blob = |c: &Content| match c {
                Content::Blob(d) => Ok(*d),
                Content::File(p) => Err(ForkError::BadEdit(format!("edit {edit}: file {p} was not stored"))),
            };
            match edit {
                Edit::Swap { a, b } => plan.swaps.push((*a, *b)),
                Edit::Message { seq, content } => {
                    plan.messages.insert(*seq, blob(content)?);
                }
                Edit::ToolOutput { seq, content } | Edit::ModelOutput { seq, content } => {
                    plan.outputs.insert(*seq, blob(content)?);
                }
                Edit::Prompt { agent, version } => {
                    plan.prompts.insert(agent.clone(), version.clone());
                }
                Edit::Model { agent, name, snapshot } => {
                    plan.models.insert(agent.clone(), (name.clone(), snapshot.clone()));
                }
                Edit::Param { agent, name, value } => {
                    plan.params.entry(agent.clone()).or_default().insert(name.clone(), value.clone());
                }
            }
        }
        plan.edits = edits;
        Ok(plan)
    }

    /// The seq from which the edit of `target` applies: the source fork's fork point for an
    /// edit inherited from it, else this fork's.
    pub fn applies_from(&self, target: &str) -> u64 {
        self.since.get(target).copied().unwrap_or(self.at)
    }

    /// Takes in the edits of `parent`, the plan of the fork this one forks (itself with what it
    /// inherited), so a fork of a fork starts from its source's world (SPEC §7: a replay of a
    /// fork applies its edits again, and so does a fork of it): the source's prompt, model and
    /// parameter edits apply from the source's fork point, and its `message:` edits' bodies
    /// are how the program's sends are looked up in the source's log. This plan's own edits of
    /// the same target win. `source_events` are the source fork's own log: its sends record
    /// the seq of the send they replaced (`origin_seq`). The source's output and swap edits
    /// need nothing: its log holds their results.
    pub fn inherit(&mut self, parent: &ForkPlan) {
        for (agent, version) in &parent.prompts {
            if !self.prompts.contains_key(agent) {
                self.prompts.insert(agent.clone(), version.clone());
                self.since.insert(prompt_target(agent), parent.applies_from(&prompt_target(agent)));
            }
        }
        for (agent, model) in &parent.models {
            if !self.models.contains_key(agent) {
                self.models.insert(agent.clone(), model.clone());
                self.since.insert(model_target(agent), parent.applies_from(&model_target(agent)));
            }
        }
        for (agent, params) in &parent.params {
            let own = self.params.entry(agent.clone()).or_default();
            for (name, value) in params {
                if !own.contains_key(name) {
                    own.insert(name.clone(), value.clone());
                    let target = param_target(agent, name);
                    self.since.insert(target.clone(), parent.applies_from(&target));
                }
            }
        }
        for blob in parent.messages.values().chain(&parent.inherited_messages) {
            if !self.inherited_messages.contains(blob) {
                self.inherited_messages.push(*blob);
            }
        }
    }

    /// Checks every edit against the source run's events; a `message` edit naming a delivery is
    /// rewritten to name its send.
    pub fn validate(mut self, store: &dyn Store, source: &str) -> Result<ForkPlan, ForkError> {
        let events = all_events(store, source)?;
        let last = events.len() as u64;
        let has = match last {
            0 => "has no events".to_owned(),
            _ => format!("has seqs 1-{last}"),
        };
        let get = |seq: u64| events.get(seq.wrapping_sub(1) as usize);
        for edit in &self.edits {
            for seq in edit.seqs() {
                if get(seq).is_none() {
                    return Err(ForkError::BadEdit(format!(
                        "edit {edit}: seq {seq} does not exist (the source run {has})"
                    )));
                }
            }
        }
        let at_ok = self.at >= 1 && self.at <= last + 1;
        if !at_ok {
            return Err(ForkError::BadEdit(format!("--at {}: the source run {has}", self.at)));
        }
        for edit in &self.edits {
            for seq in edit.seqs() {
                if seq < self.at {
                    return Err(ForkError::BadEdit(format!(
                        "edit {edit}: seq {seq} is before the fork point --at {}; fork at {seq} or earlier",
                        self.at
                    )));
                }
            }
        }
        let mut messages = HashMap::new();
        for (seq, blob) in std::mem::take(&mut self.messages) {
            let e = get(seq).expect("checked");
            let send = match e.kind {
                EventType::Send => seq,
                EventType::Deliver => e
                    .causal_parent
                    .filter(|_| !e.message.as_ref().is_some_and(|m| m.timed_out))
                    .ok_or_else(|| {
                        ForkError::BadEdit(format!(
                            "message:{seq}: that delivery is a recv timeout and carries no message"
                        ))
                    })?,
                other => {
                    return Err(ForkError::BadEdit(format!(
                        "message:{seq}: seq {seq} is {}, not a send or a delivery",
                        retrace_core::terminal::a(other.as_str())
                    )))
                }
            };
            if send < self.at {
                return Err(ForkError::BadEdit(format!(
                    "message:{seq}: the message that delivery carries is sent at seq {send}, before the \
                     fork point --at {}; fork at {send} or earlier (--at {send})",
                    self.at
                )));
            }
            if messages.insert(send, blob).is_some() {
                return Err(ForkError::BadEdit(format!(
                    "two message: edits change the message sent at seq {send} (one names its send, \
                     one its delivery); keep the one you mean"
                )));
            }
        }
        self.messages = messages;
        for &seq in self.outputs.keys() {
            let e = get(seq).expect("checked");
            let want = self.edits.iter().find(|x| x.seqs() == [seq] && !matches!(x, Edit::Message { .. }));
            let ok = match want {
                Some(Edit::ToolOutput { .. }) => e.kind == EventType::ToolCall,
                Some(Edit::ModelOutput { .. }) => e.kind == EventType::ModelCall,
                _ => true,
            };
            if !ok {
                return Err(ForkError::BadEdit(format!(
                    "{}: seq {seq} is {} ({})",
                    want.expect("found"),
                    retrace_core::terminal::a(e.kind.as_str()),
                    e.label()
                )));
            }
        }
        for &(a, b) in &self.swaps {
            let (ea, eb) = (get(a).expect("checked"), get(b).expect("checked"));
            for e in [ea, eb] {
                if e.kind != EventType::Deliver {
                    return Err(ForkError::BadEdit(format!(
                        "swap:{a},{b}: seq {} is {} ({}); swap exchanges two deliveries to the same agent",
                        e.seq,
                        retrace_core::terminal::a(e.kind.as_str()),
                        e.label()
                    )));
                }
            }
            if ea.agent_id != eb.agent_id {
                return Err(ForkError::BadEdit(format!(
                    "swap:{a},{b}: seq {a} is delivered to {} and seq {b} to {}; swap needs the same receiver",
                    ea.agent_id, eb.agent_id
                )));
            }
            let sender = |e: &Event| e.message.as_ref().and_then(|m| m.from.clone());
            let timed_out = |e: &Event| e.message.as_ref().is_some_and(|m| m.timed_out);
            if timed_out(ea) && timed_out(eb) {
                // Nothing to trade: the fork would be its source (QA29 S1: accepted silently).
                return Err(ForkError::BadEdit(format!(
                    "swap:{a},{b}: both are recv timeouts (no message was heard at either), so the swap \
                     changes nothing; swap a timeout with a delivered message to have it heard sooner or later"
                )));
            }
            if let (Some(from), true) = (sender(ea), sender(ea) == sender(eb)) {
                let sent = |e: &Event| e.causal_parent.map_or_else(|| "?".to_owned(), |s| s.to_string());
                return Err(ForkError::BadEdit(format!(
                    "swap:{a},{b}: both messages are from {from} (sent at seq {} and {}), and one sender's \
                     messages arrive in the order it sent them: no schedule hears them the other way round",
                    sent(ea),
                    sent(eb)
                )));
            }
            // Nor can a swap carry a message past another of its sender's: the deliveries between
            // the two to the same receiver keep their places, so one from A's sender would be heard
            // before A's message, or one from B's sender after B's (QA29 D1: swap:5,8 over b1 b2 a1
            // a2 played a2 b2 a1 b1).
            let (lo, hi) = (a.min(b), a.max(b));
            for k in lo + 1..hi {
                let Some(between) = get(k) else { continue };
                if between.kind != EventType::Deliver || between.agent_id != ea.agent_id {
                    continue;
                }
                let Some(from) = sender(between) else { continue };
                let (moved, how) = if Some(&from) == sender(get(lo).expect("checked")).as_ref() {
                    (lo, "after")
                } else if Some(&from) == sender(get(hi).expect("checked")).as_ref() {
                    (hi, "before")
                } else {
                    continue;
                };
                // Two neighbouring deliveries from two senders always swap: suggest the first
                // such pair in the range (QA32 D3: the suggestion was itself refused).
                let queue: Vec<&Event> = (lo..=hi)
                    .filter_map(&get)
                    .filter(|e| e.kind == EventType::Deliver && e.agent_id == ea.agent_id)
                    .collect();
                let pair = queue.windows(2).find(|w| {
                    let (x, y) = (sender(w[0]), sender(w[1]));
                    !(timed_out(w[0]) && timed_out(w[1])) && x != y
                });
                let suggestion = match pair {
                    Some(w) => format!(
                        "; neighbouring deliveries from two senders can always swap (swap:{},{})",
                        w[0].seq, w[1].seq
                    ),
                    None => String::new(),
                };
                return Err(ForkError::BadEdit(format!(
                    "swap:{a},{b}: seq {k} delivers another message from {from}, and one sender's messages \
                     arrive in the order it sent them: the swap would hear seq {moved}'s message {how} it{suggestion}"
                )));
            }
            if let Some(send_b) = eb.causal_parent {
                if let Some(chain) = causal_path(&events, send_b, a) {
                    let shown: Vec<String> = chain
                        .iter()
                        .map(|s| format!("seq {s} {}", get(*s).map(Event::label).unwrap_or_default()))
                        .collect();
                    return Err(ForkError::BadEdit(format!(
                        "swap:{a},{b}: the message delivered at {b} was sent because of delivery {a}, so it can't be heard first; causal chain: {}",
                        shown.join(" ← ")
                    )));
                }
            }
        }
        if self.swaps.len() > 1 {
            check_composed_swaps(&events, &self.swaps)?;
        }
        for edit in &self.edits {
            match edit {
                Edit::Prompt { agent, .. } => {
                    let used = events.iter().any(|e| &e.agent_id == agent && e.prompt_template.is_some());
                    if !used {
                        return Err(ForkError::BadEdit(format!(
                            "{edit}: agent {agent:?} never called template() in the source run, so there is no prompt to change"
                        )));
                    }
                }
                Edit::Model { agent, name, .. } => {
                    let providers: HashSet<&str> = events
                        .iter()
                        .filter(|e| &e.agent_id == agent && e.kind == EventType::ModelCall)
                        .filter_map(|e| e.model.as_ref().map(|m| m.provider.as_str()))
                        .collect();
                    if providers.is_empty() {
                        return Err(ForkError::BadEdit(format!(
                            "{edit}: agent {agent:?} made no model call in the source run"
                        )));
                    }
                    if let Some(other) = provider_of(name).filter(|p| !providers.contains(p)) {
                        let had: Vec<&str> = providers.into_iter().collect();
                        return Err(ForkError::BadEdit(format!(
                            "{edit}: {name} is an {other} model but agent {agent:?} calls {}; a fork can't change the provider",
                            had.join(", ")
                        )));
                    }
                    let fits = |e: &&Event| {
                        let provider = e.model.as_ref().map_or("", |m| m.provider.as_str());
                        model_edit_applies(name, provider, e.name.as_deref().unwrap_or(""))
                    };
                    if !model_calls(&events, agent).any(|e| fits(&e)) {
                        return Err(ForkError::BadEdit(format!(
                            "{edit}: none of agent {agent:?}'s model calls can take {name} ({}: an embedding model \
                             replaces embedding models, any other model the others, each within its provider)",
                            called(&events, agent)
                        )));
                    }
                }
                Edit::Param { agent, .. } => {
                    let generates = |e: &&Event| param_edit_applies(e.name.as_deref().unwrap_or(""));
                    if !model_calls(&events, agent).any(|e| generates(&e)) {
                        return Err(ForkError::BadEdit(format!(
                            "{edit}: agent {agent:?} made no model call that generates text in the source run ({})",
                            called(&events, agent)
                        )));
                    }
                }
                _ => {}
            }
        }
        Ok(self)
    }
}

/// `agent`'s model calls in `events`.
fn model_calls<'a>(events: &'a [Event], agent: &'a str) -> impl Iterator<Item = &'a Event> {
    events.iter().filter(move |e| e.agent_id == agent && e.kind == EventType::ModelCall)
}

/// What `agent`'s model calls were, for an error: `openai/v1/chat/completions (3), ...`, or
/// that it made none.
fn called(events: &[Event], agent: &str) -> String {
    let mut seen: Vec<(String, usize)> = Vec::new();
    for e in model_calls(events, agent) {
        let (provider, name) =
            (e.model.as_ref().map_or("?", |m| m.provider.as_str()), e.name.as_deref().unwrap_or("?"));
        // A proxied call's name starts with its provider already (`openai/v1/embeddings`).
        let what = match name.starts_with(provider) {
            true => name.to_owned(),
            false => format!("{provider} {name}"),
        };
        match seen.iter_mut().find(|(w, _)| *w == what) {
            Some((_, n)) => *n += 1,
            None => seen.push((what, 1)),
        }
    }
    match seen.is_empty() {
        true => "it made none".into(),
        false => seen.iter().map(|(w, n)| format!("{w} ({n})")).collect::<Vec<_>>().join(", "),
    }
}

/// Whether a fork's `model:` edit to `name` applies to a model call to `provider`'s `endpoint`:
/// an agent's calls may go to several providers and endpoints (every call of a program
/// recorded through the proxy is agent `default`'s), and an edit changes the ones the new model
/// can serve. A name that says its provider (`claude…`, `gpt…`) applies to that provider's
/// calls only; an embedding model (a name holding `embedding`) to embedding calls only, any
/// other model to the calls that aren't.
pub(crate) fn model_edit_applies(name: &str, provider: &str, endpoint: &str) -> bool {
    let provider_fits = provider_of(name).is_none_or(|p| p == provider);
    provider_fits && name.to_ascii_lowercase().contains("embedding") == embeds(endpoint)
}

/// Whether a fork's `param:` edit (sampling parameters) applies to a call of `endpoint`: the
/// calls that generate text, not embeddings.
pub(crate) fn param_edit_applies(endpoint: &str) -> bool {
    !embeds(endpoint)
}

/// Whether `endpoint` (`embeddings`, `v1/embeddings`, `chat.completions`...) makes embeddings.
fn embeds(endpoint: &str) -> bool {
    endpoint.contains("embeddings")
}

/// The provider a model name obviously belongs to, when it does.
fn provider_of(model: &str) -> Option<&'static str> {
    let m = model.to_ascii_lowercase();
    if m.starts_with("claude") {
        Some("anthropic")
    } else if m.starts_with("gpt")
        || m.starts_with("o1")
        || m.starts_with("o3")
        || m.starts_with("o4")
        || m.starts_with("text-embedding")
    {
        Some("openai")
    } else {
        None
    }
}

/// Swaps that pass one by one can still compose into an order no schedule hears (QA32 D2:
/// swap:2,4 then swap:4,6 heard x's second message before its first): applied together, as the
/// fork applies them, each receiver must still hear each sender's messages in the order sent.
fn check_composed_swaps(events: &[Event], swaps: &[(u64, u64)]) -> Result<(), ForkError> {
    // Each delivery's position and the message it carries: (sender, send seq).
    let mut carried: HashMap<u64, Option<(String, u64)>> = events
        .iter()
        .filter(|e| e.kind == EventType::Deliver)
        .map(|e| {
            let message = e.message.as_ref().filter(|m| !m.timed_out);
            (e.seq, message.and_then(|m| Some((m.from.clone()?, e.causal_parent?))))
        })
        .collect();
    for &(a, b) in swaps {
        let (ma, mb) = (carried.remove(&a).flatten(), carried.remove(&b).flatten());
        carried.insert(a, mb);
        carried.insert(b, ma);
    }
    let mut last: HashMap<(&str, &str), (u64, u64)> = HashMap::new();
    for e in events.iter().filter(|e| e.kind == EventType::Deliver) {
        let Some(Some((from, send))) = carried.get(&e.seq) else { continue };
        if let Some(&(earlier, at)) = last.get(&(e.agent_id.as_str(), from.as_str())) {
            if earlier > *send {
                let all: Vec<String> = swaps.iter().map(|(a, b)| format!("swap:{a},{b}")).collect();
                return Err(ForkError::BadEdit(format!(
                    "{}: together they have {} hear {from}'s message sent at seq {send} (delivered at {}) \
                     after the one sent at seq {earlier} (delivered at {at}), and one sender's messages \
                     arrive in the order it sent them: no schedule hears them so",
                    all.join(" "),
                    e.agent_id,
                    e.seq,
                )));
            }
        }
        last.insert((e.agent_id.as_str(), from.as_str()), (*send, e.seq));
    }
    Ok(())
}

/// If `from` causally depends on event `target` (following causal parents and each agent's
/// earlier events), the chain from `from` back to `target`.
fn causal_path(events: &[Event], from: u64, target: u64) -> Option<Vec<u64>> {
    let get = |s: u64| events.get(s.wrapping_sub(1) as usize);
    // Walk causal parents, and through each agent's own history (an agent's step happens after
    // its earlier deliveries). Depth-first over predecessors with seq >= target.
    let mut stack = vec![(from, vec![from])];
    let mut seen = HashSet::new();
    while let Some((seq, path)) = stack.pop() {
        if seq == target {
            return Some(path);
        }
        if seq < target || !seen.insert(seq) {
            continue;
        }
        let Some(e) = get(seq) else { continue };
        if let Some(p) = e.causal_parent {
            let mut next = path.clone();
            next.push(p);
            stack.push((p, next));
        }
        if let Some(prev) = events[..(seq - 1) as usize].iter().rev().find(|x| x.agent_id == e.agent_id) {
            let mut next = path.clone();
            next.push(prev.seq);
            stack.push((prev.seq, next));
        }
    }
    None
}

/// The fork point when none is given: the smallest seq the edits name, a `message` edit naming
/// a delivery counting as its send (the message is edited where it is sent), or 1.
pub fn default_at(store: &dyn Store, source: &str, edits: &[Edit]) -> StoreResult<u64> {
    let mut at = retrace_core::edit::default_fork_point(edits);
    for edit in edits {
        if let Edit::Message { seq, .. } = edit {
            let Ok(e) = store.event(source, *seq) else { continue }; // validation names it
            if let (EventType::Deliver, Some(send)) = (e.kind, e.causal_parent) {
                at = at.min(send);
            }
        }
    }
    Ok(at)
}

fn all_events(store: &dyn Store, run: &str) -> StoreResult<Vec<Event>> {
    let mut events = Vec::new();
    let mut pages = RunEvents::new(store, run)?;
    while let Some(page) = pages.next_page()? {
        events.extend(page);
    }
    Ok(events)
}
