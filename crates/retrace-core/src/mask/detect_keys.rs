//! Credential detectors: provider API keys, bearer credentials, JWTs and PEM private keys.
//!
//! Each runs at one occurrence of its anchor (found by the engine's prefilter) and returns the
//! secret's byte range, or `None`. A secret must start at a word boundary: the byte before it
//! is not an ASCII letter or digit.
//!
//! Every anchor holds a *trigger*: a byte of [`TRIGGERS`], all rare in prose (`-`, `_`, `J`,
//! `A`, `B`). The engine's prefilter stops only at trigger bytes and checks the anchors that
//! hold that byte, so common letters never cost a look.
use std::ops::Range;

use super::detect::Detector;

/// The literal anchors of the credential detectors, each with the detector it starts.
/// Longer anchors come before their prefixes (`sk-ant-` before `sk-`).
pub(crate) const ANCHORS: &[(&str, Detector)] = &[
    ("-----BEGIN ", Detector::PrivateKey),
    ("eyJ", Detector::Jwt),
    ("sk-ant-", Detector::AnthropicKey),
    ("sk-", Detector::OpenaiKey),
    ("AKIA", Detector::AwsAccessKey),
    ("ASIA", Detector::AwsAccessKey),
    ("ghp_", Detector::GithubToken),
    ("gho_", Detector::GithubToken),
    ("ghu_", Detector::GithubToken),
    ("ghs_", Detector::GithubToken),
    ("ghr_", Detector::GithubToken),
    ("github_pat_", Detector::GithubToken),
    ("AIza", Detector::GoogleApiKey),
    ("xoxa-", Detector::SlackToken),
    ("xoxb-", Detector::SlackToken),
    ("xoxp-", Detector::SlackToken),
    ("xoxr-", Detector::SlackToken),
    ("xoxs-", Detector::SlackToken),
    ("sk_live_", Detector::StripeKey),
    ("rk_live_", Detector::StripeKey),
    ("Bearer ", Detector::Bearer),
    ("BEARER ", Detector::Bearer),
];

/// The bytes the prefilter stops at for the anchors: each anchor holds one.
pub(crate) const TRIGGERS: &[u8] = b"-_JAB";

/// Where an anchor's trigger is: its first byte in [`TRIGGERS`].
pub(crate) fn trigger(anchor: &str) -> (u8, usize) {
    let at = anchor.bytes().position(|b| TRIGGERS.contains(&b)).expect("every anchor holds a trigger byte");
    (anchor.as_bytes()[at], at)
}

pub(crate) fn at_boundary(text: &[u8], at: usize) -> bool {
    at == 0 || !text[at - 1].is_ascii_alphanumeric()
}

fn base64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

fn alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

fn upper_or_digit(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit()
}

fn token68(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/' | b'=')
}

/// How many bytes from `at` satisfy `class`, looking at no more than `max`.
fn run(text: &[u8], at: usize, max: usize, class: fn(u8) -> bool) -> usize {
    text[at.min(text.len())..].iter().take(max).take_while(|b| class(**b)).count()
}

/// A key: `anchor` then a tail of `class` bytes, `min..=max` long, not followed by another
/// `class` byte; `digit`: the tail must hold a digit (random keys do, kebab-case words don't).
fn key(
    text: &[u8],
    at: usize,
    anchor: usize,
    class: fn(u8) -> bool,
    min: usize,
    max: usize,
    digit: bool,
) -> Option<Range<usize>> {
    let start = at + anchor;
    let len = run(text, start, max + 1, class);
    let tail = &text[start..start + len];
    if len < min || len > max || (digit && !tail.iter().any(u8::is_ascii_digit)) {
        return None;
    }
    Some(at..start + len)
}

