//! The mask key: the HMAC key tokens are made with, its text form and its public fingerprint.
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::token::{TOKEN_PREFIX, TOKEN_TAIL_LEN};

/// The HMAC key tokens are made with (32 bytes).
#[derive(Clone)]
pub struct MaskKey {
    bytes: [u8; 32],
    /// The HMAC state after the key, cloned for each token so the key schedule runs once.
    keyed: Hmac<Sha256>,
    /// SHA-256 states after the HMAC's inner and outer key blocks, for [`MaskKey::token`]'s
    /// short messages.
    inner: [u32; 8],
    outer: [u32; 8],
}

impl std::fmt::Debug for MaskKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MaskKey({})", self.fingerprint())
    }
}

/// A mask key that is not 32 bytes of base64.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the mask key must be 32 bytes, base64-encoded: {0}")]
pub struct BadMaskKey(String);

impl MaskKey {
    /// A key from its 32 raw bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> MaskKey {
        let keyed = Hmac::<Sha256>::new_from_slice(&bytes).expect("hmac takes any key length");
        let keyed_state = |pad: u8| {
            let mut block = [pad; 64];
            block.iter_mut().zip(bytes).for_each(|(b, k)| *b ^= k);
            let mut state = SHA256_IV;
            sha2::compress256(&mut state, &[block.into()]);
            state
        };
        MaskKey { bytes, keyed, inner: keyed_state(0x36), outer: keyed_state(0x5c) }
    }

    /// A key from its base64 text (the form of `RETRACE_MASK_KEY` and `mask.key`).
    pub fn from_base64(text: &str) -> Result<MaskKey, BadMaskKey> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| BadMaskKey(e.to_string()))?;
        let arr: [u8; 32] =
            bytes.try_into().map_err(|b: Vec<u8>| BadMaskKey(format!("got {} bytes", b.len())))?;
        Ok(MaskKey::from_bytes(arr))
    }

    /// The base64 text form.
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.bytes)
    }

    /// A public fingerprint that names the key without revealing it: `mk_<16 hex>`.
    pub fn fingerprint(&self) -> String {
        let mac = self.mac(&[b"retrace/mask-key-fingerprint"]);
        format!("mk_{}", &hex::encode(mac)[..16])
    }

    fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = self.keyed.clone();
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }

    /// The token for `secret` of `kind` (`[a-z0-9]+`).
    pub fn token(&self, kind: &str, secret: &str) -> String {
        let mac = self
            .short_mac(kind.as_bytes(), secret.as_bytes())
            .unwrap_or_else(|| self.mac(&[kind.as_bytes(), &[0], secret.as_bytes()]));
        let mut token = String::with_capacity(TOKEN_PREFIX.len() + kind.len() + 1 + TOKEN_TAIL_LEN);
        token.push_str(TOKEN_PREFIX);
        token.push_str(kind);
        token.push('_');
        token.push_str(std::str::from_utf8(&base32_tail(&mac)).expect("the base32 alphabet is ASCII"));
        token
    }
}

/// SHA-256's initial state (FIPS 180-4, 5.3.3).
const SHA256_IV: [u32; 8] =
    [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

impl MaskKey {
    /// HMAC-SHA256 of `kind`, a zero byte and `secret`, when that message fits one block with
    /// its padding (most secrets): two compressions from the precomputed key states, without
    /// the general HMAC's buffering. `None` for longer messages.
    fn short_mac(&self, kind: &[u8], secret: &[u8]) -> Option<[u8; 32]> {
        let len = kind.len() + 1 + secret.len();
        if len > 55 {
            return None;
        }
        let mut block = [0u8; 64];
        block[..kind.len()].copy_from_slice(kind);
        block[kind.len() + 1..len].copy_from_slice(secret);
        block[len] = 0x80;
        block[56..].copy_from_slice(&(((64 + len) * 8) as u64).to_be_bytes());
        let mut inner = self.inner;
        sha2::compress256(&mut inner, &[block.into()]);
        let mut block = [0u8; 64];
        for (chunk, word) in block[..32].chunks_exact_mut(4).zip(inner) {
            chunk.copy_from_slice(&word.to_be_bytes());
        }
        block[32] = 0x80;
        block[56..].copy_from_slice(&((64 + 32) * 8u64).to_be_bytes());
        let mut outer = self.outer;
        sha2::compress256(&mut outer, &[block.into()]);
        let mut mac = [0u8; 32];
        for (chunk, word) in mac.chunks_exact_mut(4).zip(outer) {
            chunk.copy_from_slice(&word.to_be_bytes());
        }
        Some(mac)
    }
}

/// The token's tail: the first 130 bits of `mac` in lower-case RFC 4648 base32 (what
/// `BASE32_NOPAD` of its first 17 bytes starts with, lower-cased), written directly.
fn base32_tail(mac: &[u8; 32]) -> [u8; TOKEN_TAIL_LEN] {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let high = u128::from_be_bytes(mac[..16].try_into().expect("16 bytes"));
    let mut tail = [0u8; TOKEN_TAIL_LEN];
    for (i, out) in tail.iter_mut().enumerate().take(25) {
        *out = ALPHABET[((high >> (123 - 5 * i)) & 31) as usize];
    }
    tail[25] = ALPHABET[(((high & 7) << 2) as usize) | usize::from(mac[16] >> 6)];
    tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_text_form_round_trips() {
        let k = MaskKey::from_bytes([7; 32]);
        assert_eq!(MaskKey::from_base64(&k.to_base64()).unwrap().fingerprint(), k.fingerprint());
        assert!(MaskKey::from_base64("c2hvcnQ=").is_err());
    }

    #[test]
    fn tokens_are_the_hmac_of_kind_and_secret() {
        // Pinned: a token must never change for a given key, kind and secret, or recorded keys
        // stop matching.
        let k = MaskKey::from_bytes([7; 32]);
        let mut mac = Hmac::<Sha256>::new_from_slice(&[7; 32]).unwrap();
        mac.update(b"email\0a@b.c");
        let bytes: [u8; 32] = mac.finalize().into_bytes().into();
        let tail = data_encoding::BASE32_NOPAD.encode(&bytes[..17]).to_ascii_lowercase();
        assert_eq!(k.token("email", "a@b.c"), format!("rtk_email_{}", &tail[..26]));
    }

    #[test]
    fn the_one_block_mac_is_the_hmac() {
        let k = MaskKey::from_bytes(std::array::from_fn(|i| i as u8 * 7));
        for len in 0..=60 {
            let secret: String = (0..len).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
            let want = k.mac(&[b"apikey", &[0], secret.as_bytes()]);
            match k.short_mac(b"apikey", secret.as_bytes()) {
                Some(mac) => assert_eq!(mac, want, "secret of {len} bytes"),
                None => assert!(6 + 1 + len > 55, "{len} bytes fit one block"),
            }
        }
    }

    #[test]
    fn the_tail_is_the_base32_of_the_mac() {
        for seed in 0..64u8 {
            let mac: [u8; 32] =
                std::array::from_fn(|i| (i as u8).wrapping_mul(37).wrapping_add(seed.wrapping_mul(101)));
            let want = data_encoding::BASE32_NOPAD.encode(&mac[..17]).to_ascii_lowercase();
            assert_eq!(std::str::from_utf8(&base32_tail(&mac)).unwrap(), &want[..26]);
        }
    }
}
