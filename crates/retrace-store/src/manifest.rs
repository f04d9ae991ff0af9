//! Chained manifests: how a model request is stored so that each turn of a conversation costs
//! only its new messages (DESIGN.md "Storage").
//!
//! A request whose top level holds a non-empty array under `messages` or `input` is cut into
//! its elements (the exact bytes between the array's delimiters, each stored as its own blob)
//! and a *skeleton* (the request with the elements removed, also a blob) plus the `offset`
//! where the elements go back. The rebuilt request is
//! `skeleton[..offset] + e1 + "," + e2 + ... + en + skeleton[offset..]`; whitespace after the
//! last element stays in the skeleton, so an element's bytes don't change when more follow it.
//!
//! Chaining: with `P_0` = 32 zero bytes and `P_i = sha256(P_{i-1} || digest(e_i))`, the store
//! remembers per run the `P_n` of each request it stored. A new request of the run builds on
//! the stored request with the longest known prefix `P_k` (`k ≤ n`): its manifest names that
//! `base` request, `base_count = k`, and only the digests of elements `k+1..n`.
//!
//! Two encodings of one manifest:
//! - **stored** (compact binary): `RTM\x01`, skeleton digest (32 bytes), LEB128 `offset`,
//!   LEB128 `base_count`, the base digest (32 bytes, only when `base_count > 0`), LEB128 count
//!   of new elements, their digests (32 bytes each);
//! - **portable** (canonical JSON, what [`crate::BlobStore::manifest_of`] returns, for exports):
//!   `{"base":…|null,"base_count":k,"elements":[…],"format":"retrace-manifest/1","offset":n,"skeleton":…}`.
//!
//! [`references`] and [`rebuild`] accept both. Rebuilding is iterative, so chains of thousands
//! of turns need no stack.
mod codec;
mod scan;

use std::collections::HashSet;

use retrace_core::digest::DigestWriter;
use retrace_core::Digest;

pub use codec::Manifest;
pub(crate) use scan::split_request;

use crate::{StoreError, StoreResult};

/// Where [`rebuild_with`] fetches what a manifest names.
pub trait ManifestSource {
    /// The manifest (either encoding) if `digest` is stored as one, else `None`.
    fn manifest(&mut self, digest: &Digest) -> StoreResult<Option<Vec<u8>>>;
    /// The bytes of `digest`, verified; `NotFound` when absent.
    fn bytes(&mut self, digest: &Digest) -> StoreResult<Vec<u8>>;
}

/// The digests a manifest names, each once: its base (if any), its skeleton, then its new
/// elements in order. Everything else it needs is named, in turn, by its base.
pub fn references(manifest: &[u8]) -> StoreResult<Vec<Digest>> {
    let m = Manifest::decode(manifest)?;
    let mut seen = HashSet::new();
    let all = m.base.iter().chain([&m.skeleton]).chain(&m.elements);
    Ok(all.filter(|d| seen.insert(**d)).copied().collect())
}

/// Rebuilds the request a manifest stands for, given the full bytes of every blob it names
/// (`lookup`; the base request as its rebuilt bytes). The caller checks the digest.
pub fn rebuild<'s>(manifest: &[u8], lookup: &dyn Fn(&Digest) -> Option<&'s [u8]>) -> StoreResult<Vec<u8>> {
    struct Lookup<'a, 's>(&'a dyn Fn(&Digest) -> Option<&'s [u8]>);
    impl ManifestSource for Lookup<'_, '_> {
        fn manifest(&mut self, _: &Digest) -> StoreResult<Option<Vec<u8>>> {
            Ok(None)
        }
        fn bytes(&mut self, digest: &Digest) -> StoreResult<Vec<u8>> {
            (self.0)(digest)
                .map(<[u8]>::to_vec)
                .ok_or_else(|| StoreError::not_found(format!("blob {digest} named by a manifest is missing")))
        }
    }
    rebuild_with(manifest, &mut Lookup(lookup))
}

/// Rebuilds the request a manifest stands for, walking its chain of bases iteratively. Bases
/// stored as manifests are followed; a base stored flat is cut into its elements. The caller
/// checks the digest of the result.
pub fn rebuild_with(manifest: &[u8], source: &mut dyn ManifestSource) -> StoreResult<Vec<u8>> {
    let mut out = Vec::new();
    rebuild_into(manifest, source, &mut |piece| out.extend_from_slice(piece))?;
    Ok(out)
}

/// The digest and length of the request a manifest stands for, hashed piece by piece as
/// [`rebuild_with`] would put it together, so the request is never held whole: a conversation's
/// requests together hold every earlier turn again at each turn, while their manifests hold
/// each message once.
pub fn digest_with(manifest: &[u8], source: &mut dyn ManifestSource) -> StoreResult<(Digest, u64)> {
    let (mut hasher, mut len) = (DigestWriter::new(), 0u64);
    rebuild_into(manifest, source, &mut |piece| {
        hasher.update(piece);
        len += piece.len() as u64;
    })?;
    Ok((hasher.finish(), len))
}

