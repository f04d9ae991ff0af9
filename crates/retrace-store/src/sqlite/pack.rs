//! Packed blobs: bytes appended end to end into `segments` rows of one page each, so that blob
//! pages stay full whatever the blob sizes (see [`super::schema`]). A blob's location is
//! `segment_id << 16 | offset`; it continues into the following segments when it doesn't fit.
use rusqlite::{params, Connection, OptionalExtension};

use crate::error::ResultExt;
use crate::{StoreError, StoreResult};

const OFFSET_BITS: u32 = 16;

/// Appends `bytes` (non-empty) after the last segment's bytes, inside the open transaction
/// `tx`, and returns their location.
pub(crate) fn append(tx: &Connection, segment_bytes: usize, bytes: &[u8]) -> StoreResult<i64> {
    let what = || "packing a blob";
    let tail: Option<(i64, i64)> = tx
        .prepare_cached("SELECT id, length(data) FROM segments ORDER BY id DESC LIMIT 1")
        .and_then(|mut s| s.query_row([], |r| Ok((r.get(0)?, r.get(1)?))).optional())
        .ctx(what)?;
    let (mut segment, mut used) = tail.map_or((0, segment_bytes), |(id, len)| (id, len as usize));
    let mut start = None;
    let mut rest = bytes;
    while !rest.is_empty() {
        if used >= segment_bytes {
            segment = tx
                .prepare_cached("INSERT INTO segments (data) VALUES (x'')")
                .and_then(|mut s| s.insert([]))
                .ctx(what)?;
            used = 0;
        }
        let take = rest.len().min(segment_bytes - used);
        start.get_or_insert(segment << OFFSET_BITS | used as i64);
        tx.prepare_cached("UPDATE segments SET data = CAST(data || ?2 AS BLOB) WHERE id = ?1")
            .and_then(|mut s| s.execute(params![segment, &rest[..take]]))
            .ctx(what)?;
        used += take;
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
