//! The two random-key indexes a recording writes, kept in levels (since schema version 12),
//! so that a small commit appends instead of dirtying one B-tree leaf per key.
//!
//! Why: a commit of a few events (16 acknowledged writers settle into commits of about 7) wrote
//! one random leaf of the blobs' digest index per blob and one of `cache` per entry, each a
//! 4 KB page into the WAL and later into the database: about three pages per event, twice the
//! store's cost of large commits. Appended rows share the tail page of their table instead.
//!
//! - **Blobs.** Every row of `blobs` stays where it is inserted (events and `deliveries` name
//!   blobs by row id). Its digest is found in one of three places (since schema version 13):
//!   - the *tail*: rows with an id above `blob_mark.merged_to`, in no index. A lookup scans
//!     them by row id ([`id_of`]: at most about [`MERGE_AT`] narrow rows);
//!   - `blob_digests_recent`, a small table of `(digest, id)` keyed by digest;
//!   - `blob_digests`, the same for every other row: the large one.
//!
//!   [`merge`] moves the whole tail into `blob_digests_recent` in digest order, then one slice
//!   of the digest space of that table into `blob_digests`, the next slice at the next merge
//!   (a sweep; [`slices`] says how many, about the square root of the large table's rows in
//!   half merges). Each insert rewrites each leaf it touches once for many keys, and so the
//!   cost of a merge grows with the square root of the store instead of with its size, the
//!   same at every merge: before version 13 each merge inserted the tail straight into the one
//!   index of every digest, and at 1.3 million blobs took 100 to 230 ms where a fresh store's
//!   took 40. A young store (one slice) moves the tail straight down.
//!   The write connection keeps the tail in memory ([`Tail`], caught up at the start of each
//!   write transaction from the rows past the last id it saw), so a commit's look-ups never
//!   scan; that is also how it keeps the three places free of duplicate digests, which no
//!   constraint across them would refuse.
//! - **Cache entries** are appended to `cache_log`; the newest row of a key wins over older
//!   ones and over `cache`. [`merge_cache`] moves them into `cache` in key order.
//!
//! A digest the tail's copy doesn't hold is looked up in the two tables, except that once a
//! write connection has asked [`FILTER_AFTER`] times, and once per [`DIGESTS_PER_LOOKUP`]
//! indexed digests, it keeps a Bloom filter of every indexed digest ([`Indexed`]) and asks only
//! when the filter says the digest may be there: a recording's new blobs then cost no index read.
//!
//! The blobs merge in the write transaction that finds the tail at [`MERGE_AT`] rows (at
//! [`BULK_MERGE_AT`] in one that stores blobs on their own, as an import does) and when
//! a run stops running (so that what reads a finished run by digest finds it in a digest table);
//! the cache log in the commit that brings the entries a write connection appended to
//! [`CACHE_MERGE_AT`] (a cache look-up, rarer than a blob's, scans the log). Both merge first
//! in every garbage collection, which then deletes only indexed rows (and their digests) and
//! sets `merged_to` to the largest id left, so that a new row's id is above it again.
//! `blob_mark.epoch` counts merges and collections: a [`Tail`] that sees another epoch forgets
//! what it held and reads the tail again, so that a row a collection deleted is never taken
//! for stored.
use retrace_core::digest_map::DigestMap;
use retrace_core::Digest;
use rusqlite::{params, Connection};

use crate::error::ResultExt;
use crate::{StoreError, StoreResult};

/// Tail rows at which a write transaction merges them into the digest tables first. At this
/// size a tail scan (a reader's look-up of a blob not yet indexed) reads about 150 pages.
pub(crate) const MERGE_AT: usize = 32768;

