//! Blobs in SQLite: small ones (up to [`ROW_MAX`]) in their row, the rest up to [`INLINE_BLOB_MAX`] packed into
//! segments ([`super::pack`]), larger ones as durable files ([`super::files`]), and model
//! requests (chained) and responses as manifests ([`crate::manifest`]). Every read verifies the digest.
use std::sync::Arc;

use retrace_core::digest_map::DigestMap;
use retrace_core::Digest;
use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use rusqlite::{params, Connection, OptionalExtension};

use super::files::Files;
use super::pack;
use super::schema::{KIND_FILE, KIND_INLINE, KIND_MANIFEST, KIND_PACKED};
use super::staged::Staged;
use super::tail::{id_of, indexed_of_list};
use crate::error::ResultExt;
use crate::head::SeqMap;
use crate::manifest::{self, Manifest, ManifestSource};
use crate::{BlobAt, BlobHint, BlobPut, BlobRef, StoreError, StoreResult, INLINE_BLOB_MAX};

/// Blobs up to this size stay in their row; larger ones up to [`INLINE_BLOB_MAX`] are packed.
///
/// A message body of a few hundred bytes in its row costs a commit nothing beyond the `blobs`
/// leaf it dirties anyway; packed, it rewrote the segment tail (a whole page) on every commit.
/// On the bus bench (200-byte bodies, batches of 6 events) raising this from 64 to 256 took
/// the pages a commit writes to the WAL from 9.2 to 8.1 and the commit path's instructions down
/// 5%, for 1.7% more pages in the database (a row-sized gap left at the end of a leaf).
const ROW_MAX: usize = 256;

/// The row id of `digest`, indexed or in the tail (see [`super::tail`]).
fn blob_id(conn: &Connection, digest: &Digest) -> StoreResult<Option<i64>> {
    conn.prepare_cached(&format!("SELECT {}", id_of("?1")))
        .and_then(|mut s| s.query_row([digest.as_bytes()], |r| r.get(0)))
        .ctx(|| format!("looking up blob {digest}"))
}

/// The row id of `digest` in the write transaction `tx`: from what the transaction already
/// knows (prefetched or inserted, see [`prefetch`]), from the tail's copy, or else asked of
/// the digest tables.
fn stored_id(tx: &Connection, staged: &mut Staged<'_>, digest: &Digest) -> StoreResult<Option<i64>> {
    match staged.known.get(digest) {
        Some(known) => Ok(*known),
        None => staged.tail.find(tx, digest),
    }
}

