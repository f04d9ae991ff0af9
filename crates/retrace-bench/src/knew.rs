//! `retrace knew` (issue 3): what an agent had heard when it acted, for a step with ≤ 1,000
//! earlier deliveries whose causal chains are ≤ 50 deep: at most 10 ms, and within 2x between a
//! 1,000-event run and a 1,000,000-event run (quick: 100,000).
//!
//! Runs are built fast by committing sealed, hash-chained events straight to a SQLite store
//! (batch durability), 4096 a batch, with the structure a multi-agent run has. A group of 15
//! relay agents message each other (a ~200 B body each, stored as the send's request blob);
//! every send's causal parent is its sender's latest delivery and every delivery's is its send,
//! except that a send starts a new chain when the chain would grow past 50 links, so chains run
//! 1..=50 deep. The group's hub receives messages from the relays, spread evenly over the
//! group's messages, and then acts (a decision: the step asked about) at the end of the run.
//!
//! Both runs hold the same `hub-250` group (999 events: the 1,000-event run is that group and one
//! tool call). The large run interleaves it evenly with a `bg-` group that fills the rest and
//! whose `hub-1000` hears 1,000 messages: the 10 ms target is asked of `hub-1000`, and the
//! 1k-vs-large comparison asks `hub-250` the very same question (same deliveries, same chains)
//! in a run a thousand (quick: a hundred) times larger.
//!
//! A fork of the large run (by reference, as `retrace fork` makes one: it stores only its own
//! events) branches off 5% before its end, where `hub-1000` has heard ~950 messages: the
//! `bg-` group goes on in the fork with messages of its own, `hub-1000` hears the rest of its
//! 1,000 among them and re-takes its decision. That step is asked about with the recording's
//! 10 ms target and compared with the recording's `hub-1000` (same count of deliveries, some
//! of them the fork's own, chains running from the fork's events back into the source's).
use std::time::{Duration, Instant};

use retrace_core::canonical::canonical_value;
use retrace_core::envelope::{Decision, MessageRef};
use retrace_core::run::{RunMeta, RunMode};
use retrace_core::{Digest, Event, EventType};
use retrace_store::causal::knew;
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Batch, BlobHint, BlobPut, Durability, Store};
use serde_json::json;

use crate::env::{note, BenchStore, Config};
use crate::payload::{words, Rng};
use crate::report::{median, print, Line, Target};

/// The longest causal chain the runs hold (links from a send back to its origin).
pub const MAX_DEPTH: u32 = 50;

/// The time budget of one `knew`, ms.
pub const BUDGET_MS: f64 = 10.0;

/// Relay agents.
const RELAYS: usize = 15;

/// Events per committed batch.
const BATCH: usize = 4096;

