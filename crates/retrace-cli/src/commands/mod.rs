//! One module per subcommand.
pub mod agents;
pub mod approve;
pub mod demo;
pub mod diff;
pub mod export;
pub mod fork;
pub mod gate;
pub mod gc;
pub mod import;
pub mod knew;
pub mod ledger;
pub mod record;
pub mod replay;
pub mod resolve;
pub mod retain;
pub mod runs;
pub mod serve;
pub mod show;
pub mod simulate;
pub mod vault;
pub mod verify;

use std::sync::Arc;

use retrace_store::{open_store, Store, StoreConfig};

/// Opens the store named by the environment (RETRACE_STORE / RETRACE_HOME).
pub fn store_from_env() -> anyhow::Result<Arc<dyn Store>> {
    let config = StoreConfig::from_env()?;
    Ok(open_store(&config)?)
}

#[derive(Clone)]
/// The masking of new recordings, once per process: the store's mask key (generated into
/// `RETRACE_HOME/mask.key` on first use, with a notice) and `./retrace.toml`'s rules.
pub struct MaskSetup {
    /// The mask key.
    pub key: retrace_core::mask::MaskKey,
    /// The rules for new recordings.
    pub rules: retrace_core::mask::MaskRules,
}

/// [`MaskSetup`] from the environment.
pub fn mask_from_env() -> anyhow::Result<MaskSetup> {
    use retrace_runtime::masking;
    static NOTICE: std::sync::Once = std::sync::Once::new();
    let resolved = masking::resolve_key(&StoreConfig::from_env()?)?;
    if let Some(notice) = resolved.notice {
        NOTICE.call_once(|| eprintln!("{notice}"));
    }
    Ok(MaskSetup { key: resolved.key, rules: masking::rules_from_cwd()? })
}
