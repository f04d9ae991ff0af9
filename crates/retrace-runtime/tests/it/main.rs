//! Integration tests of the runtime: one binary, one module per feature.
mod replay;
mod roundtrip;
