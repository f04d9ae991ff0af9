//! The replay envelope: one event per agent step, every field of SPEC §2.
//!
//! Every field the contract names is always serialized (as `null` when absent), so an event line
//! has one shape forever. Fields added after format 1 must be optional and skipped when absent,
//! so that old events keep their hashes.
mod canonical_form;

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::canonical::CanonError;
use crate::chain;
use crate::digest::Digest;

/// What kind of step an event records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    /// A call to a language model.
    ModelCall,
    /// A call to a tool.
    ToolCall,
    /// A side effect about to run (appended, acknowledged, before the live call).
    Intent,
    /// A message sent to another agent.
    Send,
    /// The moment an agent took a message (or its `recv` timed out).
    Deliver,
    /// A read of the wall clock.
    Clock,
    /// A random value.
    Random,
    /// A read of an environment variable.
    Env,
    /// A decision the agent made.
    Decision,
    /// A person's answer for an intent whose completion was never recorded.
    Resolution,
    /// The outcome of an approval held by the autonomy policy.
    Approval,
}

impl EventType {
    /// Every type, in a fixed order.
    pub const ALL: [EventType; 11] = [
        EventType::ModelCall,
        EventType::ToolCall,
        EventType::Intent,
        EventType::Send,
        EventType::Deliver,
        EventType::Clock,
        EventType::Random,
        EventType::Env,
        EventType::Decision,
        EventType::Resolution,
        EventType::Approval,
    ];

    /// The wire name, e.g. `model_call`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::ModelCall => "model_call",
            EventType::ToolCall => "tool_call",
            EventType::Intent => "intent",
            EventType::Send => "send",
            EventType::Deliver => "deliver",
            EventType::Clock => "clock",
            EventType::Random => "random",
            EventType::Env => "env",
            EventType::Decision => "decision",
            EventType::Resolution => "resolution",
            EventType::Approval => "approval",
        }
    }

    /// A small stable number for compact storage (never reuse or renumber).
    pub fn code(self) -> u8 {
        self as u8 + 1
    }

    /// The inverse of [`EventType::code`].
    pub fn from_code(code: u8) -> Option<EventType> {
        EventType::ALL.get(usize::from(code).checked_sub(1)?).copied()
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("unknown event type {s:?}"))
    }
}

/// Where a step's output came from in this run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Produced by a live call.
    #[default]
    Live,
    /// Served from the recorded log.
    Recorded,
    /// Served from the LLM or tool cache.
    CacheHit,
    /// A side effect that was not executed; the output says what would have been done.
    DryRun,
}

/// A tool's determinism class (SPEC §1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolClass {
    /// Same input, same output: cached forever per tool version.
    Deterministic,
    /// Cached for `ttl_s` seconds.
    TimeBound,
    /// Never executed by replay or fork.
    SideEffect,
}

impl ToolClass {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolClass::Deterministic => "deterministic",
            ToolClass::TimeBound => "time_bound",
            ToolClass::SideEffect => "side_effect",
        }
    }
}

impl FromStr for ToolClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "deterministic" => Ok(ToolClass::Deterministic),
            "time_bound" => Ok(ToolClass::TimeBound),
            "side_effect" => Ok(ToolClass::SideEffect),
            _ => Err(format!("unknown tool class {s:?} (want deterministic, time_bound or side_effect)")),
        }
    }
}

/// The model a `model_call` asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRef {
    /// `openai`, `anthropic`, ...
    pub provider: String,
    /// The name the program asked for (often an alias).
    pub name: String,
    /// The pinned snapshot the provider reported, or null when only an alias is known.
    pub snapshot: Option<String>,
}

/// A prompt template version and the digest of its text, e.g. `reviewer@v14`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptRef {
    /// `name@version`.
    pub id: String,
    /// Digest of the template text.
    pub digest: Digest,
}

/// The tool a `tool_call` or `intent` used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolRef {
    /// Tool name.
    pub name: String,
    /// Tool version; part of the key.
    pub version: String,
    /// Determinism class.
    pub class: ToolClass,
    /// Cache lifetime for `time_bound` tools.
    pub ttl_s: Option<u64>,
}

