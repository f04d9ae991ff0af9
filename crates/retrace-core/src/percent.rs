//! Percent-encoding (RFC 3986): what a URL's path segments and query values carry.

/// Every byte outside RFC 3986's unreserved set (`A-Z a-z 0-9 - . _ ~`) as `%XX`: safe as a
/// path segment or a query value whatever it holds.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `%XX` escapes decoded, and `+` as a space when `plus_is_space` (a form-encoded value);
/// `None` when an escape is broken or the bytes are not UTF-8.
pub fn decode(text: &str, plus_is_space: bool) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn encoding_round_trips_and_broken_escapes_are_none() {
        let text = "ada@example.com 4111+1 ü/x";
        assert_eq!(super::encode("a-b.c_d~"), "a-b.c_d~");
        assert_eq!(super::decode(&super::encode(text), false).as_deref(), Some(text));
        assert_eq!(super::decode("a+b%20c", true).as_deref(), Some("a b c"));
        assert_eq!(super::decode("a+b", false).as_deref(), Some("a+b"));
        for broken in ["%4", "%zz", "%ff"] {
            assert_eq!(super::decode(broken, false), None, "{broken}");
        }
    }
}
