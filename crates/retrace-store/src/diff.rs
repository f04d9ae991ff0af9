//! Two runs compared step by step (`retrace diff`, SPEC §4): which steps are the same, changed,
//! or only in one run; which decisions moved; what each run cost in tokens and dollars.
//!
//! **Alignment.** When one run is a fork of the other, the fork's events say which source step
//! each corresponds to (`origin_seq`): the source's events before the fork point are inherited
//! (the same by construction), each later fork step pairs with the source step it names, and
//! source steps nothing names are only in the source. Any other two runs (unrelated runs,
//! sibling forks) are paired by the rule of SPEC §7 with the older run as source: per agent,
//! identical keys in recorded order, then each leftover step of the newer run with the older
//! run's earliest leftover step of the same type and name. Deliveries pair per agent in order.
//!
//! **Same or changed.** A pair is the same when the keys are equal (the same request) and so
//! are the output hashes (or neither step has an output); else it is changed. Two model calls
//! asked the same whose outputs differ only in what a provider writes anew on every response
//! (ids, creation times, headers, a stream's timings) are the same too (`diff/answer.rs`): their
//! outputs are read to tell. A delivery's key names only
//! its sender, so a pair of deliveries is the same only if the sends they carry are aligned
//! with each other and the same as well (or are one inherited send). Hashes are compared first:
//! output blobs are read only for the changed steps shown, to print a short line diff.
//!
//! **Cost.** A run's cost is the usage of its own events whose output came from a live call;
//! events served as `recorded` or `cache_hit` cost nothing. A fork also reports what it saved:
//! the source's live usage on the steps the fork served as recorded or from the cache, and,
//! apart, the source's live usage on the events before the fork point, which it inherited.
//!
//! Reading is linear in the two runs' events, a page at a time; memory is about 200 bytes per
//! event.
mod align;
mod answer;
mod load;
mod outcome;
mod text;

use std::collections::HashMap;

use retrace_core::envelope::Usage;
use retrace_core::run::{RunMeta, RunMode, RunStatus};
use retrace_core::{Digest, EventType};
use serde::Serialize;

use self::align::Aligned;
use self::load::{Loaded, Names, Step};
use crate::{Store, StoreResult};

/// What to show of the differences (the counts always cover every step).
#[derive(Clone, Debug)]
pub struct DiffOptions {
    /// At most this many changed steps, and this many steps only in A and only in B, are listed.
    pub limit: usize,
    /// At most this many lines of output diff per changed step.
    pub max_diff_lines: usize,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions { limit: 20, max_diff_lines: 40 }
    }
}

/// One of the two runs compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Which {
    /// The first run named.
    A,
    /// The second run named.
    B,
}

/// How the two runs' steps were aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlignedBy {
    /// One run is a fork of the other: by the fork's `origin_seq`.
    OriginSeq,
    /// Unrelated runs or sibling forks: by key, then by type and name (SPEC §7).
    Pairing,
}

/// The alignment used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Alignment {
    /// By `origin_seq` or by pairing.
    pub by: AlignedBy,
    /// The run acting as source: the fork's source, or the older run.
    pub source: Which,
    /// The fork point, when aligned by `origin_seq`.
    pub fork_at: Option<u64>,
}

/// Tokens and dollars over some steps. In JSON, `cost_usd` of no steps is 0, not null (null
/// says steps were counted whose cost is unknown).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tokens {
    /// How many model calls were counted: those with a usage, and those without one.
    pub steps: u64,
    /// Of them, the model calls whose answer reported no usage (a stream asked without
    /// `stream_options.include_usage`): their tokens are unknown, not 0 (QA35 D2: a live call
    /// without usage was counted nowhere, and a fork read as having made no live call).
    pub steps_without_usage: u64,
    /// Sum of `usage.input_tokens` (prompt tokens, cached ones included).
    pub input_tokens: u64,
    /// Sum of `usage.output_tokens`.
    pub output_tokens: u64,
    /// Sum of `usage.cost_usd`, or `None` when no counted step had a cost.
    pub cost_usd: Option<f64>,
    /// Sum of `usage.cache_read_tokens`: prompt tokens the provider's prompt cache served.
    pub cache_read_tokens: u64,
    /// Sum of `usage.cache_write_tokens`: prompt tokens written to the provider's prompt cache.
    pub cache_write_tokens: u64,
}

