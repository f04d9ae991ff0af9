//! Profiling aid for `retrace knew`: opens a kept bench store and asks `knew` of one step again
//! and again, printing the median time and, with `PHASES=1` set, each phase's (for perf and
//! callgrind).
//!
//! ```text
//! cargo run --release -p retrace-bench --example knew_probe -- DB RUN SEQ [ITERATIONS]
//! ```
use std::path::Path;
use std::time::Instant;

use retrace_store::causal::{knew, MAX_CHAIN};
use retrace_store::sqlite::SqliteStore;
use retrace_store::{Durability, EventStore, Store};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [db, run, seq, rest @ ..] = args.as_slice() else {
        eprintln!("usage: knew_probe DB RUN SEQ [ITERATIONS]");
        std::process::exit(2);
    };
    let seq: u64 = seq.parse().expect("a seq");
    let n: usize = rest.first().map_or(20, |s| s.parse().expect("a count"));
    let blobs = Path::new(db).parent().expect("a folder").join("blobs");
    let store = SqliteStore::open(Path::new(db), &blobs, Durability::Batch, 5_000).expect("opening");
    let k = knew(&store, run, seq).expect("knew");
    let links: usize = k.heard.iter().map(|h| h.chain.len()).sum();
    eprintln!("{} heard, {links} links", k.heard.len());
    let mut total = Vec::new();
    let mut phases = vec![Vec::new(); 2];
    for _ in 0..n {
        let t = Instant::now();
        std::hint::black_box(knew(&store, run, seq).expect("knew"));
        total.push(t.elapsed().as_secs_f64() * 1e3);
        if std::env::var_os("PHASES").is_some() {
            // Inside one snapshot, as `knew` reads.
            store.with_snapshot(&mut || {
                let t = Instant::now();
                let step = store.event(run, seq).expect("event");
                let d = store.heard_by(run, &step.agent_id, seq).expect("deliveries");
                phases[0].push(t.elapsed().as_secs_f64() * 1e3);
                let mut sends: Vec<u64> = d.iter().filter_map(|(d, _)| d.causal_parent).collect();
                sends.sort_unstable();
                sends.dedup();
                let t = Instant::now();
                let c = store.chain_heads(run, &sends, MAX_CHAIN).expect("chains");
                phases[1].push(t.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box((c, d));
            });
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    eprintln!("knew median {:.2} ms (min {:.2})", median(&mut total), total[0]);
    for (name, v) in ["step+heard_by (deliveries and bodies)", "chain_heads"].iter().zip(&mut phases) {
        if !v.is_empty() {
            eprintln!("  {name}: {:.2} ms", median(v));
        }
    }
}
