//! The daemon's tokens: parsed from `RETRACE_SERVE_TOKENS` (`role:TOKEN,role:TOKEN`) and from a
//! tokens file (`role TOKEN [NAME]` per line, `#` comments), kept only as SHA-256 digests and
//! compared in constant time. A file's NAME says whose token it is: the audit log names them
//! when they reveal an original.
use std::fmt;

use retrace_core::Digest;

use super::{same_digest, Role};

/// The shortest token accepted: a guessable token would make the check pointless.
pub const MIN_TOKEN_LEN: usize = 16;

/// The longest name a tokens file may give a token's holder.
pub const MAX_NAME_LEN: usize = 64;

/// The tokens a daemon accepts, each with its role. Empty: every request is allowed.
#[derive(Clone, Default)]
pub struct Tokens {
    /// The digest of each token, its role, and its holder's name if the file gave one.
    entries: Vec<(Digest, Role, Option<String>)>,
}

/// Who presented a known token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The token's role.
    pub role: Role,
    /// The name the tokens file gave it (`admin TOKEN alice`), if any.
    pub name: Option<String>,
    /// `sha256:` and the first 12 hex digits of the token's digest: tells unnamed tokens apart
    /// (in the audit log) without revealing them.
    pub fingerprint: String,
}

/// Why a token list was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// An entry is not `role:TOKEN` (env) or `role TOKEN [NAME]` (file).
    #[error("{at}: expected {shape}, found {found:?}")]
    Shape {
        /// Where: `RETRACE_SERVE_TOKENS entry 2`, `tokens.txt:3`.
        at: String,
        /// The expected shape.
        shape: &'static str,
        /// What was there, its token hidden.
        found: String,
    },
    /// An unknown role.
    #[error("{at}: {message}")]
    Role {
        /// Where.
        at: String,
        /// Which role, and the known ones.
        message: String,
    },
    /// A token too short or holding characters a header can't carry.
    #[error(
        "{at}: a token must be at least {MIN_TOKEN_LEN} visible ASCII characters without spaces or commas"
    )]
    Weak {
        /// Where.
        at: String,
    },
    /// A holder's name longer than [`MAX_NAME_LEN`] characters.
    #[error("{at}: a name is at most {MAX_NAME_LEN} characters")]
    LongName {
        /// Where.
        at: String,
    },
    /// The same token twice (with the same role or not).
    #[error("{at}: this token is listed twice")]
    Duplicate {
        /// Where.
        at: String,
    },
}

impl Tokens {
    /// No tokens: the daemon is open.
    pub fn none() -> Tokens {
        Tokens::default()
    }

    /// Whether no token is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many tokens there are of each role: `(viewer, debugger, admin)`.
    pub fn counts(&self) -> (usize, usize, usize) {
        let count = |role| self.entries.iter().filter(|(_, r, _)| *r == role).count();
        (count(Role::Viewer), count(Role::Debugger), count(Role::Admin))
    }

    /// Adds the entries of `RETRACE_SERVE_TOKENS`: `role:TOKEN` separated by commas.
    pub fn add_env(&mut self, value: &str) -> Result<(), TokensError> {
        let entries = value.split(',').map(str::trim).filter(|e| !e.is_empty());
        for (i, entry) in entries.enumerate() {
            let at = format!("RETRACE_SERVE_TOKENS entry {}", i + 1);
            let Some((role, token)) = entry.split_once(':') else {
                return Err(shape(at, "role:TOKEN", entry));
            };
            self.add(&at, role.trim(), token.trim(), None)?;
        }
        Ok(())
    }

    /// Adds the lines of a tokens file named `name`: `role TOKEN`, or `role TOKEN NAME` to name
    /// the token's holder (one word, such as `alice` or `ci-bot`); blank lines and lines starting
    /// with `#` are skipped.
    pub fn add_file(&mut self, name: &str, text: &str) -> Result<(), TokensError> {
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = format!("{name}:{}", i + 1);
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next(), words.next()) {
                (Some(role), Some(token), holder, None) => self.add(&at, role, token, holder)?,
                _ => return Err(shape(at, "role TOKEN [NAME]", line)),
            }
        }
        Ok(())
    }

    fn add(&mut self, at: &str, role: &str, token: &str, holder: Option<&str>) -> Result<(), TokensError> {
        let role: Role = role.parse().map_err(|message| TokensError::Role {
            at: at.to_owned(),
            message: unknown_role(role, token, message),
        })?;
        let visible = token.bytes().all(|b| b.is_ascii_graphic() && b != b',');
        if token.len() < MIN_TOKEN_LEN || !visible {
            return Err(TokensError::Weak { at: at.to_owned() });
        }
        let digest = Digest::of(token.as_bytes());
        if holder.is_some_and(|name| name.chars().count() > MAX_NAME_LEN) {
            return Err(TokensError::LongName { at: at.to_owned() });
        }
        if self.entries.iter().any(|(d, _, _)| *d == digest) {
            return Err(TokensError::Duplicate { at: at.to_owned() });
        }
        self.entries.push((digest, role, holder.map(str::to_owned)));
        Ok(())
    }

    /// The role of `presented`, if it is one of the tokens.
    pub fn role_of(&self, presented: &[u8]) -> Option<Role> {
        self.holder_of(presented).map(|holder| holder.role)
    }

    /// The role and name of `presented`, if it is one of the tokens. Every token is compared,
    /// each in constant time, so the answer's timing says nothing about which one matched or
    /// how much.
    pub fn holder_of(&self, presented: &[u8]) -> Option<Holder> {
        let digest = Digest::of(presented);
        let mut found = None;
        for (known, role, name) in &self.entries {
            if same_digest(known, &digest) {
                found = Some((*role, name));
            }
        }
        found.map(|(role, name)| Holder { role, name: name.clone(), fingerprint: digest.short() })
    }
}

