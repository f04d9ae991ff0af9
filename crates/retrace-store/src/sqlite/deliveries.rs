//! The `deliveries` table (schema version 6): what `retrace knew` lists, clustered by the
//! receiving agent, so that an agent's deliveries lie together on a few pages however large the
//! run ([`SqliteStore::heard_impl`]).
//!
//! Row: `(run_pk, agent_pk, seq)` of a `deliver` event, its causal parent (`send`), the row id
//! of the blob its parent's `request_ref` names (`blob`) and its own `extra` column. `blob` is
//! resolved when the delivery is committed (or by the upgrade): 0 when the parent has no
//! request, NULL when it couldn't be resolved then (the parent or its blob not stored); readers
//! ask `events` and `blobs` for a NULL one. A blob an event references is never collected, so
//! the id stays that blob's for as long as the row lives.
//!
//! Since schema version 8 a row also holds the heads of its event and of its parent: its name
//! (`names.pk`), and the parent's type code, `agents.pk`, `names.pk` and causal parent
//! (`send_type` NULL when the parent wasn't stored when the delivery was). An agent's step
//! usually acts on a message delivered to it, so a causal chain of messages alternates a send
//! and a delivery to its sender: [`SqliteStore::heard_with_chains_impl`] follows it through the
//! rows of the agents on it, which lie together, instead of a head block per link.
//!
//! Since schema version 10 the rows of a run may lag its events by about
//! [`DELIVERIES_LAG`](super::schema::DELIVERIES_LAG) events ([`follow`]): written with each
//! commit, the table cost a page per delivery (each delivery goes to its receiver's page), where
//! a catch-up every couple of thousand events writes a page per receiving agent. Readers take
//! what lags from `events` in the same snapshot ([`to_agent_parts`]); a chain walk that finds no row
//! for a seq leaves it to the head blocks, as before.
use std::collections::{BinaryHeap, HashMap};

use retrace_core::{Digest, EventType};
use rusqlite::{params, Connection, OptionalExtension};

use super::blobs;
use super::files::Files;
use super::head_blocks::{resolve, RawHead};
use super::runs::run_pk;
use super::schema::seq_bound;
use super::SqliteStore;
use crate::error::ResultExt;
use crate::head::{SeqMap, SeqSet};
use crate::{ChainHead, Chains, DeliveryHead, Store, StoreError, StoreResult};

use super::schema::DELIVERIES_LAG as LAG;

/// The columns of a `deliveries` row (`seq, agent_pk, send, blob, extra, name, send_type,
/// send_agent, send_name, send_parent`) computed from the deliver event `d` of
/// [`FROM_EVENTS`]: what the table holds once caught up.
fn row_from_event() -> String {
    format!(
        "d.id & 4294967295 AS seq, d.agent_pk AS agent_pk, \
    d.causal_parent AS send, CASE WHEN s.id IS NULL THEN NULL WHEN s.request_ref IS NULL THEN 0 \
    ELSE coalesce(s.request_blob, {}) END AS blob, \
    d.extra AS extra, \
    (SELECT n.pk FROM names n WHERE n.name = d.name) AS name, \
    CASE WHEN s.name IS NULL OR sn.pk IS NOT NULL THEN s.type END AS send_type, \
    CASE WHEN s.name IS NULL OR sn.pk IS NOT NULL THEN s.agent_pk END AS send_agent, \
    CASE WHEN s.name IS NULL OR sn.pk IS NOT NULL THEN sn.pk END AS send_name, \
    CASE WHEN s.name IS NULL OR sn.pk IS NOT NULL THEN s.causal_parent END AS send_parent",
        super::tail::id_of("s.request_ref")
    )
}

/// The events [`row_from_event`] reads: `d` the delivery, `s` its send (when stored; a head
/// is only kept whole, so a send whose name isn't interned counts as unknown).
const FROM_EVENTS: &str = "FROM events d LEFT JOIN events s ON d.causal_parent < 4294967296 \
    AND s.id = (d.id >> 32 << 32) + d.causal_parent LEFT JOIN names sn ON sn.name = s.name";