/// Looks up which of `digests` are stored: in the tail's copy, and those it lacks that the
/// filter doesn't rule out ([`super::tail::Tail::may_be_indexed`]) in one query of the digest
/// tables (the digests as a JSON array of hex strings walked by `json_each`), so that [`put`]
/// asks nothing more about them.
pub(crate) fn prefetch(tx: &Connection, staged: &mut Staged<'_>, digests: &[Digest]) -> StoreResult<()> {
    let mut asked = Vec::with_capacity(digests.len());
    for digest in digests {
        let id = staged.tail.get(digest);
        if id.is_none() && staged.tail.may_be_indexed(tx, digest)? {
            asked.push(*digest);
        }
        staged.known.insert(*digest, id);
    }
    if asked.is_empty() {
        return Ok(());
    }
    let what = || format!("looking up {} blobs", asked.len());
    let found: Vec<(Vec<u8>, i64)> = tx
        .prepare_cached(&indexed_of_list("x.digest, x.id", ""))
        .and_then(|mut s| s.query_map([hex_list(&asked)], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .ctx(what)?;
    for (digest, id) in found {
        let digest = Digest::from_slice(&digest)
            .ok_or_else(|| StoreError::corrupt("a blob row holds a bad digest"))?;
        staged.known.insert(digest, Some(id));
    }
    Ok(())
}

/// Stores a batch's blobs inside `tx`: those said to be stored already ([`BlobPut::at`]) are
/// confirmed where they are said to be (one carried without its bytes must be found, by its
/// place or its digest, or the batch fails); plain blobs up to [`INLINE_BLOB_MAX`] are inserted at
/// once unless their digest is there ([`put_plain`]); the rest (model requests and responses,
/// which may become manifests, and blobs kept as files) are looked up together ([`prefetch`])
/// and put ([`put`]) unless stored. `staged.known` ends up holding every blob's row id.
pub(crate) fn put_all(
    tx: &Connection,
    staged: &mut Staged<'_>,
    run_pk: Option<i64>,
    blobs: &[BlobPut],
) -> StoreResult<()> {
    confirm(tx, staged, blobs)?;
    let plain = |b: &BlobPut| b.hint() == BlobHint::Raw && b.bytes().len() <= INLINE_BLOB_MAX;
    let unknown: Vec<Digest> = blobs
        .iter()
        .filter(|b| !plain(b) || !b.carries_bytes())
        .map(|b| b.digest())
        .filter(|d| !staged.known.contains_key(d))
        .collect();
    prefetch(tx, staged, &unknown)?;
    let mut rows = RowInserter::new(tx)?;
    for blob in blobs {
        let digest = blob.digest();
        let id = if !blob.carries_bytes() {
            // Carried only to be confirmed: it must be stored, and nothing is stored for it.
            stored_id(tx, staged, &digest)?.ok_or_else(|| {
                StoreError::not_found(format!("blob {digest}, stored earlier without a run, is gone"))
            })?
        } else if plain(blob) && !staged.known.contains_key(&digest) {
            put_plain(tx, &mut rows, staged, &digest, blob.bytes())?
        } else {
            put(tx, staged, run_pk, &digest, blob.bytes(), blob.hint())?
        };
        staged.known.insert(digest, Some(id));
    }
    Ok(())
}

/// Stores plain `bytes` (up to [`INLINE_BLOB_MAX`]) that this transaction hasn't looked up,
/// unless the store holds them (in the tail's copy or the digest tables). A packed blob's row
/// names the place its bytes will go ([`Staged::next_pack_location`]).
fn put_plain(
    tx: &Connection,
    rows: &mut RowInserter<'_>,
    staged: &mut Staged<'_>,
    digest: &Digest,
    bytes: &[u8],
) -> StoreResult<i64> {
    if let Some(id) = stored_id(tx, staged, digest)? {
        return Ok(id);
    }
    let location = match bytes.len() > ROW_MAX {
        true => Some(staged.next_pack_location(tx)?),
        false => None,
    };
    let (kind, data) = match location {
        Some(at) => (KIND_PACKED, ValueRef::Integer(at)),
        None => (KIND_INLINE, ValueRef::Blob(bytes)),
    };
    let id = rows.insert(tx, digest, kind, bytes.len(), data)?;
    staged.tail.note(*digest, id);
    if let Some(at) = location {
        let packed_at = staged.pack(tx, bytes)?;
        if packed_at != at {
            return Err(StoreError::corrupt(format!(
                "blob {digest} was packed at {packed_at}, not at {at} where its row says"
            )));
        }
    }
    Ok(id)
}

/// Puts into `staged.known` each blob of `blobs` whose row is where its [`BlobPut::at`] says,
/// with that row's digest: one range scan when the ids are close together (as an import's
/// blobs, stored in file order, are), else a row-id lookup each. A hint that points at another
/// row, or at none, is left for the digest lookup.
fn confirm(tx: &Connection, staged: &mut Staged<'_>, blobs: &[BlobPut]) -> StoreResult<()> {
    // Two blobs said to be at one row can't both be there: the later claim is kept.
    let claimed: SeqMap<i64, &Digest> =
        blobs.iter().filter_map(|b| b.at().map(|at| (at.get(), &b.digest))).collect();
    let (Some(&low), Some(&high)) = (claimed.keys().min(), claimed.keys().max()) else {
        return Ok(());
    };
    let what = || format!("confirming {} stored blobs", claimed.len());
    let mut check = |id: i64, held: ValueRef<'_>| {
        if let (Some(digest), ValueRef::Blob(held)) = (claimed.get(&id), held) {
            if held == digest.as_bytes() {
                staged.known.insert(**digest, Some(id));
            }
        }
    };
    if i128::from(high) - i128::from(low) <= 4 * claimed.len() as i128 + 64 {
        let mut scan =
            tx.prepare_cached("SELECT id, digest FROM blobs WHERE id BETWEEN ?1 AND ?2").ctx(what)?;
        let mut rows = scan.query([low, high]).ctx(what)?;
        while let Some(row) = rows.next().ctx(what)? {
            check(row.get(0).ctx(what)?, row.get_ref(1).ctx(what)?);
        }
    } else {
        let mut one = tx.prepare_cached("SELECT digest FROM blobs WHERE id = ?1").ctx(what)?;
        for &id in claimed.keys() {
            let mut rows = one.query([id]).ctx(what)?;
            if let Some(row) = rows.next().ctx(what)? {
                check(id, row.get_ref(0).ctx(what)?);
            }
        }
    }
    Ok(())
}

/// `["<hex>",...]`: digests for `json_each`.
fn hex_list(digests: &[Digest]) -> String {
    let mut list = String::with_capacity(2 + digests.len() * 67);
    list.push('[');
    for (i, digest) in digests.iter().enumerate() {
        if i > 0 {
            list.push(',');
        }
        list.push('"');
        list.push_str(&digest.hex());
        list.push('"');
    }
    list.push(']');
    list
}

fn insert(
    conn: &Connection,
    staged: &mut Staged<'_>,
    digest: &Digest,
    kind: i64,
    size: usize,
    data: Value,
) -> StoreResult<i64> {
    let id = RowInserter::new(conn)?.insert(conn, digest, kind, size, (&data).into())?;
    staged.tail.note(*digest, id);
    staged.known.insert(*digest, Some(id));
    staged.inserted.insert(*digest);
    Ok(id)
}

/// Inserts blob rows through one prepared statement, stamped with one time: a batch's plain
/// blobs took the statement from rusqlite's cache one by one, and that cache hashes the SQL
/// text at every take and return.
struct RowInserter<'c> {
    insert: rusqlite::CachedStatement<'c>,
    now: i64,
}