/// Tail rows at which a transaction of blobs stored on their own ([`crate::EventStore::put_blobs`]:
/// an import's, while it reads the rest of its file) merges them first. Such transactions come
/// many in a row, and each merge rewrites leaves across the whole digest index, so merging every
/// [`MERGE_AT`] rows rewrote the index again and again (a quarter of the storing thread's CPU
/// when importing 100k 1 KB events, 200k blobs, into a new store). Now the import's first commit
/// of events, which merges at [`MERGE_AT`] as every commit does, merges them once: that import
/// took 2-26% less CPU (4.35-4.68 s against 4.45-6.34 s, alternated 4x on a noisy 2-vCPU VM).
/// A reader's look-up of a blob in the tail scans up to this many rows meanwhile (about 1,200
/// pages).
pub(crate) const BULK_MERGE_AT: usize = 8 * MERGE_AT;

/// Index look-ups after which a write connection builds its [`Indexed`] filter (a short
/// recording into a large store doesn't read every digest first), at the least.
const FILTER_AFTER: u64 = 4096;

/// Indexed digests per look-up it takes before the filter is built: a write connection builds it
/// only once it has asked the digest tables once per this many indexed digests (and at least
/// [`FILTER_AFTER`] times), so that the look-ups it made cost about what the build does, and a
/// short recording into a large store never reads every digest (ski rental: never more than
/// twice the cheaper of the two). Measured with `retrace-bench record` (5,000 acknowledged steps
/// through a new handle on a store of 1.2 million digests, 2-core VM): the build held one
/// acknowledgment for 0.48 s (0.4 us a digest); without it the steps took 108-112 us each
/// instead of 200-206. A look-up's own cost wasn't measured alone: 32 assumes 10-20 us.
const DIGESTS_PER_LOOKUP: u64 = 32;

/// Filter bits per digest a part is built for (at least: its bits are a power of two). A full
/// part answers a false positive 0.24% of the time (4 probes); a filter started in a small
/// store has five parts at a million digests, so about 1% of new digests are still looked up.
const FILTER_BITS_PER_DIGEST: usize = 16;

/// `cache_log` rows at which a write transaction that adds entries merges them into `cache`
/// (counted by each write connection since its last merge).
pub(crate) const CACHE_MERGE_AT: i64 = 32768;

/// SQL: the row id of the blob whose digest is the SQL expression `digest`, from the digest
/// tables or else the tail (`NULL` when not stored). The subqueries' aliases are `bi`, `br`
/// and `bt`.
pub(crate) fn id_of(digest: &str) -> String {
    format!(
        "coalesce((SELECT bi.id FROM blob_digests bi WHERE bi.digest = {digest}), \
         (SELECT br.id FROM blob_digests_recent br WHERE br.digest = {digest}), \
         (SELECT bt.id FROM blobs bt WHERE bt.id > (SELECT merged_to FROM blob_mark) AND bt.digest = {digest}))"
    )
}

/// SQL: the digest and row id of each digest in the JSON array of hex strings `?1` that the
/// digest tables hold (not the tail), as `x.digest`, `x.id`, with `j.key` its place in `?1`;
/// `columns` are selected, and `join` follows each table (joining `blobs b ON b.id = x.id`,
/// say).
pub(crate) fn indexed_of_list(columns: &str, join: &str) -> String {
    let one = |table: &str| {
        format!(
            "SELECT {columns} FROM json_each(?1) j CROSS JOIN {table} x ON x.digest = unhex(j.value) {join}"
        )
    };
    format!("{} UNION ALL {}", one("blob_digests"), one("blob_digests_recent"))
}

/// The row id of `digest` in the digest tables (not the tail).
pub(crate) fn indexed_id(conn: &Connection, digest: &Digest) -> StoreResult<Option<i64>> {
    conn.prepare_cached(
        "SELECT coalesce((SELECT id FROM blob_digests WHERE digest = ?1), \
         (SELECT id FROM blob_digests_recent WHERE digest = ?1))",
    )
    .and_then(|mut s| s.query_row([digest.as_bytes()], |r| r.get(0)))
    .ctx(|| format!("looking up blob {digest}"))
}

