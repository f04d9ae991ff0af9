//! Content digests: `sha256:<64 lowercase hex>`, the one hash Retrace uses for keys, blobs and the chain.
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

/// The prefix every digest carries in text form.
pub const DIGEST_PREFIX: &str = "sha256:";

/// A SHA-256 digest, written `sha256:<64 lowercase hex>`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl std::hash::Hash for Digest {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // The 32 bytes alone: every digest has that length, so no length prefix is needed.
        state.write(&self.0);
    }
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// Wraps raw digest bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Digest {
        Digest(bytes)
    }

    /// Wraps a 32-byte slice, or `None` when it has another length.
    pub fn from_slice(bytes: &[u8]) -> Option<Digest> {
        Some(Digest(bytes.try_into().ok()?))
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 hex digits without the `sha256:` prefix.
    pub fn hex(&self) -> String {
        self.text(&mut [0; 7 + 64])[DIGEST_PREFIX.len()..].to_owned()
    }

    /// A short form for terminals: `sha256:` and the first 12 hex digits.
    pub fn short(&self) -> String {
        format!("{DIGEST_PREFIX}{}", &self.hex()[..12])
    }
}

/// An incremental SHA-256 whose result is a [`Digest`].
#[derive(Default, Clone, Debug)]
pub struct DigestWriter(Sha256);

impl DigestWriter {
    /// A fresh hasher.
    pub fn new() -> Self {
        Self::default()
    }
    /// Feeds bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    /// The digest of everything fed.
    pub fn finish(self) -> Digest {
        Digest(self.0.finalize().into())
    }
}

/// A string that is not `sha256:` followed by 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a digest (want sha256:<64 lowercase hex>): {0:?}")]
pub struct BadDigest(pub String);

/// The value of each lower-case hex digit; 0xFF for every other byte.
const HEX_VALUE: [u8; 256] = {
    let mut table = [0xFF; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};

impl FromStr for Digest {
    type Err = BadDigest;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadDigest(s.chars().take(80).collect());
        let hex_part = s.strip_prefix(DIGEST_PREFIX).ok_or_else(bad)?.as_bytes();
        if hex_part.len() != 64 {
            return Err(bad());
        }
        // One pass with no branch per digit, lower-case hex only (every event line holds
        // several digests): a digit that isn't one sets a high bit, checked once at the end.
        let mut out = [0u8; 32];
        let mut invalid = 0u8;
        for (byte, pair) in out.iter_mut().zip(hex_part.chunks_exact(2)) {
            let (high, low) = (HEX_VALUE[usize::from(pair[0])], HEX_VALUE[usize::from(pair[1])]);
            invalid |= high | low;
            *byte = high << 4 | low;
        }
        match invalid & 0xF0 {
            0 => Ok(Digest(out)),
            _ => Err(bad()),
        }
    }
}

impl Digest {
    /// The text form, `sha256:<hex>`, written into `buf`.
    pub(crate) fn text<'b>(&self, buf: &'b mut [u8; 7 + 64]) -> &'b str {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        buf[..7].copy_from_slice(DIGEST_PREFIX.as_bytes());
        for (pair, byte) in buf[7..].chunks_exact_mut(2).zip(self.0) {
            pair[0] = HEX[usize::from(byte >> 4)];
            pair[1] = HEX[usize::from(byte & 15)];
        }
        std::str::from_utf8(&buf[..]).expect("a prefix and hex digits are ASCII")
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text(&mut [0; 7 + 64]))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The text form as a plain string (no formatting machinery): every event holds several.
        s.serialize_str(self.text(&mut [0; 7 + 64]))
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_text_form_round_trips() {
        let d = Digest::of(b"abc");
        assert_eq!(d.to_string(), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        assert!("sha256:BA78".parse::<Digest>().is_err());
        assert!("md5:00".parse::<Digest>().is_err());
        let hex = d.hex();
        assert!(format!("sha256:{}", hex.to_uppercase()).parse::<Digest>().is_err());
        assert!(format!("sha256:{}g", &hex[..63]).parse::<Digest>().is_err());
        assert!(format!("sha256:{hex}0").parse::<Digest>().is_err());
        assert!(format!("sha256:é{}", &hex[2..]).parse::<Digest>().is_err());
    }

    #[test]
    fn every_byte_but_a_lower_case_hex_digit_is_refused_in_every_place() {
        let hex = Digest::of(b"abc").hex().into_bytes();
        for place in [0, 1, 30, 62, 63] {
            for byte in 0..=127u8 {
                let mut text = hex.clone();
                text[place] = byte;
                let text = format!("sha256:{}", String::from_utf8(text).unwrap());
                let parsed = text.parse::<Digest>();
                match byte {
                    b'0'..=b'9' | b'a'..=b'f' => assert_eq!(parsed.unwrap().hex(), text[7..], "{text}"),
                    _ => assert!(parsed.is_err(), "{byte:#x} at {place} was accepted"),
                }
            }
        }
    }
}
