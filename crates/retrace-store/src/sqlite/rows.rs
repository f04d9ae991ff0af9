//! Events ↔ rows: the column layout of `events` and the compact JSON of its `extra` column.
//!
//! JSON read back from the store goes through `retrace_core::json` (exact decimal → double),
//! so every number, and therefore every event hash, survives the round trip.
use std::borrow::Cow;
use std::collections::BTreeMap;

use retrace_core::envelope::{Approval, Decision, MessageRef, ModelRef, PromptRef, ToolRef, Usage};
use retrace_core::{Digest, Event, EventType, Source};
use rusqlite::types::Value;
use rusqlite::Row;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::schema::FLAG_OUTPUT_HASH_IS_REF;
use crate::{StoreError, StoreResult};

/// The columns every event read selects, in this order, joined with `agents a`.
pub(crate) const EVENT_COLUMNS: &str = "e.seq, e.type, a.name, e.lamport, e.causal_parent, e.name, e.key, \
     e.request_ref, e.output_ref, e.output_hash, e.flags, e.prev, e.hash, e.extra";

/// How many columns [`EVENT_COLUMNS`] selects (a query may select more after them).
pub(crate) const EVENT_COLUMN_COUNT: usize = 14;

/// The optional fields of an event, absent ones omitted: borrowed from the event when written,
/// owned when read back (`Extra<'static>`).
#[derive(Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Extra<'a> {
    /// The event's run when it is not the run it is stored under (inherited fork events).
    #[serde(skip_serializing_if = "Option::is_none")]
    r: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "<[u64]>::is_empty")]
    inb: Cow<'a, [u64]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<Cow<'a, ModelRef>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<Cow<'a, BTreeMap<String, serde_json::Value>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tpl: Option<Cow<'a, PromptRef>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool: Option<Cow<'a, ToolRef>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    msg: Option<Cow<'a, MessageRef>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dec: Option<Cow<'a, Decision>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    appr: Option<Cow<'a, Approval>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Cow<'a, Usage>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lat: Option<u64>,
    #[serde(skip_serializing_if = "is_live")]
    src: Source,
    #[serde(skip_serializing_if = "Option::is_none")]
    orig: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    err: Option<Cow<'a, str>>,
}

/// `Some(field)` borrowed.
fn lend<T: ToOwned + ?Sized>(field: Option<&T>) -> Option<Cow<'_, T>> {
    field.map(Cow::Borrowed)
}

/// An owned field back from a row.
fn own<T: ToOwned + ?Sized>(field: Option<Cow<'_, T>>) -> Option<T::Owned> {
    field.map(Cow::into_owned)
}

fn is_live(source: &Source) -> bool {
    *source == Source::Live
}

/// The values of one `events` row, in insert order (run_pk and agent_pk supplied by the caller):
/// seq, type, lamport, causal_parent, name, key, request_ref, output_ref, output_hash, flags,
/// prev, hash, extra.
pub(crate) fn event_values(run: &str, e: &Event) -> StoreResult<[Value; 13]> {
    let extra = Extra {
        r: (e.run_id != run).then_some(Cow::Borrowed(e.run_id.as_str())),
        role: lend(e.role.as_deref()),
        inb: Cow::Borrowed(&e.inbound),
        model: lend(e.model.as_ref()),
        params: lend(e.params.as_ref()),
        tpl: lend(e.prompt_template.as_ref()),
        tool: lend(e.tool.as_ref()),
        msg: lend(e.message.as_ref()),
        dec: lend(e.decision.as_ref()),
        appr: lend(e.approval.as_ref()),
        usage: lend(e.usage.as_ref()),
        lat: e.latency_ms,
        src: e.source,
        orig: e.origin_seq,
        err: lend(e.error.as_deref()),
    };
    let extra = serde_json::to_string(&extra).map_err(|err| {
        StoreError::invalid(format!("event {} of run {run} can't be encoded: {err}", e.seq)).with_source(err)
    })?;
    let hash_is_ref = e.output_hash.is_some() && e.output_hash == e.output_ref;
    let digest = |d: Option<Digest>| d.map_or(Value::Null, |d| Value::Blob(d.as_bytes().to_vec()));
    Ok([
        Value::Integer(e.seq as i64),
        Value::Integer(i64::from(e.kind.code())),
        Value::Integer(e.lamport as i64),
        e.causal_parent.map_or(Value::Null, |p| Value::Integer(p as i64)),
        e.name.clone().map_or(Value::Null, Value::Text),
        digest(Some(e.key)),
        digest(e.request_ref),
        digest(e.output_ref),
        digest(if hash_is_ref { None } else { e.output_hash }),
        Value::Integer(if hash_is_ref { FLAG_OUTPUT_HASH_IS_REF } else { 0 }),
        digest(e.prev),
        digest(Some(e.hash)),
        if extra == "{}" { Value::Null } else { Value::Text(extra) },
    ])
}

