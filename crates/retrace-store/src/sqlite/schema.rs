//! The SQLite schema and connection settings.
//!
//! Compact by design (a storage budget test holds it to ~1.3× the unique message bytes):
//! - `runs`: integer key, text id, start time and status for ordering and recovery, the rest of
//!   [`RunMeta`](retrace_core::run::RunMeta) as JSON, and (since version 14) `keeper`: the
//!   process that created the run `running` and will finish it, NULL when none said so
//!   ([`crate::EventStore::keep_run`]);
//! - `agents`: agent names interned to integers;
//! - `events`: a rowid table keyed by `id = run_pk << 32 | seq` (since version 9; `run_pk` and
//!   `seq` are virtual columns); digests as 32-byte blobs;
//!   `output_hash` is NULL when it equals `output_ref` (flag bit 0); the type as
//!   [`EventType::code`](retrace_core::EventType::code); the optional fields as one compact JSON
//!   column (`extra`, NULL when all are absent). Indexes: `(run_pk, agent_pk, seq)`, and the
//!   same restricted to deliveries for causal queries;
//! - `blobs`: rowid table; `kind` 0 = inline bytes (blobs up to 256 B), 1 = a file under the blob
//!   folder (`data` holds its relative path), 2 = a chained manifest (`data` holds its compact
//!   encoding), 3 = packed (`data` holds `segment_id << 16 | offset`);
//! - `blob_digests` and `blob_digests_recent` (since version 13): digest → row id of every blob
//!   but the most recent ones, without a rowid, in two levels; `blob_mark`: the id up to which
//!   blobs are in them, how many each holds and where the sweep between them is (see
//!   `sqlite/tail.rs`);
//! - `segments`: the bytes of packed blobs, appended end to end into rows of one page each
//!   (page size − [`SEGMENT_SLACK`]); a blob may continue into the following segments. One row
//!   per blob would leave ~17% of each page empty (append-only inserts split pages wherever the
//!   next row doesn't fit); segments fill pages to ~99%;
//! - `prefixes`: per run, the message-prefix digest `P_n` of each stored request → its blob;
//! - `leases`: one row per leased run;
//! - `cache` (since version 2): the LLM and tool caches, keyed by step key without a rowid: the
//!   output blob's digest, the usage as JSON, the store time, the tool class (NULL for a model)
//!   and the TTL;
//! - `vault` (since version 3): token → nonce, ciphertext (sealed under the vault key, see
//!   [`crate::vault`]) and the time it was stored, without a rowid;
//! - `vault_refs` (since version 16): which runs hold each token, so garbage collection deletes
//!   an original with the last run holding it (an original stored before has none, and stays);
//! - `audit` (since version 3): the append-only audit log, `id` AUTOINCREMENT so ids are never
//!   reused; triggers refuse every `UPDATE` and `DELETE`; indexed by subject (token or run);
//! - `blobs.stored_at` (since version 3): Unix milliseconds when the row was inserted, so
//!   garbage collection keeps what a running recording may still reference ([`crate::gc`]);
//!   `NULL` in rows older than version 3, meaning "old";
//! - `ledger` (since version 4): the replay ledger, one row per (project, agent) without a
//!   rowid; `ledger_traces`: which trace hashes each agent replayed, and whether each counts in
//!   the current clean streak ([`crate::ledger`]);
//! - `approvals` (since version 4): side effects held by the autonomy policy, decided once by
//!   `retrace approve`; indexed by (run, agent, key).
//!
//! - `names` (since version 5): step names interned to integers, for `heads`;
//! - `heads` (since version 5): packed head blocks, one row per 256 consecutive seqs of a run
//!   (`run_pk << 32 | seq >> 8`), each event's causal parent, agent, type and name as a
//!   fixed-width record, written with the events: what causal queries follow
//!   (`sqlite/head_blocks.rs`); since version 6 a block's second byte names its format, and
//!   records are 7 bytes where their values fit (13 before);
//! - `deliveries` (since version 6): each `deliver` event keyed by `(run_pk, agent_pk, seq)`
//!   without a rowid, with its causal parent, the row id of its parent's request blob and its
//!   `extra` column: what `retrace knew` lists, an agent's deliveries together on a few pages
//!   (`sqlite/deliveries.rs`);
//! - version 7 drops the indexes `events_agent` and `events_deliver`: each commit of a
//!   many-agent run dirtied a leaf page of each per agent, and `deliveries` (for deliveries)
//!   and the head blocks (for an agent's seqs, a few bytes per event) answer what they did;
//! - version 8 adds to each `deliveries` row its event's name (`names.pk`) and its send's head
//!   (`send_type`, `send_agent`, `send_name`, `send_parent`; `send_type` NULL when unknown), so
//!   that `retrace knew` follows a chain of sends and deliveries through the receiving agents'
//!   rows, a few pages, instead of a head block per link scattered over the run;
//! - version 9 rebuilds `events` as a rowid table keyed by `run_pk << 32 | seq` (so a run holds
//!   seqs up to [`MAX_SEQ`]): without a rowid its interior pages held whole rows, and a commit
//!   of one event wrote 1.7 pages of it, of a handful of events 3.9.
//!
//! - version 10 lets `deliveries` lag a run's events by about [`DELIVERIES_LAG`] events:
//!   `delivery_marks` holds, per run whose rows lag, the seq through which they are complete,
//!   and readers take the deliveries after it from `events`. Written with each commit, the
//!   table cost a page per delivery (an agent's rows lie together, and each delivery goes to
//!   its receiver's page); caught up every few thousand events, a page per receiving agent.
//!
//! - version 11 adds to each event the row ids of its request and output blobs
//!   (`request_blob`, `output_blob`; NULL when the commit didn't carry the blob, and in rows
//!   stored before), so export reads them by row id instead of looking each digest up in
//!   `blobs`' digest index: a random probe per blob, a quarter of the export's reading. A row
//!   id is a hint, never trusted alone: the reader checks the row's digest, and looks the
//!   digest up when it differs (a blob collected and its id reused).
//!
//! Versions: 1 had no `cache` table; 2 had no `vault`, no `audit` and no `blobs.stored_at`;
//! 3 had no `ledger`, `ledger_traces` or `approvals`; 4 had no `names` or `heads`; 5 had no
//! `deliveries`; 6 had the indexes `events_agent` and `events_deliver`; 7 had no heads in
//! `deliveries`; 8 kept `events` without a rowid, keyed by `(run_pk, seq)`; 9 wrote
//! `deliveries` with each commit; 10 had no blob row ids in `events`; 11 indexed every blob's
//! digest as it was stored and kept `cache` alone (see `sqlite/tail.rs`); 12 kept the indexed
//! digests in a partial index on `blobs`, one level; 13 had no `runs.keeper`; 14 had no
//! `snapshot` in `cache` and `cache_log`; 15 had no `vault_refs`.
//! Opening an older store brings it to [`SCHEMA_VERSION`] in one transaction, step by step
//! (1 → 2 adds `cache`; 2 → 3 adds `vault`, `audit` and the column; 3 → 4 adds the ledger and
//! the approvals; 4 → 5 adds `names` and `heads` and fills `heads` for every stored event;
//! 5 → 6 rewrites `heads` in the narrower format, adds `deliveries` and fills it from the stored
//! deliveries; 6 → 7 drops the two indexes; 7 → 8 adds the head columns to `deliveries` and
//! fills them; 8 → 9 rebuilds `events`; 9 → 10 adds `delivery_marks`, empty; 10 → 11 adds the
//! two columns, NULL; 11 → 12 rebuilds `blobs` with the column `indexed`, 1 in every row
//! stored, and its digest index partial, and adds `blob_mark` and `cache_log`; 12 → 13 moves
//! the indexed digests into `blob_digests` and drops that index; 13 → 14 adds `runs.keeper`,
//! NULL; 14 → 15 adds the two `snapshot` columns, NULL; 15 → 16 adds `vault_refs`, empty). A store of a newer version
//! than this build's is refused, never altered.
use rusqlite::Connection;

