//! `[retention]` in `retrace.toml`: how long routine runs live and how long fresh blobs are
//! spared. The file is read as TOML (`retention.routine_days = 7` is the same setting); only
//! that table is looked at.
//!
//! ```toml
//! [retention]
//! routine_days = 30        # routine runs expire after this many days (default 30)
//! blob_grace_minutes = 60  # blobs stored this recently are never swept (default 60)
//! ```
use super::{DEFAULT_BLOB_GRACE_MS, DEFAULT_ROUTINE_DAYS};

/// The `[retention]` settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionConfig {
    /// Routine runs expire after this many days.
    pub routine_days: u64,
    /// Blobs stored this many minutes ago or less are kept.
    pub blob_grace_minutes: u64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            routine_days: DEFAULT_ROUTINE_DAYS,
            blob_grace_minutes: DEFAULT_BLOB_GRACE_MS / 60_000,
        }
    }
}

/// A `[retention]` table that doesn't parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("retrace.toml line {line}: {why}")]
pub struct RetentionConfigError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub why: String,
}

impl RetentionConfig {
    /// The settings of `text` (a whole `retrace.toml`): the defaults, overridden by the keys of
    /// its `[retention]` table. An unknown key or a value that is not a whole number in that
    /// table is an error naming the line.
    pub fn parse_toml(text: &str) -> Result<RetentionConfig, RetentionConfigError> {
        let mut config = RetentionConfig::default();
        let entries = retrace_core::toml_table::table(text, "retention")
            .map_err(|e| RetentionConfigError { line: e.line, why: e.why })?;
        for entry in entries.unwrap_or_default() {
            let err = |why: String| RetentionConfigError { line: entry.line, why };
            let number = || retrace_core::toml_table::whole(&entry.key, &entry.value).map_err(err);
            match entry.key.as_str() {
                "routine_days" => config.routine_days = number()?,
                "blob_grace_minutes" => config.blob_grace_minutes = number()?,
                other => {
                    return Err(err(format!(
                        "unknown key {other:?} in [retention] (want routine_days or blob_grace_minutes)"
                    )))
                }
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_retention_table_is_read() {
        assert_eq!(RetentionConfig::parse_toml("").unwrap(), RetentionConfig::default());
        let text = "[prices]\nroutine_days = { input = 1 }\n\n[retention]  \nroutine_days = 7 # a week\n\
                    blob_grace_minutes = 1_0\n[keys]\nstrip = [\"x\"]\n";
        let config = RetentionConfig::parse_toml(text).unwrap();
        assert_eq!((config.routine_days, config.blob_grace_minutes), (7, 10));
        let bad = RetentionConfig::parse_toml("[retention]\nroutine_days = \"soon\"\n").unwrap_err();
        assert_eq!(bad.to_string(), "retrace.toml line 2: routine_days must be a whole number, not \"soon\"");
        // As TOML writes it otherwise (QA21 D6): the same settings, not the defaults.
        for text in ["retention.routine_days = 365\n", "retention = { routine_days = 365 }\n"] {
            assert_eq!(RetentionConfig::parse_toml(text).unwrap().routine_days, 365, "{text}");
        }
        let twice =
            RetentionConfig::parse_toml("[retention]\nroutine_days = 1\n[retention]\nroutine_days = 2\n");
        assert_eq!(twice.unwrap_err().line, 3);
        let typo = RetentionConfig::parse_toml("[retention]\nroutine_dayz = 3\n").unwrap_err();
        assert!(typo.why.contains("routine_dayz"), "{typo}");
    }
}
