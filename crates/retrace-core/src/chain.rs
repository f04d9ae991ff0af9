//! The hash chain: `hash = digest(prev + canonical event without hash)`.
//!
//! `prev` enters as its text form (`sha256:<hex>`), or as nothing for the first event of a chain.
//! A fork's chain continues from its source's hash at the fork point.
use crate::digest::{Digest, DigestWriter};

/// The hash of an event whose canonical form without `hash` is `canonical`, chained after `prev`.
pub fn link(prev: Option<&Digest>, canonical: &[u8]) -> Digest {
    let mut w = DigestWriter::new();
    if let Some(prev) = prev {
        w.update(prev.to_string().as_bytes());
    }
    w.update(canonical);
    w.finish()
}