use crate::error::ResultExt;
use crate::{Durability, StoreError, StoreResult};

/// The schema version this build writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 16;

/// Page size for new databases. Small pages keep the fixed cost of each table and index low;
/// blob bytes are packed into page-sized segments, so pages stay full whatever the blob sizes.
pub const PAGE_SIZE: u32 = 4096;

/// Blob kind: the bytes are in `data` (blobs up to 256 B).
pub const KIND_INLINE: i64 = 0;
/// Blob kind: a file under the blob folder; `data` is its relative path.
pub const KIND_FILE: i64 = 1;
/// Blob kind: a chained manifest; `data` is its compact encoding.
pub const KIND_MANIFEST: i64 = 2;
/// Blob kind: packed into `segments`; `data` is the integer `segment_id << 16 | offset`.
pub const KIND_PACKED: i64 = 3;

/// Segment rows are this much smaller than a page, so that each fills one page on its own.
pub const SEGMENT_SLACK: usize = 48;

/// `flags` bit: `output_hash` equals `output_ref` and is stored as NULL.
pub const FLAG_OUTPUT_HASH_IS_REF: i64 = 1;

const DDL: &str = "
CREATE TABLE IF NOT EXISTS runs (
    pk INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    started_at INTEGER NOT NULL,
    status TEXT NOT NULL,
    meta TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS agents (
    pk INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS blobs (
    id INTEGER PRIMARY KEY,
    digest BLOB NOT NULL UNIQUE,
    kind INTEGER NOT NULL,
    size INTEGER NOT NULL,
    data BLOB
);
CREATE TABLE IF NOT EXISTS segments (
    id INTEGER PRIMARY KEY,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS prefixes (
    run_pk INTEGER NOT NULL,
    prefix BLOB NOT NULL,
    blob_id INTEGER NOT NULL,
    PRIMARY KEY (run_pk, prefix)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    run_pk INTEGER PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at INTEGER NOT NULL
);
";

/// `events` since version 9 (a new store's, and the table an upgrade rebuilds under a temporary
/// name): a rowid table keyed by `id = run_pk << 32 | seq`, with `run_pk` and `seq` as virtual
/// columns for reading. Until version 8 it was keyed by `(run_pk, seq)` without a rowid, whose
/// interior pages hold whole rows (~270 B: 14 to a page), so each commit rewrote a path of three
/// or four pages to append one leaf; a rowid table's interior pages hold ~400 keys.
fn events_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    id INTEGER PRIMARY KEY,
    type INTEGER NOT NULL,
    agent_pk INTEGER NOT NULL,
    lamport INTEGER NOT NULL,
    causal_parent INTEGER,
    name TEXT,
    key BLOB NOT NULL,
    request_ref BLOB,
    output_ref BLOB,
    output_hash BLOB,
    flags INTEGER NOT NULL,
    prev BLOB,
    hash BLOB NOT NULL,
    extra TEXT,
    request_blob INTEGER,
    output_blob INTEGER,
    run_pk INTEGER GENERATED ALWAYS AS (id >> 32) VIRTUAL,
    seq INTEGER GENERATED ALWAYS AS (id & 4294967295) VIRTUAL
);"
    )
}

