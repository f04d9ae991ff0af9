//! `knew` on SQLite (packed head blocks, narrow delivery reads, batched bodies) answers exactly
//! as on the in-memory store (whole events, one at a time): the same deliveries, bodies and
//! chains; in a store recorded before head blocks (version 4, filled by the upgrade), with
//! blocks missing (read from `events` instead), and in a run still being recorded.
use retrace_core::canonical::canonical_value;
use retrace_core::envelope::MessageRef;
use retrace_core::{Digest, Event, EventType};
use retrace_store::causal::knew;
use retrace_store::conformance::sample_run;
use retrace_store::memory::MemoryStore;
use retrace_store::sqlite::schema::SCHEMA_VERSION;
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Batch, BlobHint, BlobPut, Durability, EventStore, Store};
use rusqlite::{Connection, OptionalExtension};
use serde_json::json;

/// A run of `agents` agents messaging at random (seeded): each send's causal parent is its
/// sender's latest delivery, each delivery's its send; every 7th send's blob is left out.
fn messaging_run(run: &str, agents: usize, messages: usize, seed: u64) -> (Vec<Event>, Vec<BlobPut>) {
    generate(run, agents, messages, None, seed)
}

/// As [`messaging_run`], but each message followed by `filler` events of a busy agent, so that a
/// chain's links lie far apart; every 4th send acts on a model call that acted on the sender's
/// latest delivery (not on the delivery itself) and every 9th message times out (a delivery of
/// no send).
fn far_run(
    run: &str,
    agents: usize,
    messages: usize,
    filler: usize,
    seed: u64,
) -> (Vec<Event>, Vec<BlobPut>) {
    generate(run, agents, messages, Some(filler), seed)
}

/// The one generator behind [`messaging_run`] (`far` is `None`) and [`far_run`].
fn generate(
    run: &str,
    agents: usize,
    messages: usize,
    far: Option<usize>,
    mut seed: u64,
) -> (Vec<Event>, Vec<BlobPut>) {
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
        let timed_out = far.is_some() && i % 9 == 5;
        let message = MessageRef {
            from: Some(format!("a{from}")),
            to: Some(format!("a{to}")),
            kind: Some("note".into()),
            timed_out,
        };
        let mut deliver = Event::new(run, format!("a{to}"), EventType::Deliver);
        deliver.name = Some(format!("a{from}"));
        deliver.message = Some(message.clone());
        if !timed_out {
            let mut parent = last[from];
            if far.is_some() && i % 4 == 1 {
                let mut think = Event::new(run, format!("a{from}"), EventType::ModelCall);
                think.name = Some("openai/chat".into());
                think.causal_parent = parent;
                parent = Some(push(&mut events, think));
            }
            let blob =
                BlobPut::new(canonical_value(&json!({"body": {"n": i}, "to": to})).unwrap(), BlobHint::Raw);
            let mut send = Event::new(run, format!("a{from}"), EventType::Send);
            send.name = Some(format!("a{to}"));
            send.message = Some(message);
            send.causal_parent = parent;
            if i % 7 != 3 {
                send.request_ref = Some(blob.digest());
                blobs.push(blob);
            }
            deliver.causal_parent = Some(push(&mut events, send));
        }
        last[to] = Some(push(&mut events, deliver));
        for _ in 0..far.unwrap_or(0) {
            let mut busy = Event::new(run, "busy", EventType::ToolCall);
            busy.name = Some("lookup".into());
            push(&mut events, busy);
        }
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
    // Enough messages that the last agent hears more than 64, from which SQLite reads the head
    // blocks on a thread of its own while it reads the bodies.
    let (events, blobs) = messaging_run("chat", 5, 400, 0x9e37_79b9);
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
    assert!(k.heard.len() > 64, "the last agent heard many messages: {}", k.heard.len());
    assert!(k.heard.iter().any(|h| h.body.is_none()), "a send without its blob has no body");
    assert!(k.heard.iter().filter_map(|h| h.body.as_ref()).all(|b| b.get("n").is_some()), "bodies");
    assert!(k.heard.iter().any(|h| h.chain.len() > 5), "chains run back through several agents");
}

