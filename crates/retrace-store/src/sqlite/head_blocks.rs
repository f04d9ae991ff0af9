//! Packed head blocks: each event's causal parent, agent, type and name as a fixed-width record,
//! 256 consecutive seqs of a run to one row of `heads`, so that following causal chains reads a
//! block per few hundred seqs instead of a row per event ([`SqliteStore::chain_heads_impl`]).
//!
//! Events never change once appended, so a block only grows: [`put`] writes the records of a
//! batch in the batch's own transaction (the one block that may already hold earlier seqs is
//! read and rewritten), and the schema's upgrade fills the blocks of runs recorded before them.
//!
//! Row: `id` = `run_pk << 32 | seq >> 8`; `data` = one byte, the index in the block of its first
//! record (a fork's first block starts at its fork point), one byte, the block's format, then a
//! fixed-width record for each consecutive seq, little-endian: the distance back to the causal
//! parent (0 = none), the agent's `agents.pk`, the name's `names.pk` (0 = none), the type's
//! code. Format [`NARROW`] (since schema version 6): `u16` distances and pks, [`NARROW_RECORD`]
//! bytes a record, so that a page holds two blocks and a walk reads half the pages; a block with
//! a value too large for that is [`WIDE`]: `u32`s, [`WIDE_RECORD`] bytes. A record whose values
//! don't fit even so has the type byte [`UNFIT`]; readers then ask `events`.
use std::collections::{BinaryHeap, HashMap};

use retrace_core::EventType;
use rusqlite::{params, Connection, OptionalExtension};

use super::runs::run_pk;
use super::SqliteStore;
use crate::error::ResultExt;
use crate::head::SeqMap;
use crate::{ChainHead, Chains, StoreError, StoreResult};

/// Seqs per block, as a shift.
const SHIFT: u32 = 8;
/// Block format: `u16` fields.
const NARROW: u8 = 0;
/// Block format: `u32` fields.
const WIDE: u8 = 1;
/// Bytes per record of a [`NARROW`] block.
const NARROW_RECORD: usize = 7;
/// Bytes per record of a [`WIDE`] block.
const WIDE_RECORD: usize = 13;
/// Bytes before a block's first record: its index and the format.
const HEADER: usize = 2;
/// Type byte of a record that couldn't hold its event's values.
const UNFIT: u8 = 0xff;

/// What a record holds, as `events` stores it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawHead {
    pub seq: u64,
    pub parent: Option<u64>,
    pub agent_pk: i64,
    pub name_pk: Option<i64>,
    pub code: u8,
}

fn block_id(run_pk: i64, seq: u64) -> Option<i64> {
    let block = seq >> SHIFT;
    (block <= u32::MAX as u64 && (0..=i32::MAX as i64).contains(&run_pk))
        .then_some(run_pk << 32 | block as i64)
}

/// A record's values: the distance back to the parent (0 = none), agent pk, name pk (0 = none)
/// and type code ([`UNFIT`], the rest 0, when they don't fit in `u32`s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Record {
    delta: u32,
    agent: u32,
    name: u32,
    code: u8,
}

const UNFIT_RECORD: Record = Record { delta: 0, agent: 0, name: 0, code: UNFIT };

impl Record {
    fn of(h: &RawHead) -> Record {
        let delta = h.parent.map_or(Some(0), |p| h.seq.checked_sub(p).filter(|d| *d > 0));
        let fields = (
            delta.and_then(|d| u32::try_from(d).ok()),
            u32::try_from(h.agent_pk).ok(),
            u32::try_from(h.name_pk.unwrap_or(0)).ok(),
        );
        match fields {
            (Some(delta), Some(agent), Some(name)) if h.code != UNFIT => {
                Record { delta, agent, name, code: h.code }
            }
            _ => UNFIT_RECORD,
        }
    }

    fn narrow(&self) -> bool {
        self.delta <= 0xffff && self.agent <= 0xffff && self.name <= 0xffff
    }
}

