//! Integration tests of the runtime: one binary, one module per feature.
mod autonomy;
mod fork;
mod fork_props;
mod interrupted;
mod masking;
mod messages;
mod proxied;
mod replay;
mod resolve;
mod retention;
mod roundtrip;
mod vault;