impl Serialize for Tokens {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("Tokens", 7)?;
        s.serialize_field("steps", &self.steps)?;
        s.serialize_field("steps_without_usage", &self.steps_without_usage)?;
        s.serialize_field("input_tokens", &self.input_tokens)?;
        s.serialize_field("output_tokens", &self.output_tokens)?;
        // To a millionth of a cent, as each event's cost is: a sum shows no binary noise
        // (QA32 S3: 0.014156000000000002).
        let cost = self.cost_usd.map(|c| (c * 1e8).round() / 1e8);
        s.serialize_field("cost_usd", &cost.or((self.steps == 0).then_some(0.0)))?;
        s.serialize_field("cache_read_tokens", &self.cache_read_tokens)?;
        s.serialize_field("cache_write_tokens", &self.cache_write_tokens)?;
        s.end()
    }
}

impl Tokens {
    fn add(&mut self, usage: &Usage) {
        self.steps += 1;
        self.input_tokens += usage.input_tokens;
        self.output_tokens += usage.output_tokens;
        self.cache_read_tokens += usage.cache_read_tokens;
        self.cache_write_tokens += usage.cache_write_tokens;
        if let Some(cost) = usage.cost_usd {
            *self.cost_usd.get_or_insert(0.0) += cost;
        }
    }

    /// Counts a model call whose answer reported no usage.
    fn add_unmetered(&mut self) {
        self.steps += 1;
        self.steps_without_usage += 1;
    }
}

/// One run, as compared.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSide {
    /// The run's id.
    pub id: String,
    /// Its name.
    pub name: Option<String>,
    /// record, replay or fork.
    pub mode: RunMode,
    /// Its status.
    pub status: RunStatus,
    /// When it started (Unix milliseconds).
    pub started_at_ms: u64,
    /// How many events it has, inherited ones included.
    pub events: u64,
    /// The run it forks or replays.
    pub source_run: Option<String>,
    /// Its fork point.
    pub fork_at: Option<u64>,
    /// The edits that made it, as a fork stores them (empty for any other run).
    pub edits: Vec<String>,
    /// Usage of its own events that ran live.
    pub live: Tokens,
    /// When it is the fork of the other run: the source's live usage on the steps it served as
    /// recorded or from the cache.
    pub saved: Option<Tokens>,
    /// When it is the fork of the other run: the source's live usage on the events it inherits.
    pub inherited: Option<Tokens>,
}

/// How many steps fell in each class. `same + changed + only_in_a` is A's event count, and
/// likewise for B.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Pairs with the same request and output (inherited events included).
    pub same: u64,
    /// Pairs whose requests or outputs differ.
    pub changed: u64,
    /// Steps of A nothing in B corresponds to.
    pub only_in_a: u64,
    /// Steps of B nothing in A corresponds to.
    pub only_in_b: u64,
}

/// A pair of corresponding steps whose requests or outputs differ.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChangedStep {
    /// The step's seq in A.
    pub seq_a: u64,
    /// The corresponding step's seq in B.
    pub seq_b: u64,
    /// The agent (of A's step).
    pub agent: String,
    /// A's step, e.g. `model_call /v1/chat/completions`.
    pub label_a: String,
    /// B's step.
    pub label_b: String,
    /// A's output hash.
    pub output_a: Option<Digest>,
    /// B's output hash.
    pub output_b: Option<Digest>,
    /// A unified line diff of the two outputs (of the two requests when neither step has an
    /// output; of the sends' requests, the messages, for two deliveries), at most [`DiffOptions::max_diff_lines`] lines; `None` when there is nothing to read.
    pub diff: Option<String>,
    /// When both steps have outputs and their requests differ too: the diff of the requests,
    /// what made the outputs differ (a changed prompt, say), in the same form as `diff`.
    pub request_diff: Option<String>,
}

/// A step only one run has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoneStep {
    /// Its seq in its run.
    pub seq: u64,
    /// Its agent.
    pub agent: String,
    /// Its label.
    pub label: String,
}

/// A decision that stands differently at the end of the two runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MovedDecision {
    /// The deciding agent.
    pub agent: String,
    /// What the decision applies to.
    pub target: Option<String>,
    /// The agent's last action on the target in A, `None` when it decided nothing on it.
    pub a: Option<String>,
    /// The same in B.
    pub b: Option<String>,
}