/// A block's `data` for records of consecutive seqs from index `first`: [`NARROW`] when every
/// record fits.
fn encode(first: u8, records: &[Record]) -> Vec<u8> {
    let narrow = records.iter().all(Record::narrow);
    let width = if narrow { NARROW_RECORD } else { WIDE_RECORD };
    let mut out = Vec::with_capacity(HEADER + records.len() * width);
    out.push(first);
    out.push(if narrow { NARROW } else { WIDE });
    append(&mut out, narrow, records);
    out
}

/// Appends `records` to a block's `data`, each [`NARROW`] or not as `narrow` says (every record
/// must then fit).
fn append(out: &mut Vec<u8>, narrow: bool, records: &[Record]) {
    for r in records {
        if narrow {
            for v in [r.delta, r.agent, r.name] {
                out.extend_from_slice(&(v as u16).to_le_bytes());
            }
        } else {
            for v in [r.delta, r.agent, r.name] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out.push(r.code);
    }
}

/// A block's first index, record width and records, if its header is good.
fn parts(data: &[u8]) -> Option<(u8, usize, &[u8])> {
    let width = match *data.get(1)? {
        NARROW => NARROW_RECORD,
        WIDE => WIDE_RECORD,
        _ => return None,
    };
    Some((data[0], width, &data[HEADER..]))
}

/// Record `index` (counted from the block's first record) of `records`, `width` bytes each.
fn record(records: &[u8], width: usize, index: usize) -> Option<Record> {
    let r = records.get(index * width..(index + 1) * width)?;
    Some(if width == NARROW_RECORD {
        let half = |i: usize| u32::from(u16::from_le_bytes([r[i], r[i + 1]]));
        Record { delta: half(0), agent: half(2), name: half(4), code: r[6] }
    } else {
        let word = |i: usize| u32::from_le_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
        Record { delta: word(0), agent: word(4), name: word(8), code: r[12] }
    })
}

/// Every record of a block, with its first index; `None` for a block that isn't well formed.
fn records(data: &[u8]) -> Option<(u8, Vec<Record>)> {
    let (first, width, body) = parts(data)?;
    if body.len() % width != 0 {
        return None;
    }
    Some((first, (0..body.len() / width).filter_map(|i| record(body, width, i)).collect()))
}

/// The record of `seq` in a block's `data`, if the block holds a usable one.
fn decode(data: &[u8], seq: u64) -> Option<Decoded> {
    let (first, width, body) = parts(data)?;
    let index = (seq & ((1 << SHIFT) - 1)).checked_sub(first as u64)? as usize;
    let r = record(body, width, index)?;
    // UNFIT is no type's code.
    let kind = EventType::from_code(r.code)?;
    let delta = r.delta as u64;
    Some(Decoded {
        seq,
        parent: seq.checked_sub(delta).filter(|_| delta > 0),
        agent_pk: r.agent as i64,
        name_pk: Some(r.name as i64).filter(|n| *n != 0),
        kind,
    })
}

/// A record read back.
#[derive(Clone, Copy, Debug)]
struct Decoded {
    seq: u64,
    parent: Option<u64>,
    agent_pk: i64,
    name_pk: Option<i64>,
    kind: EventType,
}

/// Writes the records of `heads` (consecutive seqs of run `run_pk`, ascending, continuing what
/// the run's blocks hold) in `conn`'s transaction.
pub(crate) fn put(conn: &Connection, run_pk: i64, heads: &[RawHead]) -> rusqlite::Result<()> {
    let mut read = conn.prepare_cached("SELECT data FROM heads WHERE id = ?1")?;
    let mut write = conn.prepare_cached("INSERT OR REPLACE INTO heads (id, data) VALUES (?1, ?2)")?;
    let mut rest = heads;
    while let Some(first) = rest.first() {
        let end = rest.iter().position(|h| h.seq >> SHIFT != first.seq >> SHIFT).unwrap_or(rest.len());
        let (block, tail) = rest.split_at(end);
        rest = tail;
        let Some(id) = block_id(run_pk, first.seq) else { continue };
        let start = (first.seq & ((1 << SHIFT) - 1)) as u8;
        let stored = read.query_row([id], |r| r.get::<_, Vec<u8>>(0)).optional()?;
        let new: Vec<Record> = block.iter().map(Record::of).collect();
        let data = match stored {
            // Only a block the run already wrote up to here is continued; anything else is
            // rewritten from this batch's first seq (a gap is never papered over).
            Some(stored) if continues(&stored, start) => extend(stored, &new),
            _ => encode(start, &new),
        };
        write.execute(params![id, data])?;
    }
    Ok(())
}

/// Whether a block's `data` is well formed and holds records up to index `start`, exclusive.
fn continues(data: &[u8], start: u8) -> bool {
    match parts(data) {
        Some((first, width, body)) => {
            body.len() % width == 0 && first as usize + body.len() / width == start as usize
        }
        None => false,
    }
}

/// A block that [`continues`] up to the first index of `new`, with `new` appended: in place
/// while its format holds them (the usual case: the block isn't decoded), else decoded and
/// encoded again, [`WIDE`].
fn extend(mut data: Vec<u8>, new: &[Record]) -> Vec<u8> {
    let narrow = data[1] == NARROW;
    if !narrow || new.iter().all(Record::narrow) {
        append(&mut data, narrow, new);
        return data;
    }
    let (first, mut all) = records(&data).unwrap_or_default();
    all.extend_from_slice(new);
    encode(first, &all)
}

/// The seqs of agent `agent_pk`'s events in run `run_pk`, ascending, read from the run's blocks
/// (a few bytes per event); a record that couldn't hold its values, or a block that isn't well
/// formed, is answered from `events`.
pub(crate) fn agent_seqs(conn: &Connection, run_pk: i64, agent_pk: i64) -> rusqlite::Result<Vec<u64>> {
    let mut blocks =
        conn.prepare_cached("SELECT id, data FROM heads WHERE id >= ?1 AND id < ?2 ORDER BY id")?;
    let mut from_events = conn.prepare_cached(
        "SELECT seq FROM events WHERE id >= (?1 << 32) + ?2 AND id <= (?1 << 32) + ?3 AND agent_pk = ?4 \
         ORDER BY id",
    )?;
    let mut rows = blocks.query(params![run_pk << 32, (run_pk + 1) << 32])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let base = ((row.get::<_, i64>(0)? as u64) & u64::from(u32::MAX)) << SHIFT;
        let data = row.get_ref(1)?.as_blob().unwrap_or_default();
        let (first, records) = records(data).unwrap_or((0, vec![UNFIT_RECORD; 1 << SHIFT]));
        for (i, r) in records.iter().enumerate() {
            let seq = base + u64::from(first) + i as u64;
            if r.code == UNFIT {
                let found = from_events
                    .query_map(params![run_pk, seq as i64, seq as i64, agent_pk], |r| r.get::<_, i64>(0))?;
                for found in found {
                    out.push(found? as u64);
                }
            } else if i64::from(r.agent) == agent_pk {
                out.push(seq);
            }
        }
    }
    Ok(out)
}

