//! [`EventSummary`]s straight from the `events` columns: the digests as stored, and of the
//! `extra` JSON only the source, origin, usage, decision, model, message and error, decoded without building the rest.
use retrace_core::envelope::{Decision, MessageRef, ModelRef, Usage};
use retrace_core::{Digest, EventType, Source};
use rusqlite::{params, Row};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::rows::decode_json;
use super::runs::run_pk;
use super::schema::FLAG_OUTPUT_HASH_IS_REF;
use super::SqliteStore;
use crate::error::ResultExt;
use crate::{EventSummary, StoreError, StoreResult};

/// The members of `extra` a summary needs; the others are skipped unread.
#[derive(Default, Deserialize)]
#[serde(default)]
struct ExtraSummary<'a> {
    src: Source,
    orig: Option<u64>,
    dec: Option<Decision>,
    model: Option<ModelRef>,
    msg: Option<MessageRef>,
    #[serde(borrow)]
    err: Option<std::borrow::Cow<'a, str>>,
    /// Decoded exactly (see [`decode_json`]), as whole events are, so costs are the same doubles.
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
}

fn summary_from_row(run: &str, row: &Row<'_>) -> rusqlite::Result<StoreResult<EventSummary>> {
    let seq = row.get::<_, i64>(0)? as u64;
    let bad = |what: &str| StoreError::corrupt(format!("event {seq} of run {run} has a bad {what} column"));
    let digest = |i: usize, what: &str| -> rusqlite::Result<StoreResult<Option<Digest>>> {
        Ok(match row.get_ref(i)?.as_blob_or_null()? {
            None => Ok(None),
            Some(bytes) => Digest::from_slice(bytes).map(Some).ok_or_else(|| bad(what)),
        })
    };
    let (key, request_ref, output_ref, output_hash) =
        (digest(4, "key")?, digest(5, "request_ref")?, digest(6, "output_ref")?, digest(7, "output_hash")?);
    let code: i64 = row.get(1)?;
    let agent_id: String = row.get(2)?;
    let name: Option<String> = row.get(3)?;
    let flags: i64 = row.get(8)?;
    let extra = row.get_ref(9)?.as_str_or_null()?;
    let causal_parent = row.get::<_, Option<i64>>(10)?.map(|p| p as u64);
    Ok((|| {
        let kind = u8::try_from(code).ok().and_then(EventType::from_code).ok_or_else(|| bad("type"))?;
        let what = || format!("event {seq} of run {run}");
        let extra: ExtraSummary<'_> = match extra {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| StoreError::corrupt(format!("{} is stored as bad JSON: {e}", what())))?,
            None => ExtraSummary::default(),
        };
        let usage: Option<Usage> =
            extra.usage.map(|raw| decode_json(raw.get().as_bytes(), &what())).transpose()?;
        let output_ref = output_ref?;
        let output_hash = if flags & FLAG_OUTPUT_HASH_IS_REF != 0 { output_ref } else { output_hash? };
        Ok(EventSummary {
            seq,
            agent_id,
            kind,
            name,
            causal_parent,
            key: key?.ok_or_else(|| bad("key"))?,
            request_ref: request_ref?,
            output_ref,
            output_hash,
            source: extra.src,
            origin_seq: extra.orig,
            usage,
            decision: extra.dec,
            model: extra.model,
            message: extra.msg,
            error: extra.err.map(std::borrow::Cow::into_owned),
        })
    })())
}

impl SqliteStore {
    pub(crate) fn summaries_impl(
        &self,
        run: &str,
        from: u64,
        limit: usize,
    ) -> StoreResult<Vec<EventSummary>> {
        self.read(|conn| {
            let pk = run_pk(conn, run)?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let from = super::schema::seq_bound(from);
            conn.prepare_cached(
                "SELECT e.seq, e.type, a.name, e.name, e.key, e.request_ref, e.output_ref, e.output_hash, \
                 e.flags, e.extra, e.causal_parent FROM events e JOIN agents a ON a.pk = e.agent_pk \
                 WHERE e.id >= (?1 << 32) + ?2 AND e.id < (?1 + 1) << 32 ORDER BY e.id LIMIT ?3",
            )
            .and_then(|mut s| s.query_map(params![pk, from, limit], |r| summary_from_row(run, r))?.collect())
            .ctx(|| format!("reading event summaries of run {run} from seq {from}"))
            .and_then(|rows: Vec<StoreResult<EventSummary>>| rows.into_iter().collect())
        })
    }
}
