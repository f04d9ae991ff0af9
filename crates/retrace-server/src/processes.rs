//! Which OS process owns which agent of a run. SDK clients name their process on every request
//! (`X-Retrace-Process: PID`); an agent belongs to the first process that speaks for it, and
//! another process claiming it is refused. When a process exits, its agents are declared
//! exited, so a replay waiting on one of them reports a stall at once instead of after
//! `--stall-timeout` (SPEC §7).
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::host::RunHost;

/// How often a watched process is checked.
const POLL: Duration = Duration::from_millis(100);

/// Agents by owner, and the processes being watched.
#[derive(Debug, Default)]
pub struct Processes {
    owners: Mutex<HashMap<(String, String), u32>>,
    watched: Mutex<HashMap<u32, Vec<(String, String)>>>,
}

/// Another live process owns the agent.
#[derive(Debug, thiserror::Error)]
#[error("agent {agent:?} of run {run} belongs to process {owner}; process {claimant} can't speak for it (one agent, one process)")]
pub struct Owned {
    /// The run.
    pub run: String,
    /// The agent.
    pub agent: String,
    /// Its owner.
    pub owner: u32,
    /// Who asked.
    pub claimant: u32,
}

impl Processes {
    /// Records that `pid` speaks for `agent` of `run`; refuses when another live process does.
    pub fn claim(
        self: &Arc<Self>,
        host: &Arc<RunHost>,
        run: &str,
        agent: &str,
        pid: u32,
    ) -> Result<(), Owned> {
        let key = (run.to_owned(), agent.to_owned());
        {
            let mut owners = self.owners.lock();
            match owners.get(&key) {
                Some(&owner) if owner == pid => return Ok(()),
                Some(&owner) if alive(owner) => {
                    return Err(Owned { run: key.0, agent: key.1, owner, claimant: pid });
                }
                _ => {
                    owners.insert(key.clone(), pid);
                }
            }
        }
        let first = {
            let mut watched = self.watched.lock();
            let agents = watched.entry(pid).or_default();
            agents.push(key);
            agents.len() == 1
        };
        if first {
            let (me, host) = (self.clone(), host.clone());
            tokio::spawn(async move {
                while alive(pid) {
                    tokio::time::sleep(POLL).await;
                }
                let agents = me.watched.lock().remove(&pid).unwrap_or_default();
                for (run, agent) in agents {
                    me.owners.lock().remove(&(run.clone(), agent.clone()));
                    if let Ok(a) = host.agent(&run, &agent) {
                        a.exit();
                    }
                }
            });
        }
        Ok(())
    }
}

impl Processes {
    /// `pid` created `run` through the API (`POST /api/runs` with `X-Retrace-Process`) and will
    /// finish it: once it has exited, and every process that spoke for an agent of the run has
    /// too, a run still running is stored `interrupted` (QA24 D4: a program killed with SIGKILL,
    /// whose exit hook never ran, left its run `running` for as long as the daemon lived, which
    /// blocked `delete`, `gc --compact` and its replay). A program that finishes its run, or whose
    /// exit hook does, leaves nothing to do.
    pub fn keep(self: &Arc<Self>, host: &Arc<RunHost>, run: &str, pid: u32) {
        let (me, host, run) = (self.clone(), host.clone(), run.to_owned());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(POLL).await;
                if !host.is_open(&run) {
                    return; // finished: nothing to watch
                }
                let speaking = me.owners.lock().iter().any(|((r, _), &owner)| *r == run && alive(owner));
                if !alive(pid) && !speaking {
                    break;
                }
            }
            let why = format!(
                "process {pid}, which created the run, exited without finishing it (killed, or it crashed \
                 past its exit hook)"
            );
            let _ = tokio::task::spawn_blocking(move || host.interrupt(&run, &why)).await;
        });
    }
}

/// Whether `pid` is a live process (a zombie is not).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold spaces.
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|s| s != "Z" && s != "X"),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tells_live_from_dead() {
        assert!(super::alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!super::alive(pid));
    }
}
