//! Retrace's demo programs. Each is an ordinary agent program written against the runtime's
//! [`Session`](retrace_runtime::Session): it does the same thing in record and replay, and only
//! the session decides whether its model, tools, clock, randomness and deliveries are live.
//!
//! - [`trio`]: the migration trio (planner, schema agent, reviewer) and its ordering bug;
//!   [`trio_story`] records it under chaos, finds the bad runs ([`invariant`]) and replays one.
//! - [`single`]: a single-agent triage program touching every kind of step.
//! - [`pipeline`]: the 8-step pipeline (plan → … → publish) mixing model steps and tools of all
//!   three determinism classes; [`pipeline_story`] records it, forks it at `critique` and
//!   accounts for what the fork ran, reused and saved.
//! - [`masking`]: the masking the caller gives a demo's sessions.
//! - [`server`] / [`simulator`]: the demo's model simulator (OpenAI-compatible, clearly not a
//!   real model); [`client`]: the HTTP client the agents use; [`providers`]: a stand-in for the
//!   OpenAI and Anthropic HTTP APIs, streaming included, for the proxy's tests and examples.
#![warn(missing_docs)]

pub mod client;
pub mod invariant;
pub mod masking;
pub mod pipeline;
pub mod pipeline_story;
pub mod providers;
pub mod server;
pub mod simulator;
pub mod single;
pub mod story;
pub mod trio;
pub mod trio_story;
