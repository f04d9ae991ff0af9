//! The daemon and its proxy over real loopback HTTP, a real SQLite store and the local provider
//! stand-in (`retrace_demo::providers`): record, replay, bad input, upstream failures, access
//! control, the API's read routes and its admin routes.
mod abandoned;
mod admin;
mod auth;
mod autonomy;
mod bad_input;
mod original;
mod passthrough;
mod prompt_cache;
mod reads;
mod record_replay;
mod rust_sdk;
mod support;
mod upstream_failures;