/// The secret `detector` finds at an occurrence of its anchor (`anchor` bytes long) at `at`.
pub(crate) fn find_at(detector: Detector, text: &[u8], at: usize, anchor: usize) -> Option<Range<usize>> {
    if detector != Detector::Bearer && detector != Detector::PrivateKey && !at_boundary(text, at) {
        return None;
    }
    match detector {
        Detector::OpenaiKey => {
            if text[at..].starts_with(b"sk-ant-") {
                return None;
            }
            key(text, at, anchor, base64url, 20, 400, true)
        }
        Detector::AnthropicKey => key(text, at, anchor, base64url, 20, 400, true),
        Detector::AwsAccessKey => key(text, at, anchor, upper_or_digit, 16, 16, false),
        Detector::GithubToken if anchor == "github_pat_".len() => {
            key(text, at, anchor, |b| alnum(b) || b == b'_', 22, 255, true)
        }
        Detector::GithubToken => key(text, at, anchor, alnum, 30, 255, true),
        Detector::GoogleApiKey => key(text, at, anchor, base64url, 35, 35, false),
        Detector::SlackToken => key(text, at, anchor, |b| alnum(b) || b == b'-', 10, 255, true),
        Detector::StripeKey => key(text, at, anchor, alnum, 16, 255, true),
        Detector::Bearer => bearer(text, at, anchor),
        Detector::Jwt => jwt(text, at),
        Detector::PrivateKey => private_key(text, at, anchor),
        Detector::Email | Detector::Card | Detector::Iban => None,
    }
}

/// The longest credential after `Bearer ` masked whole; a longer one has its first 64 KB masked.
const BEARER_MAX: usize = 1 << 16;

/// The credential after `Bearer ` (12 token68 bytes or more, one a digit). However long: opaque
/// tokens of several KB exist, and a credential too long to mask was kept in clear (QA27 D5). A
/// key detector's tail has a ceiling instead (400 bytes for `sk-`): without `Bearer ` before it,
/// a longer run is far more often base64 data that happens to hold `-sk-` (an embedding), which
/// masking would change.
fn bearer(text: &[u8], at: usize, anchor: usize) -> Option<Range<usize>> {
    if !at_boundary(text, at) {
        return None;
    }
    let start = at + anchor + run(text, at + anchor, 16, |b| b == b' ');
    let len = run(text, start, BEARER_MAX, token68);
    let credential = &text[start..start + len];
    if len < 12 || !credential.iter().any(u8::is_ascii_digit) {
        return None;
    }
    Some(start..start + len)
}

/// `eyJ<header>.<payload>.<signature>`, base64url parts; the signature may be empty (`alg: none`).
fn jwt(text: &[u8], at: usize) -> Option<Range<usize>> {
    let header = run(text, at, 4096, base64url);
    let dot = at + header;
    if header < 10 || text.get(dot) != Some(&b'.') {
        return None;
    }
    let payload = run(text, dot + 1, 1 << 16, base64url);
    let dot2 = dot + 1 + payload;
    if payload < 2 || text.get(dot2) != Some(&b'.') {
        return None;
    }
    let signature = run(text, dot2 + 1, 4096, base64url);
    Some(at..dot2 + 1 + signature)
}

/// `-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----` through the matching END line; a block with no END
/// (a truncated or streamed key) runs to the end of the text.
fn private_key(text: &[u8], at: usize, anchor: usize) -> Option<Range<usize>> {
    const TAIL: &[u8] = b"PRIVATE KEY-----";
    let label = at + anchor;
    let head = label + armor_label(text, label, TAIL)?;
    let Some(end) = memchr::memmem::find(&text[head..], b"-----END ") else {
        return Some(at..text.len());
    };
    let end_label = head + end + "-----END ".len();
    match armor_label(text, end_label, TAIL) {
        Some(len) => Some(at..end_label + len),
        None => Some(at..text.len()),
    }
}

