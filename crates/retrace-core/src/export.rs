//! The export format, `retrace-trace/1` (SPEC §2): JSON Lines, one header, events in seq order,
//! then the blobs they reference.
//!
//! - Header: `{"format":"retrace-trace/1","run":{…},"run_digest":"sha256:…","holds_tokens":…,
//!   "mask_key_fingerprint":…,"masking_rules":{…},"events":N,"blobs":M}`. `run_digest` is the
//!   sha256 of the run record's canonical JSON ([`run_digest`]): the hash chain covers the
//!   events, this the record (status, command, decisions...), so a byte changed in either is
//!   refused. A file written before it existed has none, and is read as before.
//! - Event lines: the event object itself (it carries `seq`).
//! - Blob lines: `{"blob":"sha256:…","text":"…"}` when the bytes are UTF-8, else
//!   `{"blob":"sha256:…","base64":"…"}`; a blob stored as a manifest (a model request chained on
//!   an earlier one, or a model response cut around the message it hands back) is exported as
//!   `{"blob":"sha256:…","manifest":{…}}` after the blobs it names, so every line's digest can be
//!   checked as it is read.
//!
//! Every line is canonical JSON, so exporting the same run twice gives identical bytes.
use serde::{Deserialize, Serialize};

use crate::mask::MaskRules;
use crate::run::RunMeta;

/// The format tag of this version.
pub const FORMAT: &str = "retrace-trace/1";
/// The major version this build reads.
pub const FORMAT_MAJOR: u32 = 1;

/// The first line of an export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExportHeader {
    /// `retrace-trace/1`.
    pub format: String,
    /// The run.
    pub run: RunMeta,
    /// Whether any exported byte holds a mask token.
    pub holds_tokens: bool,
    /// Fingerprint of the mask key the run was recorded under.
    pub mask_key_fingerprint: Option<String>,
    /// The masking rule set the run was recorded with.
    pub masking_rules: MaskRules,
    /// Number of event lines that follow.
    pub events: u64,
    /// Number of blob lines after the events.
    pub blobs: u64,
    /// The digest of `run` as written ([`run_digest`]); absent in files written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_digest: Option<crate::Digest>,
}

/// The digest of a header's run record: sha256 of its canonical JSON. `None` for a value
/// canonical JSON can't write (a run record always can).
pub fn run_digest(run: &serde_json::Value) -> Option<crate::Digest> {
    crate::canonical::canonical_value(run).ok().map(|bytes| crate::Digest::of(&bytes))
}

/// A format tag this build can't read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Not a retrace trace at all.
    #[error("not a retrace trace (format {0:?})")]
    NotATrace(String),
    /// A newer major version.
    #[error("unsupported trace format {found:?}: this build reads retrace-trace/{FORMAT_MAJOR}")]
    UnknownMajor {
        /// The tag found.
        found: String,
    },
}

/// Checks a header's format tag: `retrace-trace/1` and `retrace-trace/1.x` are read.
pub fn check_format(tag: &str) -> Result<(), FormatError> {
    let version = tag.strip_prefix("retrace-trace/").ok_or_else(|| FormatError::NotATrace(tag.to_owned()))?;
    let major = version.split('.').next().unwrap_or("");
    match major.parse::<u32>() {
        Ok(FORMAT_MAJOR) => Ok(()),
        Ok(_) => Err(FormatError::UnknownMajor { found: tag.to_owned() }),
        Err(_) => Err(FormatError::NotATrace(tag.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_tags() {
        assert!(check_format("retrace-trace/1").is_ok());
        assert!(check_format("retrace-trace/1.3").is_ok());
        assert!(matches!(check_format("retrace-trace/2"), Err(FormatError::UnknownMajor { .. })));
        assert!(matches!(check_format("vcr/1"), Err(FormatError::NotATrace(_))));
    }
}