impl<'c> RowInserter<'c> {
    fn new(conn: &'c Connection) -> StoreResult<Self> {
        let insert = conn
            .prepare_cached(
                "INSERT INTO blobs (digest, kind, size, data, stored_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .ctx(|| "preparing to store blobs")?;
        Ok(RowInserter { insert, now: crate::writer::lease::now_ms() as i64 })
    }

    /// Inserts a blob's row into the tail (the caller knows its digest has none); the new
    /// row's id.
    fn insert(
        &mut self,
        conn: &Connection,
        digest: &Digest,
        kind: i64,
        size: usize,
        data: ValueRef<'_>,
    ) -> StoreResult<i64> {
        let data = ToSqlOutput::Borrowed(data);
        self.insert
            .execute(params![digest.as_bytes(), kind, size as i64, data, self.now])
            .ctx(|| format!("storing blob {digest}"))?;
        Ok(conn.last_insert_rowid())
    }
}

/// Stores `bytes` flat (in the row, packed or as a file) unless present; returns the row id.
fn put_flat(tx: &Connection, staged: &mut Staged<'_>, digest: &Digest, bytes: &[u8]) -> StoreResult<i64> {
    match stored_id(tx, staged, digest)? {
        Some(id) => heal(tx, staged, digest, bytes).map(|()| id),
        None => store_flat(tx, staged, digest, bytes),
    }
}

/// A blob stored as a file whose file is gone or holds other bytes (damage `verify` reports)
/// is written again from the bytes in hand, which the writer has checked against the digest:
/// one damaged file would otherwise break every later run holding the same bytes, stored `ok`
/// and unreplayable (QA21 D3). Costs a read of the file when a large blob is stored again.
fn heal(tx: &Connection, staged: &mut Staged<'_>, digest: &Digest, bytes: &[u8]) -> StoreResult<()> {
    if bytes.len() <= INLINE_BLOB_MAX {
        return Ok(());
    }
    let Some((KIND_FILE, _, Value::Text(relative), _)) = row(tx, digest)? else { return Ok(()) };
    if relative != Files::relative_path(digest) {
        return Ok(());
    }
    let path = staged.files.dir.join(&relative);
    if staged.stages(&path) || std::fs::read(&path).is_ok_and(|stored| stored == bytes) {
        return Ok(());
    }
    staged.write(digest, bytes).map(drop)
}

/// A model request or response stored as a manifest that no longer rebuilds (an element's file
/// gone or damaged) is stored again, whole and flat under its row, from the bytes in hand: the
/// same repair as [`heal`] for the proxy's blobs (QA24 D1: a new run referencing it was stored
/// `ok` and failed `verify`). Only a large one can hold an element kept as a file; a manifest
/// this transaction stored is not checked (its files are not in place yet). Costs a rebuild of
/// the manifest when a large request or response is stored again.
fn heal_manifest(
    tx: &Connection,
    staged: &mut Staged<'_>,
    digest: &Digest,
    bytes: &[u8],
    id: i64,
) -> StoreResult<()> {
    if bytes.len() <= INLINE_BLOB_MAX || staged.inserted.contains(digest) {
        return Ok(());
    }
    let found = row(tx, digest)?;
    if !matches!(found, Some((KIND_MANIFEST, ..)))
        || checked(tx, staged.files, digest, found, Check::Digest).is_ok()
    {
        return Ok(());
    }
    let relative = staged.write(digest, bytes)?;
    tx.prepare_cached("UPDATE blobs SET kind = ?1, size = ?2, data = ?3 WHERE id = ?4")
        .and_then(|mut s| s.execute(params![KIND_FILE, bytes.len() as i64, relative, id]))
        .ctx(|| format!("storing blob {digest} again"))?;
    Ok(())
}

/// Stores `bytes`, not stored yet, flat.
fn store_flat(tx: &Connection, staged: &mut Staged<'_>, digest: &Digest, bytes: &[u8]) -> StoreResult<i64> {
    if bytes.len() > INLINE_BLOB_MAX {
        let relative = staged.write(digest, bytes)?;
        return insert(tx, staged, digest, KIND_FILE, bytes.len(), Value::Text(relative));
    }
    if bytes.len() > ROW_MAX {
        let location = staged.pack(tx, bytes)?;
        return insert(tx, staged, digest, KIND_PACKED, bytes.len(), Value::Integer(location));
    }
    insert(tx, staged, digest, KIND_INLINE, bytes.len(), Value::Blob(bytes.to_vec()))
}

fn remember_prefix(tx: &Connection, run_pk: i64, prefix: &Digest, blob: i64) -> StoreResult<()> {
    tx.prepare_cached("INSERT OR IGNORE INTO prefixes (run_pk, prefix, blob_id) VALUES (?1, ?2, ?3)")
        .and_then(|mut s| s.execute(params![run_pk, prefix.as_bytes(), blob]))
        .ctx(|| "remembering a request prefix")?;
    Ok(())
}

fn find_base(tx: &Connection, run_pk: i64, prefix: &Digest) -> StoreResult<Option<Digest>> {
    let found: Option<Vec<u8>> = tx
        .prepare_cached(
            "SELECT b.digest FROM prefixes p JOIN blobs b ON b.id = p.blob_id WHERE p.run_pk = ?1 AND p.prefix = ?2",
        )
        .and_then(|mut s| s.query_row(params![run_pk, prefix.as_bytes()], |r| r.get(0)).optional())
        .ctx(|| "looking up a request prefix")?;
    found
        .map(|d| Digest::from_slice(&d).ok_or_else(|| StoreError::corrupt("a blob row holds a bad digest")))
        .transpose()
}

/// Stores one blob inside the open transaction `tx` (the digest is already checked); a large
/// blob's file is staged, durable once `staged` is finished. A model request becomes a
/// manifest building on the run's longest known message prefix; a model response, a manifest
/// of its skeleton and the message it hands back (which the next request then finds stored).
pub(crate) fn put(
    tx: &Connection,
    staged: &mut Staged<'_>,
    run_pk: Option<i64>,
    digest: &Digest,
    bytes: &[u8],
    hint: BlobHint,
) -> StoreResult<i64> {
    let request = hint == BlobHint::ModelRequest;
    if let Some(id) = stored_id(tx, staged, digest)? {
        heal(tx, staged, digest, bytes)?;
        heal_manifest(tx, staged, digest, bytes, id)?;
        if let (true, Some(run)) = (request, run_pk) {
            if let Some(prefix) = manifest::prefix_of(bytes) {
                remember_prefix(tx, run, &prefix, id)?;
            }
        }
        return Ok(id);
    }
    let plan = match hint {
        BlobHint::ModelRequest => {
            let mut base = |p: &Digest| run_pk.map_or(Ok(None), |run| find_base(tx, run, p));
            manifest::plan(bytes, &mut base)?
        }
        BlobHint::ModelResponse => manifest::plan_response(bytes),
        BlobHint::Raw => None,
    };
    if let Some(plan) = plan {
        put_flat(tx, staged, &plan.manifest.skeleton, &plan.skeleton)?;
        for (element, element_bytes) in &plan.new_elements {
            put_flat(tx, staged, element, element_bytes)?;
        }
        let id = insert(tx, staged, digest, KIND_MANIFEST, bytes.len(), Value::Blob(plan.manifest.encode()))?;
        if let (Some(run), Some(prefix)) = (run_pk, plan.prefix) {
            remember_prefix(tx, run, &prefix, id)?;
        }
        return Ok(id);
    }
    store_flat(tx, staged, digest, bytes)
}

/// A blob row: kind, size, data, and for packed blobs the bytes at its location when they
/// lie within one segment (fetched in the same query).
pub(crate) type Row = (i64, i64, Value, Option<Vec<u8>>);

/// A blob row's `data` (column `i`) as a [`Value`]: text that isn't UTF-8 (only a row edited by
/// hand holds it) comes back as bytes, which the blob's digest check then refuses, where
/// rusqlite's own conversion would panic.
fn data(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Value> {
    Ok(match r.get_ref(i)? {
        ValueRef::Text(text) => match std::str::from_utf8(text) {
            Ok(text) => Value::Text(text.to_owned()),
            Err(_) => Value::Blob(text.to_vec()),
        },
        other => other.into(),
    })
}

fn row(conn: &Connection, digest: &Digest) -> StoreResult<Option<Row>> {
    conn.prepare_cached(&format!("SELECT {ROW_COLUMNS} FROM blobs b WHERE b.id = {}", id_of("?1")))
        .and_then(|mut s| {
            s.query_row([digest.as_bytes()], |r| Ok((r.get(0)?, r.get(1)?, data(r, 2)?, r.get(3)?)))
                .optional()
        })
        .ctx(|| format!("reading blob {digest}"))
}

/// The rows of `digests`, in the order given (`None` for a digest not stored): one query of
/// the digest tables (the digests as one JSON array of hex strings, walked by `json_each` as
/// the outer loop), then, for the digests it lacks, one scan of the tail for all of them.
fn rows(conn: &Connection, digests: &[Digest]) -> StoreResult<Vec<Option<Row>>> {
    let mut found: Vec<Option<Row>> = (0..digests.len()).map(|_| None).collect();
    let what = || format!("reading {} blobs", digests.len());
    let mut stmt = conn
        .prepare_cached(&indexed_of_list(
            &format!("j.key, {ROW_COLUMNS}"),
            "CROSS JOIN blobs b ON b.id = x.id",
        ))
        .ctx(what)?;
    let mut rows = stmt.query([hex_list(digests)]).ctx(what)?;
    while let Some(r) = rows.next().ctx(what)? {
        let index: i64 = r.get(0).ctx(what)?;
        let row = (r.get(1).ctx(what)?, r.get(2).ctx(what)?, data(r, 3).ctx(what)?, r.get(4).ctx(what)?);
        if let Some(slot) = usize::try_from(index).ok().and_then(|i| found.get_mut(i)) {
            *slot = Some(row);
        }
    }
    let missing: Vec<Digest> =
        (0..digests.len()).filter(|&i| found[i].is_none()).map(|i| digests[i]).collect();
    if missing.is_empty() {
        return Ok(found);
    }
    let mut tail: DigestMap<Row> = DigestMap::default();
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT b.digest, {ROW_COLUMNS} FROM blobs b WHERE b.id > (SELECT merged_to FROM blob_mark) \
             AND b.digest IN (SELECT unhex(value) FROM json_each(?1))"
        ))
        .ctx(what)?;
    let mut rows = stmt.query([hex_list(&missing)]).ctx(what)?;
    while let Some(r) = rows.next().ctx(what)? {
        let digest: Vec<u8> = r.get(0).ctx(what)?;
        let digest = Digest::from_slice(&digest)
            .ok_or_else(|| StoreError::corrupt("a blob row holds a bad digest"))?;
        tail.insert(
            digest,
            (r.get(1).ctx(what)?, r.get(2).ctx(what)?, data(r, 3).ctx(what)?, r.get(4).ctx(what)?),
        );
    }
    for (slot, digest) in found.iter_mut().zip(digests) {
        if slot.is_none() {
            *slot = tail.get(digest).cloned();
        }
    }
    Ok(found)
}

