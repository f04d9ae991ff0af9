//! Where `retrace.toml` is: the nearest one at or above the working folder, up to the git top
//! level, so a program run from a subfolder of its project (`services/agent/`) gets the
//! project's masking rules, autonomy policy and retention, not none. Outside git only the
//! folder itself is looked in: a file in some parent folder is not the project's.
use std::path::{Path, PathBuf};

/// The project configuration file: `[mask]`, `[autonomy]`, `[project]`, `[retention]`.
pub const CONFIG_FILE: &str = "retrace.toml";

/// The folder whose `retrace.toml` applies to `dir`: `dir` when it holds one (or when none is
/// found), else the nearest folder above it, up to the git top level, that holds one. Paths
/// the file names (a ledger) are relative to this folder.
pub fn config_dir(dir: &Path) -> PathBuf {
    if dir.join(CONFIG_FILE).exists() {
        return dir.to_path_buf();
    }
    let Ok(absolute) = dir.canonicalize() else { return dir.to_path_buf() };
    let Some(top) = absolute.ancestors().find(|d| d.join(".git").exists()) else {
        return dir.to_path_buf();
    };
    let nearest =
        absolute.ancestors().take_while(|d| d.starts_with(top)).find(|d| d.join(CONFIG_FILE).is_file());
    nearest.map_or_else(|| dir.to_path_buf(), Path::to_path_buf)
}

/// The price table of the project `dir` is in: the built-in prices, then `[prices]` of its
/// `retrace.toml` ([`config_dir`]), which add to or override them (QA32 D1: only the demo read
/// the table; recordings priced every model at its built-in price).
pub fn prices_in(dir: &Path) -> crate::RuntimeResult<retrace_core::prices::PriceTable> {
    let mut table = retrace_core::prices::PriceTable::builtin();
    let path = config_dir(dir).join(CONFIG_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => table.merge(
            retrace_core::prices::PriceTable::parse_toml(&text)
                .map_err(|e| crate::RuntimeError::Usage(format!("{}: {e}", path.display())))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(crate::RuntimeError::Usage(format!("reading {}: {e}", path.display()))),
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_file_up_to_the_git_top_level_applies() {
        let root = tempfile::tempdir().unwrap();
        let project = root.path().join("project");
        let sub = project.join("services").join("agent");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::create_dir(project.join(".git")).unwrap();
        // Above the git top level: never the project's.
        std::fs::write(root.path().join(CONFIG_FILE), "").unwrap();
        assert_eq!(config_dir(&sub), sub, "none in the project");
        std::fs::write(project.join(CONFIG_FILE), "").unwrap();
        assert_eq!(config_dir(&sub), project.canonicalize().unwrap());
        std::fs::write(sub.join(CONFIG_FILE), "").unwrap();
        assert_eq!(config_dir(&sub), sub, "the nearest wins");
        // Outside git: the folder itself only.
        let loose = root.path().join("loose");
        std::fs::create_dir(&loose).unwrap();
        assert_eq!(config_dir(&loose), loose);
    }

    #[test]
    fn prices_come_from_the_projects_file_over_the_built_in_ones() {
        use retrace_core::envelope::Usage;
        let dir = tempfile::tempdir().unwrap();
        let million = Usage { input_tokens: 1_000_000, ..Default::default() };
        assert_eq!(prices_in(dir.path()).unwrap().cost("gpt-4o", &million), Some(2.5), "built-in");
        std::fs::write(dir.path().join(CONFIG_FILE), "[prices]\n\"gpt-4o\" = { input = 100, output = 1 }\n")
            .unwrap();
        assert_eq!(prices_in(dir.path()).unwrap().cost("gpt-4o", &million), Some(100.0), "overridden");
        std::fs::write(dir.path().join(CONFIG_FILE), "[prices]\n\"x\" = 3\n").unwrap();
        let err = prices_in(dir.path()).unwrap_err().to_string();
        assert!(err.contains("retrace.toml") && err.contains("line 2"), "{err}");
    }
}
