//! Retrace's Rust runtime: the [`Session`] that records and replays an agent program's steps.
//!
//! Record and replay run the same code (`step.rs`): every step is canonicalised, masked, keyed,
//! and then either executed live and appended to the log, or matched by key against its agent's
//! not-yet-consumed recorded steps (SPEC §7) and answered from the log with nothing live.
//!
//! ```
//! use std::sync::Arc;
//! use retrace_runtime::{Outcome, Session, SessionOptions, ToolSpec};
//! use retrace_store::memory::MemoryStore;
//!
//! let store: Arc<dyn retrace_store::Store> = Arc::new(MemoryStore::new());
//! let rec = Session::record(store.clone(), SessionOptions::default())?;
//! let agent = rec.agent("planner");
//! let n: u64 = agent.tool("add", &(2, 3), ToolSpec::deterministic("1"), || Ok::<_, String>(5u64))?;
//! rec.finish(Outcome::default())?;
//!
//! let replay = Session::replay(store, &rec.run_id(), SessionOptions::default())?;
//! let again: u64 = replay.agent("planner").tool("add", &(2, 3), ToolSpec::deterministic("1"), || -> Result<u64, String> {
//!     unreachable!("replay never runs the tool")
//! })?;
//! assert_eq!(n, again);
//! replay.finish(Outcome::default())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

pub mod agent;
mod approval;
pub mod autonomy;
mod block;
mod bus;
pub mod env_sources;
pub mod error;
mod finite;
pub mod fork;
mod fork_messaging;
pub mod fork_sched;
mod fork_step;
pub mod http_model;
pub mod log_end;
pub mod masking;
pub mod matcher;
mod messaging;
pub mod remote;
mod remote_client;
pub mod remote_session;
pub mod scheduler;
pub mod session;
mod step;
pub mod template;
pub mod vaulting;

pub use agent::{Agent, ModelCall, ModelReply, ToolSpec};
pub use error::{Refusal, RuntimeError, RuntimeResult};
pub use http_model::{HttpModelCall, HttpModelOutput, HttpModelReply};
pub use messaging::Message;
pub use remote::{RemoteKind, RemoteStep};
pub use remote_session::DaemonRun;
pub use scheduler::{Scheduler, SchedulerConfig};
pub use session::{Mode, Outcome, RunReport, Session, SessionOptions};