/// The columns `events` stores (all but the virtual ones), in the order of [`events_ddl`].
const EVENT_STORED_COLUMNS: &str = "type, agent_pk, lamport, causal_parent, name, key, request_ref, \
    output_ref, output_hash, flags, prev, hash, extra";

/// The largest seq the SQLite store holds (seqs are the low 32 bits of `events.id`).
pub const MAX_SEQ: u64 = u32::MAX as u64;

/// Events a run's `deliveries` rows may lag behind its last seq, at most (since version 10):
/// the commit that reaches this many events past the run's mark writes every row since, all at
/// once (a page of each receiving agent per catch-up, instead of one per delivery and commit).
pub const DELIVERIES_LAG: u64 = 2048;

/// The largest run key (`runs.pk`) whose events fit `events.id`.
const MAX_RUN_PK: i64 = i32::MAX as i64;

/// `seq` as an SQL parameter added to `run_pk << 32`: at most `MAX_SEQ + 1`, which no event
/// has, so a range or a lookup from there finds nothing and never reaches the next run.
pub(crate) fn seq_bound(seq: u64) -> i64 {
    seq.min(MAX_SEQ + 1) as i64
}

/// Refuses an event whose `(run_pk, seq)` doesn't fit `events.id`.
pub(crate) fn check_event_id(run: &str, run_pk: i64, seq: u64) -> StoreResult<()> {
    if seq > MAX_SEQ {
        return Err(StoreError::invalid(format!(
            "event {seq} of run {run}: the SQLite store holds seqs up to {MAX_SEQ}"
        )));
    }
    if !(0..=MAX_RUN_PK).contains(&run_pk) {
        return Err(StoreError::invalid(format!(
            "run {run}: its key {run_pk} is beyond the {MAX_RUN_PK} runs the SQLite store numbers"
        )));
    }
    Ok(())
}