/// A hub asked about: its name and how many deliveries it gets.
type Hub = (&'static str, usize);

/// What a built run holds, for the queries.
struct Built {
    run: String,
    /// Each hub's name and the seq of its final step.
    queries: Vec<(&'static str, u64)>,
    /// Where a fork branches off, when asked for.
    fork: Option<ForkPoint>,
}

/// Where a fork of a built run branches off: its last inherited seq and hash, and the first
/// group (the large run's `bg-` group) as it stood then.
struct ForkPoint {
    seq: u64,
    prev: Option<Digest>,
    group: Group,
}

/// Messages at least that a fork's group sends of its own.
const FORK_MESSAGES: u64 = 200;

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let large: u64 = cfg.pick(100_000, 1_000_000);
    let label = if cfg.quick { "100k" } else { "1M" };
    note(&format!("knew: building a 1,000-event run and a {large}-event run (setup, untimed)"));
    let small_store = cfg.store("knew-1k", Durability::Batch);
    let small = build(&small_store, 1_000, None);
    let began = Instant::now();
    let large_store = cfg.store("knew-large", Durability::Batch);
    let mut big = build(&large_store, large, Some(large - large / 20));
    note(&format!("built the {large}-event run in {:.1} s", began.elapsed().as_secs_f64()));
    let point = big.fork.take().expect("the large run's fork point");
    let (fork_at, fork) = (point.seq + 1, build_fork(&large_store, &big.run, point));
    note(&format!("forked it at seq {fork_at}: the fork's own events are {fork_at}..={}", fork.1));

    let seq_of = |b: &Built, hub: &str| b.queries.iter().find(|(h, _)| *h == hub).expect("a hub").1;
    let (q_small, q_big250, q_big1000) =
        (seq_of(&small, "hub-250"), seq_of(&big, "hub-250"), seq_of(&big, "hub-1000"));
    describe(small_store.store.as_ref(), &small.run, q_small, 250, "1k run, hub-250");
    describe(large_store.store.as_ref(), &big.run, q_big250, 250, &format!("{label} run, hub-250"));
    describe(large_store.store.as_ref(), &big.run, q_big1000, 1_000, &format!("{label} run, hub-1000"));
    describe(large_store.store.as_ref(), &fork.0, fork.1, 1_000, &format!("{label} fork, hub-1000"));

    let (mut t_small, mut t_big250, mut t_big1000, mut t_fork) = (vec![], vec![], vec![], vec![]);
    for _ in 0..cfg.repeats {
        t_small.push(timed(small_store.store.as_ref(), &small.run, q_small));
        t_big250.push(timed(large_store.store.as_ref(), &big.run, q_big250));
        t_big1000.push(timed(large_store.store.as_ref(), &big.run, q_big1000));
        t_fork.push(timed(large_store.store.as_ref(), &fork.0, fork.1));
    }
    let opened: Vec<f64> =
        (0..cfg.repeats).map(|_| open_and_query(&large_store, &big.run, q_big1000)).collect();
    let ms = "ms";
    let (small, big250, big1000) = (median(&t_small), median(&t_big250), median(&t_big1000));
    print(
        lines,
        Line::new(
            &format!("knew {label} run, 1000 deliveries vs 10 ms"),
            big1000,
            ms,
            Some(BUDGET_MS),
            Target::RatioAtMost(1.0),
        ),
    );
    print(
        lines,
        Line::new(
            &format!("knew {label} run incl. store open (1000 dl)"),
            median(&opened),
            ms,
            None,
            Target::Info,
        ),
    );
    print(lines, Line::new("knew 1k run, 250 deliveries", small, ms, None, Target::Info));
    print(
        lines,
        Line::new(
            &format!("knew {label} vs 1k run (250 deliveries)"),
            big250,
            ms,
            Some(small),
            Target::RatioAtMost(2.0),
        ),
    );
    let in_fork = median(&t_fork);
    print(
        lines,
        Line::new(
            &format!("knew {label} fork, 1000 deliveries vs 10 ms"),
            in_fork,
            ms,
            Some(BUDGET_MS),
            Target::RatioAtMost(1.0),
        ),
    );
    print(
        lines,
        Line::new(
            &format!("knew {label} fork vs {label} run (1000 dl)"),
            in_fork,
            ms,
            Some(big1000),
            Target::RatioAtMost(2.0),
        ),
    );
}

/// One `knew` (after one untimed warm-up per store and step), ms.
fn timed(store: &dyn Store, run: &str, seq: u64) -> f64 {
    let began = Instant::now();
    let k = knew(store, run, seq).expect("knew");
    let elapsed = began.elapsed();
    std::hint::black_box(k);
    ms(elapsed)
}

/// Opening the store afresh (as `retrace knew` does) and asking, ms.
fn open_and_query(store: &BenchStore, run: &str, seq: u64) -> f64 {
    let began = Instant::now();
    let path = store.sqlite.path();
    let opened = SqliteStore::open(path, store.sqlite.blobs_dir(), Durability::Batch, 5_000)
        .expect("reopening the store");
    std::hint::black_box(knew(&opened, run, seq).expect("knew"));
    ms(began.elapsed())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Checks the answer's shape (and warms the store up): `deliveries` messages heard, chains of
/// at most [`MAX_DEPTH`] links; notes the chain lengths.
fn describe(store: &dyn Store, run: &str, seq: u64, deliveries: usize, what: &str) {
    let k = knew(store, run, seq).expect("knew");
    assert_eq!(k.heard.len(), deliveries, "{what}: every delivery heard");
    assert!(k.heard.iter().all(|h| h.body.is_some()), "{what}: every body read");
    let lengths: Vec<usize> = k.heard.iter().map(|h| h.chain.len()).collect();
    let longest = lengths.iter().copied().max().unwrap_or(0);
    assert!(longest <= MAX_DEPTH as usize, "{what}: a chain of {longest} links");
    let links: usize = lengths.iter().sum();
    note(&format!(
        "{what}: step {seq}, {} deliveries, chains {links} links in all (mean {:.1}, longest {longest})",
        k.heard.len(),
        links as f64 / k.heard.len().max(1) as f64
    ));
}

/// Per-agent state while building.
#[derive(Clone, Copy, Default)]
struct AgentState {
    lamport: u64,
    /// The latest delivery's seq and its chain depth.
    last: Option<(u64, u32)>,
}

/// A group of agents that message only each other: relays, and a hub they feed, spreading its
/// deliveries evenly over the group's messages. A group's structure depends only on its seed
/// and size, not on what it is interleaved with.
#[derive(Clone)]
struct Group {
    relays: Vec<String>,
    states: Vec<AgentState>,
    hub: &'static str,
    want: usize,
    hub_state: AgentState,
    heard: usize,
    /// Messages the group sends in all, and so far.
    messages: u64,
    sent: u64,
    rng: Rng,
}

impl Group {
    fn new(prefix: &str, (hub, want): Hub, messages: u64, seed: u64) -> Group {
        Group {
            relays: (0..RELAYS).map(|r| format!("{prefix}relay-{r}")).collect(),
            states: vec![AgentState::default(); RELAYS],
            hub,
            want,
            hub_state: AgentState::default(),
            heard: 0,
            messages,
            sent: 0,
            rng: Rng::new(seed),
        }
    }

    /// The group's next message (a send and its delivery).
    fn step(&mut self, b: &mut Builder<'_>) {
        let from = self.rng.below(RELAYS as u64) as usize;
        let hub_due =
            self.heard < self.want && self.heard as u64 * self.messages <= self.sent * self.want as u64;
        if hub_due {
            let (sent, heard) = b.message(&self.relays[from], self.states[from], self.hub, self.hub_state);
            (self.states[from], self.hub_state) = (sent, heard);
            self.heard += 1;
        } else {
            let to = (from + 1 + self.rng.below(RELAYS as u64 - 1) as usize) % RELAYS;
            let (sent, heard) =
                b.message(&self.relays[from], self.states[from], &self.relays[to], self.states[to]);
            (self.states[from], self.states[to]) = (sent, heard);
        }
        self.sent += 1;
    }

    /// The hub acts on everything it heard: the step asked about. Returns its seq.
    fn decide(&mut self, b: &mut Builder<'_>) -> u64 {
        assert_eq!((self.sent, self.heard), (self.messages, self.want), "{} got its deliveries", self.hub);
        let mut e = Event::new(&b.run, self.hub, EventType::Decision);
        e.causal_parent = self.hub_state.last.map(|(s, _)| s);
        e.decision = Some(Decision { action: "approve".into(), target: Some("plan".into()) });
        self.hub_state.lamport += 1;
        e.lamport = self.hub_state.lamport;
        b.push(e)
    }
}

/// Messages of the group every run holds (`hub-250`): with its hub's step, 999 events.
const SMALL_MESSAGES: u64 = 499;

/// Builds a run of `events` events in a fresh run of `store`: the `hub-250` group, and in a
/// larger run the `hub-1000` group around it, its messages interleaved evenly; notes where a
/// fork branches off at the first message ending at or after seq `fork_after`.
fn build(store: &BenchStore, events: u64, fork_after: Option<u64>) -> Built {
    let run = format!("knew-{events}");
    store.store.create_run(&RunMeta::new(&run, RunMode::Record, 1)).expect("creating the run");
    let mut b = Builder {
        store: store.store.as_ref(),
        run: run.clone(),
        seq: 0,
        prev: None,
        events: Vec::with_capacity(BATCH),
        blobs: Vec::with_capacity(BATCH),
        rng: Rng::new(events),
    };
    let mut groups = vec![Group::new("", ("hub-250", 250), SMALL_MESSAGES, 1)];
    // Two events a message, one a hub's step; an odd event left over is a tool call.
    let rest = events.saturating_sub(2 * SMALL_MESSAGES + 1);
    if rest > 1 {
        groups.insert(0, Group::new("bg-", ("hub-1000", 1_000), (rest - 1) / 2, 2));
    }
    let total: u64 = groups.iter().map(|g| g.messages).sum();
    let mut fork = None;
    for _ in 0..total {
        // The group furthest behind its even share goes next.
        let g = groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.sent < g.messages)
            .min_by_key(|(_, g)| g.sent as u128 * total as u128 / g.messages as u128)
            .map(|(i, _)| i)
            .expect("a group with messages left");
        groups[g].step(&mut b);
        if fork.is_none() && fork_after.is_some_and(|at| b.seq >= at) {
            fork = Some(ForkPoint { seq: b.seq, prev: b.prev, group: groups[0].clone() });
        }
    }
    if b.seq + (groups.len() as u64) < events {
        // One event short: a relay's tool call, acting on what it heard last.
        let relay = groups[0].states[0];
        let mut e = Event::new(&run, groups[0].relays[0].as_str(), EventType::ToolCall);
        e.name = Some("lookup".into());
        e.causal_parent = relay.last.map(|(s, _)| s);
        e.lamport = relay.lamport + 1;
        b.push(e);
    }
    let queries = groups.iter_mut().map(|g| (g.hub, g.decide(&mut b))).collect();
    assert_eq!(b.seq, events, "the run has the events asked for");
    b.flush();
    store.sqlite.checkpoint().expect("checkpointing the built run");
    Built { run, queries, fork }
}

/// A fork of run `source` of `store` at `point` (mode `fork`, inheriting the seqs up to
/// `point.seq` by reference): the point's group goes on with messages of its own, at least
/// [`FORK_MESSAGES`] and four for each delivery its hub has yet to hear, and its hub re-takes
/// its decision. Returns the fork and the decision's seq.
fn build_fork(store: &BenchStore, source: &str, point: ForkPoint) -> (String, u64) {
    let run = format!("{source}-fork");
    let mut meta = RunMeta::new(&run, RunMode::Fork, 2);
    meta.source_run = Some(source.to_owned());
    meta.fork_at = Some(point.seq + 1);
    store.store.create_run(&meta).expect("creating the fork");
    let mut b = Builder {
        store: store.store.as_ref(),
        run: run.clone(),
        seq: point.seq,
        prev: point.prev,
        events: Vec::with_capacity(BATCH),
        blobs: Vec::with_capacity(BATCH),
        rng: Rng::new(point.seq),
    };
    let mut group = point.group;
    let left = (group.want - group.heard) as u64;
    group.messages = group.sent + FORK_MESSAGES.max(4 * left);
    while group.sent < group.messages {
        group.step(&mut b);
    }
    let decision = group.decide(&mut b);
    b.flush();
    store.sqlite.checkpoint().expect("checkpointing the fork");
    (run, decision)
}

/// Seals events onto the chain and commits them a batch at a time.
struct Builder<'a> {
    store: &'a dyn Store,
    run: String,
    seq: u64,
    prev: Option<Digest>,
    events: Vec<Event>,
    blobs: Vec<BlobPut>,
    rng: Rng,
}

