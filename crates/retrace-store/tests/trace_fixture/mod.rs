//! Test runs built by committing batches straight through the store API (no runtime needed).
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;

use retrace_core::envelope::{Decision, MessageRef, ModelRef, ToolClass, ToolRef};
use retrace_core::run::{FinalDecision, RunMeta, RunMode, RunStatus};
use retrace_core::{Digest, Event, EventType};
use retrace_store::export::export_run;
use retrace_store::import::{import_reader, ImportError, ImportOptions, ImportOutcome};
use retrace_store::memory::MemoryStore;
use retrace_store::{open_store, Batch, BlobHint, BlobPut, Store, StoreConfig};
use serde_json::json;

/// A run, its sealed events and the blobs they reference.
pub struct Fixture {
    pub meta: RunMeta,
    pub events: Vec<Event>,
    pub blobs: Vec<BlobPut>,
}

/// Builds a run event by event: seqs, Lamport clocks and the hash chain are kept here.
pub struct Builder {
    run: String,
    events: Vec<Event>,
    blobs: Vec<BlobPut>,
    clocks: HashMap<String, u64>,
}

impl Builder {
    pub fn new(run: &str) -> Builder {
        Builder { run: run.to_owned(), events: Vec::new(), blobs: Vec::new(), clocks: HashMap::new() }
    }

    /// Appends a sealed event; returns its seq.
    pub fn push(
        &mut self,
        agent: &str,
        kind: EventType,
        name: Option<&str>,
        request: Option<(Vec<u8>, BlobHint)>,
        output: Option<Vec<u8>>,
        edit: impl FnOnce(&mut Event),
    ) -> u64 {
        let mut e = Event::new(self.run.clone(), agent, kind);
        e.seq = self.events.len() as u64 + 1;
        let clock = self.clocks.entry(agent.to_owned()).or_insert(0);
        *clock += 1;
        e.lamport = *clock;
        e.name = name.map(str::to_owned);
        e.key = Digest::of(format!("{kind} {name:?} {}", e.seq).as_bytes());
        if let Some((bytes, hint)) = request {
            let put = BlobPut::new(bytes, hint);
            e.key = Digest::of(put.bytes());
            e.request_ref = Some(put.digest());
            self.blobs.push(put);
        }
        if let Some(bytes) = output {
            // A model's reply is kept as a manifest of the message it hands back, as at record.
            let hint = if kind == EventType::ModelCall { BlobHint::ModelResponse } else { BlobHint::Raw };
            let put = BlobPut::new(bytes, hint);
            e.output_ref = Some(put.digest());
            e.output_hash = Some(put.digest());
            self.blobs.push(put);
        }
        edit(&mut e);
        self.clocks.insert(agent.to_owned(), e.lamport);
        e.seal(self.events.last().map(|p| p.hash)).unwrap();
        self.events.push(e);
        self.events.len() as u64
    }

    /// A delivery to `agent` of the message sent at `send`: lamport = max(own, send's) + 1.
    pub fn deliver(&mut self, agent: &str, send: u64) -> u64 {
        let sent = &self.events[send as usize - 1];
        let (from, kind) = (sent.agent_id.clone(), sent.message.as_ref().and_then(|m| m.kind.clone()));
        let lamport = self.clocks.get(agent).copied().unwrap_or(0).max(sent.lamport) + 1;
        let to = agent.to_owned();
        self.push(agent, EventType::Deliver, Some(&from.clone()), None, None, |e| {
            e.lamport = lamport;
            e.causal_parent = Some(send);
            e.message = Some(MessageRef { from: Some(from), to: Some(to), kind, timed_out: false });
        })
    }

    pub fn finish(self, mode: RunMode) -> Fixture {
        let mut meta = RunMeta::new(self.run, mode, 1_700_000_000_000);
        meta.name = Some("fixture".into());
        meta.status = RunStatus::Ok;
        meta.finished_at_ms = Some(1_700_000_060_000);
        meta.head = self.events.last().map(|e| e.hash);
        // As a recording's finish does: every decision taken, in order.
        meta.decisions = self
            .events
            .iter()
            .filter_map(|e| {
                let d = e.decision.as_ref()?;
                Some(FinalDecision {
                    agent: e.agent_id.clone(),
                    action: d.action.clone(),
                    target: d.target.clone(),
                })
            })
            .collect();
        Fixture { meta, events: self.events, blobs: self.blobs }
    }
}