/// Deletes the blocks of run `run_pk`.
pub(crate) fn delete_run(conn: &Connection, run_pk: i64) -> rusqlite::Result<usize> {
    conn.execute("DELETE FROM heads WHERE id >= ?1 AND id < ?2", params![run_pk << 32, (run_pk + 1) << 32])
}

/// Fills the blocks of every event stored (the upgrade to schema version 5), interning names.
pub(crate) fn backfill(conn: &Connection) -> rusqlite::Result<()> {
    let mut names: HashMap<String, i64> = HashMap::new();
    let mut heads: Vec<RawHead> = Vec::new();
    let mut run = None;
    let mut select = conn.prepare(
        "SELECT run_pk, seq, type, agent_pk, causal_parent, name FROM events ORDER BY run_pk, seq",
    )?;
    let mut rows = select.query([])?;
    while let Some(row) = rows.next()? {
        let (pk, seq): (i64, i64) = (row.get(0)?, row.get(1)?);
        if run != Some(pk) || heads.len() >= 4096 || heads.last().is_some_and(|h| h.seq + 1 != seq as u64) {
            if let Some(run) = run {
                put(conn, run, &heads)?;
            }
            heads.clear();
            run = Some(pk);
        }
        let name: Option<String> = row.get(5)?;
        let name_pk = name.map(|n| intern_name(conn, &mut names, &n)).transpose()?;
        heads.push(RawHead {
            seq: seq as u64,
            parent: row.get::<_, Option<i64>>(4)?.map(|p| p as u64),
            agent_pk: row.get(3)?,
            name_pk,
            code: u8::try_from(row.get::<_, i64>(2)?).unwrap_or(UNFIT),
        });
    }
    if let Some(run) = run {
        put(conn, run, &heads)?;
    }
    Ok(())
}

