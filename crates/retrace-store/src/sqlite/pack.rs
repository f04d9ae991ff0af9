//! Packed blobs: bytes appended end to end into `segments` rows of one page each, so that blob
//! pages stay full whatever the blob sizes (see [`super::schema`]). A blob's location is
//! `segment_id << 16 | offset`; it continues into the following segments when it doesn't fit.
use rusqlite::{params, Connection, OptionalExtension};

use crate::error::ResultExt;
use crate::{StoreError, StoreResult};

const OFFSET_BITS: u32 = 16;

/// The last segment of an open transaction, held in memory while that transaction packs blobs
/// into it and written once ([`Tail::flush`], from [`super::staged::Staged::finish`]): a batch
/// of small blobs rewrites its segment's page once, not once per blob.
pub(crate) struct Tail {
    /// The segment's id; 0 before the first segment exists.
    id: i64,
    data: Vec<u8>,
    dirty: bool,
}

impl Tail {
    /// Writes the segment's bytes, if blobs were appended since the last flush.
    pub(crate) fn flush(&mut self, tx: &Connection) -> StoreResult<()> {
        if self.dirty {
            tx.prepare_cached("UPDATE segments SET data = ?2 WHERE id = ?1")
                .and_then(|mut s| s.execute(params![self.id, self.data]))
                .ctx(|| "packing blobs")?;
            self.dirty = false;
        }
        Ok(())
    }
}

/// Appends `bytes` (non-empty) after the last segment's bytes, inside the open transaction
/// `tx` whose last segment is `tail` (read on first use), and returns their location.
pub(crate) fn append(
    tx: &Connection,
    tail: &mut Option<Tail>,
    segment_bytes: usize,
    bytes: &[u8],
) -> StoreResult<i64> {
    let what = || "packing a blob";
    let tail = match tail {
        Some(tail) => tail,
        None => {
            let last: Option<(i64, Vec<u8>)> = tx
                .prepare_cached("SELECT id, data FROM segments ORDER BY id DESC LIMIT 1")
                .and_then(|mut s| s.query_row([], |r| Ok((r.get(0)?, r.get(1)?))).optional())
                .ctx(what)?;
            let (id, data) = last.unwrap_or_default();
            tail.insert(Tail { id, data, dirty: false })
        }
    };
    let mut start = None;
    let mut rest = bytes;
    while !rest.is_empty() {
        if tail.id == 0 || tail.data.len() >= segment_bytes {
            tail.flush(tx)?;
            let id = tx
                .prepare_cached("INSERT INTO segments (data) VALUES (x'')")
                .and_then(|mut s| s.insert([]))
                .ctx(what)?;
            *tail = Tail { id, data: Vec::with_capacity(segment_bytes), dirty: false };
        }
        let take = rest.len().min(segment_bytes - tail.data.len());
        start.get_or_insert(tail.id << OFFSET_BITS | tail.data.len() as i64);
        tail.data.extend_from_slice(&rest[..take]);
        tail.dirty = true;
        rest = &rest[take..];
    }
    start.ok_or_else(|| StoreError::invalid("an empty blob can't be packed"))
}

/// The `size` bytes at `location`; `Corrupt` naming `blob` when the segments don't hold them.
pub(crate) fn read(conn: &Connection, location: i64, size: usize, blob: &str) -> StoreResult<Vec<u8>> {
    let (first, offset) = (location >> OFFSET_BITS, (location & ((1 << OFFSET_BITS) - 1)) as usize);
    let short = || {
        StoreError::corrupt(format!("blob {blob} is corrupt: its packed bytes are missing (segment {first})"))
    };
    let mut out = Vec::with_capacity(size);
    let mut stmt = conn
        .prepare_cached("SELECT id, data FROM segments WHERE id >= ?1 ORDER BY id")
        .ctx(|| format!("reading blob {blob}"))?;
    let mut rows = stmt.query([first]).ctx(|| format!("reading blob {blob}"))?;
    let mut expected = first;
    while out.len() < size {
        let row = rows.next().ctx(|| format!("reading blob {blob}"))?.ok_or_else(short)?;
        let (id, data): (i64, Vec<u8>) = (
            row.get(0).ctx(|| format!("reading blob {blob}"))?,
            row.get(1).ctx(|| format!("reading blob {blob}"))?,
        );
        if id != expected {
            return Err(short());
        }
        let from = if id == first { offset } else { 0 };
        let chunk = data.get(from..).ok_or_else(short)?;
        let take = chunk.len().min(size - out.len());
        out.extend_from_slice(&chunk[..take]);
        expected += 1;
    }
    Ok(out)
}
