//! Blobs in SQLite: tiny ones in their row, the rest up to [`INLINE_BLOB_MAX`] packed into
//! segments ([`super::pack`]), larger ones as durable files ([`super::files`]), and model
//! requests as chained manifests ([`crate::manifest`]). Every read verifies the digest.
use std::sync::Arc;

use retrace_core::Digest;
use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension};

use super::files::Files;
use super::pack;
use super::schema::{KIND_FILE, KIND_INLINE, KIND_MANIFEST, KIND_PACKED};
use super::staged::Staged;
use crate::error::ResultExt;
use crate::manifest::{self, Manifest, ManifestSource};
use crate::{BlobHint, StoreError, StoreResult, INLINE_BLOB_MAX};

/// Blobs up to this size stay in their row; larger ones up to [`INLINE_BLOB_MAX`] are packed.
const ROW_MAX: usize = 64;

fn blob_id(conn: &Connection, digest: &Digest) -> StoreResult<Option<i64>> {
    conn.prepare_cached("SELECT id FROM blobs WHERE digest = ?1")
        .and_then(|mut s| s.query_row([digest.as_bytes()], |r| r.get(0)).optional())
        .ctx(|| format!("looking up blob {digest}"))
}

fn insert(conn: &Connection, digest: &Digest, kind: i64, size: usize, data: Value) -> StoreResult<i64> {
    let now = crate::writer::lease::now_ms() as i64;
    conn.prepare_cached("INSERT INTO blobs (digest, kind, size, data, stored_at) VALUES (?1, ?2, ?3, ?4, ?5)")
        .and_then(|mut s| s.insert(params![digest.as_bytes(), kind, size as i64, data, now]))
        .ctx(|| format!("storing blob {digest}"))
}

/// Stores `bytes` flat (in the row, packed or as a file) unless present; returns the row id.
fn put_flat(tx: &Connection, staged: &mut Staged<'_>, digest: &Digest, bytes: &[u8]) -> StoreResult<i64> {
    if let Some(id) = blob_id(tx, digest)? {
        return Ok(id);
    }
    if bytes.len() > INLINE_BLOB_MAX {
        let relative = staged.write(digest, bytes)?;
        return insert(tx, digest, KIND_FILE, bytes.len(), Value::Text(relative));
    }
    if bytes.len() > ROW_MAX {
        let location = pack::append(tx, &mut staged.pack, staged.files.segment_bytes, bytes)?;
        return insert(tx, digest, KIND_PACKED, bytes.len(), Value::Integer(location));
    }
    insert(tx, digest, KIND_INLINE, bytes.len(), Value::Blob(bytes.to_vec()))
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
/// manifest building on the run's longest known message prefix.
pub(crate) fn put(
    tx: &Connection,
    staged: &mut Staged<'_>,
    run_pk: Option<i64>,
    digest: &Digest,
    bytes: &[u8],
    hint: BlobHint,
) -> StoreResult<i64> {
    let request = hint == BlobHint::ModelRequest;
    if let Some(id) = blob_id(tx, digest)? {
        if let (true, Some(run)) = (request, run_pk) {
            if let Some(prefix) = manifest::prefix_of(bytes) {
                remember_prefix(tx, run, &prefix, id)?;
            }
        }
        return Ok(id);
    }
    if request {
        let mut base = |p: &Digest| run_pk.map_or(Ok(None), |run| find_base(tx, run, p));
        if let Some(plan) = manifest::plan(bytes, &mut base)? {
            put_flat(tx, staged, &plan.manifest.skeleton, &plan.skeleton)?;
            for (element, element_bytes) in &plan.new_elements {
                put_flat(tx, staged, element, element_bytes)?;
            }
            let id = insert(tx, digest, KIND_MANIFEST, bytes.len(), Value::Blob(plan.manifest.encode()))?;
            if let Some(run) = run_pk {
                remember_prefix(tx, run, &plan.prefix, id)?;
            }
            return Ok(id);
        }
    }
    put_flat(tx, staged, digest, bytes)
}

/// A blob row: kind, size, data, and for packed blobs the bytes at its location when they
/// lie within one segment (fetched in the same query).
type Row = (i64, i64, Value, Option<Vec<u8>>);

fn row(conn: &Connection, digest: &Digest) -> StoreResult<Option<Row>> {
    conn.prepare_cached(
        "SELECT b.kind, b.size, b.data, CASE WHEN b.kind = 3 THEN \
         (SELECT substr(s.data, (b.data & 65535) + 1, b.size) FROM segments s WHERE s.id = b.data >> 16) END \
         FROM blobs b WHERE b.digest = ?1",
    )
    .and_then(|mut s| {
        s.query_row([digest.as_bytes()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).optional()
    })
    .ctx(|| format!("reading blob {digest}"))
}

fn bad_row(digest: &Digest) -> StoreError {
    StoreError::corrupt(format!("blob {digest} is corrupt: its row has an unknown kind or data"))
}

/// The verified bytes of `digest`.
pub(crate) fn get(conn: &Connection, files: &Files, digest: &Digest) -> StoreResult<Vec<u8>> {
    if let Some(bytes) = files.recent(digest) {
        return Ok(bytes.to_vec());
    }
    let (kind, size, data, packed) =
        row(conn, digest)?.ok_or_else(|| StoreError::not_found(format!("no blob {digest}")))?;
    let size = usize::try_from(size).map_err(|_| bad_row(digest))?;
    let (bytes, from) = match (kind, data) {
        (KIND_INLINE, Value::Blob(bytes)) => (bytes, "its stored bytes".to_string()),
        (KIND_PACKED, Value::Integer(location)) => {
            let bytes = match packed {
                Some(bytes) if bytes.len() == size => bytes,
                _ => pack::read(conn, location, size, &digest.to_string())?,
            };
            (bytes, "its stored bytes".to_string())
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
    let actual = Digest::of(&bytes);
    if actual != *digest {
        return Err(StoreError::corrupt(format!("blob {digest} is corrupt: {from} hashes to {actual}")));
    }
    if bytes.len() != size {
        return Err(bad_row(digest));
    }
    if kind == KIND_MANIFEST {
        files.remember(*digest, Arc::from(bytes.as_slice()));
    }
    Ok(bytes)
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
