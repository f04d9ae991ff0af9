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
//!   [`merge`] moves the whole tail into `blob_digests_recent` in digest order, and that table
//!   into `blob_digests` once it has grown to about `sqrt(2 × MERGE_AT × rows in blob_digests)`
//!   ([`moves_down`]). Either step rewrites each leaf of the table it inserts into about once
//!   for many keys, and so the cost of merging, per blob, grows with the square root of the
//!   store instead of with its size: before version 13 each merge inserted the tail straight
//!   into the one index of every digest, and at 1.3 million blobs took 100 to 230 ms where a
//!   fresh store's took 40.
//!   The write connection keeps the tail in memory ([`Tail`], caught up at the start of each
//!   write transaction from the rows past the last id it saw), so a commit's look-ups never
//!   scan; that is also how it keeps the three places free of duplicate digests, which no
//!   constraint across them would refuse.
//! - **Cache entries** are appended to `cache_log`; the newest row of a key wins over older
//!   ones and over `cache`. [`merge_cache`] moves them into `cache` in key order.
//!
//! A digest the tail's copy doesn't hold is looked up in the two tables, except that once a
//! write connection has asked [`FILTER_AFTER`] times, it keeps a Bloom filter of every indexed digest
//! ([`Indexed`]) and asks only when the filter says the digest may be there: a recording's new
//! blobs then cost no index read.
//!
//! The blobs merge in the write transaction that finds the tail at [`MERGE_AT`] rows and when
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

/// Index look-ups after which a write connection builds its [`Indexed`] filter (a short
/// recording into a large store doesn't read every digest first).
const FILTER_AFTER: u64 = 4096;

/// Filter bits per digest it is built for (it holds up to twice that many: from 16 bits down
/// to 8 per digest, with 4 probes a false positive rate of 0.2% to 2.4%).
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
    /// Every indexed digest (and maybe some since collected), once built.
    indexed: Option<Indexed>,
    /// Cache entries this connection appended to `cache_log` since it last merged it.
    pub(crate) cache_rows: i64,
}

impl Default for Tail {
    fn default() -> Self {
        Tail { epoch: -1, last_seen: 0, ids: DigestMap::default(), probes: 0, indexed: None, cache_rows: 0 }
    }
}

/// A Bloom filter of the digests of the rows up to `covered_to` (every one of them indexed):
/// four probes, each 64 bits of the digest (uniform already) reduced to a bit.
#[derive(Debug)]
pub(crate) struct Indexed {
    words: Vec<u64>,
    digests: usize,
    capacity: usize,
    covered_to: i64,
}

