//! Hash maps keyed by [`Digest`]s (and row ids), hashed in a few multiplies instead of SipHash.
//!
//! The store looks blobs up by digest at every commit and an import does so several times per
//! blob; with std's SipHash-1-3, hashing a 32-byte digest was a visible share of an import's
//! storing thread. [`FastHash`] folds each 8-byte word into the state with a 64×64→128-bit
//! multiply by secret keys (the folded multiply of foldhash and aHash), so a 32-byte digest
//! costs four multiplies.
//!
//! The keys are drawn per map from std's [`RandomState`], so a file crafted to put many digests
//! in one bucket (easy for the digest's low bits alone: a few thousand SHA-256 tries per
//! blob) can't aim at buckets it can't predict.
use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};

use crate::digest::Digest;

/// A map keyed by digest, with [`FastHash`].
pub type DigestMap<V> = HashMap<Digest, V, FastHash>;

/// A set of digests, with [`FastHash`].
pub type DigestSet = HashSet<Digest, FastHash>;

/// Builds [`FastHasher`]s with keys drawn from std's [`RandomState`] when the map is made.
#[derive(Clone, Debug)]
pub struct FastHash {
    keys: [u64; 2],
}

impl Default for FastHash {
    fn default() -> Self {
        let random = RandomState::new();
        // Odd keys: a multiply by an odd number loses no bit of the word.
        FastHash { keys: [random.hash_one(0x5eed_u64) | 1, random.hash_one(0xfeed_u64) | 1] }
    }
}

impl BuildHasher for FastHash {
    type Hasher = FastHasher;

    fn build_hasher(&self) -> FastHasher {
        FastHasher { state: self.keys[0], key: self.keys[1] }
    }
}

/// The hasher of [`FastHash`]: every word is folded into the state with the key.
#[derive(Clone, Debug)]
pub struct FastHasher {
    state: u64,
    key: u64,
}

/// The high and low halves of `a × b`, xored together.
fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

impl FastHasher {
    fn word(&mut self, word: u64) {
        self.state = fold(self.state ^ word, self.key);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.word(u64::from_le_bytes(word.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            // The length tells `[1]` from `[1, 0]`.
            self.word(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.word(n);
    }

    fn write_i64(&mut self, n: i64) {
        self.word(n as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.word(n as u64);
    }

    fn finish(&self) -> u64 {
        // One more fold, so the last word reaches the high bits the table's control bytes use.
        fold(self.state, self.key.rotate_left(32) | 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_keys_hash_equal_and_maps_work_as_maps() {
        let build = FastHash::default();
        let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
        assert_eq!(build.hash_one(a), build.hash_one(Digest::of(b"a")));
        assert_ne!(build.hash_one(a), build.hash_one(b));
        let mut map: DigestMap<u32> = DigestMap::default();
        for i in 0..10_000u32 {
            map.insert(Digest::of(&i.to_le_bytes()), i);
        }
        assert_eq!(map.len(), 10_000);
        assert!((0..10_000u32).all(|i| map[&Digest::of(&i.to_le_bytes())] == i));
        let set: DigestSet = [a, b, a].into_iter().collect();
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn digests_alike_in_their_first_bytes_still_spread_over_buckets() {
        // Digests equal in all but their last word, as a crafted file could make them.
        let build = FastHash::default();
        let buckets: HashSet<u64> = (0..4096u64)
            .map(|i| {
                let mut bytes = [7u8; 32];
                bytes[24..].copy_from_slice(&i.to_le_bytes());
                build.hash_one(Digest::from_bytes(bytes)) & 4095
            })
            .collect();
        assert!(buckets.len() > 2048, "only {} of 4096 buckets used", buckets.len());
    }

    #[test]
    fn each_map_draws_its_own_keys() {
        let d = Digest::of(b"x");
        let hashes: HashSet<u64> = (0..8).map(|_| FastHash::default().hash_one(d)).collect();
        assert!(hashes.len() > 1);
    }

    #[test]
    fn byte_strings_of_different_lengths_differ() {
        let build = FastHash::default();
        let hash = |bytes: &[u8]| {
            let mut h = build.build_hasher();
            h.write(bytes);
            h.finish()
        };
        assert_ne!(hash(&[1]), hash(&[1, 0]));
        assert_ne!(hash(&[]), hash(&[0]));
    }
}