/// Everything `retrace diff` reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunDiff {
    /// The first run.
    pub a: RunSide,
    /// The second run.
    pub b: RunSide,
    /// How steps were aligned.
    pub alignment: Alignment,
    /// Every step, counted.
    pub counts: Counts,
    /// The first changed steps (by A's seq), at most [`DiffOptions::limit`].
    pub changed: Vec<ChangedStep>,
    /// The first steps only in A, at most [`DiffOptions::limit`].
    pub only_in_a: Vec<LoneStep>,
    /// The first steps only in B, at most [`DiffOptions::limit`].
    pub only_in_b: Vec<LoneStep>,
    /// Decisions that moved, by agent and target.
    pub decisions: Vec<MovedDecision>,
    /// What to know to read the rest (a replay run's steps are its source's, or it has none).
    pub notes: Vec<String>,
}

/// Compares runs `a` and `b` (exact ids); `NotFound` when either, or a fork's source, is missing.
pub fn diff_runs(store: &dyn Store, a: &str, b: &str, options: &DiffOptions) -> StoreResult<RunDiff> {
    let (meta_a, meta_b) = (store.run(a)?, store.run(b)?);
    let alignment = choose_alignment(&meta_a, &meta_b);
    let (source_meta, other_meta) = match alignment.source {
        Which::A => (meta_a, meta_b),
        Which::B => (meta_b, meta_a),
    };
    let mut names = Names::default();
    let mut notes = Vec::new();
    let source_name = if alignment.source == Which::A { "A" } else { "B" };
    let other_name = if alignment.source == Which::A { "B" } else { "A" };
    let source = load_side(store, source_meta, 1, &mut names, source_name, &mut notes)?;
    let other =
        load_side(store, other_meta, alignment.fork_at.unwrap_or(1), &mut names, other_name, &mut notes)?;
    notes.sort();
    let aligned = match alignment.fork_at {
        Some(at) => align::by_origin(&source, &other, at),
        None => align::by_pairing(&source, &other),
    };
    let Aligned { mut pairs, only_source, only_other, inherited } = aligned;
    let (run_a, run_b, only_a, only_b) = match alignment.source {
        Which::A => (&source, &other, only_source, only_other),
        Which::B => {
            pairs.iter_mut().for_each(|p| *p = (p.1, p.0));
            (&other, &source, only_other, only_source)
        }
    };
    let messages = Messages { a: run_a, b: run_b, inherited, b_of: pairs.iter().copied().collect() };
    let (mut same, mut changed) = (inherited, Vec::new());
    for (seq_a, seq_b) in pairs {
        match (run_a.step(seq_a), run_b.step(seq_b)) {
            (Some(x), Some(y)) if x.same_as(y) && messages.same(x, y) => same += 1,
            (Some(x), Some(y)) if same_model_answer(store, x, y) => same += 1,
            (Some(x), Some(y)) => changed.push((x, y)),
            _ => unreachable!("aligned seqs are loaded"),
        }
    }
    changed.sort_unstable_by_key(|(x, y)| (x.seq, y.seq));
    let counts = Counts {
        same,
        changed: changed.len() as u64,
        only_in_a: only_a.len() as u64,
        only_in_b: only_b.len() as u64,
    };
    let show = |run: &Loaded, seqs: &[u64]| -> Vec<LoneStep> {
        let steps = seqs.iter().take(options.limit).filter_map(|s| run.step(*s));
        steps
            .map(|s| LoneStep { seq: s.seq, agent: names.name(s.agent).to_owned(), label: s.label(&names) })
            .collect()
    };
    let changed = changed
        .iter()
        .take(options.limit)
        .map(|(x, y)| changed_step(store, &names, &messages, x, y, options))
        .collect();
    let (fork_a, fork_b) = match (alignment.fork_at, alignment.source) {
        (Some(at), Which::A) => (None, Some(at)),
        (Some(at), Which::B) => (Some(at), None),
        (None, _) => (None, None),
    };
    Ok(RunDiff {
        a: outcome::side(run_a, run_b, fork_a),
        b: outcome::side(run_b, run_a, fork_b),
        counts,
        changed,
        only_in_a: show(run_a, &only_a),
        only_in_b: show(run_b, &only_b),
        decisions: outcome::moved_decisions(run_a, run_b, fork_a.or(fork_b), alignment.source, &names),
        alignment,
        notes,
    })
}

