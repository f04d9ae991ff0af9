//! Decoding a JSON string's escapes into a reusable buffer.

use crate::json::{hex4, simple_escape};

/// Appends the decoded bytes of `inner` (a JSON string's bytes between the quotes) to `out`.
/// Returns false on a malformed escape. Bytes outside escapes are copied as they are, so the
/// output is UTF-8 exactly when `inner` is (checked by the caller, only when it needs a
/// `str`). A lone surrogate decodes to U+FFFD, as lossy decoders do.
pub(crate) fn unescape(inner: &[u8], out: &mut Vec<u8>) -> bool {
    out.reserve(inner.len());
    let mut i = 0;
    while i < inner.len() {
        let next = find_near(inner, i, b'\\', b'\\').unwrap_or(inner.len());
        out.extend_from_slice(&inner[i..next]);
        i = next;
        if i >= inner.len() {
            break;
        }
        let Some(&e) = inner.get(i + 1) else {
            return false;
        };
        i += 2;
        let byte = match e {
            b'u' => {
                let Some(unit) = hex4(inner, i) else {
                    return false;
                };
                i += 4;
                let c = if (0xD800..0xDC00).contains(&unit)
                    && inner.get(i) == Some(&b'\\')
                    && inner.get(i + 1) == Some(&b'u')
                {
                    match hex4(inner, i + 2) {
                        Some(low) if (0xDC00..0xE000).contains(&low) => {
                            i += 6;
                            let code =
                                0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                            char::from_u32(code).unwrap_or('\u{FFFD}')
                        }
                        _ => '\u{FFFD}',
                    }
                } else {
                    char::from_u32(u32::from(unit)).unwrap_or('\u{FFFD}')
                };
                out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                continue;
            }
            _ => match simple_escape(e) {
                Some(byte) => byte,
                None => return false,
            },
        };
        out.push(byte);
    }
    true
}

const LOW_BITS: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `x` that is zero; above the lowest such byte, other bytes may
/// be flagged too (a borrow), so only the lowest flag is exact.
fn zero_bytes(x: u64) -> u64 {
    x.wrapping_sub(LOW_BITS) & !x & HIGH_BITS
}

/// The first index at or after `from` holding `a` or `b`. It looks eight bytes at a time
/// through the first 64 (in JSON inside JSON, the next quote or backslash is usually that
/// close, and a call to `memchr` costs more than the look), then hands the rest to `memchr2`.
pub(crate) fn find_near(hay: &[u8], from: usize, a: u8, b: u8) -> Option<usize> {
    let mut i = from;
    let near = hay.len().min(from.saturating_add(64));
    let (a8, b8) = (LOW_BITS * u64::from(a), LOW_BITS * u64::from(b));
    while i + 8 <= near {
        let x = u64::from_le_bytes(hay[i..i + 8].try_into().expect("8 bytes"));
        let hits = zero_bytes(x ^ a8) | zero_bytes(x ^ b8);
        if hits != 0 {
            return Some(i + hits.trailing_zeros() as usize / 8);
        }
        i += 8;
    }
    memchr::memchr2(a, b, hay.get(i..)?).map(|at| i + at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(inner: &str) -> Option<String> {
        let mut out = Vec::new();
        unescape(inner.as_bytes(), &mut out).then(|| String::from_utf8(out).unwrap())
    }

    #[test]
    fn find_near_finds_the_first_of_two_bytes_anywhere() {
        let hay: Vec<u8> = (0..300u32).map(|i| b'a' + (i % 20) as u8).collect();
        for from in [0, 3, 60, 63, 64, 65, 200, 299, 300] {
            for (a, b) in [(b'q', b'q'), (b'c', b'z'), (b'~', b'!'), (b'a', b'b')] {
                let want =
                    hay.get(from..).and_then(|h| h.iter().position(|x| *x == a || *x == b)).map(|p| from + p);
                assert_eq!(find_near(&hay, from, a, b), want, "from {from}, {a} {b}");
            }
        }
    }

    #[test]
    fn decodes_like_serde_json() {
        for inner in
            [r"plain", r#"a\nb\t\u0041\/\\\""#, r"sk\u002d1 \ud83d\ude00 é", r"\u00e9", r"\uD83D\uDE00"]
        {
            let want: String = serde_json::from_str(&format!("\"{inner}\"")).unwrap();
            assert_eq!(decode(inner).unwrap(), want, "{inner}");
        }
        assert_eq!(decode(r"\ud800x").unwrap(), "\u{FFFD}x");
        assert_eq!(decode(r"\q"), None);
        assert_eq!(decode(r"\u12"), None);
        assert_eq!(decode(r"\u12g4"), None);
    }
}
