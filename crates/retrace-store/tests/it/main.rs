//! The store's integration tests: the conformance suite on every backend, then SQLite specifics.
mod ack_log;
mod gc_props;
mod gc_scrub;
mod knew;
mod memory;
mod packed_blobs;
mod read_only;
mod sqlite;
mod sqlite_v11;
mod sqlite_v3;
mod sqlite_v4;
mod sqlite_v9;
mod steps;
mod storage;
mod tail;
mod wal_pages;