/// Version 9: rebuilds a version-8 `events` (keyed by `(run_pk, seq)`) as a rowid table keyed
/// by `id`, rows in the same order. Refuses, changing nothing, a store holding a seq or run key
/// beyond what `id` holds.
fn rebuild_events(conn: &Connection, path: &str) -> StoreResult<()> {
    let what = || format!("upgrading the events of the store {path} to schema version 9");
    if has_column(conn, "events", "id").ctx(what)? {
        return Ok(());
    }
    let (seq, pk): (Option<i64>, Option<i64>) = conn
        .query_row("SELECT max(seq), max(run_pk) FROM events", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .ctx(what)?;
    if seq.is_some_and(|s| s as u64 > MAX_SEQ) || pk.is_some_and(|p| p > MAX_RUN_PK) {
        return Err(StoreError::invalid(format!(
            "{}: it holds a seq above {MAX_SEQ} or a run key above {MAX_RUN_PK}, which version 9 can't number",
            what()
        )));
    }
    conn.execute_batch(&format!(
        "{ddl}
         INSERT INTO events_v9 (id, {EVENT_STORED_COLUMNS})
             SELECT (run_pk << 32) | seq, {EVENT_STORED_COLUMNS} FROM events ORDER BY run_pk, seq;
         DROP TABLE events;
         ALTER TABLE events_v9 RENAME TO events;",
        ddl = events_ddl("events_v9")
    ))
    .ctx(what)
}

/// Version 12: `blobs` with the column `indexed` and a partial digest index (every row stored
/// so far indexed, each keeping its id), `blob_mark` at the largest id, and `cache_log`
/// (see [`super::tail`]).
fn rebuild_blobs(conn: &Connection) -> rusqlite::Result<()> {
    if !has_column(conn, "blobs", "indexed")? {
        conn.execute_batch(
            "CREATE TABLE blobs_v12 (
             id INTEGER PRIMARY KEY,
             digest BLOB NOT NULL,
             kind INTEGER NOT NULL,
             size INTEGER NOT NULL,
             data BLOB,
             stored_at INTEGER,
             indexed INTEGER NOT NULL DEFAULT 0
         );
         INSERT INTO blobs_v12 (id, digest, kind, size, data, stored_at, indexed)
             SELECT id, digest, kind, size, data, stored_at, 1 FROM blobs ORDER BY id;
         DROP TABLE blobs;
         ALTER TABLE blobs_v12 RENAME TO blobs;
         CREATE UNIQUE INDEX blobs_digest ON blobs (digest) WHERE indexed = 1;",
        )?;
    }
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS blob_mark (epoch INTEGER NOT NULL, merged_to INTEGER NOT NULL);
         INSERT INTO blob_mark (epoch, merged_to) SELECT 0, coalesce(max(id), 0) FROM blobs
             WHERE NOT EXISTS (SELECT 1 FROM blob_mark);
         CREATE TABLE IF NOT EXISTS cache_log (
             id INTEGER PRIMARY KEY,
             key BLOB NOT NULL,
             output_blob BLOB NOT NULL,
             usage TEXT,
             stored_at INTEGER NOT NULL,
             class TEXT,
             ttl INTEGER
         );",
    )
}

/// Whether `table` has `column`: what makes each upgrade step that adds a column idempotent
/// (`ADD COLUMN` itself is not).
fn has_column(conn: &Connection, table: &str, column: &str) -> rusqlite::Result<bool> {
    conn.query_row("SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2", [table, column], |r| {
        r.get::<_, i64>(0)
    })
    .map(|n| n > 0)
}

/// Version 14: `runs.keeper`, the process that will finish a run it created `running` (NULL in
/// the rows already stored: those runs are judged by their lease, or the grace, as before).
fn add_keeper(conn: &Connection) -> rusqlite::Result<()> {
    if !has_column(conn, "runs", "keeper")? {
        conn.execute_batch("ALTER TABLE runs ADD COLUMN keeper TEXT;")?;
    }
    Ok(())
}

/// Version 15: a cached model output keeps the snapshot its live call reported, so a fork's
/// cache hit pins the model as the live call did (QA8 D1).
fn add_cache_snapshots(conn: &Connection) -> rusqlite::Result<()> {
    for table in ["cache", "cache_log"] {
        if !has_column(conn, table, "snapshot")? {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN snapshot TEXT;"))?;
        }
    }
    Ok(())
}