/// Hands the request a manifest stands for to `out`, piece by piece, in order.
fn rebuild_into(
    manifest: &[u8],
    source: &mut dyn ManifestSource,
    out: &mut dyn FnMut(&[u8]),
) -> StoreResult<()> {
    let top = Manifest::decode(manifest)?;
    // New elements per level, top first; the root level may come as a flat request's bytes.
    let mut levels: Vec<Vec<Digest>> = vec![top.elements.clone()];
    let mut flat_root: Option<(Vec<u8>, scan::Split)> = None;
    let (mut need, mut base) = (top.base_count, top.base);
    let mut seen = HashSet::new();
    while need > 0 {
        let digest =
            base.ok_or_else(|| StoreError::corrupt("a manifest builds on elements but names no base"))?;
        if !seen.insert(digest) {
            return Err(StoreError::corrupt(format!("the manifest chain loops through blob {digest}")));
        }
        let count_error = |held: usize| {
            StoreError::corrupt(format!(
                "blob {digest} holds {held} messages, but a manifest builds on its first {need}"
            ))
        };
        match source.manifest(&digest)? {
            Some(bytes) => {
                let m = Manifest::decode(&bytes)
                    .map_err(|e| e.context(format!("the manifest of blob {digest}")))?;
                if m.total() != need {
                    return Err(count_error(m.total() as usize));
                }
                (need, base) = (m.base_count, m.base);
                levels.push(m.elements);
            }
            None => {
                let bytes = source.bytes(&digest)?;
                let split = split_request(&bytes).ok_or_else(|| count_error(0))?;
                if split.elements.len() as u64 != need {
                    return Err(count_error(split.elements.len()));
                }
                flat_root = Some((bytes, split));
                need = 0;
            }
        }
    }
    let skeleton = source.bytes(&top.skeleton)?;
    let offset = usize::try_from(top.offset).ok().filter(|o| *o <= skeleton.len()).ok_or_else(|| {
        StoreError::corrupt(format!(
            "skeleton {} is shorter than its manifest's offset {}",
            top.skeleton, top.offset
        ))
    })?;
    out(&skeleton[..offset]);
    let mut first = true;
    let mut push = |element: &[u8]| {
        if !std::mem::take(&mut first) {
            out(b",");
        }
        out(element);
    };
    if let Some((bytes, split)) = &flat_root {
        for range in &split.elements {
            push(&bytes[range.clone()]);
        }
    }
    for digest in levels.iter().rev().flatten() {
        push(&source.bytes(digest)?);
    }
    out(&skeleton[offset..]);
    Ok(())
}

/// `P_1..P_n` for elements with these digests.
pub fn prefix_digests(elements: &[Digest]) -> Vec<Digest> {
    let mut prev = Digest::from_bytes([0; 32]);
    elements
        .iter()
        .map(|d| {
            let mut w = DigestWriter::new();
            w.update(prev.as_bytes());
            w.update(d.as_bytes());
            prev = w.finish();
            prev
        })
        .collect()
}

/// How the store should keep one model request.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The manifest to store (compact encoding via [`Manifest::encode`]).
    pub(crate) manifest: Manifest,
    /// The skeleton's bytes.
    pub(crate) skeleton: Vec<u8>,
    /// The new elements (digest, bytes) the manifest names, to store if absent.
    pub(crate) new_elements: Vec<(Digest, Vec<u8>)>,
    /// `P_n` of this request, for later requests of the run to build on (`None` for a
    /// response: requests build on requests).
    pub(crate) prefix: Option<Digest>,
}

/// The elements' digests and `P_n` of a request, or `None` when it is stored flat.
pub(crate) fn prefix_of(bytes: &[u8]) -> Option<Digest> {
    let split = split_request(bytes)?;
    let digests: Vec<Digest> = split.elements.iter().map(|r| Digest::of(&bytes[r.clone()])).collect();
    prefix_digests(&digests).last().copied()
}

/// Plans a manifest for `bytes`, building on the request `find_base(P_k)` returns for the
/// largest `k` it knows; `None` when the request is stored flat.
pub(crate) fn plan(
    bytes: &[u8],
    find_base: &mut dyn FnMut(&Digest) -> StoreResult<Option<Digest>>,
) -> StoreResult<Option<Plan>> {
    let Some(split) = split_request(bytes) else {
        return Ok(None);
    };
    let digests: Vec<Digest> = split.elements.iter().map(|r| Digest::of(&bytes[r.clone()])).collect();
    let prefixes = prefix_digests(&digests);
    let mut base = None;
    for k in (1..=prefixes.len()).rev() {
        if let Some(request) = find_base(&prefixes[k - 1])? {
            base = Some((request, k));
            break;
        }
    }
    let k = base.map_or(0, |(_, k)| k);
    let new_elements =
        (k..digests.len()).map(|i| (digests[i], bytes[split.elements[i].clone()].to_vec())).collect();
    let skeleton = split.skeleton(bytes);
    let manifest = Manifest {
        skeleton: Digest::of(&skeleton),
        offset: split.offset as u64,
        base_count: k as u64,
        base: base.map(|(d, _)| d),
        elements: digests[k..].to_vec(),
    };
    Ok(Some(Plan { manifest, skeleton, new_elements, prefix: prefixes.last().copied() }))
}

/// Plans a manifest for a model response ([`scan::split_response`]): its skeleton and the
/// message (or output items) it hands back, on no base. `None` when it is stored flat.
pub(crate) fn plan_response(bytes: &[u8]) -> Option<Plan> {
    let split = scan::split_response(bytes)?;
    let new_elements: Vec<(Digest, Vec<u8>)> =
        split.elements.iter().map(|r| (Digest::of(&bytes[r.clone()]), bytes[r.clone()].to_vec())).collect();
    let skeleton = split.skeleton(bytes);
    let manifest = Manifest {
        skeleton: Digest::of(&skeleton),
        offset: split.offset as u64,
        base_count: 0,
        base: None,
        elements: new_elements.iter().map(|(d, _)| *d).collect(),
    };
    Some(Plan { manifest, skeleton, new_elements, prefix: None })
}
