//! The two encodings of a [`Manifest`]: compact binary (stored) and canonical JSON (portable).
use retrace_core::Digest;
use serde::Deserialize;

use crate::{StoreError, StoreResult};

/// The magic and version that open a stored manifest.
pub const MAGIC: &[u8; 4] = b"RTM\x01";

/// The `format` of the portable (JSON) encoding.
pub const JSON_FORMAT: &str = "retrace-manifest/1";

/// One request stored as base + new elements + skeleton.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The request with its elements removed.
    pub skeleton: Digest,
    /// Where the elements go back into the skeleton.
    pub offset: u64,
    /// How many leading elements come from `base`.
    pub base_count: u64,
    /// The earlier request whose elements this one extends (`None` iff `base_count == 0`).
    pub base: Option<Digest>,
    /// Digests of the elements after the base's, in order.
    pub elements: Vec<Digest>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Portable {
    base: Option<Digest>,
    base_count: u64,
    elements: Vec<Digest>,
    format: String,
    offset: u64,
    skeleton: Digest,
}

impl Manifest {
    /// How many elements the rebuilt request's array holds.
    pub fn total(&self) -> u64 {
        self.base_count.saturating_add(self.elements.len() as u64)
    }

    /// The compact stored encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 32 + 12 + 32 + 32 * self.elements.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(self.skeleton.as_bytes());
        put_varint(&mut out, self.offset);
        put_varint(&mut out, self.base_count);
        if let Some(base) = &self.base {
            out.extend_from_slice(base.as_bytes());
        }
        put_varint(&mut out, self.elements.len() as u64);
        for d in &self.elements {
            out.extend_from_slice(d.as_bytes());
        }
        out
    }

    /// The portable encoding: canonical JSON.
    pub fn to_json(&self) -> Vec<u8> {
        let base = self.base.map_or_else(|| "null".to_string(), |d| format!("\"{d}\""));
        let elements: Vec<String> = self.elements.iter().map(|d| format!("\"{d}\"")).collect();
        format!(
            "{{\"base\":{base},\"base_count\":{},\"elements\":[{}],\"format\":\"{JSON_FORMAT}\",\"offset\":{},\"skeleton\":\"{}\"}}",
            self.base_count,
            elements.join(","),
            self.offset,
            self.skeleton
        )
        .into_bytes()
    }

    /// Decodes either encoding; `Corrupt` for anything else.
    pub fn decode(bytes: &[u8]) -> StoreResult<Manifest> {
        let manifest = if bytes.starts_with(MAGIC) { decode_binary(bytes)? } else { decode_json(bytes)? };
        if manifest.base.is_some() != (manifest.base_count > 0) || manifest.total() == 0 {
            return Err(StoreError::corrupt(
                "a manifest's base and base_count disagree, or it holds no element",
            ));
        }
        Ok(manifest)
    }
}

fn decode_json(bytes: &[u8]) -> StoreResult<Manifest> {
    let p: Portable = serde_json::from_slice(bytes)
        .map_err(|e| StoreError::corrupt(format!("not a manifest: {e}")).with_source(e))?;
    if p.format != JSON_FORMAT {
        return Err(StoreError::corrupt(format!(
            "unknown manifest format {:?} (want {JSON_FORMAT})",
            p.format
        )));
    }
    Ok(Manifest {
        skeleton: p.skeleton,
        offset: p.offset,
        base_count: p.base_count,
        base: p.base,
        elements: p.elements,
    })
}

fn decode_binary(bytes: &[u8]) -> StoreResult<Manifest> {
    let mut r = Reader { bytes, at: MAGIC.len() };
    let skeleton = r.digest()?;
    let offset = r.varint()?;
    let base_count = r.varint()?;
    let base = if base_count > 0 { Some(r.digest()?) } else { None };
    let count = r.varint()?;
    if count > (bytes.len() / 32) as u64 {
        return Err(truncated());
    }
    let elements = (0..count).map(|_| r.digest()).collect::<StoreResult<Vec<_>>>()?;
    if r.at != bytes.len() {
        return Err(StoreError::corrupt("a stored manifest has trailing bytes"));
    }
    Ok(Manifest { skeleton, offset, base_count, base, elements })
}

fn truncated() -> StoreError {
    StoreError::corrupt("a stored manifest is truncated")
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn digest(&mut self) -> StoreResult<Digest> {
        let slice = self.bytes.get(self.at..self.at + 32).ok_or_else(truncated)?;
        self.at += 32;
        Digest::from_slice(slice).ok_or_else(truncated)
    }

    fn varint(&mut self) -> StoreResult<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.bytes.get(self.at).ok_or_else(truncated)?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(StoreError::corrupt("a stored manifest holds an overlong number"))
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_encodings_round_trip() {
        let d = |s: &[u8]| Digest::of(s);
        let chained = Manifest {
            skeleton: d(b"s"),
            offset: 300,
            base_count: 7,
            base: Some(d(b"b")),
            elements: vec![d(b"x"), d(b"y")],
        };
        let first =
            Manifest { skeleton: d(b"s"), offset: 25, base_count: 0, base: None, elements: vec![d(b"x")] };
        for m in [chained, first] {
            assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
            let json = m.to_json();
            assert_eq!(
                retrace_core::canonical::canonicalize(&json).unwrap(),
                json,
                "portable form is canonical"
            );
            assert_eq!(Manifest::decode(&json).unwrap(), m);
            let encoded = m.encode();
            for cut in 0..encoded.len() {
                assert!(Manifest::decode(&encoded[..cut]).is_err());
            }
        }
        assert!(Manifest::decode(b"{\"format\":\"x\"}").is_err());
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics(tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&tail);
            if let Ok(m) = Manifest::decode(&bytes) {
                proptest::prop_assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
            }
            let _ = Manifest::decode(&tail);
            let _ = crate::manifest::rebuild(&bytes, &|_: &Digest| Some(&b"{\"messages\":[1]}"[..]));
        }
    }
}