/// A blob asked for: its digest, and where it is kept when the caller knows ([`BlobAt`]: its
/// row id).
pub(crate) trait Wanted {
    fn digest(&self) -> &Digest;
    fn at(&self) -> Option<BlobAt>;
}

impl Wanted for Digest {
    fn digest(&self) -> &Digest {
        self
    }
    fn at(&self) -> Option<BlobAt> {
        None
    }
}

impl Wanted for BlobRef {
    fn digest(&self) -> &Digest {
        &self.0
    }
    fn at(&self) -> Option<BlobAt> {
        self.1
    }
}

/// The rows of the `wanted` blobs that come with a row id, by id in one query, in the order
/// given: `None` for one without an id, or whose row there has another digest (the id is only
/// a hint, see [`BlobAt`]).
fn rows_at<B: Wanted>(conn: &Connection, wanted: &[B]) -> StoreResult<Vec<Option<Row>>> {
    let mut found: Vec<Option<Row>> = (0..wanted.len()).map(|_| None).collect();
    let hinted: Vec<usize> = (0..wanted.len()).filter(|&i| wanted[i].at().is_some()).collect();
    if hinted.is_empty() {
        return Ok(found);
    }
    let mut list = String::with_capacity(2 + hinted.len() * 10);
    list.push('[');
    for (n, &i) in hinted.iter().enumerate() {
        if n > 0 {
            list.push(',');
        }
        list.push_str(&wanted[i].at().map_or(0, BlobAt::get).to_string());
    }
    list.push(']');
    let what = || format!("reading {} blobs by row id", hinted.len());
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT j.key, b.digest, {ROW_COLUMNS} FROM json_each(?1) j CROSS JOIN blobs b ON b.id = j.value"
        ))
        .ctx(what)?;
    let mut rows = stmt.query([&list]).ctx(what)?;
    while let Some(r) = rows.next().ctx(what)? {
        let n: i64 = r.get(0).ctx(what)?;
        let Some(&i) = usize::try_from(n).ok().and_then(|n| hinted.get(n)) else { continue };
        let same = matches!(r.get_ref(1).ctx(what)?, ValueRef::Blob(d) if d == wanted[i].digest().as_bytes());
        if !same {
            continue;
        }
        found[i] =
            Some((r.get(2).ctx(what)?, r.get(3).ctx(what)?, data(r, 4).ctx(what)?, r.get(5).ctx(what)?));
    }
    Ok(found)
}

