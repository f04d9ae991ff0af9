//! Leases: who holds a run (`host:pid:start-time`, so a holder that died on this host is seen
//! at once) and the rules every backend applies to a lease record.
//!
//! A recorder takes a run's lease as [`LeaseHolder::unique`]: the process, plus `#n` telling it
//! apart from every other holder the process makes. With the bare process as holder, a second
//! writer of the same run in one process took the lease again (same holder), assigned seqs the
//! first had assigned, and on closing released the lease under the first's feet.
//!
//! The start time (field 22 of `/proc/<pid>/stat`, in clock ticks since boot) tells a reused pid
//! from the process that took the lease. On systems without `/proc` liveness is unknown and
//! only lease expiry frees a run.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{LeaseHolder, StoreError};

impl LeaseHolder {
    /// This process: `host:pid:start-time`.
    pub fn current() -> LeaseHolder {
        static CURRENT: OnceLock<LeaseHolder> = OnceLock::new();
        CURRENT
            .get_or_init(|| {
                let pid = std::process::id();
                let start = process_start(pid).map_or_else(|| "0".to_string(), |s| s.start);
                LeaseHolder(format!("{}:{pid}:{start}", this_host()))
            })
            .clone()
    }

    /// This process as one recorder: [`LeaseHolder::current`] and `#n`, a number no other
    /// call in this process returns. Two writers of one run in one process then hold it as two
    /// holders, and the second is refused (`Busy`, naming the first) instead of sharing it.
    pub fn unique() -> LeaseHolder {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        LeaseHolder(format!("{}#{n}", LeaseHolder::current().0))
    }

    /// The three parts `(host, pid, start)` of the process that holds the lease (a
    /// [`LeaseHolder::unique`] holder's `#n` left out), or `None` when the text has another shape.
    pub fn parts(&self) -> Option<(&str, u32, &str)> {
        let process = self.0.rsplit_once('#').map_or(self.0.as_str(), |(process, _)| process);
        let mut it = process.rsplitn(3, ':');
        let start = it.next()?;
        let pid = it.next()?.parse().ok()?;
        let host = it.next()?;
        Some((host, pid, start))
    }
}

impl std::fmt::Display for LeaseHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `holder` is still running: `Some(false)` when it is on this host and its pid is gone,
/// a zombie, or now a different process (another start time); `None` when it is on another
/// host or liveness can't be read here.
pub fn holder_is_alive(holder: &LeaseHolder) -> Option<bool> {
    let (host, pid, start) = holder.parts()?;
    if host != this_host() || process_start(std::process::id()).is_none() {
        return None;
    }
    match process_start(pid) {
        None => Some(false),
        Some(stat) => Some(!stat.zombie && stat.start == start),
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub(crate) holder: LeaseHolder,
    pub(crate) expires_at_ms: u64,
}

impl Lease {
    /// Whether the lease still binds: its holder not known to be dead, and either not expired or
    /// held by another process of this host known to be alive. Such a recorder only stopped
    /// renewing for a while (Ctrl-Z, a debugger, a paused VM, heavy swapping): taking its run
    /// as interrupted meanwhile failed its next step as "run finished" (QA24 D2). Expiry frees
    /// a holder whose liveness can't be read here (another host), and one of this process
    /// (whose liveness says nothing of the writer that took it).
    pub(crate) fn is_live(&self, now_ms: u64) -> bool {
        match holder_is_alive(&self.holder) {
            Some(false) => false,
            Some(true) if self.holder.parts().is_some_and(|(_, pid, _)| pid != std::process::id()) => true,
            _ => self.expires_at_ms > now_ms,
        }
    }
}

/// The holder naming process `pid` of this host as it runs now, if it runs (see
/// [`LeaseHolder::current`]).
pub fn holder_of_process(pid: u32) -> Option<LeaseHolder> {
    let stat = process_start(pid)?;
    Some(LeaseHolder(format!("{}:{pid}:{}", this_host(), stat.start)))
}

/// Unix milliseconds now (the lease clock, shared by processes on one host).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A running run with no lease at all is left alone this long after it started: its recorder
/// may not have taken the lease yet.
pub(crate) const LEASELESS_GRACE_MS: u64 = 10_000;

/// Whether a `running` run holding no lease is dead. Its keeper, the process that created it
/// and will finish it ([`crate::EventStore::keep_run`]): dead when that process is known dead,
/// alive however long it takes while it lives (a replay, which never holds a lease; a program
/// that prepares for a minute before its first step). With no keeper, or one whose liveness
/// can't be read here, the run is dead once [`LEASELESS_GRACE_MS`] have passed since it started.
pub(crate) fn leaseless_dead(keeper: Option<&LeaseHolder>, started_ms: u64, now_ms: u64) -> bool {
    match keeper.and_then(holder_is_alive) {
        Some(alive) => !alive,
        None => started_ms.saturating_add(LEASELESS_GRACE_MS) <= now_ms,
    }
}

/// The `Busy` error for a run whose lease `lease` is live.
pub(crate) fn lease_busy(run: &str, lease: &Lease, now_ms: u64) -> StoreError {
    StoreError::busy(format!(
        "run {run} is being recorded by {} (its lease expires in {} ms)",
        lease.holder,
        lease.expires_at_ms.saturating_sub(now_ms)
    ))
}

/// This host's name, from `/proc/sys/kernel/hostname` (`localhost` when unreadable).
fn this_host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().replace(':', "_"))
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_string())
    })
}

struct ProcStat {
    start: String,
    zombie: bool,
}

/// Field 3 (state) and field 22 (start time) of `/proc/<pid>/stat`.
fn process_start(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat { start: fields.get(19)?.to_string(), zombie: *fields.first()? == "Z" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_changed_start_time_is_dead() {
        let me = LeaseHolder::current();
        let (host, pid, start) = me.parts().unwrap();
        assert_eq!(pid, std::process::id());
        if process_start(pid).is_none() {
            return; // no /proc here: liveness is unknown
        }
        assert_eq!(holder_is_alive(&me), Some(true));
        let reused = LeaseHolder(format!("{host}:{pid}:{start}9"));
        assert_eq!(holder_is_alive(&reused), Some(false));
        let elsewhere = LeaseHolder(format!("other-host:{pid}:{start}"));
        assert_eq!(holder_is_alive(&elsewhere), None);
        assert_eq!(holder_is_alive(&LeaseHolder("garbage".into())), None);
    }

    #[test]
    fn unique_holders_differ_and_are_this_process() {
        let (a, b) = (LeaseHolder::unique(), LeaseHolder::unique());
        assert_ne!(a, b);
        assert_ne!(a, LeaseHolder::current());
        assert_eq!(a.parts(), LeaseHolder::current().parts());
        if process_start(std::process::id()).is_some() {
            assert_eq!(holder_is_alive(&a), Some(true));
            let (host, pid, start) = a.parts().unwrap();
            assert_eq!(holder_is_alive(&LeaseHolder(format!("{host}:{pid}:{start}9#1"))), Some(false));
        }
    }
}
