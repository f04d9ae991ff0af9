//! One module per subcommand.
pub mod demo;
pub mod diff;
pub mod export;
pub mod fork;
pub mod gc;
pub mod import;
pub mod knew;
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