/// How often (in seqs) commits without deliveries check a run's lag: a run's rows lag its
/// events by fewer than [`LAG`]` + CHECK_EVERY` events.
pub(crate) const CHECK_EVERY: u64 = 256;

/// Keeps the rows of run `run_pk` within about [`LAG`] events of `last`, in the transaction `tx`
/// that committed the events `first..=last` (a delivery first at `first_delivery`, if any).
///
/// `delivery_marks` holds, per run whose rows lag, the seq through which they are complete;
/// readers take the deliveries after it from `events` ([`to_agent_parts`]). The first delivery after
/// a catch-up sets the mark just before itself; the batch that reaches [`LAG`] events past the
/// mark writes every row since and clears it. A crash loses nothing: the mark stays, readers
/// read past it, and whoever commits to the run next catches up from it.
///
/// [`LAG`]: super::schema::DELIVERIES_LAG
pub(crate) fn follow(
    tx: &Connection,
    run_pk: i64,
    first: u64,
    first_delivery: Option<u64>,
    last: u64,
) -> rusqlite::Result<()> {
    // A batch without deliveries only checks when it crosses a multiple of `CHECK_EVERY`.
    if first_delivery.is_none() && first.saturating_sub(1) / CHECK_EVERY == last / CHECK_EVERY {
        return Ok(());
    }
    let mark = mark(tx, run_pk)?;
    let through = match (mark, first_delivery) {
        (Some(through), _) => through,
        (None, Some(first)) => first - 1,
        (None, None) => return Ok(()),
    };
    if last.saturating_sub(through) >= LAG {
        catch_up(tx, run_pk, through, last)?;
        if mark.is_some() {
            tx.prepare_cached("DELETE FROM delivery_marks WHERE run_pk = ?1")?.execute([run_pk])?;
        }
    } else if mark.is_none() {
        tx.prepare_cached("INSERT INTO delivery_marks (run_pk, through) VALUES (?1, ?2)")?
            .execute(params![run_pk, through as i64])?;
    }
    Ok(())
}

/// Completes the rows of run `run_pk` (clearing its mark), in `tx`: what a recorder does when
/// it lets go of the run.
pub(crate) fn complete(tx: &Connection, run_pk: i64) -> rusqlite::Result<()> {
    let mark = mark(tx, run_pk)?;
    if let Some(through) = mark {
        catch_up(tx, run_pk, through, super::schema::MAX_SEQ)?;
        tx.prepare_cached("DELETE FROM delivery_marks WHERE run_pk = ?1")?.execute([run_pk])?;
    }
    Ok(())
}

/// The seq through which the rows of run `run_pk` are complete, if they lag.
fn mark(tx: &Connection, run_pk: i64) -> rusqlite::Result<Option<u64>> {
    tx.prepare_cached("SELECT through FROM delivery_marks WHERE run_pk = ?1")?
        .query_row([run_pk], |r| r.get::<_, i64>(0))
        .optional()
        .map(|m| m.map(|t| t.max(0) as u64))
}

/// Writes the rows of the deliveries of run `run_pk` after seq `through`, up to `last`.
fn catch_up(tx: &Connection, run_pk: i64, through: u64, last: u64) -> rusqlite::Result<usize> {
    tx.prepare_cached(&format!(
        "INSERT OR REPLACE INTO deliveries (seq, agent_pk, send, blob, extra, name, send_type, \
         send_agent, send_name, send_parent, run_pk) SELECT {}, ?1 {FROM_EVENTS} \
         WHERE d.id > (?1 << 32) + ?2 AND d.id <= (?1 << 32) + ?3 AND d.type = {}",
        row_from_event(),
        EventType::Deliver.code()
    ))?
    .execute(params![run_pk, through as i64, last.min(super::schema::MAX_SEQ) as i64])
}