/// The write connection's copy of the tail: digest to row id of every row past `merged_to`.
#[derive(Debug)]
pub(crate) struct Tail {
    /// The `blob_mark.epoch` this copy belongs to (`-1`: none, read it all again).
    epoch: i64,
    /// The largest row id read into `ids`.
    last_seen: i64,
    ids: DigestMap<i64>,
    /// Look-ups of the digest tables since the filter was last dropped.
    probes: u64,
    /// The look-ups at which to consider building the filter next.
    build_at: u64,
    /// Every indexed digest (and maybe some since collected), once built.
    indexed: Option<Indexed>,
    /// Cache entries this connection appended to `cache_log` since it last merged it.
    pub(crate) cache_rows: i64,
}

impl Default for Tail {
    fn default() -> Self {
        Tail {
            epoch: -1,
            last_seen: 0,
            ids: DigestMap::default(),
            probes: 0,
            build_at: FILTER_AFTER,
            indexed: None,
            cache_rows: 0,
        }
    }
}

/// Bloom filters of the digests of the rows up to `covered_to` (every one of them indexed), in
/// parts: when the newest part is full, the next one has room for twice the digests covered so
/// far. A growing store is then never read whole again: one filter, rebuilt whole once it held
/// twice its room, read every digest inside a commit (0.75 s at 1.2 million blobs).
#[derive(Debug)]
pub(crate) struct Indexed {
    parts: Vec<Bloom>,
    covered_to: i64,
}

/// One Bloom filter: four probes, each 64 bits of the digest (uniform already) reduced to a bit.
#[derive(Debug)]
struct Bloom {
    words: Vec<u64>,
    digests: usize,
    capacity: usize,
}

impl Bloom {
    fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1 << 14);
        let bits = (capacity * FILTER_BITS_PER_DIGEST).next_power_of_two();
        Bloom { words: vec![0; bits / 64], digests: 0, capacity }
    }

    fn bits(digest: &Digest, mask: u64) -> impl Iterator<Item = u64> + '_ {
        digest
            .as_bytes()
            .chunks_exact(8)
            .map(move |c| u64::from_le_bytes(c.try_into().expect("chunks of 8 bytes")) & mask)
    }

    fn add(&mut self, digest: &Digest) {
        let mask = (self.words.len() * 64 - 1) as u64;
        for bit in Self::bits(digest, mask) {
            self.words[(bit >> 6) as usize] |= 1 << (bit & 63);
        }
        self.digests += 1;
    }

    fn may_hold(&self, digest: &Digest) -> bool {
        let mask = (self.words.len() * 64 - 1) as u64;
        Self::bits(digest, mask).all(|bit| self.words[(bit >> 6) as usize] & (1 << (bit & 63)) != 0)
    }
}

impl Indexed {
    fn new(capacity: usize) -> Self {
        Indexed { parts: vec![Bloom::new(capacity)], covered_to: 0 }
    }

    fn add(&mut self, digest: &Digest) {
        if self.parts.last().is_none_or(|p| p.digests >= p.capacity) {
            let held: usize = self.parts.iter().map(|p| p.digests).sum();
            self.parts.push(Bloom::new(held.saturating_mul(2)));
        }
        self.parts.last_mut().expect("pushed above").add(digest);
    }

    fn may_hold(&self, digest: &Digest) -> bool {
        self.parts.iter().any(|p| p.may_hold(digest))
    }

    /// Adds the digests of the rows in `(covered_to, to]`.
    fn extend(&mut self, tx: &Connection, to: i64) -> StoreResult<()> {
        let what = || "reading the digests of the indexed blobs".to_string();
        let mut select =
            tx.prepare_cached("SELECT digest FROM blobs WHERE id > ?1 AND id <= ?2").ctx(what)?;
        let mut rows = select.query([self.covered_to, to]).ctx(what)?;
        while let Some(row) = rows.next().ctx(what)? {
            let digest: Vec<u8> = row.get(0).ctx(what)?;
            let digest = Digest::from_slice(&digest)
                .ok_or_else(|| StoreError::corrupt("a blob row holds a bad digest"))?;
            self.add(&digest);
        }
        self.covered_to = to;
        Ok(())
    }
}

