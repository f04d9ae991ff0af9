//! The autonomy ladder (issue 8, SPEC §7 "Policy in replay"): which rung an agent stands on,
//! given its replay record in a trusted ledger and the `[autonomy]` policy of `retrace.toml`.
//! Pure: loading the ledger file and checking its signature happen in the runtime.
//!
//! ```toml
//! [project]
//! name = "billing"                 # the ledger's project (default: the git top-level folder)
//!
//! [autonomy]
//! ledger = "ci/ledger.json"        # a file `retrace ledger export` wrote
//! ledger_pubkey = "base64..."      # the key CI signs it with; any other signer counts as none
//! side_effect_min_clean = 5        # consecutive clean replays a side effect needs
//! side_effect_min_traces = 3       # over at least this many distinct traces
//! below = "hold"                   # "refuse" (default) or "hold" for `retrace approve`
//! approval_timeout_s = 30          # hold: block this long (0: raise ApprovalRequired at once)
//! ledger_max_age_days = 7          # a ledger exported longer ago counts as none (0: no limit)
//! ```
//!
//! Rungs, lowest first: `unproven` (no trusted ledger entry), `probation` (replayed, below the
//! bar), `autonomous` (at or above the bar: side effects run). Only side effects routed through
//! `tool(cls="side_effect")` are governed.
use serde::Serialize;

use crate::ledger::LedgerEntry;
use crate::toml_table::Entry;

/// What happens to a side effect below the bar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Below {
    /// The call fails at once.
    #[default]
    Refuse,
    /// The call waits for `retrace approve`.
    Hold,
}

/// `[autonomy]` of `retrace.toml`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AutonomyPolicy {
    /// The signed ledger file (relative to `retrace.toml`'s folder).
    pub ledger: Option<String>,
    /// The base64 Ed25519 key the ledger must be signed with.
    pub ledger_pubkey: Option<String>,
    /// Consecutive clean replays a side effect needs.
    pub side_effect_min_clean: u64,
    /// Distinct traces (in the clean streak) a side effect needs.
    pub side_effect_min_traces: u64,
    /// Refuse or hold below the bar.
    pub below: Below,
    /// How long a held call blocks waiting for approval (0: raise at once).
    pub approval_timeout_s: u64,
    /// A ledger exported longer ago than this many days counts as none (0: no limit): whoever
    /// can write the ledger file can put back an older one, signed when an agent had not yet
    /// diverged (QA26 D5); this bounds how old that can be.
    pub ledger_max_age_days: u64,
}

/// An agent's rung.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rung {
    /// No trusted ledger entry.
    Unproven,
    /// Replayed, below the bar.
    Probation,
    /// At or above the bar.
    Autonomous,
}

impl Rung {
    /// The rung's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Rung::Unproven => "unproven",
            Rung::Probation => "probation",
            Rung::Autonomous => "autonomous",
        }
    }
}

/// Where an agent stands, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Standing {
    /// The agent.
    pub agent: String,
    /// Its rung.
    pub rung: Rung,
    /// Whether its side effects run without approval.
    pub side_effects_allowed: bool,
    /// The bar, in words (`5 consecutive clean replays over 3 distinct traces`).
    pub bar: String,
    /// Why it stands there.
    pub why: String,
}

/// A `retrace.toml` section that doesn't parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("retrace.toml line {line}: {why}")]
pub struct PolicyError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub why: String,
}

impl AutonomyPolicy {
    /// The `[autonomy]` table of `text` (a whole `retrace.toml`); `None` when there is none
    /// (nothing is governed).
    pub fn parse_toml(text: &str) -> Result<Option<AutonomyPolicy>, PolicyError> {
        let entries = crate::toml_table::table(text, "autonomy")
            .map_err(|e| PolicyError { line: e.line, why: e.why })?;
        let Some(entries) = entries else { return Ok(None) };
        let mut p = AutonomyPolicy::default();
        for Entry { line, key, value } in entries {
            let err = |why: String| PolicyError { line, why };
            let number = || crate::toml_table::whole(&key, &value).map_err(err);
            let string = || value.as_str().map(str::to_owned);
            match key.as_str() {
                "ledger" => p.ledger = Some(string().ok_or_else(|| err("ledger must be a quoted path".into()))?),
                "ledger_pubkey" => {
                    let key = string().ok_or_else(|| err("ledger_pubkey must be quoted base64".into()))?;
                    // Not a key at all: no ledger could ever verify (QA26 S1), said now.
                    crate::ledger::verifying_key(&key).map_err(|e| err(format!("ledger_pubkey: {e}")))?;
                    p.ledger_pubkey = Some(key);
                }
                "side_effect_min_clean" => p.side_effect_min_clean = number()?,
                "side_effect_min_traces" => p.side_effect_min_traces = number()?,
                "approval_timeout_s" => p.approval_timeout_s = number()?,
                "ledger_max_age_days" => p.ledger_max_age_days = number()?,
                "below" => {
                    p.below = match string().as_deref() {
                        Some("refuse") => Below::Refuse,
                        Some("hold") => Below::Hold,
                        _ => return Err(err(format!("below must be \"refuse\" or \"hold\", not {value}"))),
                    }
                }
                other => {
                    return Err(err(format!(
                        "unknown key {other:?} in [autonomy] (want ledger, ledger_pubkey, side_effect_min_clean, \
                         side_effect_min_traces, below, approval_timeout_s, ledger_max_age_days)"
                    )))
                }
            }
        }
        Ok(Some(p))
    }