fn bad_row(digest: &Digest) -> StoreError {
    StoreError::corrupt(format!("blob {digest} is corrupt: its row has an unknown kind or data"))
}

/// The verified bytes of `digest`.
pub(crate) fn get(conn: &Connection, files: &Files, digest: &Digest) -> StoreResult<Vec<u8>> {
    if let Some(bytes) = files.recent(digest) {
        return Ok(bytes.to_vec());
    }
    verified(conn, files, digest, row(conn, digest)?)
}

/// The bytes of each `wanted` blob, in order: those with a row id read by id in one query,
/// the rest (and any whose id holds another blob) by digest in another; the first missing blob
/// fails the whole call. With [`Check::Digest`] every blob is verified (the first corrupt
/// one fails the call too); with [`Check::Caller`] those up to [`INLINE_BLOB_MAX`] that are not
/// manifests are not (the caller hashes them, see [`crate::BlobStore::get_blobs_unverified`]).
pub(crate) fn get_many<B: Wanted>(
    conn: &Connection,
    files: &Files,
    wanted: &[B],
    check: Check,
) -> StoreResult<Vec<Vec<u8>>> {
    let mut found = rows_at(conn, wanted)?;
    let rest: Vec<usize> = (0..wanted.len()).filter(|&i| found[i].is_none()).collect();
    if !rest.is_empty() {
        let digests: Vec<Digest> = rest.iter().map(|&i| *wanted[i].digest()).collect();
        for (i, row) in rest.into_iter().zip(rows(conn, &digests)?) {
            found[i] = row;
        }
    }
    wanted
        .iter()
        .zip(found)
        .map(|(blob, row)| match files.recent(blob.digest()) {
            Some(bytes) => Ok(bytes.to_vec()),
            None => checked(conn, files, blob.digest(), row, check),
        })
        .collect()
}

