//! Reading a recorded run into what the matcher keeps, a page at a time: each event becomes the
//! items the log integrates (a step's slot, a delivery, an intent's completion...). A replay
//! reads ahead on a thread of its own, which also reads, verifies and decodes the pages' outputs
//! so that the replaying program's thread finds them ready.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use retrace_core::envelope::Decision;
use retrace_core::{Digest, Event, EventType};
use retrace_store::export::EventCursor;
use retrace_store::verify::ChainCheck;
use retrace_store::{Store, StoreResult};
use serde_json::Value;

use super::agent_log::{intern, Slot};
use super::{Prefetched, RecordedDelivery, Resolution};

/// Events a replay's reader reads (and outputs it prefetches) at a time.
const FEED_PAGE: usize = 1024;

/// Events of the reader's first page; each next page is twice as large, up to [`FEED_PAGE`]. The
/// replay's first step waits for the first page (and its outputs): a page of 1,024 made that
/// wait most of a 200-call proxy replay's first call (600-800 us against 110-130 for the others).
const FIRST_PAGE: usize = 64;

/// Pages the reader may be ahead of the replay, beyond the one it is reading.
const FEED_AHEAD: usize = 2;

/// What one recorded event contributes to the log.
#[derive(Debug)]
pub(super) enum Item {
    /// A step the program will ask for.
    Step { agent: Arc<str>, slot: Slot },
    /// A delivery the agent heard.
    Delivery { agent: Arc<str>, delivery: RecordedDelivery },
    /// A tool call or resolution whose causal parent is `intent` (when that is an intent, it
    /// completes it).
    Completes { intent: u64, resolution: Option<Resolution> },
    /// A decision taken.
    Decision { agent: Arc<str>, decision: Decision },
    /// A seq no program step consumes (a resolution).
    Unconsumable(u64),
}

/// The items of consecutive events.
#[derive(Debug, Default)]
pub(super) struct Page {
    pub(super) items: Vec<Item>,
    /// The last seq the page covers.
    pub(super) last_seq: u64,
}

/// What the reader thread sends.
pub(super) enum Fed {
    Page(Page),
    End,
    Failed(retrace_store::StoreError),
}

/// Reads a run's events (a fork's inherited ones included) page by page into [`Page`]s.
#[derive(Debug)]
pub(super) struct Reader {
    cursor: EventCursor,
    /// A replay never serves a recording whose chain `retrace verify` would reject.
    chain: ChainCheck,
    names: HashMap<String, Arc<str>>,
    agents: HashMap<String, Arc<str>>,
}

impl Reader {
    /// Resolves where `run`'s events are stored (`NotFound` for a missing run or fork source).
    pub(super) fn new(store: &dyn Store, run: &str) -> StoreResult<Reader> {
        Ok(Reader {
            cursor: EventCursor::new(store, run)?,
            chain: ChainCheck::new(run),
            names: HashMap::new(),
            agents: HashMap::new(),
        })
    }

    /// The run's last seq.
    pub(super) fn last_seq(&self) -> u64 {
        self.cursor.count()
    }

    /// The next page of at most `limit` events as items, or `None` after the last; `Corrupt` at
    /// the first event that breaks the hash chain.
    pub(super) fn next_page(&mut self, store: &dyn Store, limit: usize) -> StoreResult<Option<Page>> {
        let Some(events) = self.cursor.next_page(store, limit)? else { return Ok(None) };
        let mut page = Page { items: Vec::with_capacity(events.len()), last_seq: 0 };
        for e in &events {
            self.chain.check(e)?;
            self.items(e, &mut page.items);
            page.last_seq = e.seq;
        }
        Ok(Some(page))
    }