/// The `names.pk` of `name`, inserting it when new; `cache` remembers what it has seen.
pub(crate) fn intern_name(
    conn: &Connection,
    cache: &mut HashMap<String, i64>,
    name: &str,
) -> rusqlite::Result<i64> {
    if let Some(pk) = cache.get(name) {
        return Ok(*pk);
    }
    conn.prepare_cached("INSERT OR IGNORE INTO names (name) VALUES (?1)")?.execute([name])?;
    let pk = conn.prepare_cached("SELECT pk FROM names WHERE name = ?1")?.query_row([name], |r| r.get(0))?;
    cache.insert(name.to_owned(), pk);
    Ok(pk)
}

/// `pk → name` of `table` for `pks`.
pub(crate) fn resolve<'a>(
    conn: &Connection,
    table: &str,
    pks: impl Iterator<Item = &'a i64>,
) -> rusqlite::Result<SeqMap<i64, String>> {
    let list = serde_json::to_string(&pks.collect::<Vec<_>>()).unwrap_or_else(|_| "[]".into());
    conn.prepare_cached(&format!(
        "SELECT t.pk, t.name FROM json_each(?1) j CROSS JOIN {table} t ON t.pk = j.value"
    ))?
    .query_map([list], |r| Ok((r.get(0)?, r.get(1)?)))?
    .collect()
}

/// Blocks a downward scan steps over rather than seeking again: a step to the previous row costs
/// a fraction of a seek from the root, so a walk that needs most blocks of a range reads them in
/// one pass, and one that needs blocks far apart seeks each.
const MAX_SKIP: i64 = 4;

impl SqliteStore {
    /// Follows every chain at once, highest seq first: a seq's children all have higher seqs,
    /// so when it comes up it is known with the most links any chain still follows from it,
    /// and each block is read once, records decoded where SQLite holds them. Blocks come from
    /// one scan down the run's blocks, sought again only across a gap. A seq no block answers
    /// for (a record that didn't fit) is read from `events`, with what lies above it, a level
    /// at a time.
    pub(crate) fn chain_heads_impl(&self, run: &str, starts: &[u64], depth: usize) -> StoreResult<Chains> {
        let starts: Vec<(u64, usize)> = starts.iter().map(|s| (*s, depth)).collect();
        self.chain_heads_from(run, &starts)
    }

    /// [`SqliteStore::chain_heads_impl`] with a depth for each start: `(seq, links)`.
    pub(crate) fn chain_heads_from(&self, run: &str, starts: &[(u64, usize)]) -> StoreResult<Chains> {
        let (walk, agents, names) = self.read(|conn| {
            let pk = run_pk(conn, run)?;
            let what = || format!("reading the causal chains of run {run}");
            let mut walk = Walk::new(pk, starts);
            let mut select = conn
                .prepare_cached("SELECT id, data FROM heads WHERE id BETWEEN ?1 AND ?2 ORDER BY id DESC")
                .ctx(what)?;
            while let Some(id) = walk.next_block() {
                // A scan down from `id`, kept while the blocks needed lie close below its row.
                let mut rows = select.query(params![pk << 32, id]).ctx(what)?;
                let mut exhausted = true;
                while let Some(row) = rows.next().ctx(what)? {
                    let at: i64 = row.get(0).ctx(what)?;
                    walk.missing_above(at);
                    if walk.next_block() == Some(at) {
                        let data = row.get_ref(1).and_then(|v| Ok(v.as_blob()?)).ctx(what)?;
                        walk.in_block(data);
                    }
                    if walk.next_block().is_none_or(|next| at - next > MAX_SKIP) {
                        exhausted = false;
                        break;
                    }
                }
                if exhausted {
                    // The run has no other block at or below `id`.
                    walk.missing_above((pk << 32) - 1);
                }
            }
            let agents = resolve(conn, "agents", walk.agents.keys()).ctx(what)?;
            let names = resolve(conn, "names", walk.names.keys()).ctx(what)?;
            Ok((walk, agents, names))
        })?;
        let offset = walk.agents.len() as u32;
        let mut strings = vec![String::new(); walk.agents.len() + walk.names.len()];
        let named = |table: &SeqMap<i64, String>, pk: &i64| {
            table.get(pk).cloned().ok_or_else(|| {
                StoreError::corrupt(format!("a head block of run {run} names a missing agent or name {pk}"))
            })
        };
        for (pk, id) in &walk.agents {
            strings[*id as usize] = named(&agents, pk)?;
        }
        for (pk, id) in &walk.names {
            strings[(offset + *id) as usize] = named(&names, pk)?;
        }
        let mut heads = SeqMap::with_capacity_and_hasher(walk.found.len(), Default::default());
        heads.extend(walk.found.into_iter().map(|(seq, mut head)| {
            head.name = head.name.map(|n| n + offset);
            (seq, head)
        }));
        let mut chains = Chains::from_parts(strings, heads);
        for (seq, left) in walk.unanswered {
            crate::head::chain_heads_by_level(self, run, &[seq], left, &mut chains)?;
        }
        Ok(chains)
    }
}