/// Version 13: the digests of the indexed blobs move from the partial index on `blobs` into
/// the table `blob_digests` (the column `indexed` stays, unused), beside an empty
/// `blob_digests_recent`, and `blob_mark` counts the rows of each and holds where the sweep
/// from one into the other is (see [`super::tail`]).
fn add_digest_tables(conn: &Connection) -> rusqlite::Result<()> {
    if has_column(conn, "blob_mark", "indexed_rows")? {
        return Ok(());
    }
    conn.execute_batch(
        "CREATE TABLE blob_digests (digest BLOB PRIMARY KEY, id INTEGER NOT NULL) WITHOUT ROWID;
         CREATE TABLE blob_digests_recent (digest BLOB PRIMARY KEY, id INTEGER NOT NULL) WITHOUT ROWID;
         INSERT INTO blob_digests (digest, id) SELECT digest, id FROM blobs WHERE indexed = 1 ORDER BY digest;
         ALTER TABLE blob_mark ADD COLUMN recent_rows INTEGER NOT NULL DEFAULT 0;
         ALTER TABLE blob_mark ADD COLUMN indexed_rows INTEGER NOT NULL DEFAULT 0;
         ALTER TABLE blob_mark ADD COLUMN sweep INTEGER NOT NULL DEFAULT 0;
         UPDATE blob_mark SET indexed_rows = (SELECT count(*) FROM blob_digests);
         DROP INDEX IF EXISTS blobs_digest;",
    )
}

/// Version 11: the row ids of each event's request and output blobs (`events.request_blob`,
/// `events.output_blob`), unless an upgrade from before version 9 rebuilt `events` with them.
fn add_blob_ids(conn: &Connection) -> rusqlite::Result<()> {
    if !has_column(conn, "events", "request_blob")? {
        conn.execute_batch(
            "ALTER TABLE events ADD COLUMN request_blob INTEGER;
             ALTER TABLE events ADD COLUMN output_blob INTEGER;",
        )?;
    }
    Ok(())
}

/// What version 2 added to version 1 (also part of a new store's schema).
const DDL_V2: &str = "
CREATE TABLE IF NOT EXISTS cache (
    key BLOB PRIMARY KEY,
    output_blob BLOB NOT NULL,
    usage TEXT,
    stored_at INTEGER NOT NULL,
    class TEXT,
    ttl INTEGER
) WITHOUT ROWID;
";