/// A message's envelope for `send` and `deliver`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageRef {
    /// Sending agent.
    pub from: Option<String>,
    /// Receiving agent.
    pub to: Option<String>,
    /// Application-level kind of the message.
    pub kind: Option<String>,
    /// A `deliver` whose `recv` timed out: no message.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
}

/// A decision an agent took.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// What was decided (`approve`, `reject`, ...).
    pub action: String,
    /// What it applies to.
    pub target: Option<String>,
}

/// The outcome of an approval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalOutcome {
    /// Released by a person.
    Approved,
    /// Refused by the policy or a person.
    Refused,
    /// Nobody answered in time.
    TimedOut,
}

/// An `approval` event's payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// approved, refused or timed_out.
    pub outcome: ApprovalOutcome,
}

/// Tokens and cost of a model call.
///
/// `input_tokens` counts every prompt token, those the provider read from or wrote to its prompt
/// cache included (OpenAI counts them so; Anthropic reports them apart, and
/// [`crate::provider_usage`] adds them in). The two cache counts say how many of them were; they
/// are left out of the JSON when zero, so events recorded before they existed keep their digests.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, cached ones included.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Estimated cost in US dollars, from the price table.
    pub cost_usd: Option<f64>,
    /// Of `input_tokens`, those read from the provider's prompt cache (OpenAI `cached_tokens`,
    /// Anthropic `cache_read_input_tokens`), priced at the cache-read rate.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Of `input_tokens`, those written to the provider's prompt cache (Anthropic
    /// `cache_creation_input_tokens`), priced at the cache-write rate.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One step of one agent: the replay envelope (SPEC §2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The run this event belongs to (for inherited fork events: the source run).
    pub run_id: String,
    /// Dense, 1-based, in the order steps completed.
    pub seq: u64,
    /// The agent's Lamport clock at this event.
    pub lamport: u64,
    /// The agent that took the step.
    pub agent_id: String,
    /// The agent's role.
    pub role: Option<String>,
    /// What kind of step this is.
    #[serde(rename = "type")]
    pub kind: EventType,
    /// The step's name: tool name, model endpoint, recipient, variable name...; pairs steps in forks.
    pub name: Option<String>,
    /// The event that triggered this one; a `deliver` names its `send`.
    pub causal_parent: Option<u64>,
    /// The `deliver` events this agent consumed since its previous step.
    pub inbound: Vec<u64>,
    /// Digest of the canonical (masked, volatile-stripped) request.
    pub key: Digest,
    /// Blob of the masked request, byte for byte.
    pub request_ref: Option<Digest>,
    /// Blob of the recorded output, byte for byte.
    pub output_ref: Option<Digest>,
    /// Digest of the canonical output, for diffing.
    pub output_hash: Option<Digest>,
    /// The model asked for.
    pub model: Option<ModelRef>,
    /// Sampling parameters.
    pub params: Option<BTreeMap<String, serde_json::Value>>,
    /// The prompt template version in force.
    pub prompt_template: Option<PromptRef>,
    /// The tool used.
    pub tool: Option<ToolRef>,
    /// The message envelope of a send or deliver.
    pub message: Option<MessageRef>,
    /// A decision taken.
    pub decision: Option<Decision>,
    /// An approval outcome.
    pub approval: Option<Approval>,
    /// Tokens and cost.
    pub usage: Option<Usage>,
    /// Wall time the live call took.
    pub latency_ms: Option<u64>,
    /// Where the output came from in this run.
    pub source: Source,
    /// In a fork: the source step this one was matched or paired with.
    pub origin_seq: Option<u64>,
    /// The step failed: its recorded error, which replay raises again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Hash of the previous event of the chain, or null for the first.
    pub prev: Option<Digest>,
    /// digest(prev + canonical event without `hash`).
    pub hash: Digest,
}

