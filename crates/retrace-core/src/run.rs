//! Runs: one execution of a multi-agent system, with its mode, status, command and lineage.
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::mask::MaskRules;

/// How a run was executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunMode {
    /// Live calls, recorded.
    Record,
    /// Exact replay of a source run.
    Replay,
    /// Counterfactual replay of a source run with edits.
    Fork,
}

/// Where a run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// A recorder holds its lease.
    Running,
    /// Finished and matched (for replays) or recorded (for recordings).
    Ok,
    /// The program or the store failed.
    Failed,
    /// Replay found a divergence.
    Diverged,
    /// Ended before it finished: a recording's recorder died (or a trace was exported while
    /// it was being recorded), or the user stopped a replay or fork (SIGINT, SIGTERM).
    Interrupted,
}

/// How long a run is kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Retention {
    /// Expires after the configured age.
    #[default]
    Routine,
    /// Kept: it explains an incident.
    Incident,
    /// Kept forever.
    Pinned,
}

macro_rules! wire_names {
    ($ty:ty, $noun:literal { $($variant:ident => $name:literal),* $(,)? }) => {
        impl $ty {
            /// The wire name.
            pub fn as_str(self) -> &'static str {
                match self { $(<$ty>::$variant => $name),* }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($name => Ok(<$ty>::$variant),)*
                    _ => Err(format!(
                        "unknown {} {s:?} (want one of: {})",
                        $noun,
                        [$($name),*].join(", ")
                    )),
                }
            }
        }
    };
}

wire_names!(RunMode, "mode" { Record => "record", Replay => "replay", Fork => "fork" });
wire_names!(RunStatus, "status" {
    Running => "running",
    Ok => "ok",
    Failed => "failed",
    Diverged => "diverged",
    Interrupted => "interrupted",
});
wire_names!(Retention, "retention tier" { Routine => "routine", Incident => "incident", Pinned => "pinned" });

/// The command a run executed, as typed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    /// argv as typed.
    pub argv: Vec<String>,
    /// Working directory relative to the git top level, or absolute outside a git repository.
    pub cwd: String,
}

/// Why a run can't be given this name and these labels (`None`: it can). An empty or blank
/// name, or an empty label key, names nothing anyone could look a run up by (`runs`, a label
/// query `label:KEY=VALUE`); a label's value may be empty, but, as every listing carries it,
/// not longer than [`MAX_LABEL_VALUE_CHARS`] or holding a control character, and a run has at
/// most [`MAX_LABELS`] (QA39 D2: a 30 MiB value made every `GET /api/runs` 31 MB).
pub fn naming_problem<'a>(
    name: Option<&str>,
    labels: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<String> {
    if name.is_some_and(|n| n.trim().is_empty()) {
        return Some("the run's name is empty: give it a name, or none".into());
    }
    // Every listing shows the name, and `GET /api/runs` carries every run's (QA20 D3).
    if let Some(problem) = name.and_then(|n| too_long_or_control(n, "the run's name", MAX_NAME_CHARS)) {
        return Some(problem);
    }
    let mut count = 0;
    for (key, value) in labels {
        count += 1;
        if key.trim().is_empty() {
            return Some("a label's key is empty: a label is KEY=VALUE".into());
        }
        if let Some(problem) = too_long_or_control(key, "a label's key", MAX_NAME_CHARS) {
            return Some(problem);
        }
        let what = format!("the value of label {key:?}");
        if let Some(problem) = too_long_or_control(value, &what, MAX_LABEL_VALUE_CHARS) {
            return Some(problem);
        }
    }
    if count > MAX_LABELS {
        return Some(format!("{count} labels: a run has at most {MAX_LABELS}"));
    }
    None
}

/// Why `id` can't be an agent's id (`None`: it can): empty or blank, longer than 256
/// characters, or holding a control character. Every route that names an agent refuses such
/// an id, so a message sent to one could never be received (QA39 D3).
pub fn agent_id_problem(id: &str) -> Option<String> {
    match id.chars().count() {
        0 => Some("the agent id is empty".into()),
        n if n > 256 => Some(format!("the agent id is {n} characters long; at most 256")),
        _ if id.chars().any(char::is_control) => Some(format!("agent id {id:?} holds a control character")),
        _ if id.trim().is_empty() => Some(format!("the agent id {id:?} is blank")),
        _ => None,
    }
}

/// The longest run name or label key, in characters.
pub const MAX_NAME_CHARS: usize = 256;
/// The longest label value, in characters.
pub const MAX_LABEL_VALUE_CHARS: usize = 1024;
/// The most labels a run is given.
pub const MAX_LABELS: usize = 64;

fn too_long_or_control(text: &str, what: &str, max: usize) -> Option<String> {
    let chars = text.chars().count();
    if chars > max {
        return Some(format!("{what} is {chars} characters long: keep it to {max}"));
    }
    text.chars().any(char::is_control).then(|| {
        // Escaped as JSON escapes it (`\u001b`), not as Rust's Debug (`\u{1b}`).
        let shown = serde_json::to_string(text).unwrap_or_else(|_| format!("{text:?}"));
        format!("{what} {shown} holds a control character")
    })
}

