//! Identical calls of one agent in flight at once, which a replay can't tell apart.
//!
//! Replay hands out the answers of identical requests (one agent, one key) in the order they
//! were recorded (SPEC §7), to requests in the order they arrive. Identical requests sent at once
//! (best-of-n sampling with `asyncio.gather`) arrive in no fixed order, in record as in replay:
//! over HTTP nothing says which caller sent which, so a replay may hand each caller another's
//! answer. Holding the later answers back until the earlier calls were recorded was tried: it
//! did not help calls sent at the same moment, and it delayed answers the upstream had already
//! given, so clients timed out under record only. So the proxy says so instead, once per run and
//! agent, with the two ways to keep each caller's answer: its own agent, or a request that differs.
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use retrace_core::digest::DigestWriter;
use retrace_core::Digest;

use super::Call;

/// Calls in flight, by run, agent and request.
#[derive(Default)]
struct Flights {
    calls: HashMap<(String, String, Digest), usize>,
    said: HashSet<(String, String)>,
}

fn flights() -> std::sync::MutexGuard<'static, Flights> {
    static FLIGHTS: OnceLock<Mutex<Flights>> = OnceLock::new();
    FLIGHTS.get_or_init(Mutex::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// A call counted in flight until dropped.
pub(crate) struct InFlight {
    at: (String, String, Digest),
}

impl InFlight {
    /// Counts `call` in flight; says on standard error, once per run and agent, when an
    /// identical call of its agent is in flight already.
    pub(crate) fn enter(call: &Arc<Call>) -> InFlight {
        let mut request = DigestWriter::new();
        for part in [call.method.as_str().as_bytes(), call.path.as_bytes(), &call.body] {
            request.update(&(part.len() as u64).to_le_bytes());
            request.update(part);
        }
        for (name, value) in call.key_headers() {
            request.update(name.as_bytes());
            request.update(value.as_bytes());
        }
        let at = (call.run.clone(), call.agent.clone(), request.finish());
        let mut flights = flights();
        let count = flights.calls.entry(at.clone()).or_insert(0);
        *count += 1;
        if *count > 1 && flights.said.insert((at.0.clone(), at.1.clone())) {
            eprintln!(
                "retrace: warning: agent {:?} of run {} made identical calls at once ({} {}): a replay can't \
                 tell which caller sent which, and hands their answers out in the order the calls arrive. \
                 To replay each caller's answer, give each caller its own agent (X-Retrace-Agent) or make \
                 the requests differ",
                at.1, at.0, call.method, call.path
            );
        }
        InFlight { at }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut flights = flights();
        if let Some(count) = flights.calls.get_mut(&self.at) {
            *count -= 1;
            if *count == 0 {
                flights.calls.remove(&self.at);
            }
        }
    }
}