    /// What `e` contributes, appended to `items`.
    fn items(&mut self, e: &Event, items: &mut Vec<Item>) {
        if matches!(e.kind, EventType::ToolCall | EventType::Resolution) {
            if let Some(intent) = e.causal_parent {
                let resolution =
                    (e.kind == EventType::Resolution).then_some(match (e.output_ref, e.name.as_deref()) {
                        (_, Some("not_executed")) | (None, _) => Resolution::NotExecuted,
                        (Some(out), _) => Resolution::Outcome(out),
                    });
                items.push(Item::Completes { intent, resolution });
            }
        }
        let agent = intern(&mut self.agents, &e.agent_id);
        if let (EventType::Decision, Some(d)) = (e.kind, &e.decision) {
            items.push(Item::Decision { agent: agent.clone(), decision: d.clone() });
        }
        match e.kind {
            // A person's answer, not a program step: replay never asks for it.
            EventType::Resolution => items.push(Item::Unconsumable(e.seq)),
            EventType::Deliver => {
                let message = e.message.as_ref();
                let delivery = RecordedDelivery {
                    seq: e.seq,
                    send_seq: e.causal_parent,
                    from: message.and_then(|m| m.from.clone()),
                    kind: message.and_then(|m| m.kind.clone()),
                    timed_out: message.is_some_and(|m| m.timed_out),
                };
                items.push(Item::Delivery { agent, delivery });
            }
            _ => items.push(Item::Step { agent, slot: Slot::new(e, &mut self.names) }),
        }
    }
}

/// Starts reading `reader`'s run on a thread of its own, [`FIRST_PAGE`] events first, then
/// pages twice as large up to [`FEED_PAGE`], [`FEED_AHEAD`] pages ahead of the receiver; while `outputs` is set, each page's step outputs are read (one query per page),
/// verified and decoded too. The thread ends after the last page, or once the receiver is dropped.
pub(super) fn spawn(store: Arc<dyn Store>, mut reader: Reader, outputs: Arc<AtomicBool>) -> Receiver<Fed> {
    let (tx, rx) = sync_channel(FEED_AHEAD);
    let spawned = std::thread::Builder::new().name("retrace-replay-reader".into()).spawn({
        let tx = tx.clone();
        move || feed(store.as_ref(), &mut reader, outputs, &tx)
    });
    if let Err(e) = spawned {
        let _ = tx.send(Fed::Failed(retrace_store::StoreError::io(format!(
            "starting the thread that reads the recorded run: {e}"
        ))));
    }
    rx
}

fn feed(store: &dyn Store, reader: &mut Reader, outputs: Arc<AtomicBool>, tx: &SyncSender<Fed>) {
    let mut limit = FIRST_PAGE;
    loop {
        let fed = match reader.next_page(store, limit) {
            Ok(Some(mut page)) => {
                if outputs.load(Ordering::Relaxed) {
                    prefetch_outputs(store, &mut page);
                }
                Fed::Page(page)
            }
            Ok(None) => Fed::End,
            Err(e) => Fed::Failed(e),
        };
        let last = !matches!(fed, Fed::Page(_));
        if tx.send(fed).is_err() || last {
            return;
        }
        limit = (limit * 2).min(FEED_PAGE);
    }
}

/// Reads the outputs of the page's steps in one query (the store verifies each digest) and
/// decodes them, but a model call's (see [`Prefetched::Bytes`]). Any failure leaves the page's
/// outputs unread: the replay then reads each itself, and meets the failure at the step it
/// belongs to.
fn prefetch_outputs(store: &dyn Store, page: &mut Page) {
    let mut wanted: Vec<(usize, Digest)> = Vec::new();
    for (i, item) in page.items.iter().enumerate() {
        if let Item::Step { slot, .. } = item {
            if let (Some(digest), false, false) =
                (slot.output_ref, slot.failed(), slot.kind == EventType::Intent)
            {
                wanted.push((i, digest));
            }
        }
    }
    if wanted.is_empty() {
        return;
    }
    let digests: Vec<Digest> = wanted.iter().map(|(_, d)| *d).collect();
    let Ok(blobs) = store.get_blobs(&digests) else { return };
    for ((i, _), bytes) in wanted.into_iter().zip(blobs) {
        let Some(Item::Step { slot, .. }) = page.items.get_mut(i) else { continue };
        slot.output = if slot.kind == EventType::ModelCall {
            Some(Prefetched::Bytes(bytes))
        } else {
            serde_json::from_slice::<Value>(&bytes).ok().map(Prefetched::Value)
        };
    }
}
