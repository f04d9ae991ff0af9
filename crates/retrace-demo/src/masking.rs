//! The masking a demo's sessions use, given by the caller: `retrace demo` hands in what
//! `retrace record` would use (the store's mask key, `./retrace.toml`'s rules or the defaults,
//! the vault key), so a demo's runs are masked like any other recording; tests hand in none.
use retrace_core::mask::{MaskKey, MaskRules};
use retrace_core::vault::VaultKey;
use retrace_runtime::SessionOptions;

/// The masking of a demo's sessions.
#[derive(Clone, Debug, Default)]
pub struct DemoMasking {
    /// The mask key (`None`: a key for the process, for runs that hold no token).
    pub key: Option<MaskKey>,
    /// The rules new recordings mask with (replays use the recorded ones, forks both).
    pub rules: MaskRules,
    /// The vault key, where masked originals are sealed.
    pub vault_key: Option<VaultKey>,
}

impl DemoMasking {
    /// `options` with this masking.
    pub fn apply(&self, options: SessionOptions) -> SessionOptions {
        SessionOptions {
            mask_key: self.key.clone(),
            mask_rules: self.rules.clone(),
            vault_key: self.vault_key.clone(),
            ..options
        }
    }
}
