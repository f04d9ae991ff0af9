//! A finished `retrace` command and the assertions the CLI tests make of it. Shared by the
//! test binaries through `#[path]`; each uses part of it.
#![allow(dead_code)]

use std::process::Output;

/// What a command printed and how it exited.
pub struct Ran(pub Output);

impl Ran {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.0.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.0.stderr).into_owned()
    }

    /// Standard output parsed as one JSON document.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout()).unwrap_or_else(|e| panic!("{e}: {}", self.stdout()))
    }

    /// Asserts the exit code, that stdout (`out`) and stderr (`err`) contain each needle, and
    /// that nothing panicked.
    pub fn expect(&self, code: i32, out: &[&str], err: &[&str]) -> &Self {
        let (stdout, stderr) = (self.stdout(), self.stderr());
        let context = format!("exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", self.0.status.code());
        assert_eq!(self.0.status.code(), Some(code), "{context}");
        for needle in out {
            assert!(stdout.contains(needle), "stdout lacks {needle:?}\n{context}");
        }
        for needle in err {
            assert!(stderr.contains(needle), "stderr lacks {needle:?}\n{context}");
        }
        assert!(!stderr.contains("panicked"), "{context}");
        self
    }
}
