//! `retrace-bench`: Retrace's performance benchmarks (issue 2), each printed beside the floor
//! measured in the same run.
//!
//! ```text
//! cargo run --release -p retrace-bench -- <record|durable|replay|export|storage|proxy|gate|mask|mask-record|mask-stream|all> [--quick]
//! ```
//!
//! Every measurement is the median of `--repeats` (default 5) runs and prints one line: name,
//! median, floor, ratio, target and PASS / MISS (INFO for context lines). Stores and files go
//! to `RETRACE_BENCH_DIR` (default: the system temp folder), which should be on the disk being
//! measured; `RETRACE_BENCH_KEEP=1` keeps them for inspection. `--quick` sizes every input for
//! CI (the whole `all` in well under two minutes).
/// The allocator of the shipped `retrace` binary, so the benches measure what users run: with 16
/// agents recording on two cores it took 6-12% less CPU per step than the system's (see
/// ARCHITECTURE.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod breakdown;
mod bus;
mod counting;
mod drive;
mod durable;
mod env;
mod floor;
mod fork;
mod gate;
mod knew;
mod machine;
mod mask;
mod mask_record;
mod mask_stream;
mod payload;
mod proxy;
mod proxy_load;
mod proxy_net;
mod proxy_vcr;
mod record;
mod replay;
mod report;
mod scheduler;
mod storage;
mod transfer;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use env::Config;
use report::Line;

type Bench = fn(&Config, &mut Vec<Line>);

/// Every bench, in the order `all` runs them.
const BENCHES: &[(&str, Bench, &str)] = &[
    ("record", record::run, "record with batch durability: 1 and 16 writers vs the raw floor and Burr"),
    ("durable", durable::run, "record with event durability: latency vs raw fsync, group commit"),
    ("replay", replay::run, "replay through the Session and store-only serving; peak RSS"),
    ("export", transfer::run, "export and import: events/s and MB/s on a blob-heavy file"),
    ("storage", storage::run, "bytes on disk for a 200-turn chat vs message bytes + 600 B/event"),
    ("scheduler", scheduler::run, "replay scheduler overhead per step beyond the store, 2/16/128 agents"),
    ("bus", bus::run, "16 agents messaging in a ring: msg/s and µs/event vs the record floor"),
    ("knew", knew::run, "causal query `knew`: 1,000 deliveries in a 1M-event run, and 1k vs 1M"),
    ("fork", fork::run, "fork at the midpoint, 1 edit reaching 1%, 20 ms model; diff of 100k steps"),
    ("proxy", proxy::run, "proxy TTFB and chunk delay added, 64 replays under wrk, vs VCR.py"),
    ("gate", gate::run, "retrace gate: 100 traces of 1,000 steps; overhead per trace, --jobs 2 vs 1"),
    ("mask", mask::run, "masking with the default rules: chat JSON without secrets and dense text, MB/s"),
    (
        "mask-record",
        mask_record::run,
        "record overhead of the default masking rules on realistic chat steps, vs none",
    ),
    ("mask-stream", mask_stream::run, "a 2 MB stream document masked per output part, vs mask_json"),
    ("breakdown", breakdown::run, "(not in all) a step's parts timed alone, for profiling"),
];

fn usage() -> String {
    let mut text = String::from("usage: retrace-bench <bench|all> [--quick] [--repeats N]\n\nbenches:\n");
    for (name, _, what) in BENCHES {
        text.push_str(&format!("  {name:<8} {what}\n"));
    }
    text
}

fn main() -> ExitCode {
    let all: Vec<String> = std::env::args().skip(1).collect();
    if all.first().map(String::as_str) == Some(replay::CHILD) {
        return replay::child(&all[1..]);
    }
    if all.first().map(String::as_str) == Some(gate::PROGRAM) {
        return gate::program(&all[1..]);
    }
    if all.first().map(String::as_str) == Some(proxy_net::CHILD) {
        return proxy_net::child(&all[1..]);
    }
    let mut args = all.into_iter();
    let (mut which, mut quick, mut repeats) = (None, false, 5);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--repeats" => match args.next().and_then(|n| n.parse().ok()).filter(|n| *n >= 1) {
                Some(n) => repeats = n,
                None => {
                    eprintln!("--repeats wants a number >= 1\n\n{}", usage());
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                print!("{}", usage());
                return ExitCode::SUCCESS;
            }
            name if which.is_none() && !name.starts_with('-') => which = Some(name.to_owned()),
            other => {
                eprintln!("unexpected argument {other:?}\n\n{}", usage());
                return ExitCode::from(2);
            }
        }
    }
    let Some(which) = which else {
        eprint!("{}", usage());
        return ExitCode::from(2);
    };
    let selected: Vec<_> = BENCHES
        .iter()
        .filter(|(name, ..)| (which == "all" && *name != "breakdown") || which == *name)
        .collect();
    if selected.is_empty() {
        eprintln!("unknown bench {which:?}\n\n{}", usage());
        return ExitCode::from(2);
    }
    let dir = std::env::var_os("RETRACE_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("retrace-bench: can't create the bench folder {}: {e}", dir.display());
        return ExitCode::from(2);
    }
    let keep = std::env::var_os("RETRACE_BENCH_KEEP").is_some_and(|v| v == "1");
    let config = Config { quick, repeats, dir, keep };
    println!(
        "retrace-bench {which}{} — {repeats} repeats, medians; files under {}",
        if quick { " --quick" } else { "" },
        config.dir.display()
    );
    report::header();
    let began = Instant::now();
    let mut lines = Vec::new();
    machine::run(&config, &mut lines);
    for (name, bench, _) in selected {
        let start = Instant::now();
        bench(&config, &mut lines);
        eprintln!("  .. {name} took {:.1} s", start.elapsed().as_secs_f64());
    }
    let missed: Vec<&str> = lines.iter().filter(|l| l.verdict() == "MISS").map(|l| l.name.as_str()).collect();
    let passed = lines.iter().filter(|l| l.verdict() == "PASS").count();
    println!(
        "{passed} PASS, {} MISS, total {:.1} s{}",
        missed.len(),
        began.elapsed().as_secs_f64(),
        if missed.is_empty() { String::new() } else { format!(" (missed: {})", missed.join("; ")) }
    );
    ExitCode::SUCCESS
}