impl Tail {
    /// Brings this copy up to the database, inside a write transaction (which sees every
    /// committed row, and keeps others from adding any until it ends).
    pub(crate) fn catch_up(&mut self, tx: &Connection) -> StoreResult<()> {
        let what = || "reading the blobs not yet indexed".to_string();
        let (epoch, merged_to): (i64, i64) = tx
            .prepare_cached("SELECT epoch, merged_to FROM blob_mark")
            .and_then(|mut s| s.query_row([], |r| Ok((r.get(0)?, r.get(1)?))))
            .ctx(what)?;
        if epoch != self.epoch {
            self.ids.clear();
            self.epoch = epoch;
            self.last_seen = merged_to;
            // Rows merged since the filter was built are added to it. Below `covered_to`, a
            // collection deleted the top rows and a new row may reuse a covered id: build anew.
            match &mut self.indexed {
                Some(f) if merged_to >= f.covered_to => f.extend(tx, merged_to)?,
                Some(_) => {
                    self.indexed = None;
                    self.probes = 0;
                    self.build_at = FILTER_AFTER;
                }
                None => {}
            }
        }
        let mut select = tx.prepare_cached("SELECT id, digest FROM blobs WHERE id > ?1").ctx(what)?;
        let mut rows = select.query([self.last_seen.max(merged_to)]).ctx(what)?;
        while let Some(row) = rows.next().ctx(what)? {
            let id: i64 = row.get(0).ctx(what)?;
            let digest: Vec<u8> = row.get(1).ctx(what)?;
            let digest = Digest::from_slice(&digest)
                .ok_or_else(|| StoreError::corrupt(format!("blob row {id} holds a bad digest")))?;
            self.note(digest, id);
        }
        Ok(())
    }

    /// Forgets everything: the transaction that added to this copy did not commit.
    pub(crate) fn invalidate(&mut self) {
        *self = Tail::default();
    }

    /// The row id of `digest` if it is in the tail.
    pub(crate) fn get(&self, digest: &Digest) -> Option<i64> {
        self.ids.get(digest).copied()
    }

    /// The row id of `digest`, inside the write transaction `tx` this copy was caught up in:
    /// from the tail's copy, else from the index unless the filter says it isn't there.
    pub(crate) fn find(&mut self, tx: &Connection, digest: &Digest) -> StoreResult<Option<i64>> {
        if let Some(id) = self.get(digest) {
            return Ok(Some(id));
        }
        match self.may_be_indexed(tx, digest)? {
            true => indexed_id(tx, digest),
            false => Ok(None),
        }
    }

    /// Whether `digest`, not in the tail, may be in the digest tables: false only when the
    /// filter says it isn't (counted as a look-up of the tables otherwise, which builds the
    /// filter after [`FILTER_AFTER`] and [`DIGESTS_PER_LOOKUP`]).
    pub(crate) fn may_be_indexed(&mut self, tx: &Connection, digest: &Digest) -> StoreResult<bool> {
        match &self.indexed {
            Some(f) => Ok(f.may_hold(digest)),
            None => {
                self.probes += 1;
                if self.probes >= self.build_at {
                    let indexed: i64 = tx
                        .query_row("SELECT indexed_rows FROM blob_mark", [], |r| r.get(0))
                        .ctx(|| "reading the blobs' index mark")?;
                    let worth = (u64::try_from(indexed).unwrap_or(0) / DIGESTS_PER_LOOKUP).max(FILTER_AFTER);
                    match self.probes >= worth {
                        true => self.build_filter(tx)?,
                        false => self.build_at = worth,
                    }
                }
                Ok(true)
            }
        }
    }

