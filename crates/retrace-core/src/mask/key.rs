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
        MaskKey { bytes, keyed }
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
        let mac = self.mac(&[kind.as_bytes(), &[0], secret.as_bytes()]);
        let mut tail = [0u8; 32];
        let len = data_encoding::BASE32_NOPAD.encode_len(17);
        data_encoding::BASE32_NOPAD.encode_mut(&mac[..17], &mut tail[..len]);
        let mut token = String::with_capacity(TOKEN_PREFIX.len() + kind.len() + 1 + TOKEN_TAIL_LEN);
        token.push_str(TOKEN_PREFIX);
        token.push_str(kind);
        token.push('_');
        token.extend(tail[..TOKEN_TAIL_LEN].iter().map(|b| char::from(b.to_ascii_lowercase())));
        token
    }
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
}