/// An event from a row selected with [`EVENT_COLUMNS`], stored under `run`.
pub(crate) fn event_from_row(run: &str, row: &Row<'_>) -> rusqlite::Result<StoreResult<Event>> {
    let seq = row.get::<_, i64>(0)? as u64;
    let bad = |what: &str| StoreError::corrupt(format!("event {seq} of run {run} has a bad {what} column"));
    let digest = |i: usize, what: &str| -> rusqlite::Result<StoreResult<Option<Digest>>> {
        Ok(match row.get::<_, Option<Vec<u8>>>(i)? {
            None => Ok(None),
            Some(bytes) => Digest::from_slice(&bytes).map(Some).ok_or_else(|| bad(what)),
        })
    };
    let (key, request_ref, output_ref, output_hash, prev, hash) = (
        digest(6, "key")?,
        digest(7, "request_ref")?,
        digest(8, "output_ref")?,
        digest(9, "output_hash")?,
        digest(11, "prev")?,
        digest(12, "hash")?,
    );
    let flags: i64 = row.get(10)?;
    let code: i64 = row.get(1)?;
    let agent: String = row.get(2)?;
    let lamport = row.get::<_, i64>(3)? as u64;
    let causal_parent = row.get::<_, Option<i64>>(4)?.map(|p| p as u64);
    let name: Option<String> = row.get(5)?;
    let extra: Option<String> = row.get(13)?;
    Ok((|| {
        let kind = u8::try_from(code).ok().and_then(EventType::from_code).ok_or_else(|| bad("type"))?;
        let extra: Extra<'static> = match extra {
            Some(text) => decode_json_with(text.as_bytes(), || format!("event {seq} of run {run}"))?,
            None => Extra::default(),
        };
        let output_ref = output_ref?;
        let output_hash = if flags & FLAG_OUTPUT_HASH_IS_REF != 0 { output_ref } else { output_hash? };
        Ok(Event {
            run_id: own(extra.r).unwrap_or_else(|| run.to_string()),
            seq,
            lamport,
            agent_id: agent,
            role: own(extra.role),
            kind,
            name,
            causal_parent,
            inbound: extra.inb.into_owned(),
            key: key?.ok_or_else(|| bad("key"))?,
            request_ref: request_ref?,
            output_ref,
            output_hash,
            model: own(extra.model),
            params: own(extra.params),
            prompt_template: own(extra.tpl),
            tool: own(extra.tool),
            message: own(extra.msg),
            decision: own(extra.dec),
            approval: own(extra.appr),
            usage: own(extra.usage),
            latency_ms: extra.lat,
            source: extra.src,
            origin_seq: extra.orig,
            error: own(extra.err),
            prev: prev?,
            hash: hash?.ok_or_else(|| bad("hash"))?,
        })
    })())
}

/// Decodes stored JSON exactly (numbers through `retrace_core::json`); `Corrupt` naming `what`.
pub(crate) fn decode_json<T: DeserializeOwned>(bytes: &[u8], what: &str) -> StoreResult<T> {
    decode_json_with(bytes, || what.to_owned())
}

/// [`decode_json`], naming what was decoded only when it fails. JSON whose numbers are all
/// small integers ([`integers_only`]) decodes straight from its bytes: serde_json reads those
/// exactly too, and skipping the exact parse and its tree is most of the cost of reading a row.
pub(crate) fn decode_json_with<T: DeserializeOwned>(
    bytes: &[u8],
    what: impl Fn() -> String,
) -> StoreResult<T> {
    let corrupt =
        |e: &dyn std::fmt::Display| StoreError::corrupt(format!("{} is stored as bad JSON: {e}", what()));
    if integers_only(bytes) {
        return serde_json::from_slice(bytes).map_err(|e| corrupt(&e));
    }
    let value = retrace_core::json::parse(bytes).map_err(|e| corrupt(&e))?.to_value();
    serde_json::from_value(value).map_err(|e| corrupt(&e))
}

/// Whether every number in the JSON text `bytes` is an integer of at most 18 digits, without
/// `-0`: no `.`, no digit followed by `e`/`E` or `-` followed by `0`, no longer run of digits.
/// Strings are not told apart from numbers, so a string such as `"1.5"` answers false, which
/// only means the exact path.
fn integers_only(bytes: &[u8]) -> bool {
    let mut digits = 0;
    let mut prev = 0u8;
    for &b in bytes {
        match b {
            b'.' => return false,
            b'0'..=b'9' => {
                digits += 1;
                if digits > 18 || (b == b'0' && prev == b'-') {
                    return false;
                }
            }
            b'e' | b'E' if prev.is_ascii_digit() => return false,
            _ => digits = 0,
        }
        prev = b;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_small_integers_take_the_fast_path() {
        for plain in [r#"{"lat":0,"inb":[1,22,333]}"#, r#"{"n":-12,"s":"x"}"#, r#"{"a":999999999999999999}"#]
        {
            assert!(integers_only(plain.as_bytes()), "{plain}");
        }
        for exact in [
            r#"{"t":0.1}"#,
            r#"{"t":1e3}"#,
            r#"{"t":1E3}"#,
            r#"{"n":-0}"#,
            r#"{"a":1234567890123456789}"#,
            r#"{"s":"1.5"}"#,
        ] {
            assert!(!integers_only(exact.as_bytes()), "{exact}");
        }
    }

    #[test]
    fn both_paths_decode_the_same() {
        type Map = BTreeMap<String, serde_json::Value>;
        for text in [r#"{"a":1,"b":[-3,4],"c":{"d":"e\u0041"}}"#, r#"{"a":-9,"b":null,"c":true}"#] {
            assert!(integers_only(text.as_bytes()));
            let fast: Map = decode_json_with(text.as_bytes(), || "t".into()).unwrap();
            let exact: Map =
                serde_json::from_value(retrace_core::json::parse(text.as_bytes()).unwrap().to_value())
                    .unwrap();
            assert_eq!(fast, exact);
        }
        let bad = decode_json_with::<Map>(b"{\"a\":", || "event 3 of run r".into()).unwrap_err();
        assert!(bad.to_string().contains("event 3 of run r is stored as bad JSON"), "{bad}");
    }
}