/// Why `role` is no role, never echoing what may be a token (QA38 D2: `TOKEN:admin`, the two
/// swapped, printed the token as the "unknown role").
fn unknown_role(role: &str, token: &str, message: String) -> String {
    const ROLES: &str = "roles: viewer, debugger, admin";
    if token.parse::<Role>().is_ok() {
        return format!(
            "the role comes first, then the token: found a token, then the role {token:?} ({ROLES})"
        );
    }
    if role.chars().count() > 12 {
        let start: String = role.chars().take(4).collect();
        return format!("unknown role \"{start}…\" ({ROLES})");
    }
    message
}

fn shape(at: String, shape: &'static str, found: &str) -> TokensError {
    // Never echo what may be a token: the role part, or the first few characters.
    let hidden = match found.split_once([':', ' ', '\t']) {
        Some((role, _)) => format!("{role}…"),
        None if found.chars().count() > 12 => format!("{}…", found.chars().take(4).collect::<String>()),
        None => found.to_owned(),
    };
    TokensError::Shape { at, shape, found: hidden }
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (viewer, debugger, admin) = self.counts();
        write!(f, "Tokens {{ viewer: {viewer}, debugger: {debugger}, admin: {admin} }}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn env_and_file_entries_map_tokens_to_roles() {
        let mut tokens = Tokens::none();
        tokens.add_env(&format!("viewer:{A}, admin:{B},")).unwrap();
        tokens.add_file("t", "# comment\n\ndebugger   cccccccccccccccccccc\n").unwrap();
        assert_eq!(tokens.role_of(A.as_bytes()), Some(Role::Viewer));
        assert_eq!(tokens.role_of(B.as_bytes()), Some(Role::Admin));
        assert_eq!(tokens.role_of(b"cccccccccccccccccccc"), Some(Role::Debugger));
        assert_eq!(tokens.role_of(b"aaaaaaaaaaaaaaaaaaab"), None);
        assert_eq!(tokens.role_of(b""), None);
        assert_eq!(format!("{tokens:?}"), "Tokens { viewer: 1, debugger: 1, admin: 1 }");
    }

    #[test]
    fn bad_entries_are_named_without_their_token() {
        let err = |env: &str| Tokens::none().add_env(env).unwrap_err().to_string();
        assert_eq!(
            err("root:xxxxxxxxxxxxxxxxxxxxxxx"),
            "RETRACE_SERVE_TOKENS entry 1: unknown role \"root\" (roles: viewer, debugger, admin)"
        );
        assert!(err(&format!("viewer:{A},viewer:short"))
            .starts_with("RETRACE_SERVE_TOKENS entry 2: a token must be"));
        assert!(!err("secretsecretsecretsecret").contains("secretsecretsecretsecret"));
        // Swapped, or a long unknown role: the token is never echoed (QA38 D2).
        let swapped = err("S3cretTokenValueQA38xyz:admin");
        assert!(swapped.contains("the role comes first, then the token"), "{swapped}");
        assert!(!swapped.contains("S3cret"), "{swapped}");
        let long = err("Zq9mSECRETxTOKEN77abcd:stranger");
        assert_eq!(
            long,
            "RETRACE_SERVE_TOKENS entry 1: unknown role \"Zq9m…\" (roles: viewer, debugger, admin)"
        );
        let file =
            Tokens::none().add_file("t.txt", "S3cretTokenValueQA38file admin").unwrap_err().to_string();
        assert!(file.starts_with("t.txt:1: the role comes first") && !file.contains("S3cret"), "{file}");
        assert!(err(&format!("viewer:{A},admin:{A}")).contains("listed twice"));
        let file = Tokens::none().add_file("t.txt", &format!("viewer {A} alice extra")).unwrap_err();
        assert_eq!(file.to_string(), "t.txt:1: expected role TOKEN [NAME], found \"viewer…\"");
        let long = Tokens::none().add_file("t.txt", &format!("viewer {A} {}", "n".repeat(65))).unwrap_err();
        assert_eq!(long.to_string(), "t.txt:1: a name is at most 64 characters");
    }

    #[test]
    fn a_file_may_name_a_token_s_holder() {
        let mut tokens = Tokens::none();
        tokens.add_env(&format!("admin:{A}")).unwrap();
        tokens.add_file("t", &format!("admin {B} alice\n")).unwrap();
        let fingerprint = |t: &str| Digest::of(t.as_bytes()).short();
        assert_eq!(
            tokens.holder_of(A.as_bytes()),
            Some(Holder { role: Role::Admin, name: None, fingerprint: fingerprint(A) })
        );
        let alice = Holder { role: Role::Admin, name: Some("alice".into()), fingerprint: fingerprint(B) };
        assert_eq!(tokens.holder_of(B.as_bytes()), Some(alice));
        assert_eq!(tokens.holder_of(b"cccccccccccccccccccc"), None);
    }
}