/// Loads a run's steps from `first` on ([`load::load`]). A replay run stores only its outcome:
/// one that ended `ok` reproduced every step of its source, so its steps are its source's,
/// served from the recording (at no cost); one that didn't has no steps to compare, and its
/// decisions are those it stored. Either way `notes` says so, naming the run `name` (A or B).
fn load_side(
    store: &dyn Store,
    meta: RunMeta,
    first: u64,
    names: &mut Names,
    name: &str,
    notes: &mut Vec<String>,
) -> StoreResult<Loaded> {
    let Some(source) = meta.source_run.clone().filter(|_| meta.mode == RunMode::Replay) else {
        return load::load(store, meta, first, names);
    };
    if meta.status == RunStatus::Ok {
        let mut loaded = load::load(store, store.run(&source)?, first, names)?;
        for step in &mut loaded.steps {
            step.source = retrace_core::Source::Recorded;
        }
        loaded.meta = meta;
        notes.push(format!(
            "{name} is a replay of {source} that ended ok: it reproduced every step, so its steps are \
             {source}'s, served from the recording"
        ));
        return Ok(loaded);
    }
    let mut loaded = load::load(store, meta, first, names)?;
    loaded.decisions = loaded
        .meta
        .decisions
        .iter()
        .map(|d| load::DecisionStep {
            seq: first,
            agent: names.id(&d.agent),
            target: d.target.clone(),
            action: d.action.clone(),
        })
        .collect();
    let divergence = match &loaded.meta.divergence {
        Some(d) => {
            let code = d.get("code").and_then(|c| c.as_str()).unwrap_or("divergence");
            let at = d
                .get("seq")
                .and_then(serde_json::Value::as_u64)
                .map_or(String::new(), |s| format!(" at seq {s}"));
            format!(" ({code}{at})")
        }
        None => String::new(),
    };
    notes.push(format!(
        "{name} is a replay of {source} that ended {}{divergence}: a replay stores only its outcome, \
         so it has no steps to compare (its decisions are those it stored); diff {source} instead",
        loaded.meta.status
    ));
    Ok(loaded)
}

/// By `origin_seq` when one run is a fork of the other, else by pairing with the older (by
/// start time, then id) as source.
fn choose_alignment(a: &RunMeta, b: &RunMeta) -> Alignment {
    let fork_of = |fork: &RunMeta, source: &RunMeta| match (&fork.source_run, fork.fork_at) {
        (Some(s), Some(at)) if *s == source.id && fork.id != source.id => Some(at),
        _ => None,
    };
    if let Some(at) = fork_of(b, a) {
        return Alignment { by: AlignedBy::OriginSeq, source: Which::A, fork_at: Some(at) };
    }
    if let Some(at) = fork_of(a, b) {
        return Alignment { by: AlignedBy::OriginSeq, source: Which::B, fork_at: Some(at) };
    }
    let older = if (b.started_at_ms, &b.id) < (a.started_at_ms, &a.id) { Which::B } else { Which::A };
    Alignment { by: AlignedBy::Pairing, source: older, fork_at: None }
}

/// Two model calls asked the same whose outputs differ only where a provider writes something
/// new on every response (`diff/answer.rs`).
fn same_model_answer(store: &dyn Store, x: &Step, y: &Step) -> bool {
    match (x.kind, y.kind, x.output_ref, y.output_ref) {
        (EventType::ModelCall, EventType::ModelCall, Some(a), Some(b)) if x.key == y.key => {
            answer::same_answer(store, &a, &b)
        }
        _ => false,
    }
}

/// The messages deliveries carry: a delivery holds only who sent it, so a pair of deliveries
/// is the same only when the sends they carry correspond and are the same too.
struct Messages<'a> {
    a: &'a Loaded,
    b: &'a Loaded,
    /// Seqs up to this are a fork's inherited events: the same steps in both runs.
    inherited: u64,
    /// B's seq of each aligned step of A.
    b_of: HashMap<u64, u64>,
}

