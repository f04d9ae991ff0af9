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
//!
//! # Several agents
//!
//! Each agent is a tokio task ([`Session::spawn`]) taking steps through its [`Agent`]. Replay runs
//! the same program against the recording: no tool function runs (a side effect least of all),
//! clock reads and random ids come back as recorded, and each agent hears the messages it heard,
//! in the same order. Anything else the program asks for is a [`retrace_core::Divergence`],
//! carried by the [`RuntimeError`] ([`RuntimeError::divergence`]).
//!
//! ```
//! use std::sync::Arc;
//! use retrace_runtime::retrace_store::{sqlite::SqliteStore, Store};
//! use retrace_runtime::{DivergenceCode, Outcome, RuntimeResult, Session, SessionOptions, ToolSpec};
//! use serde_json::{json, Value};
//!
//! /// The planner counts rows and tells the reviewer, who emails ops and approves.
//! async fn program(s: &Session, table: &'static str) -> RuntimeResult<()> {
//!     let planner = s.spawn("planner", move |a| async move {
//!         let (at, id) = (a.now_ms()?, a.random_id()?);
//!         let count = ToolSpec::deterministic("1");
//!         let n: u64 = a.tool("sql.count", &json!({ "table": table }), count, || Ok::<_, String>(42))?;
//!         a.send("reviewer", "count", &json!({ "n": n, "id": id, "at": at }), None).await
//!     });
//!     let reviewer = s.spawn("reviewer", |a| async move {
//!         let heard = a.recv(None).await?.expect("None only on a timeout");
//!         let email = ToolSpec::side_effect("1");
//!         let _sent: Value = a.tool("email.send", &heard.body, email, || {
//!             Ok::<_, String>(json!({ "queued": true })) // record only: replay never sends it
//!         })?;
//!         a.decide("approve", Some("backfill"))
//!     });
//!     planner.await.expect("the planner's task")?;
//!     reviewer.await.expect("the reviewer's task")
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // A real SQLite store in a temporary folder (deleted on drop); `retrace_store::open_store`
//!     // opens the one `RETRACE_HOME` names.
//!     let store: Arc<dyn Store> = Arc::new(SqliteStore::temporary()?);
//!     let rec = Session::record(store.clone(), SessionOptions::default())?;
//!     program(&rec, "users").await?;
//!     let run = rec.finish(Outcome::default())?.run_id;
//!
//!     // The same program replays exactly, with no live call.
//!     let replay = Session::replay(store.clone(), &run, SessionOptions::default())?;
//!     program(&replay, "users").await?;
//!     assert_eq!(replay.finish(Outcome::default())?.live_calls, 0);
//!
//!     // A changed argument: the divergence names its code, agent, step and first differing path.
//!     let changed = Session::replay(store, &run, SessionOptions::default())?;
//!     let err = program(&changed, "orders").await.unwrap_err();
//!     let d = err.divergence().expect("a divergence");
//!     assert_eq!((d.code, d.agent.as_str()), (DivergenceCode::StepMismatch, "planner"));
//!     assert_eq!((d.step.as_deref(), d.path.as_deref()), (Some("tool_call sql.count"), Some("$.table")));
//!     Ok(())
//! }
//! ```
//!
//! # Under the `retrace` command
//!
//! A program that opens its session with [`Session::from_env`] needs no store of its own: run
//! under `retrace record -- CMD`, it finds `RETRACE_URL` set and takes every step through the
//! embedded daemon (the run's one sequencer, which also records the model calls made through
//! its proxy), and `retrace replay RUN` runs the recorded command again against the recording,
//! exiting 1 on a divergence. There the launcher judges the run once the program has exited
//! (see [`RunReport::status`]). `crates/retrace-cli/examples/remote_agents.rs` is such a
//! program, two agents and a model call; with `retrace simulate` serving a stand-in model API on
//! 127.0.0.1:8100:
//!
//! ```text
//! retrace record --upstream-openai http://127.0.0.1:8100/v1 -- cargo run -p retrace-cli --example remote_agents
//! retrace replay RUN    # the run id `record` printed; no model server needed
//! ```
#![warn(missing_docs)]

pub mod agent;
mod approval;
pub mod autonomy;
mod block;
mod bus;
pub mod config_file;
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
mod panic;
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

// What a program using the runtime meets in its signatures and errors, so that this crate alone
// is enough to write one (QA18 S1); the crates themselves for the rest (stores, the envelope).
pub use retrace_core::envelope::{ToolClass, Usage};
pub use retrace_core::run::RunStatus;
pub use retrace_core::{Divergence, DivergenceCode};
pub use {retrace_core, retrace_store};
