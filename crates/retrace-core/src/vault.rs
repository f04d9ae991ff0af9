//! The token vault's cryptography: how the original of a masked value is sealed under the vault
//! key (`RETRACE_VAULT_KEY`, SPEC §3) and opened again. Pure: storing sealed originals, and
//! auditing who opens them, is the store's (`retrace_store::vault`).
//!
//! - [`VaultKey`]: 32 bytes, base64 in `RETRACE_VAULT_KEY`; separate from the mask key. Its
//!   `Debug` shows only a fingerprint (`vk_<16 hex>`), never the key.
//! - [`seal`]: XChaCha20-Poly1305 with a random 24-byte nonce (from the operating system's random
//!   source, the one thing here that is not a pure function; [`seal_with_nonce`] takes the nonce
//!   instead) and the token as associated data, so a sealed original only opens under the
//!   token it was sealed for: swapping two vault rows fails like tampering does.
//! - [`open`]: the original again, or [`VaultError::CannotOpen`] when the key is not the one it
//!   was sealed with or the bytes were altered (AEAD can't tell those apart, and says so).
//!
//! ```
//! use retrace_core::vault::{open, seal, VaultKey};
//!
//! let key = VaultKey::from_bytes([7; 32]);
//! let sealed = seal(&key, "rtk_email_aaaaaaaaaaaaaaaaaaaaaaaaaa", b"ada@example.com");
//! assert_eq!(open(&key, "rtk_email_aaaaaaaaaaaaaaaaaaaaaaaaaa", &sealed)?, b"ada@example.com");
//! assert!(open(&VaultKey::from_bytes([8; 32]), "rtk_email_aaaaaaaaaaaaaaaaaaaaaaaaaa", &sealed).is_err());
//! # Ok::<(), retrace_core::vault::VaultError>(())
//! ```
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit as _, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The environment variable that holds the vault key.
pub const VAULT_KEY_ENV: &str = "RETRACE_VAULT_KEY";

/// Bytes of a nonce (XChaCha20: 192 bits, safe to pick at random).
pub const NONCE_BYTES: usize = 24;

/// The key of the token vault: 32 bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct VaultKey([u8; 32]);

impl std::fmt::Debug for VaultKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VaultKey({})", self.fingerprint())
    }
}

/// What went wrong with the vault's cryptography.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VaultError {
    /// `RETRACE_VAULT_KEY` is not 32 bytes of base64.
    #[error("the vault key must be 32 bytes, base64-encoded: {0}")]
    BadKey(String),
    /// The sealed original does not open: wrong key, altered bytes, or sealed for another token.
    #[error(
        "the original of {token} does not open under vault key {fingerprint}: the key is not the one \
         it was sealed with, or the stored bytes were altered"
    )]
    CannotOpen {
        /// The token whose original was asked for.
        token: String,
        /// The fingerprint of the key tried.
        fingerprint: String,
    },
}

impl VaultKey {
    /// A key from its 32 raw bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> VaultKey {
        VaultKey(bytes)
    }

    /// A key from its base64 text (the form of `RETRACE_VAULT_KEY`); surrounding whitespace is
    /// ignored.
    pub fn from_base64(text: &str) -> Result<VaultKey, VaultError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| VaultError::BadKey(e.to_string()))?;
        let key: [u8; 32] =
            bytes.try_into().map_err(|b: Vec<u8>| VaultError::BadKey(format!("got {} bytes", b.len())))?;
        Ok(VaultKey(key))
    }

    /// The base64 text form.
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.0)
    }

    /// A public fingerprint that names the key without revealing it: `vk_<16 hex>`.
    pub fn fingerprint(&self) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(b"retrace/vault-key-fingerprint");
        format!("vk_{}", &hex::encode(mac.finalize().into_bytes())[..16])
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new((&self.0).into())
    }
}

/// An original sealed under the vault key: the nonce and the ciphertext (with its 16-byte tag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sealed {
    /// The random nonce it was sealed with.
    pub nonce: [u8; NONCE_BYTES],
    /// The ciphertext followed by the Poly1305 tag.
    pub ciphertext: Vec<u8>,
}