/// The deliveries to the agent named `?2` in run `?1` before seq `?3` (at most
/// [`super::schema::MAX_SEQ`]` + 1`), as rows with the columns `seq, send, blob, extra, name,
/// send_type, send_agent, send_name, send_parent`, in two statements: the table's rows through
/// the run's mark, then those computed from `events` past it. Each yields its rows in seq order
/// without a sort (one `UNION ALL ... ORDER BY` would sort, copying every column of every row
/// first), and every row of the first lies below every row of the second. Read both in one
/// snapshot ([`SqliteStore::read_one_snapshot`]).
pub(crate) fn to_agent_parts() -> [String; 2] {
    const COLUMNS: &str = "seq, send, blob, extra, name, send_type, send_agent, send_name, send_parent";
    [
        format!(
            "SELECT {COLUMNS} \
             FROM deliveries WHERE run_pk = ?1 AND agent_pk = (SELECT pk FROM agents WHERE name = ?2) \
             AND seq < ?3 AND seq <= coalesce((SELECT through FROM delivery_marks WHERE run_pk = ?1), 4294967295)"
        ),
        format!(
            "SELECT {COLUMNS} FROM (SELECT {} {FROM_EVENTS} \
             WHERE d.id > (?1 << 32) + (SELECT through FROM delivery_marks WHERE run_pk = ?1) \
             AND d.id < (?1 << 32) + ?3 AND d.type = {} \
             AND d.agent_pk = (SELECT pk FROM agents WHERE name = ?2))",
            row_from_event(),
            EventType::Deliver.code()
        ),
    ]
}

/// Deletes the deliveries of run `run_pk`.
pub(crate) fn delete_run(conn: &Connection, run_pk: i64) -> rusqlite::Result<usize> {
    conn.execute("DELETE FROM delivery_marks WHERE run_pk = ?1", [run_pk])?;
    conn.execute("DELETE FROM deliveries WHERE run_pk = ?1", [run_pk])
}

/// Fills the table from every delivery stored (the upgrade to schema version 6).
pub(crate) fn backfill(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "INSERT OR REPLACE INTO deliveries (run_pk, agent_pk, seq, send, blob, extra) \
         SELECT d.run_pk, d.agent_pk, d.seq, d.causal_parent, \
         CASE WHEN s.seq IS NULL THEN NULL WHEN s.request_ref IS NULL THEN 0 \
         ELSE (SELECT b.id FROM blobs b WHERE b.digest = s.request_ref) END, d.extra \
         FROM events d LEFT JOIN events s ON s.run_pk = d.run_pk AND s.seq = d.causal_parent \
         WHERE d.type = 5",
    )
}

/// Fills the columns version 8 added: each delivery's name, and its parent's head where that is
/// stored (the upgrade to schema version 8). Every stored event's name is interned since
/// version 5 (the upgrade to it interned the names of the events before).
pub(crate) fn backfill_heads(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "UPDATE deliveries SET name = (SELECT n.pk FROM events e JOIN names n ON n.name = e.name \
         WHERE e.run_pk = deliveries.run_pk AND e.seq = deliveries.seq); \
         UPDATE deliveries SET send_type = s.type, send_agent = s.agent_pk, send_name = n.pk, \
         send_parent = s.causal_parent \
         FROM events s LEFT JOIN names n ON n.name = s.name \
         WHERE s.run_pk = deliveries.run_pk AND s.seq = deliveries.send AND (s.name IS NULL OR n.pk IS NOT NULL);",
    )
}

/// The `msg` member of an event's `extra` column, the rest left unread.
#[derive(serde::Deserialize)]
struct MessageOnly {
    msg: Option<retrace_core::envelope::MessageRef>,
}

/// The message envelope in a delivery's `extra` column.
fn message(
    run: &str,
    seq: i64,
    extra: Option<&str>,
) -> StoreResult<Option<retrace_core::envelope::MessageRef>> {
    match extra {
        // Plain serde_json: a message envelope holds no numbers to keep exact.
        Some(json) => Ok(serde_json::from_str::<MessageOnly>(json)
            .map_err(|e| {
                StoreError::corrupt(format!("event {seq} of run {run} has a bad extra column: {e}"))
            })?
            .msg),
        None => Ok(None),
    }
}

