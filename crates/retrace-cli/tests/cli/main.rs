//! The real `retrace` binary against a temporary RETRACE_HOME, one module per subject.
mod export_import;
mod inspect;
mod launch;
mod resolve;

#[path = "../../../retrace-store/tests/trace_fixture/mod.rs"]
mod trace_fixture;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use retrace_store::{open_store, StoreConfig};
use trace_fixture::{conversation, Builder, Fixture};

/// A store folder and the binary pointed at it.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home { dir: tempfile::tempdir().unwrap() }
    }

    /// A home holding `fixture`, committed through the store API.
    fn with(fixture: &Fixture) -> Home {
        let home = Home::new();
        let store = open_store(&StoreConfig::in_home(home.dir.path())).unwrap();
        fixture.commit(&*store);
        home
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_retrace"));
        command.args(args).env("RETRACE_HOME", self.dir.path());
        for var in ["RETRACE_STORE", "RETRACE_BLOBS", "RETRACE_URL", "RETRACE_RUN"] {
            command.env_remove(var);
        }
        command
    }

    fn run(&self, args: &[&str]) -> Result {
        Result(self.command(args).stdin(Stdio::null()).output().unwrap())
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

struct Result(Output);

impl Result {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.0.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.0.stderr).into_owned()
    }
    /// Asserts the exit code and that stdout (`out`) and stderr (`err`) contain each needle.
    fn expect(&self, code: i32, out: &[&str], err: &[&str]) -> &Self {
        let context = format!(
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.0.status.code(),
            self.stdout(),
            self.stderr()
        );
        assert_eq!(self.0.status.code(), Some(code), "{context}");
        for needle in out {
            assert!(self.stdout().contains(needle), "stdout lacks {needle:?}\n{context}");
        }
        for needle in err {
            assert!(self.stderr().contains(needle), "stderr lacks {needle:?}\n{context}");
        }
        assert!(!self.stderr().contains("panicked"), "{context}");
        self
    }
}

const RUN: &str = "01clirun00000000000000000a";

/// The run ids `retrace runs --json` lists, with their mode and status.
fn runs_of(home: &Home) -> Vec<(String, String, String)> {
    let out = home.run(&["runs", "--json"]);
    out.expect(0, &[], &[]);
    let runs: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    let field = |r: &serde_json::Value, k: &str| r[k].as_str().unwrap_or_default().to_owned();
    runs.as_array().unwrap().iter().map(|r| (field(r, "id"), field(r, "mode"), field(r, "status"))).collect()
}