/// A walk down all chains at once: what is still to follow, and what the blocks answered, agent
/// and name pks given string ids.
struct Walk {
    run_pk: i64,
    /// Blocks (seq >> [`SHIFT`]) with seqs to follow, highest first; each once.
    blocks: BinaryHeap<u64>,
    /// Block → (seq, links still to follow from it), a seq possibly more than once.
    pending: SeqMap<u64, Vec<(u64, usize)>>,
    /// The block being read: links still to follow from each of its seqs (0: none), and which
    /// are set, as bits.
    left: Vec<usize>,
    set: [u64; BLOCK_WORDS],
    /// Seqs no block answered for, with their links left.
    unanswered: Vec<(u64, usize)>,
    found: Vec<(u64, ChainHead)>,
    agents: SeqMap<i64, u32>,
    names: SeqMap<i64, u32>,
}

/// Words of a bit per seq of a block.
const BLOCK_WORDS: usize = (1 << SHIFT) / 64;

impl Walk {
    fn new(run_pk: i64, starts: &[(u64, usize)]) -> Walk {
        let mut walk = Walk {
            run_pk,
            blocks: BinaryHeap::new(),
            pending: SeqMap::default(),
            left: vec![0; 1 << SHIFT],
            set: [0; BLOCK_WORDS],
            unanswered: Vec::new(),
            found: Vec::new(),
            agents: SeqMap::default(),
            names: SeqMap::default(),
        };
        for (start, depth) in starts.iter().filter(|(_, depth)| *depth > 0) {
            walk.follow_later(*start, *depth);
        }
        walk
    }

    /// Follows `seq` (in a block below the one being read) with `left` links.
    fn follow_later(&mut self, seq: u64, left: usize) {
        let blocks = &mut self.blocks;
        self.pending
            .entry(seq >> SHIFT)
            .or_insert_with(|| {
                blocks.push(seq >> SHIFT);
                Vec::new()
            })
            .push((seq, left));
    }

    /// Follows `seq` of the block being read with `left` links, unless it is already followed
    /// with as many.
    fn follow_here(&mut self, seq: u64, left: usize) {
        let i = (seq & ((1 << SHIFT) - 1)) as usize;
        self.left[i] = self.left[i].max(left);
        self.set[i / 64] |= 1 << (i % 64);
    }

    /// The id of the highest block with seqs to follow; a block that can have no id is taken
    /// with nothing on the way.
    fn next_block(&mut self) -> Option<i64> {
        while let Some(&block) = self.blocks.peek() {
            match block_id(self.run_pk, block << SHIFT) {
                Some(id) => return Some(id),
                None => self.in_block(&[]),
            }
        }
        None
    }

    /// Every block needed above `id` is missing.
    fn missing_above(&mut self, id: i64) {
        while self.next_block().is_some_and(|next| next > id) {
            self.in_block(&[]);
        }
    }

