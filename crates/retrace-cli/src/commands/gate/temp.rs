//! The gate's temporary folders (a throwaway store per trace, a mask key made for one gate),
//! named after the process that made them: `retrace-gate-PID-…` under the system's temporary
//! folder. A gate stopped with SIGKILL (a CI runner's timeout) removes nothing, and its
//! folders hold a store the size of its traces and a copy of the mask key: each gate removes
//! those of gates whose process is gone before it makes its own.
use std::path::Path;

use tempfile::TempDir;

/// What every gate folder's name starts with.
const PREFIX: &str = "retrace-gate-";

/// A new folder `retrace-gate-{kind}PID-…`, removed when dropped.
pub fn dir(kind: &str) -> std::io::Result<TempDir> {
    tempfile::Builder::new().prefix(&format!("{PREFIX}{kind}{}-", std::process::id())).tempdir()
}

/// Removes the gate folders under `root` whose process is gone; returns how many. A folder
/// named otherwise (an older build's, without a pid), or another user's, is left alone.
pub fn sweep_stale(root: &Path) -> usize {
    // Without /proc no process can be told dead here: nothing is removed.
    if !Path::new("/proc/self").exists() {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(root) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner(&name) else { continue };
        if pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
            && std::fs::remove_dir_all(entry.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// The pid in a gate folder's name: `retrace-gate-PID-…` or `retrace-gate-key-PID-…`.
fn owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let rest = rest.strip_prefix("key-").unwrap_or(rest);
    let (pid, _) = rest.split_once('-')?;
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_of_dead_gates_go_and_the_others_stay() {
        let root = tempfile::tempdir().unwrap();
        let mut dead = std::process::Command::new("true").spawn().unwrap();
        let gone = dead.id();
        dead.wait().unwrap();
        let me = std::process::id();
        for name in [
            format!("retrace-gate-{gone}-abc"),
            format!("retrace-gate-key-{gone}-abc"),
            format!("retrace-gate-{me}-abc"),
            "retrace-gate-Kour".to_owned(),
            format!("other-{gone}-abc"),
        ] {
            std::fs::create_dir(root.path().join(&name)).unwrap();
            std::fs::write(root.path().join(name).join("mask.key"), b"k").unwrap();
        }
        assert_eq!(sweep_stale(root.path()), 2);
        let mut left: Vec<String> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into())
            .collect();
        left.sort();
        let mut kept =
            [format!("other-{gone}-abc"), "retrace-gate-Kour".to_owned(), format!("retrace-gate-{me}-abc")];
        kept.sort();
        assert_eq!(left, kept);
        assert_eq!(owner("retrace-gate-key-42-x"), Some(42));
        assert_eq!(
            dir("").unwrap().path().file_name().unwrap().to_string_lossy().split('-').nth(2),
            Some(&*me.to_string())
        );
    }
}
