//! The store's integration tests: the conformance suite on every backend, then SQLite specifics.
mod memory;
mod sqlite;
mod storage;