/// An event's canonical form without `hash`, missing only `seq` and `prev`: the members before
/// `"prev"`, between `"prev"` and `"seq"`, and after `"seq"` ([`Event::unsealed`]).
#[derive(Clone, Debug)]
pub struct Unsealed {
    low: Vec<u8>,
    mid: Vec<u8>,
    high: Vec<u8>,
}

impl Unsealed {
    /// The chain hash of the event with `seq`, after `prev`: `chain::link` of its canonical form.
    pub fn hash(&self, seq: u64, prev: Option<&Digest>) -> Digest {
        let mut text = [0; 7 + 64];
        let prev_text = prev.map(|d| d.text(&mut text));
        let mut canonical = Vec::with_capacity(self.low.len() + self.mid.len() + self.high.len() + 120);
        canonical.push(b'{');
        let mut member = |bytes: &[u8]| {
            if bytes.is_empty() {
                return;
            }
            if canonical.len() > 1 {
                canonical.push(b',');
            }
            canonical.extend_from_slice(bytes);
        };
        member(&self.low);
        let mut scratch = Vec::with_capacity(16 + 7 + 64);
        scratch.extend_from_slice(b"\"prev\":");
        match prev_text {
            Some(text) => {
                scratch.push(b'"');
                scratch.extend_from_slice(text.as_bytes());
                scratch.push(b'"');
            }
            None => scratch.extend_from_slice(b"null"),
        }
        member(&scratch);
        member(&self.mid);
        scratch.clear();
        scratch.extend_from_slice(b"\"seq\":");
        crate::canonical::write_u64(seq, &mut scratch);
        member(&scratch);
        member(&self.high);
        canonical.push(b'}');
        chain::link(prev, &canonical)
    }
}

impl Event {
    /// A blank event of `kind` with the zero digest in `key` and `hash`; fill it, then [`Event::seal`].
    pub fn new(run_id: impl Into<String>, agent_id: impl Into<String>, kind: EventType) -> Event {
        let zero = Digest::from_bytes([0; 32]);
        Event {
            run_id: run_id.into(),
            seq: 0,
            lamport: 0,
            agent_id: agent_id.into(),
            role: None,
            kind,
            name: None,
            causal_parent: None,
            inbound: Vec::new(),
            key: zero,
            request_ref: None,
            output_ref: None,
            output_hash: None,
            model: None,
            params: None,
            prompt_template: None,
            tool: None,
            message: None,
            decision: None,
            approval: None,
            usage: None,
            latency_ms: None,
            source: Source::Live,
            origin_seq: None,
            error: None,
            prev: None,
            hash: zero,
        }
    }

    /// The canonical JSON of this event without its `hash` field: what the chain hashes.
    pub fn canonical_without_hash(&self) -> Result<Vec<u8>, CanonError> {
        let mut out = Vec::with_capacity(1024);
        canonical_form::write(self, false, &mut out)?;
        Ok(out)
    }

    /// [`Event::canonical_without_hash`] through a `serde_json::Value` of the whole event: the
    /// definition the direct writer is held to.
    #[cfg(test)]
    fn canonical_without_hash_via_value(&self) -> Result<Vec<u8>, CanonError> {
        let mut value = serde_json::to_value(self).expect("an event always serializes");
        if let serde_json::Value::Object(map) = &mut value {
            map.remove("hash");
        }
        crate::canonical::canonical_value(&value)
    }

    /// The canonical JSON of the whole event, as written in exports.
    pub fn canonical(&self) -> Result<Vec<u8>, CanonError> {
        let mut out = Vec::with_capacity(1024);
        self.write_canonical(&mut out)?;
        Ok(out)
    }

    /// Appends [`Event::canonical`] to `out`.
    pub fn write_canonical(&self, out: &mut Vec<u8>) -> Result<(), CanonError> {
        canonical_form::write(self, true, out).map(|_| ())
    }

    /// The hash this event should carry given its `prev`.
    pub fn compute_hash(&self) -> Result<Digest, CanonError> {
        Ok(chain::link(self.prev.as_ref(), &self.canonical_without_hash()?))
    }