/// Commits `events` (and the blobs they reference) to `store` in batches of 1..=`max` events.
fn commit_in_batches(store: &dyn Store, run: &str, events: &[Event], blobs: &[BlobPut], max: usize) {
    let mut at = 0;
    while at < events.len() {
        let end = (at + 1 + (at * 7) % max).min(events.len());
        let wanted: Vec<Digest> = events[at..end].iter().filter_map(|e| e.request_ref).collect();
        let blobs = blobs.iter().filter(|b| wanted.contains(&b.digest())).cloned().collect();
        store
            .commit(&Batch { run_id: run.into(), events: events[at..end].to_vec(), blobs, cache: vec![] })
            .unwrap();
        at = end;
    }
}

/// `knew` on both stores at several steps up to `last`, and at every decision.
fn same_knew(sqlite: &dyn Store, memory: &dyn Store, run: &str, last: u64, events: &[Event]) {
    let decisions = events.iter().filter(|e| e.seq <= last && e.kind == EventType::Decision).map(|e| e.seq);
    for seq in [1, 2, 40, 257, 301, 513, last / 2, last - 1, last].into_iter().chain(decisions) {
        if seq == 0 || seq > last {
            continue;
        }
        let (on_sqlite, on_memory) = (knew(sqlite, run, seq).unwrap(), knew(memory, run, seq).unwrap());
        assert_eq!(on_sqlite, on_memory, "knew at seq {seq} of {last}");
    }
}

fn open(dir: &std::path::Path) -> SqliteStore {
    SqliteStore::open(&dir.join("retrace.db"), &dir.join("blobs"), Durability::Os, 5_000).unwrap()
}

#[test]
fn knew_in_a_store_recorded_before_head_blocks_equals_knew_on_memory() {
    let (events, blobs) = messaging_run("old", 6, 400, 0x5eed_1234);
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryStore::new();
    memory.create_run(&sample_run("old", 1)).unwrap();
    commit_in_batches(&memory, "old", &events, &blobs, 50);
    let half = 451;
    {
        let sqlite = open(dir.path());
        sqlite.create_run(&sample_run("old", 1)).unwrap();
        commit_in_batches(&sqlite, "old", &events[..half], &blobs, 50);
    }
    // What a version 4 store holds: no head blocks, no interned names.
    let db = dir.path().join("retrace.db");
    Connection::open(&db)
        .unwrap()
        .execute_batch("DROP TABLE heads; DROP TABLE names; PRAGMA user_version = 4;")
        .unwrap();
    let sqlite = open(dir.path());
    let version: i64 =
        Connection::open(&db).unwrap().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let blocks: i64 =
        Connection::open(&db).unwrap().query_row("SELECT count(*) FROM heads", [], |r| r.get(0)).unwrap();
    assert_eq!(blocks, 2, "the upgrade filled the blocks of seqs 1..={half}");
    same_knew(&sqlite, &memory, "old", half as u64, &events);
    // The run goes on recording after the upgrade: its last block keeps growing.
    commit_in_batches(&sqlite, "old", &events[half..], &blobs, 9);
    same_knew(&sqlite, &memory, "old", events.len() as u64, &events);
}

#[test]
fn knew_while_a_run_is_recorded_and_with_blocks_missing_equals_knew_on_memory() {
    let (events, blobs) = messaging_run("live", 4, 350, 0xfeed_beef);
    let (sqlite, memory) = (SqliteStore::temporary().unwrap(), MemoryStore::new());
    for store in [&sqlite as &dyn Store, &memory] {
        store.create_run(&sample_run("live", 1)).unwrap();
    }
    // Batches of a few events, asked after each of several: partial blocks, then full ones.
    for stop in [3, 120, 255, 256, 257, 530, events.len()] {
        let done = sqlite.last_seq("live").unwrap() as usize;
        commit_in_batches(&sqlite, "live", &events[done..stop], &blobs, 5);
        commit_in_batches(&memory, "live", &events[done..stop], &blobs, 64);
        same_knew(&sqlite, &memory, "live", stop as u64, &events);
    }
    // A block gone (as if never written): its seqs are read from `events` instead.
    Connection::open(sqlite.path()).unwrap().execute("DELETE FROM heads WHERE id % 2 = 1", []).unwrap();
    same_knew(&sqlite, &memory, "live", events.len() as u64, &events);
}

