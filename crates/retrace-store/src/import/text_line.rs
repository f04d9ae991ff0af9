//! The blob line export writes for a text blob, `{"blob":"sha256:<hex>","text":"<string>"}`,
//! read without serde: the string is unescaped a run of plain bytes at a time (`memchr` finds
//! the next `"` or `\`), where serde_json looks at every byte. A line in any other shape, or
//! holding anything this reader does not expect (a raw control character, a `\u` surrogate,
//! bytes after the closing brace), is left to serde_json, whose answer (and error message) is
//! the reference: this is a shortcut for lines serde_json would read the same way, never a
//! second parser with its own rules.
use retrace_core::json::{hex4, simple_escape};
use retrace_core::Digest;

const HEAD: &[u8] = b"{\"blob\":\"";
const MIDDLE: &[u8] = b"\",\"text\":\"";
/// `sha256:` and 64 hex digits.
const DIGEST_LEN: usize = 7 + 64;

/// The digest and decoded text of `line` (without its `\n`), when it has exactly the shape
/// export writes; `None` means "ask serde_json".
pub(super) fn read(line: &[u8]) -> Option<(Digest, Vec<u8>)> {
    let rest = line.strip_prefix(HEAD)?;
    let digest = std::str::from_utf8(rest.get(..DIGEST_LEN)?).ok()?.parse().ok()?;
    let body = rest[DIGEST_LEN..].strip_prefix(MIDDLE)?.strip_suffix(b"\"}")?;
    let text = unescape(body)?;
    std::str::from_utf8(&text).ok()?;
    Some((digest, text))
}

/// The bytes a JSON string's contents (between its quotes) stand for; `None` for a quote or
/// control character that JSON does not allow there, a bad escape, or a `\u` surrogate.
fn unescape(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len());
    loop {
        let plain = memchr::memchr2(b'"', b'\\', body).unwrap_or(body.len());
        let run = &body[..plain];
        if run.iter().any(|&b| b < 0x20) {
            return None;
        }
        out.extend_from_slice(run);
        body = &body[plain..];
        let Some((&first, after)) = body.split_first() else { return Some(out) };
        if first == b'"' {
            // An unescaped quote inside the string: the line is not what it seems.
            return None;
        }
        let (&escape, after) = after.split_first()?;
        body = after;
        if escape == b'u' {
            let code = hex4(body, 0)?;
            body = &body[4..];
            let c = char::from_u32(u32::from(code))?; // surrogates are not chars: serde_json decides
            out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes());
            continue;
        }
        out.push(simple_escape(escape)?);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What serde_json makes of the same line, the reference.
    fn serde(line: &[u8]) -> Option<(Digest, Vec<u8>)> {
        #[derive(serde::Deserialize)]
        struct Line {
            blob: Digest,
            text: String,
        }
        serde_json::from_slice::<Line>(line).ok().map(|l| (l.blob, l.text.into_bytes()))
    }

    fn line(text: &str) -> Vec<u8> {
        let digest = Digest::of(text.as_bytes());
        let mut line = format!("{{\"blob\":\"{digest}\",\"text\":").into_bytes();
        serde_json::to_writer(&mut line, text).unwrap();
        line.push(b'}');
        line
    }

    #[test]
    fn reads_what_export_writes_as_serde_json_does() {
        for text in ["", "plain", "{\"a\":[1,\"x\\\"y\"]}\n\ttabs\u{0001}", "é ü 😀 \u{2028}", "\\\\\"\""]
        {
            let line = line(text);
            let fast = read(&line).expect("the exported shape");
            assert_eq!(Some(fast.clone()), serde(&line));
            assert_eq!(fast.1, text.as_bytes());
        }
    }

    #[test]
    fn leaves_anything_else_to_serde_json() {
        let digest = Digest::of(b"x");
        for line in [
            format!("{{\"blob\":\"{digest}\",\"text\":\"a\"b\"}}"), // a bare quote
            format!("{{\"blob\":\"{digest}\",\"text\":\"a\u{1}b\"}}"), // a raw control character
            format!("{{\"blob\":\"{digest}\",\"text\":\"\\ud83d\\ude00\"}}"), // a surrogate pair
            format!("{{\"blob\":\"{digest}\",\"text\":\"\\x\"}}"),  // a bad escape
            format!("{{\"blob\":\"{digest}\",\"text\":\"\\u+041\"}}"), // a sign after \u
            format!("{{\"blob\":\"{digest}\",\"text\":\"a\"}} "),   // bytes after the brace
            format!("{{\"text\":\"a\",\"blob\":\"{digest}\"}}"),    // another order
            format!("{{\"blob\":\"{digest}\", \"text\":\"a\"}}"),   // whitespace
            format!("{{\"blob\":\"{}\",\"text\":\"a\"}}", digest.to_string().to_uppercase()),
        ] {
            assert_eq!(read(line.as_bytes()), None, "{line}");
        }
        let invalid_utf8 = [&line("ab")[..line("ab").len() - 4], &[0xff, b'"', b'}']].concat();
        assert_eq!(read(&invalid_utf8), None);
    }

    proptest! {
        #[test]
        fn agrees_with_serde_json_on_any_text(text in any::<String>()) {
            let line = line(&text);
            prop_assert_eq!(read(&line), serde(&line));
        }

        #[test]
        fn never_accepts_what_serde_json_refuses(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let digest = Digest::of(&bytes);
            let line = [format!("{{\"blob\":\"{digest}\",\"text\":\"").as_bytes(), &bytes, b"\"}"].concat();
            if let Some(fast) = read(&line) {
                prop_assert_eq!(Some(fast), serde(&line));
            }
        }
    }
}
