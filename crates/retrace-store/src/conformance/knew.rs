//! `knew` in forks that inherit their source's events by reference answers exactly as in a
//! recording that stores the same events itself: a fork, a fork of a fork past its source's
//! fork point, and a fork of a fork before it.
use std::collections::VecDeque;

use retrace_core::envelope::{Decision, MessageRef};
use retrace_core::run::{RunMeta, RunMode};
use retrace_core::{Digest, Event, EventType};

use super::{sample_run, MakeStore};
use crate::causal::{knew, Knew};
use crate::{Batch, BlobHint, BlobPut, Store};

/// Agents messaging each other.
const AGENTS: u64 = 4;

/// A run being made up, one event a step: agents send to each other (each send acting on its
/// sender's latest delivery, or on a model call that did), messages are delivered a few steps
/// after they are sent (so a fork point falls between a send and its delivery), some time out,
/// and agents decide on what they heard last. Cloned at a fork point and reseeded, it makes
/// the fork's own events.
#[derive(Clone)]
struct Plot {
    seed: u64,
    events: Vec<Event>,
    blobs: Vec<BlobPut>,
    /// Each agent's latest delivery.
    last: Vec<Option<u64>>,
    /// Sends not yet delivered: (send seq, from, to).
    in_flight: VecDeque<(u64, u64, u64)>,
}

impl Plot {
    fn new(seed: u64) -> Plot {
        Plot {
            seed,
            events: Vec::new(),
            blobs: Vec::new(),
            last: vec![None; AGENTS as usize],
            in_flight: VecDeque::new(),
        }
    }

    /// The same run from here on, told with `seed`.
    fn branch(&self, seed: u64) -> Plot {
        Plot { seed, ..self.clone() }
    }

    fn next(&mut self, n: u64) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed % n
    }

    fn push(&mut self, mut e: Event) -> u64 {
        e.seq = self.events.len() as u64 + 1;
        self.events.push(e);
        self.events.len() as u64
    }

    fn envelope(from: u64, to: u64, timed_out: bool) -> MessageRef {
        MessageRef {
            from: (!timed_out).then(|| format!("a{from}")),
            to: Some(format!("a{to}")),
            kind: (!timed_out).then(|| "note".to_owned()),
            timed_out,
        }
    }

    /// One more event.
    fn step(&mut self) {
        let roll = self.next(20);
        let due = self.in_flight.len() > 3 || (roll < 8 && !self.in_flight.is_empty());
        if due {
            let (send, from, to) = self.in_flight.pop_front().expect("a message in flight");
            let mut deliver = Event::new("", format!("a{to}"), EventType::Deliver);
            deliver.name = Some(format!("a{from}"));
            deliver.message = Some(Plot::envelope(from, to, false));
            deliver.causal_parent = Some(send);
            self.last[to as usize] = Some(self.push(deliver));
        } else if roll == 8 {
            let to = self.next(AGENTS);
            let mut timeout = Event::new("", format!("a{to}"), EventType::Deliver);
            timeout.message = Some(Plot::envelope(to, to, true));
            self.last[to as usize] = Some(self.push(timeout));
        } else if roll == 9 {
            let who = self.next(AGENTS);
            let mut decide = Event::new("", format!("a{who}"), EventType::Decision);
            decide.causal_parent = self.last[who as usize];
            decide.decision =
                Some(Decision { action: "approve".into(), target: Some(format!("step:{roll}")) });
            self.push(decide);
        } else {
            let from = self.next(AGENTS);
            let to = (from + 1 + self.next(AGENTS - 1)) % AGENTS;
            let mut parent = self.last[from as usize];
            if roll.is_multiple_of(5) {
                let mut think = Event::new("", format!("a{from}"), EventType::ModelCall);
                think.name = Some("openai/chat".into());
                think.causal_parent = parent;
                parent = Some(self.push(think));
            }
            let n = self.events.len();
            let body = format!("{{\"body\":{{\"n\":{n}}},\"to\":\"a{to}\"}}");
            let blob = BlobPut::new(body.into_bytes(), BlobHint::Raw);
            let mut send = Event::new("", format!("a{from}"), EventType::Send);
            send.name = Some(format!("a{to}"));
            send.message = Some(Plot::envelope(from, to, false));
            send.causal_parent = parent;
            send.request_ref = Some(blob.digest());
            // Every 7th send's body is never stored.
            if n % 7 != 3 {
                self.blobs.push(blob);
            }
            let send = self.push(send);
            self.in_flight.push_back((send, from, to));
        }
    }

    /// Steps until the run has `n` events.
    fn until(&mut self, n: u64) {
        while (self.events.len() as u64) < n {
            self.step();
        }
    }
}

