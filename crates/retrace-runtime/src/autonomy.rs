//! Loading the autonomy policy where the agents run: `retrace.toml`'s `[project]` and
//! `[autonomy]` tables and the signed ledger they name ([`retrace_core::autonomy`] judges).
//!
//! A ledger file that is missing, unreadable, or not signed by `ledger_pubkey` counts as no
//! ledger: every agent stands on the lowest rung, and [`Governor::warning`] says why (agents
//! can't grant themselves autonomy by writing a ledger).
use std::path::{Path, PathBuf};

use retrace_core::autonomy::{project_name, AutonomyPolicy, PolicyError, Rung, Standing};
use retrace_core::ledger::{LedgerEntry, LedgerFile};

/// The configuration file read from the working directory.
pub use crate::config_file::CONFIG_FILE;

/// The policy in force for one project, with its trusted ledger.
#[derive(Clone, Debug)]
pub struct Governor {
    /// The policy.
    pub policy: AutonomyPolicy,
    /// The project whose ledger entries count.
    pub project: String,
    /// The ledger, only when its signature verified against `ledger_pubkey`.
    pub ledger: Option<LedgerFile>,
    /// Why the ledger is ignored, when it is.
    pub warning: Option<String>,
}

impl Governor {
    /// A governor from a policy and an already-checked ledger (tests, and the loader below).
    pub fn new(policy: AutonomyPolicy, project: &str, ledger: Option<LedgerFile>) -> Governor {
        Governor { policy, project: project.into(), ledger, warning: None }
    }

    /// Reads the `retrace.toml` that applies to `dir` ([`crate::config_file::config_dir`]);
    /// `None` when it has no `[autonomy]` table (nothing governed). The ledger path is relative
    /// to the file's folder.
    pub fn load(dir: &Path) -> Result<Option<Governor>, PolicyError> {
        let dir = &crate::config_file::config_dir(dir);
        let text = std::fs::read_to_string(dir.join(CONFIG_FILE)).unwrap_or_default();
        let Some(policy) = AutonomyPolicy::parse_toml(&text)? else { return Ok(None) };
        let project = project(dir);
        let (ledger, mut warning) = match trusted_ledger(&policy, dir) {
            Ok(l) => (l, None),
            Err(why) => (None, Some(why)),
        };
        // A policy that sets no bar governs nothing: every side effect runs, whatever `below`
        // says (QA26 S1: a user who wrote only `below = "hold"` expected holds). Said, not changed.
        if policy.side_effect_min_clean == 0 && policy.side_effect_min_traces == 0 {
            let no_bar =
                "[autonomy] sets no bar (side_effect_min_clean, side_effect_min_traces): every agent's \
                          side effects run without approval";
            warning = Some(match warning {
                Some(w) => format!("{w}; {no_bar}"),
                None => no_bar.to_owned(),
            });
        }
        Ok(Some(Governor { policy, project, ledger, warning }))
    }

    /// Where `agent` stands, by the signed ledger alone.
    pub fn standing(&self, agent: &str) -> Standing {
        let entry = self.ledger.as_ref().and_then(|l| l.entry(&self.project, agent));
        self.policy.standing(agent, entry)
    }

    /// Where `agent` stands, by the signed ledger, unless `local` (this store's own ledger entry
    /// for it) records a divergence after the signed ledger was exported: then it is on
    /// probation. The local store can't raise a rung (anyone may write it), but what it says
    /// against an agent can only lower one, so an older signed ledger put back in place doesn't
    /// restore an autonomy a later divergence took away.
    pub fn standing_with(&self, agent: &str, local: Option<&LedgerEntry>) -> Standing {
        let mut standing = self.standing(agent);
        let exported = self.ledger.as_ref().map_or(0, |l| l.exported_at_ms);
        let later = local.and_then(|l| l.last_divergence.as_ref()).filter(|d| d.at_ms > exported);
        if let (true, Some(diverged)) = (standing.side_effects_allowed, later) {
            standing.rung = Rung::Probation;
            standing.side_effects_allowed = false;
            standing.why = format!(
                "diverged ({}) in a replay at {} UTC, after the signed ledger was exported at {} UTC \
                 (this store's ledger says so): held until a ledger signed since shows the bar met again",
                diverged.detail,
                retrace_core::terminal::utc_time(diverged.at_ms),
                retrace_core::terminal::utc_time(exported)
            );
        }
        standing
    }
}

/// The ledger `policy` names, if it verifies; `Err` says why it is ignored.
fn trusted_ledger(policy: &AutonomyPolicy, dir: &Path) -> Result<Option<LedgerFile>, String> {
    let Some(path) = &policy.ledger else { return Ok(None) };
    let path = dir.join(path);
    let ignored = |why: String| {
        format!("the ledger {} is ignored ({why}): every agent is on the lowest rung", path.display())
    };
    let Some(pubkey) = &policy.ledger_pubkey else {
        return Err(ignored("[autonomy] names no ledger_pubkey to check it against".into()));
    };
    let bytes = std::fs::read(&path).map_err(|e| ignored(format!("cannot read it: {e}")))?;
    let file = LedgerFile::parse(&bytes).map_err(|e| ignored(e.to_string()))?;
    file.verify(pubkey).map_err(|e| ignored(e.to_string()))?;
    let max_ms = policy.ledger_max_age_days.saturating_mul(86_400_000);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if max_ms > 0 && now.saturating_sub(file.exported_at_ms) > max_ms {
        return Err(ignored(format!(
            "it was exported at {} UTC, more than ledger_max_age_days = {} ago: export a fresh one",
            retrace_core::terminal::utc_time(file.exported_at_ms),
            policy.ledger_max_age_days
        )));
    }
    Ok(Some(file))
}

/// The project of `dir`: `[project] name` in `dir/retrace.toml`, else the name of the git
/// top-level folder above `dir` (or of `dir` outside git).
pub fn project(dir: &Path) -> String {
    let dir = &crate::config_file::config_dir(dir);
    let text = std::fs::read_to_string(dir.join(CONFIG_FILE)).unwrap_or_default();
    if let Some(name) = project_name(&text).filter(|n| !n.trim().is_empty()) {
        return name;
    }
    let top = git_toplevel(dir).unwrap_or_else(|| dir.to_path_buf());
    top.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "project".into())
}

/// The nearest folder at or above `dir` holding `.git` (a folder, or a worktree's file).
fn git_toplevel(dir: &Path) -> Option<PathBuf> {
    let dir = dir.canonicalize().ok()?;
    dir.ancestors().find(|d| d.join(".git").exists()).map(Path::to_path_buf)
}

/// [`Governor::load`] for the working directory, printing the ledger warning once, for
/// [`crate::Session::from_env`] and the daemon.
pub fn from_cwd() -> Result<Option<std::sync::Arc<Governor>>, crate::RuntimeError> {
    let dir = std::env::current_dir()
        .map_err(|e| crate::RuntimeError::Usage(format!("no working directory: {e}")))?;
    let governor = Governor::load(&dir).map_err(|e| crate::RuntimeError::Usage(e.to_string()))?;
    if let Some(warning) = governor.as_ref().and_then(|g| g.warning.as_ref()) {
        eprintln!("retrace: warning: {warning}");
    }
    Ok(governor.map(std::sync::Arc::new))
}