/// Who checks a blob's bytes against its digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// The store, before it returns them.
    Digest,
    /// The caller, for blobs kept in the database (up to [`INLINE_BLOB_MAX`]): the store still
    /// checks what it rebuilds (manifests), files and sizes.
    Caller,
}

/// The bytes `row` (the row of `digest`, if stored) stands for, verified against `digest`.
fn verified(conn: &Connection, files: &Files, digest: &Digest, row: Option<Row>) -> StoreResult<Vec<u8>> {
    checked(conn, files, digest, row, Check::Digest)
}

/// The bytes `row` (the row of `digest`, if stored) stands for, checked as `check` says.
fn checked(
    conn: &Connection,
    files: &Files,
    digest: &Digest,
    row: Option<Row>,
    check: Check,
) -> StoreResult<Vec<u8>> {
    let (kind, size, data, packed) = row.ok_or_else(|| StoreError::not_found(format!("no blob {digest}")))?;
    let size = usize::try_from(size).map_err(|_| bad_row(digest))?;
    let (bytes, from) = match (kind, data) {
        (KIND_INLINE, Value::Blob(bytes)) => (bytes, "its stored content".to_string()),
        (KIND_PACKED, Value::Integer(location)) => {
            let bytes = match packed {
                Some(bytes) if bytes.len() == size => bytes,
                _ => pack::read(conn, location, size, &digest.to_string())?,
            };
            (bytes, "its stored content".to_string())
        }
        (KIND_FILE, Value::Text(relative)) => {
            let (bytes, path) = files.read(digest, &relative)?;
            (bytes, format!("its file {}", path.display()))
        }
        (KIND_MANIFEST, Value::Blob(manifest)) => {
            let bytes = manifest::rebuild_with(&manifest, &mut Source { conn, files })
                .map_err(|e| e.context(format!("rebuilding blob {digest}")))?;
            (bytes, "the request its manifest rebuilds".to_string())
        }
        _ => return Err(bad_row(digest)),
    };
    if check == Check::Digest || kind == KIND_MANIFEST || kind == KIND_FILE {
        let actual = Digest::of(&bytes);
        if actual != *digest {
            return Err(corrupt(digest, &from, &actual));
        }
    }
    if bytes.len() != size {
        // Not the blob's bytes (they were not hashed above, unverified): said as verify says it.
        return Err(corrupt(digest, &from, &Digest::of(&bytes)));
    }
    if kind == KIND_MANIFEST {
        files.remember(*digest, Arc::from(bytes.as_slice()));
    }
    Ok(bytes)
}