impl Messages<'_> {
    /// Whether `x` (of A) and `y` (of B) carry the same message, or are not deliveries.
    fn same(&self, x: &Step, y: &Step) -> bool {
        if x.kind != EventType::Deliver || y.kind != EventType::Deliver {
            return true;
        }
        match (x.causal_parent, y.causal_parent) {
            (None, None) => true,
            (Some(p), Some(q)) if p == q && p <= self.inherited => true,
            (Some(p), Some(q)) if self.b_of.get(&p) == Some(&q) => {
                matches!(self.sends(x, y), (Some(s), Some(t)) if s.same_as(t))
            }
            _ => false,
        }
    }

    /// The sends deliveries `x` (of A) and `y` (of B) carry, where loaded (a fork is loaded from
    /// its fork point: what it inherits is read from its source).
    fn sends(&self, x: &Step, y: &Step) -> (Option<&Step>, Option<&Step>) {
        (self.send(self.a, self.b, x.causal_parent), self.send(self.b, self.a, y.causal_parent))
    }

    fn send<'r>(&self, run: &'r Loaded, other: &'r Loaded, seq: Option<u64>) -> Option<&'r Step> {
        let seq = seq?;
        run.step(seq).or_else(|| other.step(seq).filter(|_| seq <= self.inherited))
    }
}

/// A changed pair, with the diff of its outputs (or requests, when neither has an output; or,
/// for deliveries, of the messages they carry).
fn changed_step(
    store: &dyn Store,
    names: &Names,
    messages: &Messages<'_>,
    x: &Step,
    y: &Step,
    options: &DiffOptions,
) -> ChangedStep {
    let has_output = |s: &Step| s.output_hash.is_some() || s.output_ref.is_some() || s.error.is_some();
    let (what, blob_a, blob_b) = if has_output(x) || has_output(y) {
        ("output", x.output_ref, y.output_ref)
    } else if x.kind == EventType::Deliver && y.kind == EventType::Deliver {
        let (s, t) = messages.sends(x, y);
        ("message", s.and_then(|s| s.request_ref), t.and_then(|t| t.request_ref))
    } else {
        ("request", x.request_ref, y.request_ref)
    };
    let diff_of = |what: &str, blob_a: Option<Digest>, blob_b: Option<Digest>| {
        // An output diff shows a failed step's error where its output would be.
        let (err_a, err_b) = match what {
            "output" => (x.error.as_deref(), y.error.as_deref()),
            _ => (None, None),
        };
        (blob_a != blob_b || err_a != err_b).then(|| {
            let (title_a, title_b) = (format!("A seq {} {what}", x.seq), format!("B seq {} {what}", y.seq));
            let a = text::Side { title: &title_a, blob: blob_a, error: err_a };
            let b = text::Side { title: &title_b, blob: blob_b, error: err_b };
            text::diff_blobs(store, a, b, options.max_diff_lines)
        })
    };
    let diff = diff_of(what, blob_a, blob_b);
    let request_diff = match what {
        "output" => diff_of("request", x.request_ref, y.request_ref),
        _ => None,
    };
    ChangedStep {
        seq_a: x.seq,
        seq_b: y.seq,
        agent: names.name(x.agent).to_owned(),
        label_a: x.label(names),
        label_b: y.label(names),
        output_a: x.output_hash,
        output_b: y.output_hash,
        diff,
        request_diff,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live model call whose answer reported no usage counts as a step, its tokens and cost
    /// unknown (QA35 D2: it was counted nowhere).
    #[test]
    fn a_call_without_usage_counts_and_its_cost_is_unknown() {
        let mut tokens = Tokens::default();
        tokens.add_unmetered();
        let json = serde_json::to_value(&tokens).unwrap();
        assert_eq!((json["steps"].clone(), json["steps_without_usage"].clone()), (1.into(), 1.into()));
        assert_eq!(json["cost_usd"], serde_json::Value::Null, "unknown, not free");
    }

    #[test]
    fn no_steps_cost_nothing_and_unpriced_steps_cost_unknown() {
        let json = |t: &Tokens| serde_json::to_value(t).unwrap()["cost_usd"].clone();
        let mut tokens = Tokens::default();
        assert_eq!(json(&tokens), serde_json::json!(0.0));
        tokens.add(&Usage { input_tokens: 1, output_tokens: 1, cost_usd: None, ..Default::default() });
        assert_eq!(json(&tokens), serde_json::Value::Null);
        tokens.add(&Usage { input_tokens: 1, output_tokens: 1, cost_usd: Some(0.5), ..Default::default() });
        assert_eq!(json(&tokens), serde_json::json!(0.5));
        for cost in [0.004125, 0.009631] {
            tokens.add(&Usage { cost_usd: Some(cost), ..Default::default() });
        }
        assert_eq!(json(&tokens), serde_json::json!(0.513756), "no binary noise in a sum");
    }
}