/// A planner/reviewer conversation of `turns` turns: model requests whose message lists grow
/// (chained manifests in SQLite), sends and deliveries, tools with binary output, a 100 KB blob.
pub fn conversation(run: &str, turns: usize) -> Fixture {
    let mut b = Builder::new(run);
    let mut messages = vec![json!({"role": "system", "content": "plan the migration \u{2603}"})];
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": format!("turn {t}: what next?\n\"quoted\"")}));
        let request =
            serde_json::to_vec(&json!({"model": "gpt-4o", "messages": messages, "temperature": 0.2}))
                .unwrap();
        let output = format!(r#"{{"choices":[{{"message":{{"content":"step {t}"}}}}]}}"#).into_bytes();
        let call = b.push(
            "planner",
            EventType::ModelCall,
            Some("gpt-4o"),
            Some((request, BlobHint::ModelRequest)),
            Some(output),
            |e| {
                e.model = Some(ModelRef { provider: "openai".into(), name: "gpt-4o".into(), snapshot: None });
            },
        );
        messages.push(json!({"role": "assistant", "content": format!("step {t}")}));
        let body = format!(r#"{{"kind":"backfill_ready","turn":{t}}}"#).into_bytes();
        let send =
            b.push("planner", EventType::Send, Some("reviewer"), Some((body, BlobHint::Raw)), None, |e| {
                e.causal_parent = Some(call);
                let kind = Some("backfill_ready".into());
                e.message = Some(MessageRef {
                    from: Some("planner".into()),
                    to: Some("reviewer".into()),
                    kind,
                    timed_out: false,
                });
            });
        let deliver = b.deliver("reviewer", send);
        let mut binary = vec![0xff, 0x00, 0xfe, t as u8];
        if t == 1 {
            binary = "x".repeat(100 * 1024).into_bytes();
        }
        let query = format!(r#"{{"q":"select {t}"}}"#).into_bytes();
        b.push(
            "reviewer",
            EventType::ToolCall,
            Some("sql.query"),
            Some((query, BlobHint::Raw)),
            Some(binary),
            |e| {
                e.inbound = vec![deliver];
                e.tool = Some(ToolRef {
                    name: "sql.query".into(),
                    version: "2".into(),
                    class: ToolClass::Deterministic,
                    ttl_s: None,
                });
            },
        );
    }
    b.push("reviewer", EventType::Decision, None, None, None, |e| {
        e.decision = Some(Decision { action: "approve".into(), target: Some("step:backfill".into()) });
    });
    b.finish(RunMode::Record)
}

impl Fixture {
    /// Creates the run and commits its events in batches of 7.
    pub fn commit(&self, store: &dyn Store) {
        store.create_run(&self.meta).unwrap();
        let by_digest: HashMap<Digest, &BlobPut> = self.blobs.iter().map(|b| (b.digest(), b)).collect();
        for chunk in self.events.chunks(7) {
            let wanted = chunk.iter().flat_map(|e| [e.request_ref, e.output_ref]).flatten();
            let blobs = wanted.filter_map(|d| by_digest.get(&d).map(|b| (*b).clone())).collect();
            store
                .commit(&Batch {
                    run_id: self.meta.id.clone(),
                    events: chunk.to_vec(),
                    blobs,
                    cache: Vec::new(),
                })
                .unwrap();
        }
    }

    /// Reseals events from index `from` on, after an edit, so that only the edit is wrong.
    pub fn reseal_from(&mut self, from: usize) {
        for i in from..self.events.len() {
            let prev = if i == 0 { None } else { Some(self.events[i - 1].hash) };
            self.events[i].seal(prev).unwrap();
        }
        self.meta.head = self.events.last().map(|e| e.hash);
    }
}

/// A fork of `source` at seq `at`: its own two tool calls of agent `planner` follow `source`'s
/// first `at - 1` events (chained on them, clocks past theirs).
pub fn fork_of(source: &Fixture, id: &str, at: u64) -> Fixture {
    let mut b = Builder::new(id);
    for i in 0..2 {
        let output = Some(format!("{id} {i}").into_bytes());
        b.push("planner", EventType::ToolCall, Some("t"), None, output, |_| {});
    }
    let mut fork = b.finish(RunMode::Fork);
    let mut prev = source.events[at as usize - 2].hash;
    for (i, e) in fork.events.iter_mut().enumerate() {
        (e.seq, e.lamport) = (at + i as u64, 100 + i as u64);
        e.seal(Some(prev)).unwrap();
        prev = e.hash;
    }
    fork.meta.source_run = Some(source.meta.id.clone());
    fork.meta.fork_at = Some(at);
    fork.meta.head = Some(prev);
    fork
}

/// A store of each backend; the temporary folder lives as long as the store is used.
pub struct Backend {
    pub store: Arc<dyn Store>,
    pub dir: Option<tempfile::TempDir>,
}

pub fn memory() -> Backend {
    Backend { store: Arc::new(MemoryStore::new()), dir: None }
}

pub fn sqlite() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(&StoreConfig::in_home(dir.path())).unwrap();
    Backend { store, dir: Some(dir) }
}

pub fn export(store: &dyn Store, run: &str) -> Vec<u8> {
    let mut out = Vec::new();
    export_run(store, run, &mut out, &mut |_| {}).unwrap();
    out
}

pub fn import(store: &dyn Store, bytes: &[u8]) -> Result<ImportOutcome, ImportError> {
    import_reader(store, bytes, ImportOptions::default())
}

/// The file's lines, without their `\n`.
pub fn lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8(bytes.to_vec()).unwrap().lines().map(str::to_owned).collect()
}

/// Lines joined back into a file.
pub fn join(lines: &[String]) -> Vec<u8> {
    let mut out = lines.join("\n").into_bytes();
    out.push(b'\n');
    out
}
