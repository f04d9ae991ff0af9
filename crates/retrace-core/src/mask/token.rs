//! The shape of a token, `rtk_<kind>_<26 base32 chars>`, and finding tokens in text.
use std::ops::Range;

/// The token prefix.
pub const TOKEN_PREFIX: &str = "rtk_";
/// Number of base32 characters in a token's tail.
pub const TOKEN_TAIL_LEN: usize = 26;

/// If `s` starts with a token, its length.
pub fn token_len_at(s: &str) -> Option<usize> {
    token_len_at_bytes(s.as_bytes())
}

pub(crate) fn token_len_at_bytes(s: &[u8]) -> Option<usize> {
    let len = token_prefix_len(s)?;
    let more = s.get(len).is_some_and(|b| base32(*b));
    (!more).then_some(len)
}

fn base32(b: u8) -> bool {
    b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b)
}

/// The length of the token `s` starts with, whatever follows it (a token glued to a following
/// word is still a token to protect).
pub(crate) fn token_prefix_len(s: &[u8]) -> Option<usize> {
    let rest = s.strip_prefix(TOKEN_PREFIX.as_bytes())?;
    let kind_len = rest.iter().take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit()).count();
    if kind_len == 0 || rest.get(kind_len) != Some(&b'_') {
        return None;
    }
    let tail = &rest[kind_len + 1..];
    let tail_len = tail.iter().take(TOKEN_TAIL_LEN).take_while(|b| base32(**b)).count();
    (tail_len == TOKEN_TAIL_LEN).then_some(TOKEN_PREFIX.len() + kind_len + 1 + TOKEN_TAIL_LEN)
}

/// True when `bytes` hold at least one token.
pub fn contains_token(bytes: &[u8]) -> bool {
    memchr::memmem::find_iter(bytes, TOKEN_PREFIX).any(|at| token_len_at_bytes(&bytes[at..]).is_some())
}

/// The byte ranges of every token inside `text`, in order: the ranges masking must not touch.
/// A token directly followed by more base32 letters counts here (masking glues tokens to
/// the words around them), though [`token_len_at`] does not call that a token.
pub(crate) fn token_spans(bytes: &[u8]) -> Vec<Range<usize>> {
    memchr::memmem::find_iter(bytes, TOKEN_PREFIX)
        .filter_map(|pos| token_prefix_len(&bytes[pos..]).map(|len| pos..pos + len))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_shape() {
        let t = format!("rtk_email_{}", "a".repeat(26));
        assert_eq!(token_len_at(&t), Some(t.len()));
        assert_eq!(token_len_at(&format!("{t}zz")), None, "a longer tail is not a token");
        assert_eq!(token_len_at("rtk__aaaaaaaaaaaaaaaaaaaaaaaaaa"), None);
        assert!(contains_token(format!("x {t} y").as_bytes()));
        assert!(!contains_token(b"rtk_email_short"));
        assert_eq!(
            token_spans(format!("a{t}-{t}").as_bytes()),
            vec![1..1 + t.len(), 2 + t.len()..2 + 2 * t.len()]
        );
        assert_eq!(token_spans(format!("{t}{t}").as_bytes()), vec![0..t.len(), t.len()..2 * t.len()]);
    }
}