    /// The bar in words.
    pub fn bar(&self) -> String {
        format!(
            "{} consecutive clean replays over {} distinct traces",
            self.side_effect_min_clean, self.side_effect_min_traces
        )
    }

    /// Where `agent` stands given its entry in a *trusted* ledger (`None`: no entry, or no
    /// trusted ledger at all).
    pub fn standing(&self, agent: &str, entry: Option<&LedgerEntry>) -> Standing {
        let bar = self.bar();
        let meets = |e: &LedgerEntry| {
            e.clean_streak >= self.side_effect_min_clean && e.distinct_traces >= self.side_effect_min_traces
        };
        let (rung, why) = match entry {
            Some(e) if meets(e) => (
                Rung::Autonomous,
                format!(
                    "{} clean replays in a row over {} distinct traces",
                    e.clean_streak, e.distinct_traces
                ),
            ),
            Some(e) => (
                Rung::Probation,
                format!(
                    "{} clean replays in a row over {} distinct traces{}",
                    e.clean_streak,
                    e.distinct_traces,
                    match &e.last_divergence {
                        Some(d) => format!("; last diverged in trace {} ({})", d.trace, d.detail),
                        None => String::new(),
                    }
                ),
            ),
            None if self.side_effect_min_clean == 0 && self.side_effect_min_traces == 0 => {
                (Rung::Autonomous, "the policy asks for no replays".into())
            }
            None => (Rung::Unproven, "no replay record in a trusted ledger".into()),
        };
        Standing { agent: agent.into(), rung, side_effects_allowed: rung == Rung::Autonomous, bar, why }
    }
}

/// `[project] name` of `text`, if set (and `text` is TOML).
pub fn project_name(text: &str) -> Option<String> {
    let entries = crate::toml_table::table(text, "project").ok()??;
    entries.into_iter().find(|e| e.key == "name").and_then(|e| e.value.as_str().map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOML: &str = r#"
[project]
name = "billing"   # the ledger's project

[autonomy]
ledger = "ci/ledger#1.json"
side_effect_min_clean = 5
side_effect_min_traces = 3
below = "hold"
approval_timeout_s = 30
"#;

    fn entry(clean: u64, distinct: u64) -> LedgerEntry {
        LedgerEntry {
            agent: "a".into(),
            clean_streak: clean,
            distinct_traces: distinct,
            ..Default::default()
        }
    }

    #[test]
    fn the_tables_parse() {
        let p = AutonomyPolicy::parse_toml(TOML).unwrap().unwrap();
        assert_eq!(p.ledger.as_deref(), Some("ci/ledger#1.json"), "a # in a string is no comment");
        // A key parses; what is no key is refused where it is written (QA26 S1).
        let key = crate::ledger::public_key_base64(
            &crate::ledger::signing_key("BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=").unwrap(),
        );
        let keyed =
            AutonomyPolicy::parse_toml(&format!("[autonomy]\nledger_pubkey = \"{key}\"\n")).unwrap().unwrap();
        assert_eq!(keyed.ledger_pubkey, Some(key));
        let bad =
            AutonomyPolicy::parse_toml("[autonomy]\nbelow = \"hold\"\nledger_pubkey = \"notbase64!!\"\n")
                .unwrap_err();
        assert_eq!(bad.line, 3);
        assert!(bad.why.starts_with("ledger_pubkey: "), "{bad:?}");
        assert_eq!((p.side_effect_min_clean, p.side_effect_min_traces, p.approval_timeout_s), (5, 3, 30));
        assert_eq!(p.below, Below::Hold);
        assert_eq!(project_name(TOML).as_deref(), Some("billing"));
        assert_eq!(AutonomyPolicy::parse_toml("[retention]\nx = 1\n").unwrap(), None);
        let bad = AutonomyPolicy::parse_toml("[autonomy]\nbelow = \"later\"\n").unwrap_err();
        assert_eq!(bad.line, 2);
        assert!(AutonomyPolicy::parse_toml("[autonomy]\nmax = 1\n").unwrap_err().why.contains("unknown key"));

        // Dotted keys are the same setting (QA21 D6): a policy written so governs.
        let dotted = AutonomyPolicy::parse_toml("autonomy.side_effect_min_clean = 2\n").unwrap().unwrap();
        assert_eq!(dotted.side_effect_min_clean, 2);
    }

    #[test]
    fn each_rung() {
        let p = AutonomyPolicy::parse_toml(TOML).unwrap().unwrap();
        let unproven = p.standing("a", None);
        assert_eq!((unproven.rung, unproven.side_effects_allowed), (Rung::Unproven, false));
        assert!(unproven.why.contains("no replay record"), "{}", unproven.why);
        // A long streak over too few traces, and many traces with a short streak: probation.
        assert_eq!(p.standing("a", Some(&entry(50, 2))).rung, Rung::Probation);
        let short = p.standing("a", Some(&entry(4, 9)));
        assert_eq!((short.rung, short.side_effects_allowed), (Rung::Probation, false));
        assert_eq!(short.bar, "5 consecutive clean replays over 3 distinct traces");
        let up = p.standing("a", Some(&entry(5, 3)));
        assert_eq!((up.rung, up.side_effects_allowed), (Rung::Autonomous, true));
        // A policy asking for nothing lets every agent act.
        let lax = AutonomyPolicy::parse_toml("[autonomy]\n").unwrap().unwrap();
        assert!(lax.standing("new", None).side_effects_allowed);
    }
}
