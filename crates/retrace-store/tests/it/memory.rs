//! The conformance suite on [`MemoryStore`].
use std::sync::Arc;

use retrace_store::conformance;
use retrace_store::memory::MemoryStore;
use retrace_store::Store;

fn make() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

#[test]
fn memory_store_conforms() {
    conformance::run_all(&make);
}