impl Indexed {
    fn new(capacity: usize) -> Self {
        let bits = (capacity.max(1 << 14) * FILTER_BITS_PER_DIGEST).next_power_of_two();
        Indexed { words: vec![0; bits / 64], digests: 0, capacity: capacity.max(1 << 14), covered_to: 0 }
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
                Some(f) if merged_to >= f.covered_to && f.digests <= 2 * f.capacity => {
                    f.extend(tx, merged_to)?
                }
                Some(_) => {
                    self.indexed = None;
                    self.probes = 0;
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
    /// filter after [`FILTER_AFTER`]).
    pub(crate) fn may_be_indexed(&mut self, tx: &Connection, digest: &Digest) -> StoreResult<bool> {
        match &self.indexed {
            Some(f) => Ok(f.may_hold(digest)),
            None => {
                self.probes += 1;
                if self.probes >= FILTER_AFTER {
                    self.build_filter(tx)?;
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

/// Moves the whole tail into `blob_digests_recent`, or, with what that holds, into
/// `blob_digests` when [`moves_down`] says so, inside `tx`. Each is inserted in digest order, so that each leaf of
/// the table it goes into is rewritten once however many keys it gains.
pub(crate) fn merge(tx: &Connection) -> StoreResult<()> {
    let what = || "indexing the blobs stored since the last merge".to_string();
    let (merged_to, recent, indexed): (i64, i64, i64) = tx
        .query_row("SELECT merged_to, recent_rows, indexed_rows FROM blob_mark", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .ctx(what)?;
    let top: Option<i64> = tx.query_row("SELECT max(id) FROM blobs", [], |r| r.get(0)).ctx(what)?;
    let refused = |e: rusqlite::Error| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::ConstraintViolation) => {
            StoreError::corrupt("two blob rows hold one digest").with_source(e)
        }
        _ => StoreError::from_sqlite(e, what()),
    };
    let tail: i64 = tx
        .prepare_cached("SELECT count(*) FROM blobs WHERE id > ?1")
        .and_then(|mut s| s.query_row([merged_to], |r| r.get(0)))
        .ctx(what)?;
    let (recent, indexed) = if moves_down(recent + tail, indexed) {
        // Straight down with what is recent, so that the tail is written once, and the small
        // table's pages aren't left free (a young store never fills it).
        tx.prepare_cached(
            "INSERT INTO blob_digests (digest, id) SELECT digest, id FROM \
             (SELECT digest, id FROM blob_digests_recent UNION ALL SELECT digest, id FROM blobs WHERE id > ?1) \
             ORDER BY digest",
        )
        .and_then(|mut s| s.execute([merged_to]))
        .map_err(refused)?;
        if recent > 0 {
            tx.execute("DELETE FROM blob_digests_recent", []).ctx(what)?;
        }
        (0, indexed + recent + tail)
    } else {
        tx.prepare_cached(
            "INSERT INTO blob_digests_recent (digest, id) SELECT digest, id FROM blobs WHERE id > ?1 ORDER BY digest",
        )
        .and_then(|mut s| s.execute([merged_to]))
        .map_err(refused)?;
        (recent + tail, indexed)
    };
    tx.prepare_cached("UPDATE blob_mark SET recent_rows = ?1, indexed_rows = ?2")
        .and_then(|mut s| s.execute([recent, indexed]))
        .ctx(what)?;
    set_mark(tx, top.unwrap_or(0))
}

/// Whether `recent` rows in `blob_digests_recent` are moved into `blob_digests`, which holds
/// `indexed`: once `recent² ≥ 2 × MERGE_AT × indexed`. A merge of the tail rewrites about
/// every leaf of the small table, and moving it down about every leaf of the large one; at
/// this size the two costs, spread over the blobs merged, are about equal and their sum is
/// least. The leaves rewritten per blob then grow with the square root of the store's blobs
/// instead of with their number. A young store's small table moves down at every merge.
pub(crate) fn moves_down(recent: i64, indexed: i64) -> bool {
    let (recent, indexed) = (i128::from(recent), i128::from(indexed));
    recent * recent >= 2 * MERGE_AT as i128 * indexed
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
        "INSERT OR REPLACE INTO cache (key, output_blob, usage, stored_at, class, ttl) \
         SELECT key, output_blob, usage, stored_at, class, ttl FROM cache_log ORDER BY key, id; \
         DELETE FROM cache_log;",
    )
    .ctx(|| "merging the cache entries stored since the last merge")
}

#[cfg(test)]
mod tests {
    use super::{moves_down, MERGE_AT};

    #[test]
    fn recent_digests_move_down_at_the_square_root_of_twice_the_merge_size_times_the_store() {
        let merge = MERGE_AT as i64;
        // A young store: each merge's tail moves straight down.
        assert!(moves_down(0, 0));
        assert!(moves_down(merge, 0));
        assert!(moves_down(merge, merge / 2));
        // 1.3 million indexed digests: about 292k recent ones, nine merges' worth.
        let indexed = 1_300_000;
        let at = ((2 * merge * indexed) as f64).sqrt().ceil() as i64;
        assert_eq!(at / 1000, 291);
        assert!(!moves_down(at - 1, indexed));
        assert!(moves_down(at, indexed));
        // No overflow at any size a store can count.
        assert!(!moves_down(1, i64::MAX));
        assert!(moves_down(i64::MAX, i64::MAX));
    }
}
