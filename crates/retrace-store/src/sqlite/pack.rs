//! Packed blobs: bytes appended end to end into `segments` rows of one page each, so that blob
//! pages stay full whatever the blob sizes (see [`super::schema`]). A blob's location is
//! `segment_id << 16 | offset`; it continues into the following segments when it doesn't fit.
use rusqlite::{params, Connection, OptionalExtension};

use crate::error::ResultExt;
use crate::{StoreError, StoreResult};

const OFFSET_BITS: u32 = 16;

/// Packs the blobs of one write transaction: the last segment is read once, kept in memory
/// while blobs are appended to it, and each segment's row is written once, when it fills up or
/// at [`Packer::finish`], instead of rewriting the last segment's row for every blob.
#[derive(Debug)]
pub(crate) struct Packer {
    segment_bytes: usize,
    /// The segment being filled, once the first blob is packed.
    tail: Option<Tail>,
}

/// The segment being filled: its id, its bytes, whether its row exists and whether the bytes
/// changed since they were read or written.
#[derive(Debug)]
struct Tail {
    id: i64,
    data: Vec<u8>,
    stored: bool,
    dirty: bool,
}

impl Packer {
    pub(crate) fn new(segment_bytes: usize) -> Packer {
        Packer { segment_bytes, tail: None }
    }

    /// Appends `bytes` (non-empty) after the last segment's bytes, inside the open transaction
    /// `tx`, and returns their location; they reach `tx` by [`Packer::finish`] at the latest.
    pub(crate) fn append(&mut self, tx: &Connection, bytes: &[u8]) -> StoreResult<i64> {
        if bytes.is_empty() {
            return Err(StoreError::invalid("an empty blob can't be packed"));
        }
        let segment_bytes = self.segment_bytes;
        let mut tail = match self.tail.take() {
            Some(tail) => tail,
            None => last_segment(tx, segment_bytes)?,
        };
        let mut start = None;
        let mut rest = bytes;
        while !rest.is_empty() {
            if tail.data.len() >= segment_bytes {
                // Ids follow the last one: the write transaction holds the only writer, and a
                // blob continues into the next id (see `read`).
                write(tx, &tail)?;
                tail = Tail {
                    id: tail.id + 1,
                    data: Vec::with_capacity(segment_bytes),
                    stored: false,
                    dirty: true,
                };
            }
            let take = rest.len().min(segment_bytes - tail.data.len());
            start.get_or_insert(tail.id << OFFSET_BITS | tail.data.len() as i64);
            tail.data.extend_from_slice(&rest[..take]);
            tail.dirty = true;
            rest = &rest[take..];
        }
        self.tail = Some(tail);
        Ok(start.expect("bytes is not empty"))
    }

    /// Where the next [`Packer::append`] will put its bytes, without appending them.
    pub(crate) fn next_location(&mut self, tx: &Connection) -> StoreResult<i64> {
        let tail = match self.tail.take() {
            Some(tail) => tail,
            None => last_segment(tx, self.segment_bytes)?,
        };
        let location = if tail.data.len() >= self.segment_bytes {
            (tail.id + 1) << OFFSET_BITS
        } else {
            tail.id << OFFSET_BITS | tail.data.len() as i64
        };
        self.tail = Some(tail);
        Ok(location)
    }

    /// Writes the segment being filled, if it changed.
    pub(crate) fn finish(self, tx: &Connection) -> StoreResult<()> {
        match self.tail {
            Some(tail) => write(tx, &tail),
            None => Ok(()),
        }
    }
}

/// The last segment, or a full one with id 0 when there is none (so the first blob starts
/// segment 1).
fn last_segment(tx: &Connection, segment_bytes: usize) -> StoreResult<Tail> {
    let last: Option<(i64, Vec<u8>)> = tx
        .prepare_cached("SELECT id, data FROM segments ORDER BY id DESC LIMIT 1")
        .and_then(|mut s| s.query_row([], |r| Ok((r.get(0)?, r.get(1)?))).optional())
        .ctx(|| "packing a blob")?;
    Ok(match last {
        Some((id, data)) => Tail { id, data, stored: true, dirty: false },
        None => Tail { id: 0, data: vec![0; segment_bytes], stored: true, dirty: false },
    })
}

fn write(tx: &Connection, tail: &Tail) -> StoreResult<()> {
    if !tail.dirty {
        return Ok(());
    }
    let sql = match tail.stored {
        true => "UPDATE segments SET data = ?2 WHERE id = ?1",
        false => "INSERT INTO segments (id, data) VALUES (?1, ?2)",
    };
    tx.prepare_cached(sql)
        .and_then(|mut s| s.execute(params![tail.id, &tail.data]))
        .ctx(|| "packing a blob")?;
    Ok(())
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
