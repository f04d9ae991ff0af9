//! Header rules: masking an HTTP header's value by the header's name.
use super::rules::RuleMatch;
use super::token::token_len_at;
use super::Masker;

/// Authorization schemes whose credential is masked while the scheme stays readable.
const SCHEMES: &[&str] = &["bearer", "basic"];

impl Masker {
    /// The value of header `name` with its secret replaced by a token, or `None` when no header
    /// rule names it (names compare case-insensitively).
    ///
    /// The whole value becomes the token, except `Bearer X` and `Basic X` (any case), where the
    /// scheme and the spaces after it stay and only `X` becomes the token. A value (or
    /// credential) that already is a token stays as it is, so masking twice equals masking once.
    pub fn mask_header(&self, name: &str, value: &str) -> Option<String> {
        let kind = self.rules.rules.iter().find_map(|rule| match &rule.matcher {
            RuleMatch::Header { header } if header.eq_ignore_ascii_case(name) => Some(rule.kind.as_str()),
            _ => None,
        })?;
        let key = self.key.as_ref()?;
        let trimmed = value.trim();
        if trimmed.is_empty() {
            return Some(value.to_owned());
        }
        let (head, secret) = split_scheme(trimmed);
        if token_len_at(secret) == Some(secret.len()) {
            return Some(trimmed.to_owned());
        }
        Some(format!("{head}{}", self.mint(key, kind, secret)))
    }
}

/// `("Bearer ", "X")` for `Bearer X`, else `("", value)`.
fn split_scheme(value: &str) -> (&str, &str) {
    let Some(space) = value.find([' ', '\t']) else {
        return ("", value);
    };
    let scheme = &value[..space];
    let credential = value[space..].trim_start();
    if credential.is_empty() || !SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme)) {
        return ("", value);
    }
    (&value[..value.len() - credential.len()], credential)
}

#[cfg(test)]
mod tests {
    use crate::mask::{MaskKey, MaskRules, Masker};

    fn masker() -> (Masker, MaskKey) {
        let key = MaskKey::from_bytes([3; 32]);
        (Masker::new(MaskRules::defaults(), Some(key.clone())).unwrap(), key)
    }

    #[test]
    fn bearer_and_basic_keep_their_scheme() {
        let (m, key) = masker();
        let token = key.token("bearer", "sk-abc123");
        assert_eq!(m.mask_header("Authorization", "Bearer sk-abc123").unwrap(), format!("Bearer {token}"));
        assert_eq!(m.mask_header("AUTHORIZATION", "bearer  sk-abc123").unwrap(), format!("bearer  {token}"));
        let basic = key.token("bearer", "dXNlcjpwYXNz");
        assert_eq!(
            m.mask_header("proxy-authorization", "Basic dXNlcjpwYXNz").unwrap(),
            format!("Basic {basic}")
        );
    }

    #[test]
    fn other_header_values_are_masked_whole() {
        let (m, key) = masker();
        assert_eq!(m.mask_header("x-api-key", "sk-ant-xyz").unwrap(), key.token("apikey", "sk-ant-xyz"));
        assert_eq!(m.mask_header("Cookie", "a=1; b=2").unwrap(), key.token("cookie", "a=1; b=2"));
        let odd = "Token abc def";
        assert_eq!(m.mask_header("authorization", odd).unwrap(), key.token("bearer", odd));
    }

    #[test]
    fn unnamed_headers_are_none_and_masking_twice_is_once() {
        let (m, _) = masker();
        assert_eq!(m.mask_header("content-type", "application/json"), None);
        assert_eq!(Masker::empty().mask_header("authorization", "Bearer x"), None);
        let once = m.mask_header("authorization", "Bearer sk-abc123").unwrap();
        assert_eq!(m.mask_header("authorization", &once).unwrap(), once);
        let whole = m.mask_header("set-cookie", "id=7; Path=/").unwrap();
        assert_eq!(m.mask_header("set-cookie", &whole).unwrap(), whole);
        assert_eq!(m.mask_header("cookie", "").unwrap(), "");
    }
}