#[test]
fn garbage_collection_deletes_a_runs_head_blocks_and_only_its_own() {
    use retrace_core::run::{RunMode, RunStatus};
    use retrace_store::{GcRequest, GcStore};
    let sqlite = SqliteStore::temporary().unwrap();
    for run in ["gone", "kept"] {
        let (events, blobs) = messaging_run(run, 3, 200, 7);
        let mut meta = retrace_core::run::RunMeta::new(run, RunMode::Record, 1);
        meta.status = RunStatus::Ok;
        sqlite.create_run(&meta).unwrap();
        commit_in_batches(&sqlite, run, &events, &blobs, 30);
    }
    let blocks = || -> i64 {
        Connection::open(sqlite.path())
            .unwrap()
            .query_row("SELECT count(*) FROM heads", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(blocks(), 4, "two blocks a run");
    let kept = knew(&sqlite, "kept", 403).unwrap();
    let request =
        GcRequest { runs: vec!["gone".into()], named: vec![], blob_cutoff_ms: u64::MAX, dry_run: false };
    assert_eq!(sqlite.collect_garbage(&request).unwrap().runs_deleted, ["gone"]);
    assert_eq!(blocks(), 2);
    assert_eq!(knew(&sqlite, "kept", 403).unwrap(), kept);
}

#[test]
fn a_corrupt_body_is_left_out_on_sqlite_as_on_memory_where_it_is_missing() {
    let (events, blobs) = messaging_run("bad", 4, 120, 0xbad);
    let (sqlite, memory) = (SqliteStore::temporary().unwrap(), MemoryStore::new());
    let last = events.len() as u64;
    let sends: Vec<u64> = events.iter().filter(|e| e.request_ref.is_some()).map(|e| e.seq).collect();
    // One stored body made corrupt on SQLite (its row's bytes changed) and left out of memory.
    let (corrupt, digest) = (sends[sends.len() - 1], events[sends[sends.len() - 1] as usize - 1].request_ref);
    let digest = digest.unwrap();
    for store in [&sqlite as &dyn Store, &memory] {
        store.create_run(&sample_run("bad", 1)).unwrap();
    }
    let batch = Batch { run_id: "bad".into(), events: events.clone(), blobs: blobs.clone(), cache: vec![] };
    sqlite.commit(&batch).unwrap();
    let kept: Vec<BlobPut> = blobs.iter().filter(|b| b.digest() != digest).cloned().collect();
    memory.commit(&Batch { blobs: kept, ..batch }).unwrap();
    let changed = Connection::open(sqlite.path())
        .unwrap()
        .execute(
            "UPDATE blobs SET data = CAST(upper(CAST(data AS TEXT)) AS BLOB) WHERE digest = ?1 AND kind = 0",
            [digest.as_bytes()],
        )
        .unwrap();
    assert_eq!(changed, 1, "the body is stored in its row");
    let read = sqlite.request_blobs_at("bad", &[corrupt, sends[0]]).unwrap();
    assert!(read[0].is_none() && read[1].is_some(), "only the corrupt blob is left out");
    same_knew(&sqlite, &memory, "bad", last, &events);
}

/// `heard_with_chains` on SQLite answers what its parts (`heard_by`, `chain_heads`) answer.
fn same_parts(sqlite: &SqliteStore, run: &str, events: &[Event]) {
    for e in events.iter().filter(|e| e.kind == EventType::Decision) {
        let (heard, chains) = sqlite.heard_with_chains(run, &e.agent_id, e.seq, 40).unwrap();
        assert_eq!(heard, sqlite.heard_by(run, &e.agent_id, e.seq).unwrap(), "heard at {}", e.seq);
        let mut sends: Vec<u64> = heard.iter().filter_map(|(d, _)| d.causal_parent).collect();
        sends.sort_unstable();
        sends.dedup();
        let parts = sqlite.chain_heads(run, &sends, 40).unwrap();
        assert_eq!(chains.heads(), parts.heads(), "chains of what {} heard at {}", e.agent_id, e.seq);
    }
}

#[test]
fn knew_over_chains_far_apart_equals_knew_on_memory() {
    // 300 seqs between messages: every link of a chain in a head block of its own.
    let (events, blobs) = far_run("far", 5, 120, 300, 0x5eed_f00d);
    let (sqlite, memory) = (SqliteStore::temporary().unwrap(), MemoryStore::new());
    for store in [&sqlite as &dyn Store, &memory] {
        store.create_run(&sample_run("far", 1)).unwrap();
        commit_in_batches(store, "far", &events, &blobs, 700);
    }
    let last = events.len() as u64;
    same_knew(&sqlite, &memory, "far", last, &events);
    same_parts(&sqlite, "far", &events);
    let heard: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventType::Decision)
        .flat_map(|e| knew(&sqlite, "far", e.seq).unwrap().heard)
        .collect();
    assert!(heard.iter().any(|h| h.chain.len() > 8), "chains run back through several agents");
    assert!(heard.iter().any(|h| h.chain.iter().any(|l| &*l.label == "model_call openai/chat")));
    assert!(heard.iter().any(|h| h.send_seq.is_none()), "a timeout was heard");
    // Sends that were committed a batch before their deliveries have their heads read back.
    let unknown: i64 = Connection::open(sqlite.path())
        .unwrap()
        .query_row("SELECT count(*) FROM deliveries WHERE send IS NOT NULL AND send_type IS NULL", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(unknown, 0, "every delivery's row holds its send's head");
}

#[test]
fn knew_in_a_store_recorded_before_delivery_heads_equals_knew_on_memory() {
    let (events, blobs) = far_run("v7", 4, 90, 260, 0x7777);
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryStore::new();
    memory.create_run(&sample_run("v7", 1)).unwrap();
    commit_in_batches(&memory, "v7", &events, &blobs, 500);
    let half = events.len() / 2;
    {
        let sqlite = open(dir.path());
        sqlite.create_run(&sample_run("v7", 1)).unwrap();
        commit_in_batches(&sqlite, "v7", &events[..half], &blobs, 500);
    }
    // What a version 7 store holds: deliveries without their heads.
    let db = dir.path().join("retrace.db");
    Connection::open(&db)
        .unwrap()
        .execute_batch(
            "ALTER TABLE deliveries DROP COLUMN name; ALTER TABLE deliveries DROP COLUMN send_type; \
             ALTER TABLE deliveries DROP COLUMN send_agent; ALTER TABLE deliveries DROP COLUMN send_name; \
             ALTER TABLE deliveries DROP COLUMN send_parent; PRAGMA user_version = 7;",
        )
        .unwrap();
    let sqlite = open(dir.path());
    let conn = Connection::open(&db).unwrap();
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let (rows, known): (i64, i64) = conn
        .query_row("SELECT count(*), count(send_type) FROM deliveries WHERE send IS NOT NULL", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert!(rows > 30 && known == rows, "the upgrade filled the heads of {known} of {rows} deliveries");
    same_knew(&sqlite, &memory, "v7", half as u64, &events);
    // The run goes on recording after the upgrade.
    commit_in_batches(&sqlite, "v7", &events[half..], &blobs, 300);
    same_knew(&sqlite, &memory, "v7", events.len() as u64, &events);
    same_parts(&sqlite, "v7", &events);
}

/// The `deliveries` rows of `run` in the table, and the seq through which they are complete
/// (`None`: all of them).
fn indexed(sqlite: &SqliteStore, run: &str) -> (i64, Option<u64>) {
    let conn = Connection::open(sqlite.path()).unwrap();
    let rows = conn
        .query_row(
            "SELECT count(*) FROM deliveries d JOIN runs r ON r.pk = d.run_pk WHERE r.id = ?1",
            [run],
            |r| r.get(0),
        )
        .unwrap();
    let mark = conn
        .query_row(
            "SELECT m.through FROM delivery_marks m JOIN runs r ON r.pk = m.run_pk WHERE r.id = ?1",
            [run],
            |r| r.get::<_, i64>(0),
        )
        .optional()
        .unwrap();
    (rows, mark.map(|m| m as u64))
}

/// The deliveries among `events` up to `last`.
fn delivered(events: &[Event], last: u64) -> i64 {
    events.iter().filter(|e| e.seq <= last && e.kind == EventType::Deliver).count() as i64
}

#[test]
fn deliveries_lag_a_bounded_number_of_events_and_are_read_past_the_mark() {
    use retrace_store::sqlite::schema::DELIVERIES_LAG;
    use retrace_store::LeaseHolder;
    let (events, blobs) = messaging_run("lag", 6, 2_600, 0x1a9);
    assert!(events.len() as u64 > 2 * DELIVERIES_LAG);
    let (sqlite, memory) = (SqliteStore::temporary().unwrap(), MemoryStore::new());
    for store in [&sqlite as &dyn Store, &memory] {
        store.create_run(&sample_run("lag", 1)).unwrap();
    }
    let holder = LeaseHolder("recorder".into());
    sqlite.acquire_lease("lag", &holder, 60_000).unwrap();
    let mut lagged = false;
    for stop in [5, 700, 2_049, 2_300, 4_100, 4_500, events.len()] {
        let done = sqlite.last_seq("lag").unwrap() as usize;
        commit_in_batches(&sqlite, "lag", &events[done..stop], &blobs, 40);
        commit_in_batches(&memory, "lag", &events[done..stop], &blobs, 64);
        let (rows, mark) = indexed(&sqlite, "lag");
        let last = stop as u64;
        match mark {
            // Complete through the mark, nothing after it, and never more than the lag behind.
            Some(through) => {
                lagged = true;
                assert!(last - through < DELIVERIES_LAG + 256, "{through} lags {last} too far");
                assert_eq!(rows, delivered(&events, through), "rows through {through}");
            }
            None => assert_eq!(rows, delivered(&events, last), "rows through {last}"),
        }
        for agent in ["a0", "a3", "a5"] {
            let ask = last.saturating_sub(3).max(1);
            assert_eq!(
                sqlite.heard_by("lag", agent, ask).unwrap(),
                memory.heard_by("lag", agent, ask).unwrap(),
                "what {agent} heard before {ask}"
            );
            assert_eq!(
                sqlite.deliveries_to("lag", agent, ask).unwrap(),
                memory.deliveries_to("lag", agent, ask).unwrap()
            );
        }
    }
    assert!(lagged, "some commits left rows to a catch-up");
    same_knew(&sqlite, &memory, "lag", events.len() as u64, &events[..600]);
    // The recorder lets go: every row is written, the mark gone, and knew unchanged.
    sqlite.release_lease("lag", &holder).unwrap();
    assert_eq!(indexed(&sqlite, "lag"), (delivered(&events, events.len() as u64), None));
    same_knew(&sqlite, &memory, "lag", events.len() as u64, &events[..600]);
}

#[test]
fn a_recorder_that_dies_with_rows_lagging_loses_none_and_the_next_one_catches_up() {
    let (events, blobs) = messaging_run("died", 5, 1_500, 0xdead);
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryStore::new();
    memory.create_run(&sample_run("died", 1)).unwrap();
    commit_in_batches(&memory, "died", &events, &blobs, 64);
    let half = 1_000;
    {
        let sqlite = open(dir.path());
        sqlite.create_run(&sample_run("died", 1)).unwrap();
        commit_in_batches(&sqlite, "died", &events[..half], &blobs, 30);
        // Dropped without letting go, as a killed recorder leaves it.
    }
    let sqlite = open(dir.path());
    let (rows, mark) = indexed(&sqlite, "died");
    assert_eq!((rows, mark), (0, Some(1)), "nothing indexed yet: the first delivery is at seq 2");
    same_knew(&sqlite, &memory, "died", half as u64, &events);
    commit_in_batches(&sqlite, "died", &events[half..], &blobs, 30);
    let (rows, mark) = indexed(&sqlite, "died");
    let through = mark.expect("the run's tail still lags");
    assert!(through > half as u64, "the next recorder caught up past the first one's rows");
    assert_eq!(rows, delivered(&events, through));
    same_knew(&sqlite, &memory, "died", events.len() as u64, &events);
}

#[test]
fn a_version_9_store_has_its_deliveries_whole_and_gets_marks_on_upgrade() {
    let (events, blobs) = messaging_run("v9", 4, 300, 0x99);
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryStore::new();
    memory.create_run(&sample_run("v9", 1)).unwrap();
    commit_in_batches(&memory, "v9", &events, &blobs, 64);
    {
        let sqlite = open(dir.path());
        sqlite.create_run(&sample_run("v9", 1)).unwrap();
        let holder = retrace_store::LeaseHolder("v9".into());
        sqlite.acquire_lease("v9", &holder, 60_000).unwrap();
        commit_in_batches(&sqlite, "v9", &events, &blobs, 64);
        sqlite.release_lease("v9", &holder).unwrap();
    }
    let db = dir.path().join("retrace.db");
    Connection::open(&db)
        .unwrap()
        .execute_batch("DROP TABLE delivery_marks; PRAGMA user_version = 9;")
        .unwrap();
    let sqlite = open(dir.path());
    let version: i64 =
        Connection::open(&db).unwrap().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(indexed(&sqlite, "v9"), (delivered(&events, events.len() as u64), None));
    same_knew(&sqlite, &memory, "v9", events.len() as u64, &events);
}