/// The head of a delivery from a row whose first columns are `seq`, `send` and `extra`.
fn head_from_row(run: &str, r: &rusqlite::Row<'_>) -> rusqlite::Result<StoreResult<DeliveryHead>> {
    let seq: i64 = r.get(0)?;
    let send: Option<i64> = r.get(1)?;
    let extra = r.get_ref(2).and_then(|v| Ok(v.as_str_or_null()?))?;
    Ok(message(run, seq, extra).map(|message| DeliveryHead {
        seq: seq as u64,
        causal_parent: send.map(|s| s as u64),
        message,
    }))
}

impl SqliteStore {
    /// The deliveries to `agent` before `before`, in seq order, from `deliveries` alone.
    pub(crate) fn delivery_heads_impl(
        &self,
        run: &str,
        agent: &str,
        before: u64,
    ) -> StoreResult<Vec<DeliveryHead>> {
        let what = || format!("reading the deliveries to agent {agent} in run {run}");
        self.read_one_snapshot(what, |conn| {
            let pk = run_pk(conn, run)?;
            let before = seq_bound(before);
            let mut out = Vec::new();
            for part in to_agent_parts() {
                let mut select = conn
                    .prepare_cached(&format!("SELECT d.seq, d.send, d.extra FROM ({part}) d ORDER BY d.seq"))
                    .ctx(what)?;
                let mut rows = select.query(params![pk, agent, before]).ctx(what)?;
                while let Some(r) = rows.next().ctx(what)? {
                    out.push(head_from_row(run, r).ctx(what)??);
                }
            }
            Ok(out)
        })
    }

    /// [`crate::Store::heard_by`]: the deliveries with the request blobs of the events they
    /// delivered, each blob read by its row id (verified against that row's digest); a delivery
    /// whose blob wasn't resolved when committed is answered as
    /// [`SqliteStore::request_blobs_at_impl`] answers.
    pub(crate) fn heard_impl(
        &self,
        run: &str,
        agent: &str,
        before: u64,
    ) -> StoreResult<Vec<(DeliveryHead, Option<Vec<u8>>)>> {
        let what = || format!("reading the deliveries to agent {agent} in run {run}");
        let mut heard = self.read_one_snapshot(what, |conn| {
            heard_rows(conn, &self.files, run, run_pk(conn, run)?, agent, before)
        })?;
        self.resolve_bodies(run, &mut heard)?;
        Ok(heard.rows)
    }

