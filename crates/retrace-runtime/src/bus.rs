//! The in-process message bus used in record: one mailbox per agent. A message becomes
//! deliverable once its `send` event is acknowledged; the moment a receiver takes it is its own
//! `deliver` event. Messages from one sender to one receiver stay in order; across senders the
//! earliest send wins, or, under chaos, a seeded random pick among messages whose (small,
//! random) delivery delay has passed.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::sync::Notify;

/// A message waiting in a mailbox.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    pub(crate) send_seq: u64,
    pub(crate) from: String,
    pub(crate) kind: Option<String>,
    pub(crate) lamport: u64,
    pub(crate) parent: Option<u64>,
    pub(crate) body: Value,
    ready_at: Instant,
}

#[derive(Debug, Default)]
struct Mailbox {
    queue: Mutex<Vec<Pending>>,
    notify: Notify,
}

/// Chaos: shuffles delivery order and injects small delays, seeded so a run can say how it was
/// shuffled.
#[derive(Debug)]
struct Chaos {
    rng: Mutex<StdRng>,
    max_delay: Duration,
}

/// The record-mode bus.
#[derive(Debug, Default)]
pub(crate) struct Bus {
    boxes: Mutex<HashMap<String, Arc<Mailbox>>>,
    chaos: Option<Chaos>,
}

/// What a `recv` took.
pub(crate) enum Taken {
    Message(Pending),
    TimedOut,
}

impl Bus {
    /// A bus; with `chaos_seed`, delivery order is shuffled within what causality allows and
    /// each message waits a random delay of at most `max_delay` before it can be delivered.
    pub(crate) fn new(chaos_seed: Option<u64>, max_delay: Duration) -> Bus {
        Bus {
            boxes: Mutex::new(HashMap::new()),
            chaos: chaos_seed.map(|seed| Chaos { rng: Mutex::new(StdRng::seed_from_u64(seed)), max_delay }),
        }
    }

    fn mailbox(&self, agent: &str) -> Arc<Mailbox> {
        self.boxes.lock().entry(agent.to_owned()).or_default().clone()
    }

    /// Posts an acknowledged message to `to`'s mailbox.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn post(
        &self,
        to: &str,
        send_seq: u64,
        from: &str,
        kind: Option<String>,
        lamport: u64,
        parent: Option<u64>,
        body: Value,
    ) {
        let delay = match &self.chaos {
            Some(c) => c.rng.lock().gen_range(Duration::ZERO..=c.max_delay),
            None => Duration::ZERO,
        };
        let mailbox = self.mailbox(to);
        mailbox.queue.lock().push(Pending {
            send_seq,
            from: from.to_owned(),
            kind,
            lamport,
            parent,
            body,
            ready_at: Instant::now() + delay,
        });
        mailbox.notify.notify_one();
    }

    /// Takes the next message for `agent`, waiting up to `timeout` (forever when None).
    pub(crate) async fn take(&self, agent: &str, timeout: Option<Duration>) -> Taken {
        let mailbox = self.mailbox(agent);
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let next_ready = {
                let mut queue = mailbox.queue.lock();
                let now = Instant::now();
                if let Some(idx) = self.pick(&queue, now) {
                    return Taken::Message(queue.remove(idx));
                }
                queue.iter().map(|p| p.ready_at).min()
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| d <= now) {
                return Taken::TimedOut;
            }
            let wake_at = match (next_ready, deadline) {
                (Some(r), Some(d)) => Some(r.min(d)),
                (r, d) => r.or(d),
            };
            match wake_at {
                Some(at) => {
                    let _ =
                        tokio::time::timeout(at.saturating_duration_since(now), mailbox.notify.notified())
                            .await;
                }
                None => mailbox.notify.notified().await,
            }
        }
    }

    /// The index of the message to deliver: among each sender's oldest message that is ready,
    /// the earliest send, or a seeded random one under chaos.
    fn pick(&self, queue: &[Pending], now: Instant) -> Option<usize> {
        let mut oldest: HashMap<&str, usize> = HashMap::new();
        for (i, p) in queue.iter().enumerate() {
            let slot = oldest.entry(p.from.as_str()).or_insert(i);
            if queue[*slot].send_seq > p.send_seq {
                *slot = i;
            }
        }
        let mut heads: Vec<usize> = oldest.into_values().filter(|&i| queue[i].ready_at <= now).collect();
        heads.sort_unstable();
        if heads.is_empty() {
            return None;
        }
        Some(match &self.chaos {
            Some(c) => heads[c.rng.lock().gen_range(0..heads.len())],
            None => *heads.iter().min_by_key(|&&i| queue[i].send_seq).expect("non-empty"),
        })
    }
}
