//! The daemon and its proxy over real loopback HTTP, a real SQLite store and the local provider
//! stand-in (`retrace_demo::providers`): record, replay, bad input, upstream failures.
mod bad_input;
mod record_replay;
mod support;
mod upstream_failures;
