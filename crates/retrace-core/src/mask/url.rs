//! Masking a URL or an HTTP path with its query: what a text rule finds in the raw string, and
//! what it finds in each percent-decoded path segment and query value (`a%40b.com` is an email,
//! `4111+1111+1111+1111` a card), put back percent-encoded as its token.
use std::borrow::Cow;

use super::Masker;

impl Masker {
    /// Masks `url` (a full URL or a path with its query). Returns the masked text and the number
    /// of tokens it holds that `url` did not.
    pub fn mask_url<'a>(&self, url: &'a str) -> (Cow<'a, str>, usize) {
        let (raw, mut count) = self.mask_text(url);
        if !raw.contains(['%', '+']) {
            return (raw, count);
        }
        let (before, query) = match raw.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (raw.as_ref(), None),
        };
        let mut out = String::with_capacity(raw.len());
        for (i, segment) in before.split('/').enumerate() {
            if i > 0 {
                out.push('/');
            }
            out.push_str(&self.mask_encoded(segment, false, &mut count));
        }
        if let Some(query) = query {
            out.push('?');
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match pair.split_once('=') {
                    Some((name, value)) => {
                        out.push_str(&self.mask_encoded(name, true, &mut count));
                        out.push('=');
                        out.push_str(&self.mask_encoded(value, true, &mut count));
                    }
                    None => out.push_str(&self.mask_encoded(pair, true, &mut count)),
                }
            }
        }
        if out == raw {
            return (raw, count);
        }
        (Cow::Owned(out), count)
    }

    /// One percent-encoded component, decoded (`+` is a space in a query), masked, and
    /// encoded again when anything was found; as it was otherwise.
    fn mask_encoded<'s>(&self, component: &'s str, query: bool, count: &mut usize) -> Cow<'s, str> {
        let encoded = component.contains('%') || (query && component.contains('+'));
        if !encoded {
            return Cow::Borrowed(component);
        }
        let Some(decoded) = percent_decode(component, query) else {
            return Cow::Borrowed(component);
        };
        let (masked, found) = self.mask_text(&decoded);
        if found == 0 {
            return Cow::Borrowed(component);
        }
        *count += found;
        Cow::Owned(percent_encode(&masked))
    }
}

/// `%XX` escapes (and, in a query, `+` as a space) decoded; `None` when an escape is broken or
/// the bytes are not UTF-8.
fn percent_decode(text: &str, query: bool) -> Option<String> {
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
            b'+' if query => {
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

/// Every byte outside RFC 3986's unreserved set as `%XX`.
fn percent_encode(text: &str) -> String {
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

#[cfg(test)]
mod tests {
    use crate::mask::{MaskKey, MaskRules, Masker};

    fn masker() -> Masker {
        Masker::new(MaskRules::defaults(), Some(MaskKey::from_bytes([7; 32]))).unwrap()
    }

    #[test]
    fn encoded_secrets_in_a_query_or_path_become_tokens() {
        let m = masker();
        let key = MaskKey::from_bytes([7; 32]);
        let (email, card) = (key.token("email", "ada@example.com"), key.token("card", "4111 1111 1111 1111"));
        let (out, n) =
            m.mask_url("/v1/users/ada%40example.com?to=ada%40example.com&card=4111+1111+1111+1111&x=1");
        assert_eq!(out, format!("/v1/users/{email}?to={email}&card={card}&x=1"));
        assert_eq!(n, 3);
        assert_eq!(m.mask_url(&out).1, 0, "masking twice equals once");
    }

    #[test]
    fn plain_and_unmasked_urls_are_borrowed_as_they_are() {
        let m = masker();
        for url in ["/v1/chat/completions", "/v1/models?limit=5&after=a%2Fb+c", "/x?%zz=1&bad=%4"] {
            let (out, n) = m.mask_url(url);
            assert!(matches!(out, std::borrow::Cow::Borrowed(_)) && out == url && n == 0, "{url}: {out}");
        }
        // Unencoded secrets are found as in any text.
        assert_eq!(m.mask_url("/x?to=ada@example.com").1, 1);
    }
}
