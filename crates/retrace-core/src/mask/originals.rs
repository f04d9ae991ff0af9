//! Where the masking stage reports each secret it replaced, so the runtime can seal the
//! originals into the vault (issue 7). Reporting is opt-in: a stage without a sink keeps
//! nothing.
use std::sync::{Arc, Mutex};

/// A shared list of `(token, original)` pairs, filled as tokens are made.
#[derive(Clone, Default)]
pub struct OriginalsSink(Arc<Mutex<Vec<(String, String)>>>);

impl std::fmt::Debug for OriginalsSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the originals themselves.
        write!(f, "OriginalsSink({} pending)", self.lock().len())
    }
}

impl OriginalsSink {
    /// An empty sink.
    pub fn new() -> OriginalsSink {
        OriginalsSink::default()
    }

    /// Everything reported since the last take.
    pub fn take(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.lock())
    }

    pub(crate) fn push(&self, token: &str, original: &str) {
        self.lock().push((token.to_owned(), original.to_owned()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, String)>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
