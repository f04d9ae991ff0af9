//! Checking a stored run: hash chain, dense seqs, blob digests, Lamport clocks, causality, and
//! that a finished recording's final decisions are its decision events.
//!
//! [`verify_run`] streams a run's events page by page, a fork's inherited ones included (a run of
//! a million events is never loaded at once), and keeps only a few bytes per event for the
//! causal checks. An event that can't be read is a problem at its own seq, and the check goes on
//! past it (the events beside it aren't blamed for the hole). Every finding is a [`Problem`] that names the run, the seq or digest, and what
//! is wrong; an empty list means the run is sound.
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

use retrace_core::canonical::CanonError;
use retrace_core::envelope::EventType;
use retrace_core::run::{FinalDecision, RunMeta, RunMode, RunStatus};
use retrace_core::{Digest, Event};
use serde::Serialize;

mod causality;

pub(crate) use causality::Causality;

use crate::export::{RunEvents, PAGE};
use crate::{Store, StoreError, StoreErrorKind, StoreResult};

/// The problem of a run whose stored record can't be read: its events aren't checked (the
/// record says where they start, for a fork).
pub fn unreadable_run(run: &crate::UnreadableRun) -> Problem {
    Problem {
        run: run.id.clone(),
        seq: None,
        digest: None,
        kind: ProblemKind::Unreadable,
        message: format!("its record can't be read, so its events weren't checked: {}", run.error),
    }
}

/// A run's hash chain, checked one event at a time as its events are read in order (a fork's
/// inherited ones first): for the commands that read a run whole, replay and export, which must
/// not pass on a run that [`verify_run`] rejects (an event edited in the store).
#[derive(Debug)]
pub struct ChainCheck {
    run: String,
    prev: Option<Digest>,
    /// Each event's canonical form, one buffer for all.
    scratch: Vec<u8>,
}

impl ChainCheck {
    /// The check of run `run`'s events, from seq 1.
    pub fn new(run: &str) -> ChainCheck {
        ChainCheck { run: run.to_owned(), prev: None, scratch: Vec::with_capacity(4096) }
    }

    /// Checks that `e`, the next event, follows the one before it and hashes to its `hash`: a
    /// `Corrupt` error naming the run, the seq and both digests if not.
    pub fn check(&mut self, e: &Event) -> StoreResult<()> {
        let computed = e.compute_hash_with(&mut self.scratch);
        self.check_hashed(e, computed)
    }

    /// [`ChainCheck::check`] of `e` whose hash the caller computed already
    /// ([`Event::write_canonical_hashing`]).
    pub fn check_hashed(&mut self, e: &Event, computed: Result<Digest, CanonError>) -> StoreResult<()> {
        let problem = |what: String| {
            StoreError::corrupt(format!(
                "run {} seq {}: {what} (`retrace verify {}` lists every problem)",
                self.run, e.seq, self.run
            ))
        };
        if e.prev != self.prev {
            let want = self.prev.map_or("null".to_owned(), |d| d.to_string());
            let found = e.prev.map_or("null".to_owned(), |d| d.to_string());
            return Err(problem(format!(
                "chain broken: prev is {found}, the previous event's hash is {want}"
            )));
        }
        match computed {
            Ok(hash) if hash == e.hash => {}
            Ok(hash) => {
                return Err(problem(format!("hash mismatch: stored {}, content hashes to {hash}", e.hash)))
            }
            Err(err) => return Err(problem(format!("cannot hash: {err}"))),
        }
        self.prev = Some(e.hash);
        Ok(())
    }
}

/// What kind of rule a [`Problem`] breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// The run or its events could not be read.
    Unreadable,
    /// Seqs are not 1, 2, 3... in order.
    Seq,
    /// An event's `hash` is not the digest of its content.
    Hash,
    /// An event's `prev` is not the previous event's hash.
    Chain,
    /// An event names a run it does not belong to.
    RunId,
    /// A referenced blob is missing.
    BlobMissing,
    /// A referenced blob's bytes don't match its digest.
    BlobCorrupt,
    /// An agent's Lamport clock did not increase, or a delivery is not after its send.
    Lamport,
    /// A `causal_parent` that does not name an earlier event (or a deliver's is not a send).
    Causal,
    /// An `inbound` seq that is not an earlier delivery to the same agent.
    Inbound,
    /// The run's recorded `head` is not its last event's hash.
    Head,
    /// Acknowledged events wait in an ack log that recovery could not apply.
    Unrecovered,
    /// A finished recording's final decisions are not its agents' `decision` events.
    Decisions,
    /// An import that stopped part way: the store holds only the first events of the file's
    /// run (those it holds are checked as far as they go).
    Unfinished,
    /// The run's record is one no run could have: a replay or fork of no run, a fork with no
    /// fork point, `diverged` with no divergence (QA40 D3).
    Record,
}