    /// Builds the filter from every indexed row (the rows up to `merged_to`).
    fn build_filter(&mut self, tx: &Connection) -> StoreResult<()> {
        let merged_to: i64 = tx
            .query_row("SELECT merged_to FROM blob_mark", [], |r| r.get(0))
            .ctx(|| "reading the blobs' index mark")?;
        // Ids are about as many as rows: room for twice as many digests as there are now.
        let mut filter = Indexed::new(usize::try_from(merged_to).unwrap_or(0).saturating_mul(2));
        filter.extend(tx, merged_to)?;
        self.indexed = Some(filter);
        Ok(())
    }

    /// Records a row this transaction inserted.
    pub(crate) fn note(&mut self, digest: Digest, id: i64) {
        self.ids.insert(digest, id);
        self.last_seen = self.last_seen.max(id);
    }

    /// Rows in the tail.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }
}

/// Moves the whole tail into `blob_digests_recent`, then the next of its [`slices`] into
/// `blob_digests`, inside `tx`; while one slice covers every digest, the tail goes straight
/// down. Each is inserted in digest order, so that each leaf of the table it goes into is
/// rewritten once however many keys it gains. `blob_mark.sweep` is where the next slice starts
/// (the first two bytes of its digests, as an integer).
pub(crate) fn merge(tx: &Connection) -> StoreResult<()> {
    let what = || "indexing the blobs stored since the last merge".to_string();
    let (merged_to, recent, indexed, sweep): (i64, i64, i64, i64) = tx
        .query_row("SELECT merged_to, recent_rows, indexed_rows, sweep FROM blob_mark", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .ctx(what)?;
    let top: Option<i64> = tx.query_row("SELECT max(id) FROM blobs", [], |r| r.get(0)).ctx(what)?;
    let refused = |e: rusqlite::Error| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::ConstraintViolation) => {
            StoreError::corrupt("two blob rows hold one digest").with_source(e)
        }
        _ => StoreError::from_sqlite(e, what()),
    };
    let (recent, indexed, sweep) = match slices(indexed) {
        1 => {
            // Straight down with what is recent, so that the tail is written once, and the
            // small table's pages aren't left free (a young store never fills it).
            let moved = tx
                .prepare_cached(
                    "INSERT INTO blob_digests (digest, id) SELECT digest, id FROM \
                     (SELECT digest, id FROM blob_digests_recent UNION ALL SELECT digest, id FROM blobs WHERE id > ?1) \
                     ORDER BY digest",
                )
                .and_then(|mut s| s.execute([merged_to]))
                .map_err(refused)? as i64;
            if recent > 0 {
                tx.execute("DELETE FROM blob_digests_recent", []).ctx(what)?;
            }
            (0, indexed + moved, 0)
        }
        n => {
            let tail = tx
                .prepare_cached(
                    "INSERT INTO blob_digests_recent (digest, id) SELECT digest, id FROM blobs WHERE id > ?1 ORDER BY digest",
                )
                .and_then(|mut s| s.execute([merged_to]))
                .map_err(refused)? as i64;
            let from = sweep.clamp(0, SWEEP_END - 1);
            let to = slice_end(from, n);
            let (low, high) = (slice_bound(from), slice_bound(to));
            let moved = tx
                .prepare_cached(
                    "INSERT INTO blob_digests (digest, id) SELECT digest, id FROM blob_digests_recent \
                     WHERE digest >= ?1 AND digest < ?2 ORDER BY digest",
                )
                .and_then(|mut s| s.execute([&low, &high]))
                .map_err(refused)? as i64;
            tx.prepare_cached("DELETE FROM blob_digests_recent WHERE digest >= ?1 AND digest < ?2")
                .and_then(|mut s| s.execute([&low, &high]))
                .ctx(what)?;
            (recent + tail - moved, indexed + moved, to % SWEEP_END)
        }
    };
    tx.prepare_cached("UPDATE blob_mark SET recent_rows = ?1, indexed_rows = ?2, sweep = ?3")
        .and_then(|mut s| s.execute([recent, indexed, sweep]))
        .ctx(what)?;
    set_mark(tx, top.unwrap_or(0))
}

