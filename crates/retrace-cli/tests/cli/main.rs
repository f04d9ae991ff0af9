//! The real `retrace` binary against a temporary RETRACE_HOME, one module per subject.
mod concurrent;
mod export_import;
mod fork;
mod inspect;
mod launch;
mod masking;
mod resolve;
mod stopping;

#[path = "../../../retrace-store/tests/trace_fixture/mod.rs"]
mod trace_fixture;

#[path = "../common/ran.rs"]
mod ran;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ran::Ran;
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

    fn run(&self, args: &[&str]) -> Ran {
        Ran(self.command(args).stdin(Stdio::null()).output().unwrap())
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
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