impl Builder<'_> {
    /// Appends `e` as the next seq; returns the seq.
    fn push(&mut self, mut e: Event) -> u64 {
        self.seq += 1;
        e.seq = self.seq;
        e.key = Digest::of(format!("{} {} {}", e.agent_id, e.kind, e.seq).as_bytes());
        e.seal(self.prev).expect("sealing an event");
        self.prev = Some(e.hash);
        self.events.push(e);
        if self.events.len() >= BATCH {
            self.flush();
        }
        self.seq
    }

    fn flush(&mut self) {
        let batch = Batch {
            run_id: self.run.clone(),
            events: std::mem::take(&mut self.events),
            blobs: std::mem::take(&mut self.blobs),
            cache: Vec::new(),
        };
        self.store.commit(&batch).expect("committing a batch");
    }

    /// A message from `from` to `to` (a send, then its delivery right after); returns both
    /// agents' new state.
    fn message(
        &mut self,
        from: &str,
        mut sender: AgentState,
        to: &str,
        mut receiver: AgentState,
    ) -> (AgentState, AgentState) {
        let envelope = MessageRef {
            from: Some(from.to_owned()),
            to: Some(to.to_owned()),
            kind: Some("note".into()),
            timed_out: false,
        };
        let text = words(&mut self.rng, 180);
        let request = json!({"to": to, "kind": "note", "body": {"n": self.seq, "text": text}});
        let blob = BlobPut::new(canonical_value(&request).expect("canonical"), BlobHint::Raw);
        let (parent, depth) = match sender.last {
            Some((seq, depth)) if depth < MAX_DEPTH => (Some(seq), depth + 1),
            _ => (None, 1),
        };
        let mut send = Event::new(&self.run, from, EventType::Send);
        send.name = Some(to.to_owned());
        send.message = Some(envelope.clone());
        send.causal_parent = parent;
        send.request_ref = Some(blob.digest());
        sender.lamport += 1;
        send.lamport = sender.lamport;
        self.blobs.push(blob);
        let send_seq = self.push(send);

        let mut deliver = Event::new(&self.run, to, EventType::Deliver);
        deliver.name = Some(from.to_owned());
        deliver.message = Some(envelope);
        deliver.causal_parent = Some(send_seq);
        receiver.lamport = receiver.lamport.max(sender.lamport) + 1;
        deliver.lamport = receiver.lamport;
        let deliver_seq = self.push(deliver);
        receiver.last = Some((deliver_seq, depth + 1));
        (sender, receiver)
    }
}