/// What version 16 added: the runs holding each token the vault keeps, so that deleting the
/// last of them deletes the original (QA38 D1).
const DDL_V16: &str = "
CREATE TABLE IF NOT EXISTS vault_refs (
    run TEXT NOT NULL,
    token TEXT NOT NULL,
    PRIMARY KEY (run, token)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS vault_refs_token ON vault_refs (token);
";

/// What version 3 added to version 2 (also part of a new store's schema), besides the column
/// `blobs.stored_at` ([`add_stored_at`]).
const DDL_V3: &str = "
CREATE TABLE IF NOT EXISTS vault (
    token TEXT PRIMARY KEY,
    nonce BLOB NOT NULL,
    ciphertext BLOB NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at INTEGER NOT NULL,
    who TEXT NOT NULL,
    role TEXT NOT NULL,
    action TEXT NOT NULL,
    subject TEXT NOT NULL,
    reason TEXT NOT NULL,
    outcome TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_subject ON audit (subject, id);
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
    BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
";

/// What version 4 added to version 3 (also part of a new store's schema).
const DDL_V4: &str = "
CREATE TABLE IF NOT EXISTS ledger (
    project TEXT NOT NULL,
    agent TEXT NOT NULL,
    replays INTEGER NOT NULL,
    traces_replayed INTEGER NOT NULL,
    clean_streak INTEGER NOT NULL,
    distinct_traces INTEGER NOT NULL,
    last_divergence TEXT,
    PRIMARY KEY (project, agent)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger_traces (
    project TEXT NOT NULL,
    agent TEXT NOT NULL,
    trace BLOB NOT NULL,
    in_streak INTEGER NOT NULL,
    PRIMARY KEY (project, agent, trace)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS approvals (
    id TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    agent TEXT NOT NULL,
    tool TEXT NOT NULL,
    key BLOB NOT NULL,
    rung TEXT NOT NULL,
    why TEXT NOT NULL,
    requested_at INTEGER NOT NULL,
    decision TEXT
);
CREATE INDEX IF NOT EXISTS approvals_step ON approvals (run, agent, key, requested_at);
";

/// What version 5 added to version 4 (also part of a new store's schema); an upgrade fills
/// `heads` for the events already stored (`head_blocks::backfill`).
const DDL_V5: &str = "
CREATE TABLE IF NOT EXISTS names (
    pk INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS heads (
    id INTEGER PRIMARY KEY,
    data BLOB NOT NULL
);
";

/// What version 6 added to version 5 (also part of a new store's schema); an upgrade fills it
/// (`deliveries::backfill`).
const DDL_V6: &str = "
CREATE TABLE IF NOT EXISTS deliveries (
    run_pk INTEGER NOT NULL,
    agent_pk INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    send INTEGER,
    blob INTEGER,
    extra TEXT,
    PRIMARY KEY (run_pk, agent_pk, seq)
) WITHOUT ROWID;
";

/// What version 10 added: per run whose `deliveries` rows lag its events, the seq through
/// which they are complete (`sqlite/deliveries.rs`).
const DDL_V10: &str = "
CREATE TABLE IF NOT EXISTS delivery_marks (
    run_pk INTEGER PRIMARY KEY,
    through INTEGER NOT NULL
);
";

/// What version 7 changed: `events` has no secondary indexes (see the module's notes).
const DDL_V7: &str = "DROP INDEX IF EXISTS events_agent; DROP INDEX IF EXISTS events_deliver;";

/// The columns version 8 added to `deliveries` (also part of a new store's schema, added by
/// [`add_delivery_heads`]); an upgrade fills them (`deliveries::backfill_heads`).
const DELIVERY_HEAD_COLUMNS: [&str; 5] = ["name", "send_type", "send_agent", "send_name", "send_parent"];

/// Adds the columns of [`DELIVERY_HEAD_COLUMNS`] that `deliveries` lacks; whether any was.
fn add_delivery_heads(conn: &Connection) -> rusqlite::Result<bool> {
    let mut added = false;
    for column in DELIVERY_HEAD_COLUMNS {
        if !has_column(conn, "deliveries", column)? {
            conn.execute_batch(&format!("ALTER TABLE deliveries ADD COLUMN {column} INTEGER"))?;
            added = true;
        }
    }
    Ok(added)
}

/// Adds `blobs.stored_at` unless it is there (`ADD COLUMN` itself is not idempotent).
fn add_stored_at(conn: &Connection) -> rusqlite::Result<()> {
    if !has_column(conn, "blobs", "stored_at")? {
        conn.execute_batch("ALTER TABLE blobs ADD COLUMN stored_at INTEGER")?;
    }
    Ok(())
}

/// Settings every connection gets.
pub(crate) fn configure(
    conn: &Connection,
    durability: Durability,
    busy_timeout_ms: u64,
    path: &str,
) -> StoreResult<()> {
    conn.busy_timeout(std::time::Duration::from_millis(busy_timeout_ms)).ctx(|| format!("opening {path}"))?;
    // `event` is `NORMAL` too: the store fdatasyncs the WAL itself after each commit
    // (`sync::WalSync`), which costs less than SQLite's `fsync` at `FULL`.
    let synchronous = match durability {
        Durability::Event | Durability::Batch => "NORMAL",
        Durability::Os => "OFF",
    };
    conn.execute_batch(&format!("PRAGMA synchronous = {synchronous}; PRAGMA foreign_keys = OFF;"))
        .ctx(|| format!("configuring {path}"))
}

/// Creates or checks the schema on the write connection (WAL mode, page size, tables);
/// returns the segment size for the database's page size, and the version this call upgraded
/// the store from (`None` for a store that was new or up to date, or that another process
/// upgraded first).
pub(crate) fn migrate(conn: &Connection, path: &str) -> StoreResult<(usize, Option<i64>)> {
    let what = || format!("opening the store {path}");
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).ctx(what)?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::invalid(format!(
            "the store {path} has schema version {version}, newer than this build's {SCHEMA_VERSION}"
        )));
    }
    if version == 0 {
        conn.execute_batch(&format!("PRAGMA page_size = {PAGE_SIZE};")).ctx(what)?;
    }
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)).ctx(what)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::io(format!("{}: could not switch to WAL mode (got {mode})", what())));
    }
    let upgraded = match version < SCHEMA_VERSION {
        true => upgrade(conn, path)?.filter(|from| *from > 0),
        false => None,
    };
    let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0)).ctx(what)?;
    Ok(((page_size as usize).saturating_sub(SEGMENT_SLACK).max(512), upgraded))
}