/// Everything stored about a run apart from its events.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    /// Unique, time-sortable id.
    pub id: String,
    /// Human name.
    pub name: Option<String>,
    /// Free labels.
    pub labels: BTreeMap<String, String>,
    /// record, replay or fork.
    pub mode: RunMode,
    /// running, ok, failed, diverged, interrupted.
    pub status: RunStatus,
    /// routine, incident, pinned.
    pub retention: Retention,
    /// The command run, if launched through the CLI.
    pub command: Option<Command>,
    /// The command's exit status.
    pub exit_status: Option<i32>,
    /// Replays and forks: the run they re-execute.
    pub source_run: Option<String>,
    /// Forks: the first seq the fork numbers itself.
    pub fork_at: Option<u64>,
    /// Forks: the edits, as typed (`swap:3,5`, ...).
    pub edits: Vec<String>,
    /// Upstream endpoints used for live calls, by provider.
    pub upstreams: BTreeMap<String, String>,
    /// The chaos seed that shuffled deliveries, if any.
    pub chaos_seed: Option<u64>,
    /// Fingerprint of the mask key the run was recorded under.
    pub mask_key_fingerprint: Option<String>,
    /// Whether any stored byte of the run holds a mask token.
    pub holds_tokens: bool,
    /// The masking rule set the run was recorded with.
    pub masking_rules: MaskRules,
    /// Final decisions, in the order they were taken (filled when the run finishes).
    pub decisions: Vec<FinalDecision>,
    /// Divergence report, when the run diverged.
    pub divergence: Option<serde_json::Value>,
    /// Unix milliseconds when the run started.
    pub started_at_ms: u64,
    /// Unix milliseconds when the run finished.
    pub finished_at_ms: Option<u64>,
    /// Hash of the run's last event when it finished.
    pub head: Option<Digest>,
    /// The proxy's request body limit in bytes, when it was not the default (`record
    /// --max-body`): replays and forks of the run refuse the requests it refused (QA28 D1: a
    /// replay let them through and diverged). Left out of the JSON when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body: Option<u64>,
}

/// A decision as it stands at the end of a run, for comparing outcomes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalDecision {
    /// Agent that decided.
    pub agent: String,
    /// What it decided.
    pub action: String,
    /// What it applies to.
    pub target: Option<String>,
}

impl RunMeta {
    /// A new recording started now.
    pub fn new(id: impl Into<String>, mode: RunMode, started_at_ms: u64) -> RunMeta {
        RunMeta {
            id: id.into(),
            name: None,
            labels: BTreeMap::new(),
            mode,
            status: RunStatus::Running,
            retention: Retention::Routine,
            command: None,
            exit_status: None,
            source_run: None,
            fork_at: None,
            edits: Vec::new(),
            upstreams: BTreeMap::new(),
            chaos_seed: None,
            mask_key_fingerprint: None,
            holds_tokens: false,
            masking_rules: MaskRules::default(),
            decisions: Vec::new(),
            divergence: None,
            started_at_ms,
            finished_at_ms: None,
            head: None,
            max_body: None,
        }
    }
}

/// Crockford base32 alphabet, lower case, for run ids.
const ID_ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// A 26-character, time-sortable id (ULID layout): 48 bits of Unix milliseconds, 80 random bits.
pub fn make_run_id(unix_ms: u64, random: u128) -> String {
    let value: u128 = (u128::from(unix_ms & 0xFFFF_FFFF_FFFF) << 80) | (random & ((1u128 << 80) - 1));
    (0..26).rev().map(|i| ID_ALPHABET[((value >> (i * 5)) & 31) as usize] as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_sort_by_time() {
        let a = make_run_id(1_700_000_000_000, u128::MAX);
        let b = make_run_id(1_700_000_000_001, 0);
        assert_eq!(a.len(), 26);
        assert!(a < b);
        assert_eq!("fork".parse::<RunMode>().unwrap(), RunMode::Fork);
        assert!("nope".parse::<RunStatus>().unwrap_err().contains("interrupted"));
    }

    /// A control character is shown as JSON escapes it, which users and scripts read, not as
    /// Rust's Debug does (QA23 D5).
    #[test]
    fn a_control_character_in_a_name_is_shown_escaped_as_json() {
        let problem = naming_problem(Some("two\nlines\u{1b}[31mred"), []).unwrap();
        assert_eq!(problem, r#"the run's name "two\nlines\u001b[31mred" holds a control character"#);
        // A label's value too, and its length, and how many (QA39 D2).
        let problem = naming_problem(None, [("k", "bad\nvalue")]).unwrap();
        assert_eq!(problem, r#"the value of label "k" "bad\nvalue" holds a control character"#);
        let long = "v".repeat(MAX_LABEL_VALUE_CHARS + 1);
        let problem = naming_problem(None, [("k", long.as_str())]).unwrap();
        assert_eq!(problem, "the value of label \"k\" is 1025 characters long: keep it to 1024");
        let keys: Vec<String> = (0..=MAX_LABELS).map(|i| format!("k{i}")).collect();
        let problem = naming_problem(None, keys.iter().map(|k| (k.as_str(), ""))).unwrap();
        assert_eq!(problem, "65 labels: a run has at most 64");
        assert_eq!(naming_problem(Some("ok"), [("k", ""), ("team", "payments")]), None);
    }
}