    /// Takes every seq to follow in the highest such block, its records in `data`, highest
    /// first; a parent in the same block is followed in this pass.
    fn in_block(&mut self, data: &[u8]) {
        let Some(block) = self.blocks.pop() else { return };
        for (seq, left) in self.pending.remove(&block).unwrap_or_default() {
            self.follow_here(seq, left);
        }
        for word in (0..BLOCK_WORDS).rev() {
            while self.set[word] != 0 {
                let bit = 63 - self.set[word].leading_zeros() as usize;
                self.set[word] &= !(1 << bit);
                let i = word * 64 + bit;
                let left = std::mem::take(&mut self.left[i]);
                let seq = block << SHIFT | i as u64;
                let Some(raw) = decode(data, seq) else {
                    self.unanswered.push((seq, left));
                    continue;
                };
                self.add(raw);
                match raw.parent.filter(|_| left > 1) {
                    Some(parent) if parent >> SHIFT == block => self.follow_here(parent, left - 1),
                    Some(parent) => self.follow_later(parent, left - 1),
                    None => {}
                }
            }
        }
    }

    /// Adds `raw`.
    fn add(&mut self, raw: Decoded) {
        // Names are numbered apart and put after the agents at the end.
        let next = self.agents.len() as u32;
        let agent = *self.agents.entry(raw.agent_pk).or_insert(next);
        let name = raw.name_pk.map(|pk| {
            let next = self.names.len() as u32;
            *self.names.entry(pk).or_insert(next)
        });
        let head = ChainHead { kind: raw.kind, agent, name, causal_parent: raw.parent };
        self.found.push((raw.seq, head));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_what_does_not_fit_is_unanswered() {
        let h = RawHead { seq: 300, parent: Some(17), agent_pk: 7, name_pk: Some(9), code: 5 };
        let none = RawHead { seq: 301, parent: None, agent_pk: 8, name_pk: None, code: 1 };
        let far = RawHead { seq: 302, parent: Some(1), agent_pk: 1 << 40, name_pk: None, code: 1 };
        let wide = RawHead { seq: 303, parent: Some(2), agent_pk: 1 << 20, name_pk: Some(3), code: 2 };
        let narrow: Vec<Record> = [&h, &none, &far].into_iter().map(Record::of).collect();
        let data = encode((300 & 255) as u8, &narrow);
        assert_eq!((data[1], data.len()), (NARROW, HEADER + 3 * NARROW_RECORD), "small values pack narrow");
        assert_eq!(records(&data), Some(((300 & 255) as u8, narrow.clone())), "a block reads back whole");
        let back = decode(&data, 300).unwrap();
        assert_eq!((back.parent, back.agent_pk, back.name_pk, back.kind.code()), (Some(17), 7, Some(9), 5));
        let back = decode(&data, 301).unwrap();
        assert_eq!((back.parent, back.agent_pk, back.name_pk, back.kind.code()), (None, 8, None, 1));
        assert!(decode(&data, 302).is_none(), "an agent pk over u32 doesn't fit");
        assert!(decode(&data, 303).is_none(), "past the block's end");
        assert!(decode(&data, 299).is_none(), "before its first record");

        let mut all = narrow;
        all.push(Record::of(&wide));
        let data = encode((300 & 255) as u8, &all);
        assert_eq!((data[1], data.len()), (WIDE, HEADER + 4 * WIDE_RECORD), "a pk over u16 widens the block");
        let back = decode(&data, 303).unwrap();
        assert_eq!(
            (back.parent, back.agent_pk, back.name_pk, back.kind.code()),
            (Some(2), 1 << 20, Some(3), 2)
        );
        let back = decode(&data, 300).unwrap();
        assert_eq!((back.parent, back.agent_pk, back.name_pk), (Some(17), 7, Some(9)));
        assert!(decode(&data, 302).is_none(), "still unfit when wide");
    }

    #[test]
    fn an_agents_seqs_come_from_its_records_and_from_events_where_a_record_cant_tell() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE heads (id INTEGER PRIMARY KEY, data BLOB NOT NULL); \
             CREATE TABLE events (id INTEGER PRIMARY KEY, agent_pk INTEGER, \
             run_pk INTEGER GENERATED ALWAYS AS (id >> 32) VIRTUAL, \
             seq INTEGER GENERATED ALWAYS AS (id & 4294967295) VIRTUAL);",
        )
        .unwrap();
        let far = 1i64 << 40;
        // Seqs 1..=700 of run 1 over agents 1, 2 and 3, seq 300 by an agent whose pk doesn't fit
        // a record; seqs 5..=9 of run 2 all by agent 2.
        let agent = |seq: u64| if seq == 300 { far } else { (seq % 3) as i64 + 1 };
        let heads: Vec<RawHead> = (1..=700)
            .map(|seq| RawHead { seq, parent: None, agent_pk: agent(seq), name_pk: None, code: 1 })
            .collect();
        for h in &heads {
            conn.execute(
                "INSERT INTO events (id, agent_pk) VALUES (1 << 32 | ?1, ?2)",
                params![h.seq as i64, h.agent_pk],
            )
            .unwrap();
        }
        put(&conn, 1, &heads[..450]).unwrap();
        put(&conn, 1, &heads[450..]).unwrap();
        let other: Vec<RawHead> =
            (5..=9).map(|seq| RawHead { seq, parent: None, agent_pk: 2, name_pk: None, code: 1 }).collect();
        put(&conn, 2, &other).unwrap();
        // The block of seqs 512..=700 is damaged: its seqs are read from `events`.
        conn.execute("UPDATE heads SET data = x'00ff' WHERE id = ?1", [1i64 << 32 | 2]).unwrap();