/// The end of the sweep's range: slices are ranges of the first two bytes of a digest.
const SWEEP_END: i64 = 1 << 16;

/// Where the slice starting at `from` ends, of `n` slices of the sweep's range (the last one
/// shorter).
fn slice_end(from: i64, n: i64) -> i64 {
    (from + (SWEEP_END + n - 1) / n).min(SWEEP_END)
}

/// The smallest digest of the slice starting at `at` (two bytes, which every digest starting
/// with them sorts after), or, at [`SWEEP_END`], a bound above every digest.
fn slice_bound(at: i64) -> Vec<u8> {
    match at {
        SWEEP_END.. => vec![0xff; 33],
        _ => vec![(at >> 8) as u8, at as u8],
    }
}

/// How many slices of the digest space `blob_digests_recent` moves down in turn, one per merge,
/// when `blob_digests` holds `indexed` rows: `⌈sqrt(indexed / (MERGE_AT / 2))⌉`, at least 1.
///
/// A merge rewrites about every leaf of the small table (which holds about `slices × MERGE_AT
/// / 2` rows: a digest waits half a sweep on average) and the leaves of one slice of the
/// large one (`indexed / slices` rows). This count makes the two equal and their sum least,
/// so that every merge rewrites about `2 × sqrt(indexed × MERGE_AT / 2)` rows' worth of
/// leaves: the cost grows with the square root of the store, every merge alike (a store of
/// 1.3 million blobs: 9 slices, about a quarter of the leaves a merge into one index rewrote).
pub(crate) fn slices(indexed: i64) -> i64 {
    let half = (MERGE_AT / 2) as f64;
    ((indexed.max(0) as f64 / half).sqrt().ceil() as i64).clamp(1, SWEEP_END)
}

/// Sets `merged_to` (every row at or below it is in a digest table) and starts a new epoch.
pub(crate) fn set_mark(tx: &Connection, merged_to: i64) -> StoreResult<()> {
    tx.prepare_cached("UPDATE blob_mark SET epoch = epoch + 1, merged_to = ?1")
        .and_then(|mut s| s.execute(params![merged_to]))
        .ctx(|| "moving the blobs' index mark")?;
    Ok(())
}

/// Moves `cache_log` into `cache` in key order (each leaf of `cache` rewritten once), a key's
/// later rows replacing its earlier ones.
pub(crate) fn merge_cache(tx: &Connection) -> StoreResult<()> {
    tx.execute_batch(
        "INSERT OR REPLACE INTO cache (key, output_blob, usage, stored_at, class, ttl, snapshot) \
         SELECT key, output_blob, usage, stored_at, class, ttl, snapshot FROM cache_log ORDER BY key, id; \
         DELETE FROM cache_log;",
    )
    .ctx(|| "merging the cache entries stored since the last merge")
}

#[cfg(test)]
mod tests {
    use super::{
        slice_bound, slice_end, slices, Indexed, Tail, DIGESTS_PER_LOOKUP, FILTER_AFTER, MERGE_AT, SWEEP_END,
    };
    use retrace_core::Digest;

