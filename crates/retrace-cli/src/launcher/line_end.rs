//! Whether the programs' standard output ended mid-line, for `--json`: `record`, `replay` and
//! `fork` print their summary as the last line of standard output, after the program's own, and
//! a program whose output lacks a final newline (`printf abc`, a crash mid-line) would have it
//! glued to that line, where `tail -1 | jq` can't read it.
//!
//! When [`track`] was called and standard output is not a terminal (a pipe or a file: a script
//! reads it), a program's standard output goes through Retrace, which copies it as it comes and
//! remembers its last byte; [`start_line`] then starts the summary on a line of its own. On a
//! terminal the program keeps the terminal itself (it may draw on it).
use std::io::{IsTerminal, Read, Write};
use std::process::ChildStdout;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// Whether programs' standard output is copied through Retrace.
static TRACKED: AtomicBool = AtomicBool::new(false);
/// Whether the last byte a program wrote there was not a newline.
static MID_LINE: AtomicBool = AtomicBool::new(false);

/// Copies programs' standard output through Retrace from now on, when standard output is not a
/// terminal (`--json`).
pub fn track() {
    if !std::io::stdout().is_terminal() {
        TRACKED.store(true, Ordering::SeqCst);
    }
}

/// Whether programs' standard output is copied ([`track`]).
pub fn tracked() -> bool {
    TRACKED.load(Ordering::SeqCst)
}

/// Ends the line a program left open on standard output, if it did.
pub fn start_line(out: &mut impl Write) -> std::io::Result<()> {
    match MID_LINE.swap(false, Ordering::SeqCst) {
        true => out.write_all(b"\n"),
        false => Ok(()),
    }
}

/// A copy of one program's standard output to Retrace's, running on a thread of its own.
pub struct Copy(mpsc::Receiver<()>);

/// Copies `from` to standard output as it comes, remembering whether it ends mid-line. A
/// standard output that can't be written (a closed pipe) ends the copy, and the program then
/// finds its own output closed, as it would have without Retrace.
pub fn copy(mut from: ChildStdout) -> Copy {
    let (done, drained) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut out = std::io::stdout().lock();
            if out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
                break;
            }
            MID_LINE.store(buf[n - 1] != b'\n', Ordering::SeqCst);
        }
        let _ = done.send(());
    });
    Copy(drained)
}

impl Copy {
    /// Waits, once the program has ended, for what it wrote to be copied: until its output
    /// closes, or at most a second (a process it left behind may hold it open).
    pub fn drained(self) {
        let _ = self.0.recv_timeout(Duration::from_secs(1));
    }
}
