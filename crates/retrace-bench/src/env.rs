//! What every bench shares: the run configuration, throwaway stores on the work disk, and
//! process facts (peak RSS, bytes on disk).
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use retrace_store::sqlite::SqliteStore;
use retrace_store::{Durability, Store};
use tempfile::TempDir;

/// How a bench run is sized.
#[derive(Clone, Debug)]
pub struct Config {
    /// CI-sized inputs.
    pub quick: bool,
    /// Timed repeats per measurement (the median is reported).
    pub repeats: usize,
    /// Where stores and files go (`RETRACE_BENCH_DIR`, else the system temp folder).
    pub dir: PathBuf,
    /// Keep every store and file for inspection (`RETRACE_BENCH_KEEP=1`).
    pub keep: bool,
}

impl Config {
    /// `quick` or `full`.
    pub fn pick<T>(&self, quick: T, full: T) -> T {
        if self.quick {
            quick
        } else {
            full
        }
    }

    /// A new empty folder under [`Config::dir`], deleted on drop.
    pub fn temp_dir(&self, what: &str) -> TempDir {
        let mut dir = tempfile::Builder::new()
            .prefix(&format!("retrace-bench-{what}-"))
            .tempdir_in(&self.dir)
            .expect("creating a temporary folder for a bench");
        if self.keep {
            dir.disable_cleanup(true);
            note(&format!("keeping {}", dir.path().display()));
        }
        dir
    }

    /// A fresh SQLite store (as `retrace` opens it by default, with `durability`).
    pub fn store(&self, what: &str, durability: Durability) -> BenchStore {
        let dir = self.temp_dir(what);
        let sqlite =
            SqliteStore::open(&dir.path().join("retrace.db"), &dir.path().join("blobs"), durability, 5_000)
                .expect("opening a bench store");
        let sqlite = Arc::new(sqlite);
        BenchStore { store: sqlite.clone(), sqlite, dir }
    }
}

/// A throwaway store; its folder is deleted on drop.
pub struct BenchStore {
    /// The store, as sessions take it.
    pub store: Arc<dyn Store>,
    /// The same store, for SQLite-only calls (checkpoint).
    pub sqlite: Arc<SqliteStore>,
    /// Its folder.
    pub dir: TempDir,
}

impl std::fmt::Debug for BenchStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BenchStore").field("dir", &self.dir.path()).finish()
    }
}

/// A field of `/proc/self/status` in kB (`VmHWM`, `VmRSS`), if readable.
pub fn status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
    line[field.len() + 1..].trim().trim_end_matches("kB").trim().parse().ok()
}

/// CPU time this process has used so far, on every thread (exited ones included): `utime` +
/// `stime` of `/proc/self/stat`, in clock ticks of 10 ms (`USER_HZ` is 100 on Linux). Less
/// noisy than wall time on a shared VM, so a change's cost shows in a few runs.
pub fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at field 3, `state`.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
    let ticks = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    Some(Duration::from_millis((ticks(14)? + ticks(15)?) * 10))
}

/// Resets the peak RSS (`VmHWM`) to the current RSS (Linux ≥ 4.0); false when not possible.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Bytes of every file under `path` (0 when absent).
pub fn disk_bytes(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return 0 };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .map(|entries| entries.filter_map(Result::ok).map(|e| disk_bytes(&e.path())).sum())
        .unwrap_or(0)
}

/// Progress for the operator, on stderr (stdout holds only the table).
pub fn note(what: &str) {
    eprintln!("  .. {what}");
}