    #[test]
    fn a_large_store_is_asked_longer_before_its_digests_are_read_into_a_filter() {
        let dir = tempfile::tempdir().unwrap();
        let conn = rusqlite::Connection::open(dir.path().join("t.db")).unwrap();
        super::super::schema::migrate(&conn, "t.db").unwrap();
        let ask = |tail: &mut Tail, times: u64| {
            for n in 0..times {
                assert!(tail.may_be_indexed(&conn, &Digest::of(&n.to_le_bytes())).unwrap());
            }
        };
        // A small store: the filter after FILTER_AFTER look-ups, as before.
        let mut small = Tail::default();
        ask(&mut small, FILTER_AFTER - 1);
        assert!(small.indexed.is_none());
        ask(&mut small, 1);
        assert!(small.indexed.is_some(), "built after {FILTER_AFTER} look-ups");
        // A store of a million indexed digests: not before a million / DIGESTS_PER_LOOKUP.
        conn.execute_batch("UPDATE blob_mark SET indexed_rows = 1000000").unwrap();
        let worth = 1_000_000 / DIGESTS_PER_LOOKUP;
        let mut large = Tail::default();
        ask(&mut large, FILTER_AFTER);
        assert!(large.indexed.is_none(), "read a large store's digests after {FILTER_AFTER} look-ups");
        assert_eq!(large.build_at, worth);
        ask(&mut large, worth - FILTER_AFTER - 1);
        assert!(large.indexed.is_none());
        ask(&mut large, 1);
        assert!(large.indexed.is_some(), "built after {worth} look-ups");
    }

    #[test]
    fn the_filter_grows_in_parts_holds_every_digest_added_and_rarely_one_not() {
        let mut filter = Indexed::new(0);
        let digest = |n: u32| Digest::of(&n.to_le_bytes());
        for n in 0..300_000 {
            filter.add(&digest(n));
        }
        // Room for 16,384, then twice what is held each time: 16k, 33k, 98k, 295k.
        let rooms: Vec<usize> = filter.parts.iter().map(|p| p.capacity).collect();
        assert_eq!(rooms, [16_384, 32_768, 98_304, 294_912]);
        assert!((0..300_000).all(|n| filter.may_hold(&digest(n))), "no false negatives");
        let false_positives = (300_000..400_000).filter(|&n| filter.may_hold(&digest(n))).count();
        assert!(false_positives < 1_500, "{false_positives} of 100,000 absent digests");
    }

    #[test]
    fn the_sweep_has_as_many_slices_as_the_square_root_of_the_store_in_half_merges() {
        let half = MERGE_AT as i64 / 2;
        // A young store: one slice, the tail goes straight down.
        assert_eq!(slices(0), 1);
        assert_eq!(slices(half), 1);
        assert_eq!(slices(half + 1), 2);
        assert_eq!(slices(4 * half), 2);
        assert_eq!(slices(1_300_000), 9);
        assert_eq!(slices(i64::MAX), SWEEP_END);
        assert_eq!(slices(-1), 1);
    }

    #[test]
    fn slice_bounds_take_every_digest_once() {
        let digest = |first: u8, second: u8| {
            let mut d = [0x80u8; 32];
            (d[0], d[1]) = (first, second);
            d.to_vec()
        };
        let within = |d: &Vec<u8>, from: i64, to: i64| *d >= slice_bound(from) && *d < slice_bound(to);
        assert!(within(&digest(0, 0), 0, 1));
        assert!(!within(&digest(0, 1), 0, 1));
        assert!(within(&digest(0x12, 0x34), 0x1234, 0x1235));
        assert!(within(&vec![0xff; 32], SWEEP_END - 1, SWEEP_END));
        assert!(!within(&vec![0xff; 32], 0, SWEEP_END - 1));
        // Nine slices cover the whole space, each digest in one.
        let n = 9;
        let mut cuts = vec![0];
        while cuts.last() != Some(&SWEEP_END) {
            cuts.push(slice_end(*cuts.last().unwrap(), n));
        }
        assert_eq!(cuts.len(), 10, "nine slices: {cuts:?}");
        assert_eq!(cuts[4], 0x71c8, "0x71c7 ends the fourth slice");
        for d in [digest(0, 0), digest(0x71, 0xc7), digest(0x71, 0xc8), vec![0xff; 32]] {
            assert_eq!(cuts.windows(2).filter(|w| within(&d, w[0], w[1])).count(), 1, "{d:?}");
        }
    }
}