/// Creates `meta` and commits `events` (seqs `first..`, as run `meta.id`) with the blobs they
/// name, in batches of 1..=9 events, as a recording commits them.
fn store_run(store: &dyn Store, meta: RunMeta, events: &[Event], first: u64, blobs: &[BlobPut]) {
    store.create_run(&meta).unwrap();
    let mut prev = None;
    let mut own: Vec<Event> = Vec::new();
    for e in events {
        let mut e = e.clone();
        e.run_id = meta.id.clone();
        e.key = Digest::of(format!("{} {}", e.seq, e.agent_id).as_bytes());
        e.seal(prev).unwrap();
        prev = Some(e.hash);
        if e.seq >= first {
            own.push(e);
        }
    }
    let mut at = 0;
    while at < own.len() {
        let end = (at + 1 + at % 9).min(own.len());
        let wanted: Vec<Digest> = own[at..end].iter().filter_map(|e| e.request_ref).collect();
        let blobs = blobs.iter().filter(|b| wanted.contains(&b.digest)).cloned().collect();
        let batch = Batch { run_id: meta.id.clone(), events: own[at..end].to_vec(), blobs, cache: vec![] };
        store.commit(&batch).unwrap();
        at = end;
    }
}

/// A fork `id` of `source` at `at`, inheriting by reference.
fn fork_meta(id: &str, source: &str, at: u64) -> RunMeta {
    let mut meta = sample_run(id, 2);
    (meta.mode, meta.source_run, meta.fork_at) = (RunMode::Fork, Some(source.into()), Some(at));
    meta
}

/// `knew` at every step of fork `fork` of its own (and at every tenth it inherits) equals
/// `knew` at the same step of `flat`, a recording of the same events; returns the answers at
/// the fork's own steps.
fn same_as_flat(store: &dyn Store, fork: &str, flat: &str, at: u64, last: u64) -> Vec<Knew> {
    let mut own = Vec::new();
    for seq in (1..=last).filter(|s| *s >= at - 1 || s.is_multiple_of(10)) {
        let (in_fork, in_flat) = (knew(store, fork, seq).unwrap(), knew(store, flat, seq).unwrap());
        assert_eq!(in_fork.run, fork);
        assert_eq!(in_fork, Knew { run: fork.to_owned(), ..in_flat }, "{fork}: knew at seq {seq}");
        if seq >= at {
            own.push(in_fork);
        }
    }
    own
}

/// A fork's own step hears messages sent before its fork point and after it, each with its
/// chain through the fork's own events into its source's (and, in a fork of a fork, into the
/// source's source): exactly what a recording of the same events answers, at every step. So
/// does a fork of a fork whose fork point lies before its source's (it inherits only events its
/// source inherited).
pub fn knew_in_forks_answers_as_a_recording(make: MakeStore<'_>) {
    let store = make();
    let store = store.as_ref();
    let mut plot = Plot::new(0x2545_f491);
    plot.until(300);
    let at_300 = plot.clone();
    plot.until(400);
    let at_400 = plot.clone();
    plot.until(600);
    store_run(store, sample_run("src", 1), &plot.events, 1, &plot.blobs);

    // fork-a: src's 1..=400, then its own to 700; fork-b: fork-a's 1..=550, then its own to 800.
    let mut a = at_400.branch(0x9e37_79b9);
    a.until(550);
    let at_550 = a.clone();
    a.until(700);
    store_run(store, fork_meta("fork-a", "src", 401), &a.events, 401, &a.blobs);
    store_run(store, sample_run("flat-a", 3), &a.events, 1, &a.blobs);
    let mut b = at_550.branch(0x1234_5678);
    b.until(800);
    store_run(store, fork_meta("fork-b", "fork-a", 551), &b.events, 551, &b.blobs);
    store_run(store, sample_run("flat-b", 4), &b.events, 1, &b.blobs);
    // fork-c: fork-a's 1..=300 (src's), then its own to 500.
    let mut c = at_300.branch(0x0bad_cafe);
    c.until(500);
    store_run(store, fork_meta("fork-c", "fork-a", 301), &c.events, 301, &c.blobs);
    store_run(store, sample_run("flat-c", 5), &c.events, 1, &c.blobs);

    let own_a = same_as_flat(store, "fork-a", "flat-a", 401, 700);
    let own_b = same_as_flat(store, "fork-b", "flat-b", 551, 800);
    let own_c = same_as_flat(store, "fork-c", "flat-c", 301, 500);

    // What the answers went through: deliveries of inherited sends, chains across fork points.
    let crosses = |k: &Knew, at: u64| {
        k.heard
            .iter()
            .any(|h| h.chain.first().is_some_and(|l| l.seq >= at) && h.chain.iter().any(|l| l.seq < at))
    };
    let inherited_send =
        |k: &Knew, at: u64| k.heard.iter().any(|h| h.deliver_seq >= at && h.send_seq.is_some_and(|s| s < at));
    for (own, at, what) in [(&own_a, 401, "fork-a"), (&own_b, 551, "fork-b"), (&own_c, 301, "fork-c")] {
        assert!(
            own.iter().any(|k| crosses(k, at)),
            "{what}: a chain from the fork's own send into its source"
        );
        assert!(own.iter().any(|k| inherited_send(k, at)), "{what}: a delivery of an inherited send");
        assert!(
            own.iter().any(|k| k.heard.iter().any(|h| h.body.is_none() && h.send_seq.is_some())),
            "{what}: a send without its body"
        );
        assert!(own.iter().any(|k| k.heard.iter().any(|h| h.send_seq.is_none())), "{what}: a timeout");
    }
    assert!(
        own_b.iter().any(|k| crosses(k, 551)
            && k.heard.iter().any(
                |h| h.chain.first().is_some_and(|l| l.seq >= 551) && h.chain.iter().any(|l| l.seq < 401)
            )),
        "fork-b: a chain through both fork points"
    );
}