/// The error for blob `digest` whose bytes (`from`: where they came from) hash to `actual`.
pub(crate) fn corrupt(digest: &Digest, from: &str, actual: &Digest) -> StoreError {
    StoreError::corrupt(format!("blob {digest} is corrupt: {from} hashes to {actual}"))
}

/// The columns of a [`Row`] of `blobs b`, for a query that joins the blobs it reads. A packed
/// blob's bytes come with it when they lie within one segment or continue into the next (the
/// first segment's tail and the next one's head, concatenated: `||` makes text of the bytes, the
/// cast makes them a blob again, unchanged); one spread over more is read by [`pack::read`].
pub(crate) const ROW_COLUMNS: &str = "b.kind, b.size, b.data, CASE WHEN b.kind = 3 THEN \
     (SELECT CASE WHEN length(s.data) - (b.data & 65535) >= b.size \
         THEN substr(s.data, (b.data & 65535) + 1, b.size) \
         ELSE CAST(substr(s.data, (b.data & 65535) + 1) || coalesce((SELECT substr(t.data, 1, \
             b.size - length(s.data) + (b.data & 65535)) FROM segments t WHERE t.id = s.id + 1), x'') AS BLOB) END \
      FROM segments s WHERE s.id = b.data >> 16) END";

/// The verified bytes of `digest` from its row (read by such a query), as [`get`] answers.
pub(crate) fn from_row(
    conn: &Connection,
    files: &Files,
    digest: &Digest,
    row: Option<Row>,
) -> StoreResult<Vec<u8>> {
    match files.recent(digest) {
        Some(bytes) => Ok(bytes.to_vec()),
        None => verified(conn, files, digest, row),
    }
}