/// [`migrate`] for a read-only connection: the store must already be at [`SCHEMA_VERSION`]
/// (an upgrade would write it) and in WAL mode; returns the segment size for its page size.
pub(crate) fn check_read_only(conn: &Connection, path: &str) -> StoreResult<usize> {
    let what = || format!("opening the store {path} read-only");
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).ctx(what)?;
    if version != SCHEMA_VERSION {
        let (than, to) = match version > SCHEMA_VERSION {
            true => ("newer than this build's", "read it with a newer retrace"),
            false => ("older than this build's", "upgrading it would write it: copy it somewhere writable"),
        };
        return Err(StoreError::invalid(format!(
            "the store {path} has schema version {version}, {than} {SCHEMA_VERSION}, and is read-only: {to}"
        )));
    }
    let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0)).ctx(what)?;
    Ok((page_size as usize).saturating_sub(SEGMENT_SLACK).max(512))
}

/// Brings a store of an older version (0: new) up to [`SCHEMA_VERSION`] in one `BEGIN IMMEDIATE`
/// transaction. The version is read again inside it, so two processes opening the same old store
/// at once upgrade it once; every statement is idempotent besides. Returns the version it
/// upgraded from (0: new), or `None` if the store was up to date by then.
fn upgrade(conn: &Connection, path: &str) -> StoreResult<Option<i64>> {
    let what = || format!("upgrading the schema of the store {path}");
    conn.execute_batch("BEGIN IMMEDIATE").ctx(what)?;
    let upgraded = (|| {
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).ctx(what)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::invalid(format!(
                "the store {path} has schema version {version}, newer than this build's {SCHEMA_VERSION}"
            )));
        }
        if version == SCHEMA_VERSION {
            return Ok(None);
        }
        if version == 0 {
            conn.execute_batch(DDL).ctx(what)?;
            conn.execute_batch(&events_ddl("events")).ctx(what)?;
        }
        if version < 2 {
            conn.execute_batch(DDL_V2).ctx(what)?;
        }
        if version < 3 {
            add_stored_at(conn).ctx(what)?;
            conn.execute_batch(DDL_V3).ctx(what)?;
        }
        if version < 4 {
            conn.execute_batch(DDL_V4).ctx(what)?;
        }
        if version < 5 {
            conn.execute_batch(DDL_V5).ctx(what)?;
            if version > 0 {
                super::head_blocks::backfill(conn).ctx(what)?;
            }
        }
        if version == 5 {
            // Version 6 packs head blocks narrower: rewrite them.
            conn.execute_batch("DELETE FROM heads").ctx(what)?;
            super::head_blocks::backfill(conn).ctx(what)?;
        }
        if version < 6 {
            conn.execute_batch(DDL_V6).ctx(what)?;
            if version > 0 {
                super::deliveries::backfill(conn).ctx(what)?;
            }
        }
        if version < 7 {
            conn.execute_batch(DDL_V7).ctx(what)?;
        }
        if version < 8 && add_delivery_heads(conn).ctx(what)? && version > 0 {
            super::deliveries::backfill_heads(conn).ctx(what)?;
        }
        if version < 9 && version > 0 {
            rebuild_events(conn, path)?;
        }
        if version < 10 {
            // No mark: every run's rows are complete, as they were.
            conn.execute_batch(DDL_V10).ctx(what)?;
        }
        if version < 11 && version > 0 {
            // NULL in the rows already stored: their blobs are found by digest, as before.
            add_blob_ids(conn).ctx(what)?;
        }
        if version < 12 {
            rebuild_blobs(conn).ctx(what)?;
        }
        if version < 13 {
            add_digest_tables(conn).ctx(what)?;
        }
        if version < 14 {
            add_keeper(conn).ctx(what)?;
        }
        if version < 15 {
            add_cache_snapshots(conn).ctx(what)?;
        }
        if version < 16 {
            // Empty: the originals stored before are nobody's, and stay.
            conn.execute_batch(DDL_V16).ctx(what)?;
        }
        conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}")).ctx(what)?;
        Ok(Some(version))
    })();
    match upgraded {
        Ok(from) => conn.execute_batch("COMMIT").ctx(what).map(|()| from),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}