        let want = |a: i64| (1..=700).filter(|s| agent(*s) == a).collect::<Vec<u64>>();
        for a in [1, 2, 3, far] {
            assert_eq!(agent_seqs(&conn, 1, a).unwrap(), want(a), "agent {a}");
        }
        assert_eq!(agent_seqs(&conn, 1, far).unwrap(), [300]);
        assert_eq!(agent_seqs(&conn, 2, 2).unwrap(), [5, 6, 7, 8, 9]);
        assert!(agent_seqs(&conn, 3, 2).unwrap().is_empty(), "a run without blocks");
    }

    #[test]
    fn batches_append_to_a_block_and_a_wide_record_widens_what_came_before() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE heads (id INTEGER PRIMARY KEY, data BLOB NOT NULL)").unwrap();
        let head = |seq: u64, agent_pk: i64| RawHead {
            seq,
            parent: seq.checked_sub(2).filter(|p| *p > 0),
            agent_pk,
            name_pk: Some(seq as i64 % 5).filter(|n| *n != 0),
            code: (seq % 6) as u8 + 1,
        };
        // Seqs 1..=20 in batches of three, narrow; 21..=23 with one agent pk over u16; 24..=30
        // narrow again: one block, widened once.
        let heads: Vec<RawHead> =
            (1..=30).map(|seq| head(seq, if seq == 22 { 1 << 20 } else { seq as i64 % 4 + 1 })).collect();
        let data = || -> Vec<u8> {
            conn.query_row("SELECT data FROM heads WHERE id = ?1", [1i64 << 32], |r| r.get(0)).unwrap()
        };
        for batch in heads[..20].chunks(3) {
            put(&conn, 1, batch).unwrap();
        }
        assert_eq!((data()[1], data().len()), (NARROW, HEADER + 20 * NARROW_RECORD), "appended narrow");
        put(&conn, 1, &heads[20..23]).unwrap();
        put(&conn, 1, &heads[23..]).unwrap();
        let all: Vec<Record> = heads.iter().map(Record::of).collect();
        assert_eq!(data(), encode(1, &all), "the same bytes as the block written at once");
        assert_eq!(data()[1], WIDE);
        for h in &heads {
            let back = decode(&data(), h.seq).unwrap();
            assert_eq!(
                (back.parent, back.agent_pk, back.name_pk, back.kind.code()),
                (h.parent, h.agent_pk, h.name_pk, h.code)
            );
        }

        // A batch that doesn't continue the block (a gap) starts it again from its first seq.
        put(&conn, 1, &[head(40, 1), head(41, 2)]).unwrap();
        assert_eq!(data(), encode(40, &[Record::of(&head(40, 1)), Record::of(&head(41, 2))]));
        assert!(decode(&data(), 30).is_none(), "what came before the gap is not papered over");
    }
}