/// If `text[at..]` is `[A-Z0-9 ]{0,40}` followed by `tail`, the length through `tail`.
fn armor_label(text: &[u8], at: usize, tail: &[u8]) -> Option<usize> {
    let words = run(text, at, 40, |b| upper_or_digit(b) || b == b' ');
    (0..=words).find(|k| text[at + k..].starts_with(tail)).map(|k| k + tail.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(detector: Detector, text: &str) -> Option<&str> {
        let bytes = text.as_bytes();
        ANCHORS.iter().filter(|(_, d)| *d == detector).find_map(|(anchor, _)| {
            let at = memchr::memmem::find(bytes, anchor.as_bytes())?;
            find_at(detector, bytes, at, anchor.len()).map(|r| &text[r])
        })
    }

    #[test]
    fn every_anchor_has_a_trigger() {
        for (anchor, _) in ANCHORS {
            let (byte, at) = trigger(anchor);
            assert_eq!(anchor.as_bytes()[at], byte);
        }
    }

    #[test]
    fn provider_keys() {
        let cases: &[(Detector, &str, Option<&str>)] = &[
            (
                Detector::OpenaiKey,
                "key sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t ok",
                Some("sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t"),
            ),
            (Detector::OpenaiKey, "sk-Ab3dEf6hIj9kLm2nOp5qRs8tUv", Some("sk-Ab3dEf6hIj9kLm2nOp5qRs8tUv")),
            (Detector::OpenaiKey, "use sk-learn-is-a-great-library-for-ml", None),
            (Detector::OpenaiKey, "task-Ab3dEf6hIj9kLm2nOp5qRs8tUv", None),
            (Detector::OpenaiKey, "sk-ant-api03-Ab3dEf6hIj9kLm2nOp5qRs8t", None),
            (
                Detector::AnthropicKey,
                "x=sk-ant-api03-Ab3dEf6hIj9kLm2nOp5qRs8t_x",
                Some("sk-ant-api03-Ab3dEf6hIj9kLm2nOp5qRs8t_x"),
            ),
            (Detector::AwsAccessKey, "id AKIAIOSFODNN7EXAMPLE,", Some("AKIAIOSFODNN7EXAMPLE")),
            (Detector::AwsAccessKey, "ASIAY34FZKBOKMUTVV7A", Some("ASIAY34FZKBOKMUTVV7A")),
            (Detector::AwsAccessKey, "AKIAIOSFODNN7EXAMPLEX", None),
            (
                Detector::GithubToken,
                "ghp_1234567890abcdefghijABCDEFGHIJ123456",
                Some("ghp_1234567890abcdefghijABCDEFGHIJ123456"),
            ),
            (
                Detector::GithubToken,
                "github_pat_11ABCDEFG0abcdefghijkl_mnopqrstuvwxyz0123456789",
                Some("github_pat_11ABCDEFG0abcdefghijkl_mnopqrstuvwxyz0123456789"),
            ),
            (Detector::GithubToken, "ghp_short1", None),
            (
                Detector::GoogleApiKey,
                "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
                Some("AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q"),
            ),
            (Detector::GoogleApiKey, "AIzaSyShort", None),
            (Detector::SlackToken, "xoxb-1234567890-abcdefghij", Some("xoxb-1234567890-abcdefghij")),
            (Detector::SlackToken, "xoxb-only-words-here", None),
            (
                Detector::StripeKey,
                "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
                Some("sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
            ),
            (Detector::StripeKey, "rk_live_51H8abcDEF123ghiJKL", Some("rk_live_51H8abcDEF123ghiJKL")),
        ];
        for (detector, text, want) in cases {
            assert_eq!(found(*detector, text), *want, "{detector:?} in {text:?}");
        }
    }

    #[test]
    fn bearer_jwt_and_private_key() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        let long_bearer = format!("Bearer {}", "QA27b".repeat(820));
        let cases: &[(Detector, &str, Option<&str>)] = &[
            (Detector::Bearer, "Authorization: Bearer abc123def456ghi", Some("abc123def456ghi")),
            (Detector::Bearer, "the bearer instrument is fine", None),
            (Detector::Bearer, "bearer abc123def456ghi", None),
            (Detector::Bearer, "Bearer short1", None),
            // However long (QA27 D5: one over 4 KB was kept in clear); the first 64 KB are masked.
            (Detector::Bearer, &long_bearer, Some(&long_bearer["Bearer ".len()..])),
            (Detector::Jwt, &format!("token={jwt};"), Some(jwt)),
            (Detector::Jwt, "eyJhbGciOiJIUzI1NiJ9 only one part", None),
            (
                Detector::Jwt,
                "eyJhbGciOiJub25lIn0.eyJzdWIiOiIxIn0.",
                Some("eyJhbGciOiJub25lIn0.eyJzdWIiOiIxIn0."),
            ),
            (
                Detector::PrivateKey,
                "k: -----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----\nrest",
                Some("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----"),
            ),
            (
                Detector::PrivateKey,
                "-----BEGIN PRIVATE KEY-----\nMIIE",
                Some("-----BEGIN PRIVATE KEY-----\nMIIE"),
            ),
            (Detector::PrivateKey, "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----", None),
        ];
        for (detector, text, want) in cases {
            assert_eq!(found(*detector, text), *want, "{detector:?} in {text:?}");
        }
    }
}