    /// [`crate::Store::heard_with_chains`]: [`SqliteStore::heard_impl`], and the chains of the
    /// sends heard followed through the rows of `deliveries` as far as they alternate a send
    /// and a delivery to its sender, the rest as [`SqliteStore::chain_heads_impl`] follows them.
    pub(crate) fn heard_with_chains_impl(
        &self,
        run: &str,
        agent: &str,
        before: u64,
        depth: usize,
    ) -> StoreResult<crate::HeardWithChains> {
        let what = || format!("reading the causal chains of the deliveries to agent {agent} in run {run}");
        let (mut heard, walk, agents, names, blocks) = self.read_one_snapshot(what, |conn| {
            // The sends heard with their heads first (a few columns of the same rows), so the
            // chains can be followed while the bodies are read.
            let pk = run_pk(conn, run)?;
            let mut walk = ChainWalk::default();
            if depth > 0 {
                for (seq, send) in send_heads(conn, pk, agent, before).ctx(what)? {
                    walk.offer(seq, depth, send, None);
                }
            }
            walk.run(conn, pk).ctx(what)?;
            let (mut agents, mut names) = (SeqMap::default(), SeqMap::default());
            if !walk.found.is_empty() {
                agents = resolve(conn, "agents", walk.agents().iter()).ctx(what)?;
                names = resolve(conn, "names", walk.names().iter()).ctx(what)?;
            }
            // What the head blocks answer, the bulk of a busy run's chains, read on a thread of
            // its own when there is much of it: on another connection, whose snapshot is this
            // one's or later and holds the same blocks for these seqs (events never change).
            let rest = &walk.rest;
            let (heard, blocks) = if rest.len() >= PARALLEL_BLOCKS && crate::causal::query_threads() > 1 {
                std::thread::scope(|scope| {
                    let blocks = scope.spawn(|| {
                        // Through a snapshot connection too: a pooled reader maps only the first
                        // 64 MB of the file, and reads the blocks past them with `pread`.
                        let mut blocks = None;
                        Store::with_snapshot(self, &mut || blocks = Some(self.chain_heads_from(run, rest)));
                        blocks.expect("with_snapshot runs its function")
                    });
                    let heard = heard_rows(conn, &self.files, run, pk, agent, before);
                    let blocks = blocks.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    (heard, Some(blocks))
                })
            } else {
                (heard_rows(conn, &self.files, run, pk, agent, before), None)
            };
            Ok((heard?, walk, agents, names, blocks))
        })?;
        self.resolve_bodies(run, &mut heard)?;
        // What the head blocks answer first, then the rest.
        let mut chains = match (blocks, walk.rest.is_empty()) {
            (Some(blocks), _) => blocks?,
            (None, true) => Chains::default(),
            (None, false) => self.chain_heads_from(run, &walk.rest)?,
        };
        for (seq, h) in &walk.found {
            let agent = chains.intern(named(run, &agents, h.agent_pk)?);
            let name = h.name_pk.map(|pk| named(run, &names, pk).map(|n| chains.intern(n))).transpose()?;
            let kind = EventType::from_code(h.code)
                .ok_or_else(|| StoreError::corrupt(format!("event {seq} of run {run} has a bad type")))?;
            chains.insert_interned(*seq, ChainHead { kind, agent, name, causal_parent: h.parent });
        }
        Ok((heard.rows, chains))
    }

    /// Reads the bodies [`heard_rows`] left to `events` and `blobs`.
    fn resolve_bodies(&self, run: &str, heard: &mut HeardRows) -> StoreResult<()> {
        if heard.unresolved.is_empty() {
            return Ok(());
        }
        let mut sends: Vec<u64> = heard.unresolved.iter().map(|(_, s)| *s).collect();
        sends.sort_unstable();
        sends.dedup();
        let blobs = self.request_blobs_at_impl(run, &sends)?;
        let by_send: HashMap<u64, Option<Vec<u8>>> = sends.into_iter().zip(blobs).collect();
        for (i, send) in std::mem::take(&mut heard.unresolved) {
            heard.rows[i].1 = by_send.get(&send).cloned().flatten();
        }
        Ok(())
    }
}

/// Chain starts left to the head blocks from which [`SqliteStore::heard_with_chains_impl`]
/// reads the blocks on a thread of its own while it reads the bodies: a thread costs tens of µs.
const PARALLEL_BLOCKS: usize = 64;

/// The send of each delivery to `agent` of run `run_pk` before `before`, with the send's head
/// when the row holds it (in no particular order).
fn send_heads(
    conn: &Connection,
    run_pk: i64,
    agent: &str,
    before: u64,
) -> rusqlite::Result<Vec<(u64, Option<RawHead>)>> {
    let mut out = Vec::new();
    for part in to_agent_parts() {
        let mut select = conn.prepare_cached(&format!(
            "SELECT d.send, d.send_type, d.send_agent, d.send_name, d.send_parent FROM ({part}) d \
             WHERE d.send IS NOT NULL"
        ))?;
        let mut rows = select.query(params![run_pk, agent, seq_bound(before)])?;
        while let Some(r) = rows.next()? {
            let send = r.get::<_, i64>(0)? as u64;
            out.push((send, send_head(r, 1, send)?));
        }
    }
    Ok(out)
}

/// The string of `pk` in `table` (read by [`resolve`]).
fn named<'a>(run: &str, table: &'a SeqMap<i64, String>, pk: i64) -> StoreResult<&'a str> {
    table.get(&pk).map(String::as_str).ok_or_else(|| {
        StoreError::corrupt(format!("a delivery of run {run} names a missing agent or name {pk}"))
    })
}

