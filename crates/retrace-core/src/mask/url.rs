//! Secrets that travel percent-encoded: in a URL's path and query (`a%40b.com` is an email,
//! `card=4111+1111+1111+1111` a card), and so in whatever echoes one back (a `Location` header, a
//! pagination `next` link, an error body quoting the request). Each part of the text between
//! URL delimiters that holds an escape is decoded, masked, and put back percent-encoded as its
//! token; every other byte stays.
use std::borrow::Cow;

use super::Masker;

/// The bytes that separate a URL's parts: what a secret never spans once encoded.
fn delimiter(b: u8) -> bool {
    matches!(
        b,
        b'/' | b'?' | b'&' | b'=' | b';' | b':' | b'#' | b',' | b'"' | b'\'' | b'<' | b'>' | b'(' | b')'
    ) || b.is_ascii_whitespace()
}

impl Masker {
    /// Masks `url` (a full URL or a path with its query), as [`Masker::mask_text`] masks any
    /// text: what a text rule finds in it as it is (the value of a query parameter a query rule
    /// names among them), then in each percent-encoded part.
    pub fn mask_url<'a>(&self, url: &'a str) -> (Cow<'a, str>, usize) {
        self.mask_text(url)
    }

    /// [`Masker::mask_encoded_parts`] of `text` (already masked as text), then the text rules
    /// again, until neither finds more: a secret next to an encoded one may have been read as
    /// one with it (`4111+1111+1111+1111 4111 1111 1111 1111` is no card until the first is a
    /// token). `None` when nothing was found.
    pub(crate) fn mask_encoded(&self, text: &str) -> Option<(String, usize)> {
        let (mut masked, mut count) = self.mask_encoded_parts(text)?;
        for _ in 0..4 {
            let (again, more) = self.mask_plain(&masked);
            if more == 0 {
                break;
            }
            masked = again.into_owned();
            count += more;
            match self.mask_encoded_parts(&masked) {
                Some((again, more)) => (masked, count) = (again, count + more),
                None => break,
            }
        }
        Some((masked, count))
    }

    /// The parts of `text` between [`delimiter`]s that hold a `%XX` escape (or, after `=`, a
    /// `+`, a space in a form-encoded value), decoded and masked with the text rules, each put
    /// back percent-encoded where something was found. `None` when nothing was.
    pub(crate) fn mask_encoded_parts(&self, text: &str) -> Option<(String, usize)> {
        let bytes = text.as_bytes();
        if !may_hide(bytes) {
            return None;
        }
        let (mut out, mut copied, mut count) = (String::new(), 0, 0);
        let mut start = 0;
        while start < bytes.len() {
            let end = bytes[start..].iter().position(|b| delimiter(*b)).map_or(bytes.len(), |i| start + i);
            let form_value = start > 0 && bytes[start - 1] == b'=';
            let part = &text[start..end];
            if let Some((masked, n)) = self.mask_url_part(part, form_value) {
                out.push_str(&text[copied..start]);
                out.push_str(&masked);
                copied = end;
                count += n;
            }
            start = end + 1;
        }
        if count == 0 {
            return None;
        }
        out.push_str(&text[copied..]);
        Some((out, count))
    }

    /// One part, decoded (`+` as a space in a form value), masked, and encoded again when
    /// anything was found.
    fn mask_url_part(&self, part: &str, form_value: bool) -> Option<(String, usize)> {
        let escaped = part.contains('%') || (form_value && part.contains('+'));
        if !escaped {
            return None;
        }
        let decoded = crate::percent::decode(part, form_value)?;
        match self.mask_plain(&decoded) {
            (_, 0) => None,
            (masked, n) => Some((crate::percent::encode(&masked), n)),
        }
    }
}

/// Whether `bytes` hold a `%XX` escape, or a `+` and an `=` (a form value's space): only then can
/// decoding them find anything (`12.5% of` holds no escape). Cheap, for every string masked.
pub(crate) fn may_hide(bytes: &[u8]) -> bool {
    let escape = |i: usize| bytes.get(i + 1..i + 3).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit));
    memchr::memchr_iter(b'%', bytes).any(escape)
        || (memchr::memchr(b'+', bytes).is_some() && memchr::memchr(b'=', bytes).is_some())
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

    /// QA17 D3: credentials a URL carries by parameter name, whatever they look like.
    #[test]
    fn credentials_in_a_query_by_parameter_name_become_tokens() {
        let m = masker();
        let key = MaskKey::from_bytes([7; 32]);
        let url = "openai/v1/chat/completions?api-version=2024-06-01&Access_Token=ya29.SECRET&api_key=d41d8cd9#frag";
        let (out, n) = m.mask_url(url);
        assert_eq!(
            out,
            format!(
                "openai/v1/chat/completions?api-version=2024-06-01&Access_Token={}&api_key={}#frag",
                key.token("apikey", "ya29.SECRET"),
                key.token("apikey", "d41d8cd9")
            )
        );
        assert_eq!(n, 2);
        assert_eq!(m.mask_url(&out).1, 0, "masking twice equals once");
        assert_eq!(m.mask_url("/v1/x?api-key=&key").1, 0, "nothing to mask in an empty value");
        // Quoted in a body (an upstream echoing the request), up to a delimiter.
        let echoed = "{\"error\": \"bad path /v1/x?api_key=d41d8cd9, retry\"}";
        let (out, n) = m.mask_text(echoed);
        assert_eq!(
            out,
            format!("{{\"error\": \"bad path /v1/x?api_key={}, retry\"}}", key.token("apikey", "d41d8cd9"))
        );
        assert_eq!(n, 1);
        assert_eq!(m.mask_text("x = 1; token = 2; a==b").1, 0, "an equals sign after no ? or &");
        let none = Masker::new(MaskRules::default(), Some(key)).unwrap();
        assert_eq!(none.mask_url(url).1, 0, "only where a rule names the parameter");
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
        // A `+` is a space only in a form value: a sum in text is left alone.
        assert_eq!(m.mask_encoded_parts("total 4111+1111+1111+1111"), None);
    }

    #[test]
    fn a_url_echoed_in_text_is_masked_where_it_is_encoded() {
        let m = masker();
        let key = MaskKey::from_bytes([7; 32]);
        let echoed = "invalid request to /v1/x?to=ada%40example.com: retry later";
        let (out, n) = m.mask_encoded_parts(echoed).unwrap();
        assert_eq!(
            out,
            format!("invalid request to /v1/x?to={}: retry later", key.token("email", "ada@example.com"))
        );
        assert_eq!(n, 1);
    }
}
