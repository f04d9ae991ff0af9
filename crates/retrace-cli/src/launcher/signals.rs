//! SIGINT and SIGTERM while Retrace runs programs: one watcher for the whole process forwards
//! each signal to every program running now (but a terminal's Ctrl-C, which the programs in
//! Retrace's process group got too) and remembers it, so that a command can tell the
//! user stopping it (Ctrl-C, `kill`) from a program that ended on its own with the same status.
//! A program that exits 130 is judged on that status; only a signal Retrace itself received is
//! an interruption.
//!
//! Once the watcher is installed the signals no longer end Retrace: the command notices them
//! ([`received`]), lets the programs end, stores what it has and exits `128 + signal`, as a
//! shell reports a program a signal ended.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::{getpgid, Pid};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::iterator::SignalsInfo;
use signal_hook::low_level::siginfo::Cause;

/// The last SIGINT or SIGTERM received since the watcher was installed (0: none), set by the
/// signal handler itself, so that it is set before the program a terminal's Ctrl-C also ends
/// can be waited for, as far as the kernel allows (see [`received_by_end`]).
static RECEIVED: LazyLock<Arc<AtomicUsize>> = LazyLock::new(|| Arc::new(AtomicUsize::new(0)));
/// The programs running now, which a signal received is forwarded to.
static RUNNING: Mutex<Vec<Pid>> = Mutex::new(Vec::new());
/// Whether the watcher is installed, or why it could not be.
static WATCHER: OnceLock<Result<(), String>> = OnceLock::new();

/// Whether the watcher is installed: SIGINT and SIGTERM then no longer end Retrace.
pub fn watching() -> bool {
    matches!(WATCHER.get(), Some(Ok(())))
}

/// Installs the watcher (once per process): from now on SIGINT and SIGTERM are remembered and
/// forwarded to the programs running, instead of ending Retrace.
pub fn watch() -> anyhow::Result<()> {
    let installed = WATCHER.get_or_init(|| {
        for sig in [SIGINT, SIGTERM] {
            signal_hook::flag::register_usize(sig, RECEIVED.clone(), sig as usize)
                .map_err(|e| e.to_string())?;
        }
        let mut signals = SignalsInfo::<WithOrigin>::new([SIGINT, SIGTERM]).map_err(|e| e.to_string())?;
        std::thread::Builder::new()
            .name("retrace-signals".into())
            .spawn(move || {
                for origin in signals.forever() {
                    let Ok(signal) = Signal::try_from(origin.signal) else { continue };
                    // A terminal's Ctrl-C (sent by the kernel) reaches the whole foreground
                    // process group: a program in ours has it already, and a second one would
                    // cut short what it does on the first (a KeyboardInterrupt's cleanup).
                    let from_terminal = matches!(origin.cause, Cause::Kernel);
                    for pid in RUNNING.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                        if from_terminal && in_our_group(*pid) {
                            continue;
                        }
                        let _ = kill(*pid, signal);
                    }
                }
            })
            .map(drop)
            .map_err(|e| e.to_string())
    });
    installed.clone().map_err(anyhow::Error::msg).context("installing signal forwarding")
}

/// Whether `pid` is in Retrace's own process group (a program that made a group of its own
/// doesn't get a terminal's signals through ours).
fn in_our_group(pid: Pid) -> bool {
    matches!((getpgid(Some(pid)), getpgid(None)), (Ok(theirs), Ok(ours)) if theirs == ours)
}

/// The SIGINT or SIGTERM Retrace received, if any: the user stopped the command.
pub fn received() -> Option<Signal> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        sig => Signal::try_from(sig as i32).ok(),
    }
}

/// [`received`] once a program has ended with `status`. A signal sent to the process group
/// reaches the program and Retrace at once, and the kernel may run Retrace's handler on another
/// thread after the wait for the program returned: when the status is the one SIGINT or SIGTERM
/// leaves (130, 143), the handler gets a moment to run. A program that exits so by itself costs
/// that moment, and is still judged on its status.
pub fn received_by_end(status: i32) -> Option<Signal> {
    let by_signal = [Signal::SIGINT, Signal::SIGTERM].iter().any(|s| status == 128 + *s as i32);
    let until = Instant::now() + Duration::from_millis(if by_signal { 200 } else { 0 });
    loop {
        if let Some(signal) = received() {
            return Some(signal);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A running program that signals are forwarded to until this is dropped.
pub struct Forwarding(Pid);

impl Forwarding {
    /// Forwards signals to `pid` from now on, and at once the one already received, if any:
    /// it came between the check before the start and the start.
    pub fn to(pid: Pid) -> Forwarding {
        RUNNING.lock().unwrap_or_else(|p| p.into_inner()).push(pid);
        if let Some(signal) = received() {
            let _ = kill(pid, signal);
        }
        Forwarding(pid)
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        RUNNING.lock().unwrap_or_else(|p| p.into_inner()).retain(|pid| *pid != self.0);
    }
}
