//! `knew` on SQLite (narrow head reads, batched bodies) answers exactly as on the in-memory
//! store (whole events, one at a time): the same deliveries, bodies and chains.
use retrace_core::canonical::canonical_value;
use retrace_core::envelope::MessageRef;
use retrace_core::{Digest, Event, EventType};
use retrace_store::causal::knew;
use retrace_store::conformance::sample_run;
use retrace_store::memory::MemoryStore;
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Batch, BlobHint, BlobPut, Store};
use serde_json::json;

/// A run of `agents` agents messaging at random (seeded): each send's causal parent is its
/// sender's latest delivery, each delivery's its send; every 7th send's blob is left out.
fn messaging_run(run: &str, agents: usize, messages: usize, mut seed: u64) -> (Vec<Event>, Vec<BlobPut>) {
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut events, mut blobs, mut last) = (Vec::new(), Vec::new(), vec![None; agents]);
    let push = |events: &mut Vec<Event>, mut e: Event| {
        e.seq = events.len() as u64 + 1;
        e.key = Digest::of(e.seq.to_string().as_bytes());
        e.seal(events.last().map(|p: &Event| p.hash)).unwrap();
        events.push(e);
        events.len() as u64
    };
    for i in 0..messages {
        let from = next() as usize % agents;
        let to = (from + 1 + next() as usize % (agents - 1)) % agents;
        let message = MessageRef {
            from: Some(format!("a{from}")),
            to: Some(format!("a{to}")),
            kind: Some("note".into()),
            timed_out: false,
        };
        let blob =
            BlobPut::new(canonical_value(&json!({"body": {"n": i}, "to": to})).unwrap(), BlobHint::Raw);
        let mut send = Event::new(run, format!("a{from}"), EventType::Send);
        send.name = Some(format!("a{to}"));
        send.message = Some(message.clone());
        send.causal_parent = last[from];
        if i % 7 != 3 {
            send.request_ref = Some(blob.digest);
            blobs.push(blob);
        }
        let send_seq = push(&mut events, send);
        let mut deliver = Event::new(run, format!("a{to}"), EventType::Deliver);
        deliver.name = Some(format!("a{from}"));
        deliver.message = Some(message);
        deliver.causal_parent = Some(send_seq);
        last[to] = Some(push(&mut events, deliver));
    }
    for (agent, parent) in last.iter().enumerate() {
        let mut decide = Event::new(run, format!("a{agent}"), EventType::Decision);
        decide.causal_parent = *parent;
        push(&mut events, decide);
    }
    (events, blobs)
}

#[test]
fn knew_on_sqlite_equals_knew_on_memory() {
    let (events, blobs) = messaging_run("chat", 5, 300, 0x9e37_79b9);
    let sqlite = SqliteStore::temporary().unwrap();
    let memory = MemoryStore::new();
    for store in [&sqlite as &dyn Store, &memory] {
        store.create_run(&sample_run("chat", 1)).unwrap();
        let batch =
            Batch { run_id: "chat".into(), events: events.clone(), blobs: blobs.clone(), cache: vec![] };
        store.commit(&batch).unwrap();
    }
    let last = events.len() as u64;
    for seq in [1, 2, 3, 40, 301, last - 2, last] {
        let (on_sqlite, on_memory) =
            (knew(&sqlite, "chat", seq).unwrap(), knew(&memory, "chat", seq).unwrap());
        assert_eq!(on_sqlite, on_memory, "knew at seq {seq}");
    }
    let k = knew(&sqlite, "chat", last).unwrap();
    assert!(k.heard.len() > 20, "the last agent heard many messages");
    assert!(k.heard.iter().any(|h| h.body.is_none()), "a send without its blob has no body");
    assert!(k.heard.iter().filter_map(|h| h.body.as_ref()).all(|b| b.get("n").is_some()), "bodies");
    assert!(k.heard.iter().any(|h| h.chain.len() > 5), "chains run back through several agents");
}
