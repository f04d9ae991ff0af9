//! Retrace's core: the replay envelope and everything about it that is pure.
//!
//! This crate does no I/O and no async. It defines:
//! - [`envelope::Event`], the replay envelope of SPEC §2, and its hash chain ([`chain`]);
//! - canonical JSON ([`canonical`], RFC 8785 with one documented exception) and
//!   [`digest::Digest`] (`sha256:<hex>`);
//! - step keys ([`key`]), computed on the output of the masking stage ([`mask`]);
//! - Lamport clocks ([`lamport`]), runs ([`run`]), the export format ([`export`]);
//! - the price table for model tokens ([`prices`]);
//! - [`divergence::Divergence`], built in one place with a stable code;
//! - the token vault's sealing of masked originals ([`vault`]), and handing originals back
//!   into a masked value ([`unmask`]).
//!
//! ```
//! use retrace_core::{envelope::EventType, json, key::KeyConfig, mask::Masker};
//!
//! let raw = br#"{"q": "select 1", "request_id": "abc"}"#;
//! let masked = Masker::empty().mask_json(raw);
//! let request = json::parse(&masked.bytes)?;
//! let key = KeyConfig::default().key(EventType::ToolCall, Some("sql.query"), Some("1"), &request)?;
//! assert!(key.to_string().starts_with("sha256:"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

pub mod autonomy;
pub mod canonical;
pub mod chain;
pub mod digest;
pub mod digest_map;
pub mod divergence;
pub mod edit;
pub mod envelope;
pub mod export;
pub mod http_doc;
pub mod json;
pub mod json_diff;
pub mod key;
pub mod label;
pub mod lamport;
pub mod ledger;
pub mod mask;
pub mod mask_http;
pub mod mask_stream;
pub mod percent;
pub mod prices;
pub mod provider_usage;
pub mod run;
pub mod terminal;
pub mod toml_table;
pub mod unmask;
pub mod vault;

pub use digest::Digest;
pub use divergence::{Divergence, DivergenceCode};
pub use envelope::{Event, EventType, Source};
