//! Proofs of the multi-agent runtime (SPEC §7) under stress: sixteen and more agents as tokio
//! tasks with seeded random delays, fan-in and fan-out messaging, recv timeouts, and tool steps
//! whose arguments depend on what each agent heard, recorded under hundreds of chaos seeds and
//! replayed under different OS scheduling. What every replay must show:
//!
//! - each agent takes the same steps (types and keys) in the same order, and hears the same
//!   messages (sender, send seq, body) in the same order; nothing runs live;
//! - strict replay releases recorded seqs in exactly the recorded global order;
//! - agents that also wait on each other outside Retrace (a lock, a bounded channel) never
//!   deadlock in default mode;
//! - a divergence is reported at the first divergent step and releases every other agent.
//!
//! And of every recording: seqs are dense and unique under concurrency, and Lamport clocks are
//! consistent with happened-before (same agent, send → deliver, transitively).
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use retrace_core::Event;
use retrace_store::Store;

mod divergence;
mod lamport;
mod outside_waits;
mod program;
mod regressions;
mod seeds;

/// Guard against hangs: no single record or replay of these programs takes anywhere near this.
const RUN_LIMIT: Duration = Duration::from_secs(20);

fn agent_name(i: usize) -> String {
    format!("a{i:02}")
}

/// splitmix64: what the "live" tools compute.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A seeded scheduling perturbation: nothing, a yield, or a sleep of 0–2 ms.
async fn jitter(rng: &mut StdRng) {
    match rng.gen_range(0..4) {
        0 => {}
        1 => tokio::task::yield_now().await,
        _ => tokio::time::sleep(Duration::from_micros(rng.gen_range(0..=2_000))).await,
    }
}

fn panic_again(e: tokio::task::JoinError) -> ! {
    match e.try_into_panic() {
        Ok(payload) => std::panic::resume_unwind(payload),
        Err(e) => panic!("task failed: {e}"),
    }
}

/// Reads a run's events, page by page.
fn all_events(store: &dyn Store, run: &str) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    loop {
        let page = store.events(run, out.len() as u64 + 1, 4096).unwrap();
        let done = page.len() < 4096;
        out.extend(page);
        if done {
            return out;
        }
    }
}
