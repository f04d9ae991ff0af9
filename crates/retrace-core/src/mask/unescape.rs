//! Decoding a JSON string's escapes into a reusable buffer.

/// Appends the decoded form of `inner` (a JSON string's bytes between the quotes) to `out`.
/// Returns false when `inner` is not valid UTF-8 or holds a malformed escape. A lone surrogate
/// decodes to U+FFFD, as lossy decoders do.
pub(crate) fn unescape(inner: &[u8], out: &mut String) -> bool {
    let mut i = 0;
    while i < inner.len() {
        let Some(at) = memchr::memchr(b'\\', &inner[i..]) else {
            return push_utf8(&inner[i..], out);
        };
        if !push_utf8(&inner[i..i + at], out) {
            return false;
        }
        i += at;
        let Some(&e) = inner.get(i + 1) else {
            return false;
        };
        i += 2;
        let c = match e {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let Some(unit) = hex4(inner, i) else {
                    return false;
                };
                i += 4;
                if (0xD800..0xDC00).contains(&unit)
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
                }
            }
            _ => return false,
        };
        out.push(c);
    }
    true
}

fn push_utf8(bytes: &[u8], out: &mut String) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(s) => {
            out.push_str(s);
            true
        }
        Err(_) => false,
    }
}

fn hex4(bytes: &[u8], at: usize) -> Option<u16> {
    let digits = bytes.get(at..at + 4)?;
    let text = std::str::from_utf8(digits).ok()?;
    if !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u16::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(inner: &str) -> Option<String> {
        let mut out = String::new();
        unescape(inner.as_bytes(), &mut out).then_some(out)
    }

    #[test]
    fn decodes_like_serde_json() {
        for inner in [r"plain", r#"a\nb\t\u0041\/\\\""#, r"sk\u002d1 \ud83d\ude00 é", r"\u00e9"] {
            let want: String = serde_json::from_str(&format!("\"{inner}\"")).unwrap();
            assert_eq!(decode(inner).unwrap(), want, "{inner}");
        }
        assert_eq!(decode(r"\ud800x").unwrap(), "\u{FFFD}x");
        assert_eq!(decode(r"\q"), None);
        assert_eq!(decode(r"\u12"), None);
    }
}