/// One thing wrong with a stored run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The run.
    pub run: String,
    /// The event, when the problem is about one.
    pub seq: Option<u64>,
    /// The blob, when the problem is about one.
    pub digest: Option<Digest>,
    /// Which rule is broken.
    pub kind: ProblemKind,
    /// What is wrong, in lower case.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "run {}", self.run)?;
        if let Some(seq) = self.seq {
            write!(f, " seq {seq}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, " blob {digest}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Checks one run; an empty list means it is sound.
pub fn verify_run(store: &dyn Store, run_id: &str) -> Vec<Problem> {
    verify_run_reporting(store, run_id, &mut |_| {})
}

/// [`verify_run`], calling `checked` with the number of events each page added, for progress
/// on a long run.
pub fn verify_run_reporting(store: &dyn Store, run_id: &str, checked: &mut dyn FnMut(u64)) -> Vec<Problem> {
    let mut check = RunCheck::new(store, run_id);
    check.run(checked);
    check.problems
}

/// Checks every run in the store, oldest first.
pub fn verify_all(store: &dyn Store) -> Vec<Problem> {
    match store.runs_and_unreadable() {
        Ok((runs, unreadable)) => unreadable
            .iter()
            .map(unreadable_run)
            .chain(runs.iter().flat_map(|run| verify_run(store, &run.id)))
            .collect(),
        Err(e) => vec![Problem {
            run: "*".into(),
            seq: None,
            digest: None,
            kind: ProblemKind::Unreadable,
            message: format!("cannot list runs: {e}"),
        }],
    }
}

struct RunCheck<'a> {
    store: &'a dyn Store,
    run: &'a str,
    problems: Vec<Problem>,
    causality: Causality,
    blobs: HashSet<Digest>,
    prev: Option<Digest>,
    /// Each `decision` event's agent, action and target, in seq order.
    decisions: Vec<FinalDecision>,
    /// The seqs of events that couldn't be read (holes in `causality`).
    unreadable: BTreeSet<u64>,
    /// The event before the next one couldn't be read, so its `prev` isn't known.
    after_hole: bool,
}

impl<'a> RunCheck<'a> {
    fn new(store: &'a dyn Store, run: &'a str) -> Self {
        RunCheck {
            store,
            run,
            problems: Vec::new(),
            causality: Causality::default(),
            blobs: HashSet::new(),
            prev: None,
            decisions: Vec::new(),
            unreadable: BTreeSet::new(),
            after_hole: false,
        }
    }

    fn problem(&mut self, kind: ProblemKind, seq: Option<u64>, message: String) {
        let run = self.run.to_owned();
        self.problems.push(Problem { run, seq, digest: None, kind, message });
    }

    fn run(&mut self, checked: &mut dyn FnMut(u64)) {
        let meta = match self.store.run(self.run) {
            Ok(meta) => meta,
            Err(e) => {
                return self.problem(ProblemKind::Unreadable, None, format!("cannot read the run: {e}"))
            }
        };
        if let Some(why) = self.store.unrecovered(self.run) {
            self.problem(ProblemKind::Unrecovered, None, why);
        }
        let importing = meta.status == RunStatus::Running;
        if meta.labels.contains_key(crate::import::UNFINISHED_LABEL) && !importing {
            // One still running is an import in progress, not a problem yet.
            let held = match self.store.last_seq(self.run) {
                Ok(0) => "none of the events".to_owned(),
                Ok(n) => format!("the first {n} events"),
                Err(_) => "some of the events".to_owned(),
            };
            let message = format!(
                "an unfinished import: the store holds {held} of the file's run, not all of them (import \
                 its trace file again to store the rest)"
            );
            self.problem(ProblemKind::Unfinished, None, message);
        }
        let mut pages = match RunEvents::new(self.store, self.run) {
            Ok(pages) => pages,
            Err(e) => return self.problem(ProblemKind::Unreadable, None, format!("cannot read events: {e}")),
        };
        loop {
            match pages.next_page() {
                Ok(Some(page)) => {
                    page.iter().for_each(|event| self.event(event, meta.fork_at));
                    checked(page.len() as u64);
                }
                Ok(None) => break,
                Err(e) => {
                    if !self.one_at_a_time(&mut pages, meta.fork_at, e) {
                        return;
                    }
                }
            }
        }
        if !self.unreadable.is_empty() {
            // The head and the decisions are judged from every event: a skipped one would
            // make both look wrong.
            return;
        }
        if let Some(head) = meta.head {
            if self.prev != Some(head) {
                let last = self.causality.len();
                let found = self.prev.map_or("no events".to_owned(), |d| d.to_string());
                let message = format!("run head is {head} but the last event's hash is {found}");
                self.problem(ProblemKind::Head, (last > 0).then_some(last), message);
            }
        }
        self.final_decisions(&meta);
        if let Some(message) = crate::import::impossible_record(&meta) {
            self.problem(ProblemKind::Record, None, format!("the run's record is impossible: {message}"));
        }
        self.edit_blobs(&meta);
    }

    /// A fork's edits that name a blob (`message:7=@sha256:…`) need it: its replay applies them
    /// again.
    fn edit_blobs(&mut self, meta: &RunMeta) {
        for digest in crate::gc::edit_blobs(meta) {
            let Err(e) = self.store.get_blob(&digest) else { continue };
            let kind = match e.kind {
                StoreErrorKind::NotFound => ProblemKind::BlobMissing,
                StoreErrorKind::Corrupt => ProblemKind::BlobCorrupt,
                _ => ProblemKind::Unreadable,
            };
            let edit =
                meta.edits.iter().find(|e| e.contains(&digest.to_string())).cloned().unwrap_or_default();
            let message = format!("named by the fork's edit {edit}: {e}");
            self.problems.push(Problem {
                run: self.run.to_owned(),
                seq: None,
                digest: Some(digest),
                kind,
                message,
            });
        }
    }

    /// Reads the events of a page that couldn't be read, `failed`, one at a time: each event
    /// that can't be read is a problem at its own seq, and the check goes on past it. False
    /// when [`RunCheck::GIVE_UP`] events in a row can't be read either (the store, not an
    /// event, is what fails), after saying so.
    fn one_at_a_time(&mut self, pages: &mut RunEvents<'_>, fork_at: Option<u64>, failed: StoreError) -> bool {
        let mut in_a_row = 0;
        for _ in 0..PAGE {
            let Some((seq, read)) = pages.next_single() else { return true };
            match read {
                Ok(event) => {
                    in_a_row = 0;
                    self.event(&event, fork_at);
                }
                Err(e) => {
                    in_a_row += 1;
                    if in_a_row == Self::GIVE_UP {
                        let from = seq + 1 - Self::GIVE_UP;
                        let message = format!("cannot read events from seq {from} on: {failed}");
                        self.problem(ProblemKind::Unreadable, Some(from), message);
                        return false;
                    }
                    self.skipped(seq, e);
                }
            }
        }
        true
    }

    /// Unreadable events in a row after which [`RunCheck::one_at_a_time`] stops.
    const GIVE_UP: u64 = 8;

    /// Event `seq`, which can't be read: a problem, and a hole its neighbours' checks skip.
    fn skipped(&mut self, seq: u64, e: StoreError) {
        self.problem(ProblemKind::Unreadable, Some(seq), format!("cannot read the event: {e}"));
        self.unreadable.insert(seq);
        self.causality.hole();
        self.prev = None;
        self.after_hole = true;
    }

    fn final_decisions(&mut self, meta: &RunMeta) {
        if let Some(message) = decisions_disagree(meta, &self.decisions) {
            self.problem(ProblemKind::Decisions, None, message);
        }
    }

    fn event(&mut self, e: &Event, fork_at: Option<u64>) {
        let expected = self.causality.len() + 1;
        if e.seq != expected {
            let message = format!("expected seq {expected}, found seq {}", e.seq);
            self.problem(ProblemKind::Seq, Some(e.seq), message);
        }
        let own = fork_at.is_none_or(|at| e.seq >= at);
        if own && e.run_id != self.run {
            self.problem(ProblemKind::RunId, Some(e.seq), format!("event names run {}", e.run_id));
        }
        self.chain(e);
        for (kind, message) in self.causality.check(e, &self.unreadable) {
            self.problem(kind, Some(e.seq), message);
        }
        if let (EventType::Decision, Some(d)) = (e.kind, &e.decision) {
            let decision = FinalDecision {
                agent: e.agent_id.clone(),
                action: d.action.clone(),
                target: d.target.clone(),
            };
            self.decisions.push(decision);
        }
        for digest in [e.request_ref, e.output_ref].into_iter().flatten() {
            self.blob(e.seq, digest);
        }
        self.prev = Some(e.hash);
    }

    fn chain(&mut self, e: &Event) {
        if std::mem::take(&mut self.after_hole) {
            // The event before it can't be read: its `prev` can't be checked.
        } else if e.prev != self.prev {
            let want = self.prev.map_or("null".to_owned(), |d| d.to_string());
            let found = e.prev.map_or("null".to_owned(), |d| d.to_string());
            let message = format!("chain broken: prev is {found}, the previous event's hash is {want}");
            self.problem(ProblemKind::Chain, Some(e.seq), message);
        }
        match e.compute_hash() {
            Ok(hash) if hash == e.hash => {}
            Ok(hash) => {
                let message = format!("hash mismatch: stored {}, content hashes to {hash}", e.hash);
                self.problem(ProblemKind::Hash, Some(e.seq), message);
            }
            Err(err) => self.problem(ProblemKind::Hash, Some(e.seq), format!("cannot hash: {err}")),
        }
    }

    fn blob(&mut self, seq: u64, digest: Digest) {
        if !self.blobs.insert(digest) {
            return;
        }
        let Err(e) = self.store.get_blob(&digest) else { return };
        let kind = match e.kind {
            StoreErrorKind::NotFound => ProblemKind::BlobMissing,
            StoreErrorKind::Corrupt => ProblemKind::BlobCorrupt,
            _ => ProblemKind::Unreadable,
        };
        let run = self.run.to_owned();
        // The problem's own text names the seq and the blob: the error's says what is wrong.
        let text = e.to_string();
        let own = text.strip_prefix(&format!("blob {digest} ")).map(|t| t.strip_prefix("is ").unwrap_or(t));
        let message = own.unwrap_or(&text).to_owned();
        self.problems.push(Problem { run, seq: Some(seq), digest: Some(digest), kind, message });
    }
}

/// Each agent's decisions (action, target), in order.
type ByAgent<'a> = BTreeMap<&'a str, Vec<(&'a str, Option<&'a str>)>>;

fn by_agent(all: &[FinalDecision]) -> ByAgent<'_> {
    let mut by = ByAgent::new();
    for d in all {
        by.entry(d.agent.as_str()).or_default().push((d.action.as_str(), d.target.as_deref()));
    }
    by
}

