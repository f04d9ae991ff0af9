//! Retrace's demo programs. Each is an ordinary agent program written against the runtime's
//! [`Session`](retrace_runtime::Session): it does the same thing in record and replay, and only
//! the session decides whether its model, tools, clock and randomness run live.
#![warn(missing_docs)]

pub mod simulator;
pub mod single;
pub mod story;