/// What [`heard_rows`] reads: each delivery and its body, and which bodies are left to `events`
/// and `blobs` (index, send).
struct HeardRows {
    rows: Vec<(DeliveryHead, Option<Vec<u8>>)>,
    unresolved: Vec<(usize, u64)>,
}

/// The deliveries to `agent` of `run` (whose pk is `pk`) before `before` with the bodies their
/// rows resolve; read it in one snapshot.
fn heard_rows(
    conn: &Connection,
    files: &Files,
    run: &str,
    pk: i64,
    agent: &str,
    before: u64,
) -> StoreResult<HeardRows> {
    let what = || format!("reading the deliveries to agent {agent} in run {run}");
    let before = seq_bound(before);
    let mut out = HeardRows { rows: Vec::new(), unresolved: Vec::new() };
    // Each part is in seq order, and the first's rows lie below the second's.
    for part in to_agent_parts() {
        let mut select = conn
            .prepare_cached(&format!(
                "SELECT d.seq, d.send, d.extra, d.blob, b.digest, {} FROM ({part}) d \
                 LEFT JOIN blobs b ON b.id = d.blob ORDER BY d.seq",
                blobs::ROW_COLUMNS,
            ))
            .ctx(what)?;
        let mut rows = select.query(params![pk, agent, before]).ctx(what)?;
        while let Some(r) = rows.next().ctx(what)? {
            heard_row(conn, files, r, run, &mut out).ctx(what)??;
        }
    }
    Ok(out)
}

/// Adds the delivery of row `r` (of [`heard_rows`]) to `out`, with its body when the row
/// resolves it.
fn heard_row(
    conn: &Connection,
    files: &Files,
    r: &rusqlite::Row<'_>,
    run: &str,
    out: &mut HeardRows,
) -> rusqlite::Result<StoreResult<()>> {
    let head = match head_from_row(run, r)? {
        Ok(head) => head,
        Err(e) => return Ok(Err(e)),
    };
    let blob_id: Option<i64> = r.get(3)?;
    let bytes = match (head.causal_parent, blob_id) {
        (None, _) | (_, Some(0)) => None,
        (Some(send), None) => {
            out.unresolved.push((out.rows.len(), send));
            None
        }
        (Some(send), Some(_)) => match r.get_ref(4).and_then(|v| Ok(v.as_blob_or_null()?))? {
            // No such row (a blob an event references is never collected).
            None => {
                out.unresolved.push((out.rows.len(), send));
                None
            }
            Some(digest) => {
                let Some(digest) = Digest::from_slice(digest) else {
                    return Ok(Err(StoreError::corrupt("a blob row holds a bad digest")));
                };
                let row = (r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?);
                blobs::from_row(conn, files, &digest, Some(row)).ok()
            }
        },
    };
    out.rows.push((head, bytes));
    Ok(Ok(()))
}

/// The head of event `seq` from the columns `send_type`, `send_agent`, `send_name` and
/// `send_parent` of a row, from index `at`; `None` when the row doesn't hold it.
fn send_head(r: &rusqlite::Row<'_>, at: usize, seq: u64) -> rusqlite::Result<Option<RawHead>> {
    let Some(code) = r.get::<_, Option<i64>>(at)? else { return Ok(None) };
    let Ok(code) = u8::try_from(code) else { return Ok(None) };
    Ok(Some(RawHead {
        seq,
        agent_pk: r.get(at + 1)?,
        name_pk: r.get(at + 2)?,
        parent: r.get::<_, Option<i64>>(at + 3)?.map(|p| p as u64),
        code,
    }))
}

/// Seqs between an event and its parent below which the parent is left to the head blocks: a
/// chain whose links lie this close reads a block for many of them (the events of a busy part
/// of the run), where a chain of links far apart reads one for each (the events of a few agents
/// in a large run), and their rows lie together.
const NEAR: u64 = 256;

