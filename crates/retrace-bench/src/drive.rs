//! Driving the Session API the way a program does: tool steps with a request and a live output,
//! recorded from one or many threads (one agent per thread, one session).
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use retrace_runtime::{Outcome, Session, SessionOptions, ToolSpec};
use retrace_store::Store;
use serde_json::Value;

use crate::env::process_cpu;

/// The tool every bench step calls.
pub const TOOL: &str = "search";

/// The agent of thread `t`.
pub fn agent_name(t: usize) -> String {
    format!("agent-{t}")
}

/// The spec of [`TOOL`].
pub fn spec() -> ToolSpec {
    ToolSpec::deterministic("1")
}

/// What a timed recording took.
#[derive(Debug)]
pub struct Recorded {
    /// From the first step to `finish` returning (everything acknowledged).
    pub wall: Duration,
    /// Each step's latency, as the program saw it.
    pub latencies: Vec<Duration>,
    /// CPU time of the whole process over `wall`, every thread's ([`crate::env::process_cpu`]).
    pub cpu: Option<Duration>,
}

/// Records `data` (request, live output) as tool steps through one session, split into
/// `threads` contiguous slices, each recorded by its own thread and agent.
pub fn record(
    store: Arc<dyn Store>,
    data: &[(Value, Value)],
    threads: usize,
    wait_for_ack: bool,
) -> Recorded {
    let options = SessionOptions { wait_for_ack, ..SessionOptions::default() };
    let session = Session::record(store, options).expect("starting a recording");
    let slices: Vec<&[(Value, Value)]> = data.chunks(data.len().div_ceil(threads).max(1)).collect();
    let start = Barrier::new(slices.len() + 1);
    let (wall, latencies, cpu) = std::thread::scope(|scope| {
        let workers: Vec<_> = slices
            .into_iter()
            .enumerate()
            .map(|(t, slice)| {
                // The live outputs are the program's; cloning them is not Retrace's cost.
                let outputs: Vec<Value> = slice.iter().map(|(_, out)| out.clone()).collect();
                let agent = session.agent(&agent_name(t));
                let start = &start;
                scope.spawn(move || {
                    let mut latencies = Vec::with_capacity(slice.len());
                    start.wait();
                    for ((request, _), output) in slice.iter().zip(outputs) {
                        let began = Instant::now();
                        let _: Value = agent
                            .tool(TOOL, request, spec(), move || Ok::<_, String>(output))
                            .expect("recording a step");
                        latencies.push(began.elapsed());
                    }
                    latencies
                })
            })
            .collect();
        start.wait();
        let began = Instant::now();
        let cpu_before = process_cpu();
        let mut latencies = Vec::with_capacity(data.len());
        for worker in workers {
            latencies.extend(worker.join().expect("a recording thread panicked"));
        }
        session.finish(Outcome::default()).expect("finishing a recording");
        let cpu = process_cpu().zip(cpu_before).map(|(after, before)| after.saturating_sub(before));
        (began.elapsed(), latencies, cpu)
    });
    Recorded { wall, latencies, cpu }
}

/// Records `count` tool steps by one agent, pipelined, generating step `i`'s (request, output)
/// with `make(i)` a chunk at a time (so any size fits in memory). Returns the run id.
pub fn record_generated(store: Arc<dyn Store>, count: u64, make: impl Fn(u64) -> (Value, Value)) -> String {
    let options = SessionOptions { wait_for_ack: false, ..SessionOptions::default() };
    let session = Session::record(store, options).expect("starting a recording");
    let agent = session.agent(&agent_name(0));
    let mut next = 0;
    while next < count {
        let end = (next + 4096).min(count);
        let chunk: Vec<(Value, Value)> = (next..end).map(&make).collect();
        for (request, output) in chunk {
            let _: Value = agent
                .tool(TOOL, &request, spec(), move || Ok::<_, String>(output))
                .expect("recording a step");
        }
        next = end;
    }
    session.finish(Outcome::default()).expect("finishing a recording");
    session.run_id()
}
