//! The storage budget: a 200-turn conversation whose every request carries the whole history
//! costs about its unique message bytes, not the sum of its requests.
use std::path::Path;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retrace_core::{Event, EventType};
use retrace_store::conformance::sample_run;
use retrace_store::sqlite::SqliteStore;
use retrace_store::{BlobHint, BlobPut, BlobStore, Durability, EventStore, LeaseHolder, RunWriter};

fn folder_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else { return 0 };
    entries
        .flatten()
        .map(|e| {
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                folder_size(&e.path())
            } else {
                meta.len()
            }
        })
        .sum()
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// A chat message of 200 B..4 KB of random printable text, as JSON.
fn message(rng: &mut StdRng, role: &str) -> String {
    let len = rng.gen_range(200..=4096);
    let content: String = (0..len).map(|_| char::from(rng.gen_range(b' '..=b'~'))).collect();
    serde_json::json!({ "role": role, "content": content }).to_string()
}

/// How the model's reply is stored.
#[derive(Clone, Copy, Debug)]
enum Reply {
    /// The assistant message itself, as plain bytes.
    Bare,
    /// A chat completion holding the message, as a model response: its message is stored once,
    /// though the next request carries it again.
    ChatCompletion,
}

#[test]
fn a_long_conversation_costs_its_unique_bytes() {
    converse(Reply::Bare);
}

#[test]
fn a_chat_completion_s_message_is_stored_once() {
    converse(Reply::ChatCompletion);
}

fn converse(reply: Reply) {
    let dir = tempfile::tempdir().unwrap();
    let (db, blobs) = (dir.path().join("retrace.db"), dir.path().join("blobs"));
    let store = Arc::new(SqliteStore::open(&db, &blobs, Durability::Batch, 5_000).unwrap());
    store.create_run(&sample_run("budget", 1)).unwrap();
    let writer = RunWriter::open(store.clone(), "budget", LeaseHolder::current()).unwrap();
    let mut rng = StdRng::seed_from_u64(2024);
    let (turns, mut unique, mut naive) = (200u64, 0u64, 0u64);
    let mut history: Vec<String> = Vec::new();
    let (mut requests, mut outputs) = (Vec::new(), Vec::new());
    for turn in 0..turns {
        let user = message(&mut rng, "user");
        unique += user.len() as u64;
        history.push(user);
        let request = format!("{{\"model\":\"m\",\"messages\":[{}]}}", history.join(","));
        naive += request.len() as u64;
        let assistant = message(&mut rng, "assistant");
        unique += assistant.len() as u64;
        let request = BlobPut::new(request.into_bytes(), BlobHint::ModelRequest);
        let output = match reply {
            Reply::Bare => BlobPut::new(assistant.clone().into_bytes(), BlobHint::Raw),
            Reply::ChatCompletion => {
                let body = format!(
                    "{{\"choices\":[{{\"finish_reason\":\"stop\",\"index\":0,\"message\":{assistant}}}],\
                     \"id\":\"chatcmpl-{turn}\",\"object\":\"chat.completion\"}}"
                );
                naive += body.len() as u64;
                BlobPut::new(body.into_bytes(), BlobHint::ModelResponse)
            }
        };
        let mut event = Event::new("budget", "agent", EventType::ModelCall);
        event.name = Some("/v1/chat/completions".into());
        event.key = request.digest();
        event.request_ref = Some(request.digest());
        event.output_ref = Some(output.digest());
        event.output_hash = Some(output.digest());
        requests.push(request.clone());
        outputs.push(output.clone());
        writer.append(event, vec![request, output]).unwrap();
        history.push(assistant);
    }
    writer.close().unwrap();
    store.checkpoint().unwrap();
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    let (db_bytes, wal_bytes, blob_bytes) = (file_size(&db), file_size(Path::new(&wal)), folder_size(&blobs));
    let total = db_bytes + wal_bytes + blob_bytes;
    let budget = unique * 13 / 10 + 600 * turns;
    eprintln!(
        "storage ({reply:?}): {total} bytes (db {db_bytes}, wal {wal_bytes}, blob files {blob_bytes}) for {unique} \
         unique message bytes and {turns} events: ratio {:.3}, {:.0} bytes per event beyond the messages; \
         flat requests and outputs would take {naive} bytes ({:.1}x); budget {budget}",
        total as f64 / unique as f64,
        (total as f64 - unique as f64) / turns as f64,
        naive as f64 / unique as f64,
    );
    assert!(total <= budget, "{total} bytes stored, budget {budget}");
    // Every 10th request, and the last ones in order (the cache of rebuilt requests at work).
    for request in requests.iter().step_by(10).chain(&requests[190..]) {
        assert_eq!(store.get_blob(&request.digest()).unwrap(), request.bytes().to_vec());
        assert!(store.manifest_of(&request.digest()).unwrap().is_some());
    }
    for output in outputs.iter().step_by(7) {
        assert_eq!(store.get_blob(&output.digest()).unwrap(), output.bytes().to_vec());
        let manifest = store.manifest_of(&output.digest()).unwrap();
        assert_eq!(manifest.is_some(), matches!(reply, Reply::ChatCompletion), "{reply:?}");
    }
    let events = store.events("budget", 1, usize::MAX).unwrap();
    assert_eq!(events.len() as u64, turns);
    assert!(events.iter().all(|e| e.compute_hash().unwrap() == e.hash));
}