    /// Appends [`Event::canonical`] to `out` and returns [`Event::compute_hash`], hashing the
    /// bytes just written but the `hash` member: what an export checks of each event it writes,
    /// for one write of its canonical form.
    pub fn write_canonical_hashing(&self, out: &mut Vec<u8>) -> Result<Digest, CanonError> {
        let start = out.len();
        let [_, _, hash] = canonical_form::write(self, true, out)?;
        let mut w = crate::digest::DigestWriter::new();
        if let Some(prev) = &self.prev {
            w.update(prev.to_string().as_bytes());
        }
        w.update(&out[start..hash.start]);
        w.update(&out[hash.end..]);
        Ok(w.finish())
    }

    /// [`Event::compute_hash`], writing the canonical form into `scratch` (cleared first): for
    /// a reader checking every event of a run, which reuses one buffer.
    pub fn compute_hash_with(&self, scratch: &mut Vec<u8>) -> Result<Digest, CanonError> {
        scratch.clear();
        canonical_form::write(self, false, scratch)?;
        Ok(chain::link(self.prev.as_ref(), scratch))
    }

    /// Sets `prev` and computes `hash`.
    pub fn seal(&mut self, prev: Option<Digest>) -> Result<(), CanonError> {
        let unsealed = self.unsealed()?;
        self.seal_with(&unsealed, self.seq, prev);
        Ok(())
    }

    /// This event's canonical form without `hash`, with `seq` and `prev` left open: the costly
    /// part of [`Event::seal`], done before a sequencer knows the seq, so that its critical
    /// section only hashes ([`Event::seal_with`]).
    pub fn unsealed(&self) -> Result<Unsealed, CanonError> {
        let mut canonical = Vec::with_capacity(1024);
        let [prev, seq, _] = canonical_form::write(self, false, &mut canonical)?;
        // The members around `prev` and `seq`, without the commas that joined them.
        let part = |range: Range<usize>| {
            let bytes = &canonical[range];
            let bytes = bytes.strip_prefix(b",").unwrap_or(bytes);
            bytes.strip_suffix(b",").unwrap_or(bytes).to_vec()
        };
        Ok(Unsealed {
            low: part(1..prev.start),
            mid: part(prev.end..seq.start),
            high: part(seq.end..canonical.len() - 1),
        })
    }

    /// Sets `seq` and `prev` and the `hash` they give with `unsealed` (this event's
    /// [`Event::unsealed`], taken while nothing else about it changed).
    pub fn seal_with(&mut self, unsealed: &Unsealed, seq: u64, prev: Option<Digest>) {
        self.seq = seq;
        self.prev = prev;
        self.hash = unsealed.hash(seq, prev.as_ref());
    }