/// The decision an event records, if it is a `decision` event.
pub(crate) fn decision_of(e: &Event) -> Option<FinalDecision> {
    let d = e.decision.as_ref().filter(|_| e.kind == EventType::Decision)?;
    Some(FinalDecision { agent: e.agent_id.clone(), action: d.action.clone(), target: d.target.clone() })
}

/// Why `meta`'s final decisions are not the decisions its events `taken` (in seq order), if
/// they are not. A recording or fork that finished `ok` took each decision of its header as a
/// `decision` event: per agent, the same ones in the same order (agents interleave as they ran,
/// so only each agent's order is compared, as replay does). Any other run is not judged: it
/// may have taken a decision whose event was never stored, and a replay run holds no events.
pub(crate) fn decisions_disagree(meta: &RunMeta, taken: &[FinalDecision]) -> Option<String> {
    let finished = meta.status == RunStatus::Ok && matches!(meta.mode, RunMode::Record | RunMode::Fork);
    if !finished {
        return None;
    }
    let (header, events) = (by_agent(&meta.decisions), by_agent(taken));
    let agents: BTreeSet<&str> = header.keys().chain(events.keys()).copied().collect();
    let agent = agents.into_iter().find(|a| header.get(a) != events.get(a))?;
    let show = |ds: Option<&Vec<(&str, Option<&str>)>>| {
        let shown: Vec<String> = ds
            .into_iter()
            .flatten()
            .map(|(action, target)| target.map_or_else(|| action.to_string(), |t| format!("{action} {t}")))
            .collect();
        format!("[{}]", shown.join(", "))
    };
    Some(format!(
        "the run's final decisions of agent {agent} are {} but its decision events say {}",
        show(header.get(agent)),
        show(events.get(agent))
    ))
}
