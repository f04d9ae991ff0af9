//! The LLM and tool caches in SQLite: entries are appended to `cache_log` and merged into
//! `cache`, one row per step key, now and then (see [`super::tail`]); the newest wins.
//!
//! Times and TTLs are stored as SQLite's signed integers with their bits unchanged (as seqs
//! are), so every `u64` reads back exactly.
use retrace_core::envelope::{ToolClass, Usage};
use retrace_core::Digest;
use rusqlite::{params, Connection, OptionalExtension};

use super::rows::decode_json;
use super::{blobs, SqliteStore};
use crate::cache::{check_entry, missing_blob};
use crate::error::ResultExt;
use crate::{Cache, CacheEntry, StoreError, StoreResult};

/// Stores `entry` under `key`, replacing any earlier entry, inside the open transaction `tx`
/// (already checked): appended to `cache_log`.
pub(crate) fn put(tx: &Connection, key: &Digest, entry: &CacheEntry) -> StoreResult<()> {
    let usage = entry
        .usage
        .as_ref()
        .map(|u| {
            serde_json::to_string(u).map_err(|e| {
                StoreError::invalid(format!("the usage of cache entry {key} can't be encoded: {e}"))
                    .with_source(e)
            })
        })
        .transpose()?;
    tx.prepare_cached(
        "INSERT INTO cache_log (key, output_blob, usage, stored_at, class, ttl, snapshot) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .and_then(|mut s| {
        s.execute(params![
            key.as_bytes(),
            entry.output_ref.as_bytes(),
            usage,
            entry.stored_at_ms as i64,
            entry.class.map(ToolClass::as_str),
            entry.ttl_s.map(|t| t as i64),
            entry.snapshot,
        ])
    })
    .ctx(|| format!("storing cache entry {key}"))?;
    Ok(())
}

type Row = (Vec<u8>, Option<String>, i64, Option<String>, Option<i64>, Option<String>);

/// The newest entry of `key`: the last appended to `cache_log` (a scan of the few rows not
/// merged yet), else the one in `cache`.
fn get(conn: &Connection, key: &Digest) -> StoreResult<Option<CacheEntry>> {
    let mut row: Option<Row> = None;
    for sql in [
        "SELECT output_blob, usage, stored_at, class, ttl, snapshot FROM cache_log WHERE key = ?1 ORDER BY id DESC LIMIT 1",
        "SELECT output_blob, usage, stored_at, class, ttl, snapshot FROM cache WHERE key = ?1",
    ] {
        row = conn
            .prepare_cached(sql)
            .and_then(|mut s| {
                s.query_row([key.as_bytes()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))
                    .optional()
            })
            .ctx(|| format!("reading cache entry {key}"))?;
        if row.is_some() {
            break;
        }
    }
    let Some((output, usage, stored_at, class, ttl, snapshot)) = row else {
        return Ok(None);
    };
    let bad = |what: &str| StoreError::corrupt(format!("cache entry {key} has a bad {what} column"));
    let usage: Option<Usage> =
        usage.map(|u| decode_json(u.as_bytes(), &format!("the usage of cache entry {key}"))).transpose()?;
    Ok(Some(CacheEntry {
        output_ref: Digest::from_slice(&output).ok_or_else(|| bad("output_blob"))?,
        usage,
        stored_at_ms: stored_at as u64,
        class: class.map(|c| c.parse::<ToolClass>().map_err(|_| bad("class"))).transpose()?,
        ttl_s: ttl.map(|t| t as u64),
        snapshot,
    }))
}

impl Cache for SqliteStore {
    fn cache_get(&self, key: &Digest) -> StoreResult<Option<CacheEntry>> {
        self.read(|conn| get(conn, key))
    }

    fn cache_put(&self, key: &Digest, entry: &CacheEntry) -> StoreResult<()> {
        check_entry(key, entry)?;
        self.write(&format!("storing cache entry {key}"), |tx| {
            if !blobs::has(tx, &entry.output_ref)? {
                return Err(missing_blob(key, entry));
            }
            put(tx, key, entry)
        })
    }
}