/// Seals `original`, the secret that masking replaced by `token`, under `key` with a fresh random
/// nonce; the token is the associated data.
pub fn seal(key: &VaultKey, token: &str, original: &[u8]) -> Sealed {
    let nonce: [u8; NONCE_BYTES] = XChaCha20Poly1305::generate_nonce(&mut OsRng).into();
    seal_with_nonce(key, token, nonce, original)
}

/// [`seal`] with the nonce given (for tests; a nonce must never be used twice under one key).
pub fn seal_with_nonce(key: &VaultKey, token: &str, nonce: [u8; NONCE_BYTES], original: &[u8]) -> Sealed {
    let ciphertext = key
        .cipher()
        .encrypt(XNonce::from_slice(&nonce), Payload { msg: original, aad: token.as_bytes() })
        .expect("XChaCha20-Poly1305 seals any message that fits in memory");
    Sealed { nonce, ciphertext }
}

/// The original `sealed` holds for `token`; [`VaultError::CannotOpen`] under another key, for
/// another token, or when a byte was altered.
pub fn open(key: &VaultKey, token: &str, sealed: &Sealed) -> Result<Vec<u8>, VaultError> {
    key.cipher()
        .decrypt(
            XNonce::from_slice(&sealed.nonce),
            Payload { msg: &sealed.ciphertext, aad: token.as_bytes() },
        )
        .map_err(|_| VaultError::CannotOpen { token: token.to_owned(), fingerprint: key.fingerprint() })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "rtk_apikey_abcdefghijklmnopqrstuvwxyz";

    #[test]
    fn sealed_originals_open_only_under_their_key_and_token() {
        let key = VaultKey::from_bytes([1; 32]);
        let sealed = seal(&key, TOKEN, b"sk-live-123");
        assert_eq!(open(&key, TOKEN, &sealed).unwrap(), b"sk-live-123");
        assert_eq!(sealed.ciphertext.len(), b"sk-live-123".len() + 16, "ciphertext plus tag");
        assert!(!sealed.ciphertext.windows(11).any(|w| w == b"sk-live-123"));

        let other = VaultKey::from_bytes([2; 32]);
        let err = open(&other, TOKEN, &sealed).unwrap_err();
        assert!(err.to_string().contains(&other.fingerprint()), "{err}");
        assert!(err.to_string().contains("not the one it was sealed with"), "{err}");
        assert!(open(&key, "rtk_apikey_other", &sealed).is_err(), "the token is bound in");

        let mut tampered = sealed.clone();
        tampered.ciphertext[0] ^= 1;
        assert!(matches!(open(&key, TOKEN, &tampered), Err(VaultError::CannotOpen { .. })));
        let mut renonced = sealed.clone();
        renonced.nonce[0] ^= 1;
        assert!(open(&key, TOKEN, &renonced).is_err());
    }

    #[test]
    fn nonces_are_random_and_fixed_nonces_are_deterministic() {
        let key = VaultKey::from_bytes([3; 32]);
        assert_ne!(seal(&key, TOKEN, b"x").nonce, seal(&key, TOKEN, b"x").nonce);
        let a = seal_with_nonce(&key, TOKEN, [9; NONCE_BYTES], b"x");
        assert_eq!(a, seal_with_nonce(&key, TOKEN, [9; NONCE_BYTES], b"x"));
        assert_eq!(open(&key, TOKEN, &a).unwrap(), b"x");
        assert_eq!(open(&key, TOKEN, &seal(&key, TOKEN, b"")).unwrap(), b"");
    }

    #[test]
    fn keys_parse_from_base64_and_debug_shows_only_a_fingerprint() {
        let key = VaultKey::from_bytes([5; 32]);
        let text = key.to_base64();
        assert_eq!(VaultKey::from_base64(&format!(" {text}\n")).unwrap(), key);
        let debug = format!("{key:?}");
        assert!(debug.starts_with("VaultKey(vk_") && !debug.contains(&text), "{debug}");
        assert_eq!(key.fingerprint().len(), 3 + 16);
        assert_ne!(key.fingerprint(), VaultKey::from_bytes([6; 32]).fingerprint());
        let short = VaultKey::from_base64("c2hvcnQ=").unwrap_err();
        assert_eq!(short.to_string(), "the vault key must be 32 bytes, base64-encoded: got 5 bytes");
        assert!(matches!(VaultKey::from_base64("not base64!"), Err(VaultError::BadKey(_))));
    }
}