/// Whether `digest` is stored.
pub(crate) fn has(conn: &Connection, digest: &Digest) -> StoreResult<bool> {
    Ok(blob_id(conn, digest)?.is_some())
}

/// The portable (JSON) manifest of `digest` if it is stored as one.
pub(crate) fn manifest_of(conn: &Connection, digest: &Digest) -> StoreResult<Option<Vec<u8>>> {
    match row(conn, digest)? {
        Some((KIND_MANIFEST, _, Value::Blob(bytes), _)) => {
            let manifest =
                Manifest::decode(&bytes).map_err(|e| e.context(format!("the manifest of blob {digest}")))?;
            Ok(Some(manifest.to_json()))
        }
        _ => Ok(None),
    }
}

/// What a stored manifest's rebuild reads: stored manifests and verified blobs.
struct Source<'a> {
    conn: &'a Connection,
    files: &'a Files,
}

impl ManifestSource for Source<'_> {
    fn manifest(&mut self, digest: &Digest) -> StoreResult<Option<Vec<u8>>> {
        match row(self.conn, digest)? {
            None => Err(StoreError::corrupt(format!("blob {digest}, named by a manifest, is missing"))),
            Some(_) if self.files.recent(digest).is_some() => Ok(None),
            Some((KIND_MANIFEST, _, Value::Blob(bytes), _)) => Ok(Some(bytes)),
            Some(_) => Ok(None),
        }
    }

    fn bytes(&mut self, digest: &Digest) -> StoreResult<Vec<u8>> {
        get(self.conn, self.files, digest).map_err(|e| match e.kind {
            crate::StoreErrorKind::NotFound => {
                StoreError::corrupt(format!("blob {digest}, named by a manifest, is missing"))
            }
            _ => e,
        })
    }
}