    /// A one-line label: `tool_call sql.query`.
    pub fn label(&self) -> String {
        match &self.name {
            Some(name) => format!("{} {name}", self.kind),
            None => self.kind.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events of every shape the log holds: blank, every optional field set (nested objects
    /// holding `prev` and `seq` keys of their own), a failure, a fork step.
    fn shapes() -> Vec<Event> {
        let blank = Event::new("run-1", "a", EventType::Clock);
        let mut full = Event::new("run-ü", "agent \"q\"", EventType::ModelCall);
        full.lamport = 7;
        full.role = Some("planner".into());
        full.name = Some("chat.completions".into());
        full.causal_parent = Some(3);
        full.inbound = vec![2, 3];
        full.key = Digest::of(b"key");
        full.request_ref = Some(Digest::of(b"request"));
        full.output_ref = Some(Digest::of(b"output"));
        full.output_hash = Some(Digest::of(b"output"));
        full.model = Some(ModelRef { provider: "openai".into(), name: "m".into(), snapshot: None });
        full.params = Some(BTreeMap::from([
            ("prev".to_owned(), serde_json::json!(null)),
            ("seq".to_owned(), serde_json::json!({"seq": 1.5, "prev": [1, "x"]})),
        ]));
        full.prompt_template = Some(PromptRef { id: "p@v1".into(), digest: Digest::of(b"tpl") });
        full.tool = Some(ToolRef {
            name: "t".into(),
            version: "1".into(),
            class: ToolClass::TimeBound,
            ttl_s: Some(9),
        });
        full.message = Some(MessageRef { from: Some("a".into()), to: None, kind: None, timed_out: true });
        full.decision = Some(Decision { action: "approve".into(), target: None });
        full.approval = Some(Approval { outcome: ApprovalOutcome::TimedOut });
        full.usage = Some(Usage {
            input_tokens: 10,
            output_tokens: 2,
            cost_usd: Some(0.25),
            cache_read_tokens: 6,
            cache_write_tokens: 3,
        });
        full.latency_ms = Some(12);
        let mut failed = Event::new("r", "b", EventType::ToolCall);
        failed.error = Some("boom \u{1F4A5} \"prev\":null,}]\\\"seq\":1\n".into());
        let mut forked = Event::new("f", "c", EventType::Send);
        forked.source = Source::Recorded;
        forked.origin_seq = Some(40);
        vec![blank, full, failed, forked]
    }

    /// A random event: every optional field present or not, strings with escapes, quotes,
    /// controls and astral characters, integers past 2^53, doubles in nested objects.
    fn arbitrary_event() -> impl proptest::strategy::Strategy<Value = Event> {
        use proptest::prelude::*;
        let text = || "[a-z\\\"\u{0}-\u{1f}\u{7f}\u{e9}\u{2028}\u{1F4A5}{}:,]{0,10}";
        let kinds = [EventType::ModelCall, EventType::Send, EventType::Deliver, EventType::Clock];
        let sources = [Source::Live, Source::Recorded, Source::CacheHit, Source::DryRun];
        (
            (text(), text(), proptest::option::of(text()), proptest::option::of(text()), 0..4usize),
            (
                any::<u64>(),
                any::<u64>(),
                proptest::option::of(any::<u64>()),
                proptest::collection::vec(any::<u64>(), 0..4),
            ),
            (any::<[u8; 4]>(), any::<u8>()),
            (
                proptest::option::of(text()),
                proptest::option::of(any::<u64>()),
                proptest::option::of(any::<u64>()),
                0..4usize,
            ),
            (
                proptest::option::of((text(), any::<i64>(), any::<f64>())),
                proptest::option::of((text(), proptest::option::of(text()), any::<bool>())),
            ),
            proptest::option::of((
                (any::<u64>(), any::<u64>(), proptest::option::of(-1e300f64..1e300)),
                (0..3u64, any::<u64>()),
            )),
        )
            .prop_map(
                move |(
                    (run, agent, role, name, kind),
                    (seq, lamport, parent, inbound),
                    (seed, set),
                    (error, latency, origin, source),
                    (params, message),
                    usage,
                )| {
                    let mut e = Event::new(run, agent, kinds[kind]);
                    let digest = |i: u8| Digest::of(&[seed[usize::from(i) % 4], i]);
                    let on = |bit: u8| set & (1 << bit) != 0;
                    e.seq = seq;
                    e.lamport = lamport;
                    e.role = role;
                    e.name = name;
                    e.causal_parent = parent;
                    e.inbound = inbound;
                    e.key = digest(0);
                    e.request_ref = on(0).then(|| digest(1));
                    e.output_ref = on(1).then(|| digest(2));
                    e.output_hash = on(2).then(|| digest(3));
                    e.prev = on(3).then(|| digest(4));
                    e.hash = digest(5);
                    e.model = on(4).then(|| ModelRef {
                        provider: "p".into(),
                        name: e.agent_id.clone(),
                        snapshot: e.role.clone(),
                    });
                    e.params = params.map(|(k, i, f)| {
                        BTreeMap::from([
                            (k, serde_json::json!({"seq": i, "prev": [f, null]})),
                            ("z".into(), serde_json::json!(f)),
                        ])
                    });
                    e.tool = on(5).then(|| ToolRef {
                        name: "t".into(),
                        version: "1".into(),
                        class: ToolClass::TimeBound,
                        ttl_s: e.latency_ms,
                    });
                    e.message = message.map(|(from, to, timed_out)| MessageRef {
                        from: Some(from),
                        to,
                        kind: None,
                        timed_out,
                    });
                    e.decision = on(6).then(|| Decision { action: "a".into(), target: e.name.clone() });
                    e.approval = on(7).then_some(Approval { outcome: ApprovalOutcome::Refused });
                    e.usage = usage.map(|((input_tokens, output_tokens, cost_usd), (cached, n))| Usage {
                        input_tokens,
                        output_tokens,
                        cost_usd,
                        // Absent, then one or both of the cache counts.
                        cache_read_tokens: if cached >= 1 { n } else { 0 },
                        cache_write_tokens: if cached == 2 { n / 2 } else { 0 },
                    });
                    e.latency_ms = latency;
                    e.origin_seq = origin;
                    e.source = sources[source];
                    e.error = error;
                    e
                },
            )
    }

    proptest::proptest! {
        /// The direct writer gives the bytes of the definition (the event as a
        /// `serde_json::Value`, then canonical JSON), with and without `hash`, and the unsealed
        /// form seals to the hash of those bytes.
        #[test]
        fn the_direct_writer_matches_the_definition(event in arbitrary_event()) {
            let without = event.canonical_without_hash().unwrap();
            proptest::prop_assert_eq!(&without, &event.canonical_without_hash_via_value().unwrap());
            let value = serde_json::to_value(&event).unwrap();
            proptest::prop_assert_eq!(event.canonical().unwrap(), crate::canonical::canonical_value(&value).unwrap());
            let mut sealed = event.clone();
            sealed.seal_with(&event.unsealed().unwrap(), event.seq, event.prev);
            proptest::prop_assert_eq!(sealed.hash, chain::link(event.prev.as_ref(), &without));
            let mut scratch = b"left over".to_vec();
            proptest::prop_assert_eq!(sealed.hash, event.compute_hash_with(&mut scratch).unwrap());
            let mut line = b"earlier lines\n".to_vec();
            proptest::prop_assert_eq!(sealed.hash, event.write_canonical_hashing(&mut line).unwrap());
            proptest::prop_assert_eq!(&line[14..], &event.canonical().unwrap()[..]);
        }
    }

    proptest::proptest! {
        /// Strings of JSON punctuation, escapes and the two member names, in the fields before,
        /// between and after `prev` and `seq`, never mislead the scan for those members.
        #[test]
        fn the_unsealed_form_survives_strings_that_look_like_members(
            texts in proptest::collection::vec("[\\\\\"{}\\[\\],:prevsq\u{0}\n\u{1F4A5}]{0,12}", 4),
        ) {
            let mut event = Event::new("run", texts[0].as_str(), EventType::ToolCall);
            event.name = Some(texts[1].clone());
            event.error = Some(texts[2].clone());
            event.role = Some(texts[3].clone());
            let unsealed = event.unsealed().unwrap();
            let mut sealed = event.clone();
            sealed.seal_with(&unsealed, 9, Some(Digest::of(b"p")));
            event.seq = 9;
            event.seal(Some(Digest::of(b"p"))).unwrap();
            proptest::prop_assert_eq!(sealed, event);
        }
    }

    #[test]
    fn sealing_from_the_unsealed_form_hashes_the_canonical_event() {
        for event in shapes() {
            let unsealed = event.unsealed().unwrap();
            for (seq, prev) in [(0, None), (1, Some(Digest::of(b"p"))), (u64::MAX, Some(Digest::of(b"q")))] {
                let mut sealed = event.clone();
                sealed.seal_with(&unsealed, seq, prev);
                let mut reference = event.clone();
                reference.seq = seq;
                reference.prev = prev;
                assert_eq!(
                    reference.canonical_without_hash().unwrap(),
                    reference.canonical_without_hash_via_value().unwrap(),
                    "{event:?} at {seq}"
                );
                assert_eq!(sealed.hash, reference.compute_hash().unwrap(), "{event:?} at {seq}");
                reference.seal(prev).unwrap();
                assert_eq!(sealed, reference);
            }
        }
    }
}