/// A walk down the chains of the sends heard, highest seq first (a seq's children all have
/// higher seqs, so when it comes up it is known with the most links any chain still follows
/// from it). A seq comes with its head when a row held it; else the parent of an agent's step,
/// when far below it, is taken for a delivery to that agent and looked up in its rows. What
/// neither answers is left, with its links, to the head blocks.
#[derive(Default)]
struct ChainWalk {
    /// Seqs to take, each once.
    queue: BinaryHeap<u64>,
    /// Seq → links left, its head if known, the agent it may have been delivered to.
    pending: SeqMap<u64, (usize, Option<RawHead>, Option<i64>)>,
    found: Vec<(u64, RawHead)>,
    /// Seqs left to the head blocks, with their links.
    rest: Vec<(u64, usize)>,
}

impl ChainWalk {
    /// Follows `seq` with `left` links, its head or the agent it may have been delivered to
    /// known; kept with the most links and all that is known of it.
    fn offer(&mut self, seq: u64, left: usize, head: Option<RawHead>, delivered_to: Option<i64>) {
        let queue = &mut self.queue;
        let entry = self.pending.entry(seq).or_insert_with(|| {
            queue.push(seq);
            (0, None, None)
        });
        entry.0 = entry.0.max(left);
        entry.1 = entry.1.or(head);
        entry.2 = entry.2.or(delivered_to);
    }

    fn run(&mut self, conn: &Connection, run_pk: i64) -> rusqlite::Result<()> {
        let mut row_of = conn.prepare_cached(
            "SELECT name, send, send_type, send_agent, send_name, send_parent FROM deliveries \
             WHERE run_pk = ?1 AND agent_pk = ?2 AND seq = ?3",
        )?;
        while let Some(seq) = self.queue.pop() {
            let Some((left, head, delivered_to)) = self.pending.remove(&seq) else { continue };
            let head = match (head, delivered_to) {
                (Some(head), _) => head,
                (None, Some(agent)) => {
                    let found = row_of
                        .query_row(params![run_pk, agent, seq as i64], |r| {
                            let send = r.get::<_, Option<i64>>(1)?.map(|s| s as u64);
                            let deliver = RawHead {
                                seq,
                                parent: send,
                                agent_pk: agent,
                                name_pk: r.get(0)?,
                                code: EventType::Deliver.code(),
                            };
                            Ok((deliver, send.map(|s| send_head(r, 2, s)).transpose()?.flatten()))
                        })
                        .optional()?;
                    let Some((deliver, send)) = found else {
                        self.rest.push((seq, left));
                        continue;
                    };
                    if let (Some(send), true) = (send, left > 1) {
                        self.offer(send.seq, left - 1, Some(send), None);
                    }
                    deliver
                }
                (None, None) => {
                    self.rest.push((seq, left));
                    continue;
                }
            };
            let deliver = head.code == EventType::Deliver.code();
            match head.parent.filter(|_| left > 1) {
                // A parent close below is likely in a head block read for others close by: the
                // step and its chain are left to the blocks.
                // (A parent not below its child, in a malformed log, is left to them too.)
                Some(parent) if !deliver && seq.checked_sub(parent).is_none_or(|d| d < NEAR) => {
                    self.rest.push((seq, left))
                }
                // A delivery's parent is another agent's send: known from its row, or left.
                Some(parent) if deliver => {
                    self.found.push((seq, head));
                    self.offer(parent, left - 1, None, None);
                }
                Some(parent) => {
                    self.found.push((seq, head));
                    self.offer(parent, left - 1, None, Some(head.agent_pk));
                }
                None => self.found.push((seq, head)),
            }
        }
        Ok(())
    }

    /// The agents' pks of what was found, each once.
    fn agents(&self) -> SeqSet<i64> {
        self.found.iter().map(|(_, h)| h.agent_pk).collect()
    }

    /// The names' pks of what was found, each once.
    fn names(&self) -> SeqSet<i64> {
        self.found.iter().filter_map(|(_, h)| h.name_pk).collect()
    }
}
