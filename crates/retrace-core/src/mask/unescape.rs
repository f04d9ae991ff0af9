//! Decoding a JSON string's escapes into a reusable buffer.

/// Appends the decoded bytes of `inner` (a JSON string's bytes between the quotes) to `out`.
/// Returns false on a malformed escape. Bytes outside escapes are copied as they are, so the
/// output is UTF-8 exactly when `inner` is (checked by the caller, only when it needs a
/// `str`). A lone surrogate decodes to U+FFFD, as lossy decoders do.
pub(crate) fn unescape(inner: &[u8], out: &mut Vec<u8>) -> bool {
    let mut i = 0;
    while i < inner.len() {
        let run = memchr::memchr(b'\\', &inner[i..]).unwrap_or(inner.len() - i);
        out.extend_from_slice(&inner[i..i + run]);
        i += run;
        if i >= inner.len() {
            break;
        }
        let Some(&e) = inner.get(i + 1) else {
            return false;
        };
        i += 2;
        let byte = match e {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
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
            _ => return false,
        };
        out.push(byte);
    }
    true
}

fn hex4(bytes: &[u8], at: usize) -> Option<u16> {
    let digits = bytes.get(at..at + 4)?;
    digits.iter().try_fold(0u16, |acc, b| Some(acc * 16 + (*b as char).to_digit(16)? as u16))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(inner: &str) -> Option<String> {
        let mut out = Vec::new();
        unescape(inner.as_bytes(), &mut out).then(|| String::from_utf8(out).unwrap())
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
