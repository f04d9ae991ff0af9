//! Per-request replay cost against VCR.py (issue 5: VCR.py replaying a 200-interaction cassette
//! is about 4.1 ms per request on this machine class; target ≥ 8× faster, and flat as the run
//! grows). Both sides of each comparison use the same Python client, from
//! `bench/vcr_baseline.py`, run by the virtualenv in `RETRACE_BENCH_VENV` (default
//! `target/bench-venv`; it needs vcrpy and httpx). VCR.py records a 200-interaction cassette
//! against the local upstream and replays it with its default matchers (method and URL,
//! interactions in recorded order: the 4.1 ms baseline); with body matching too, as
//! Retrace matches on the request's key, VCR.py is about 10x slower still (measured once, full
//! runs only). Retrace replays runs of 200, 2,000 and 20,000 recorded calls through the daemon.
//! Per request = the whole replay (cassette load / replay open included) divided by its calls.
//!
//! Two clients, each on both sides:
//! - `http.client`, the standard library's keep-alive connection (VCR.py patches it too): the
//!   lines held to the target, since a client this lean shows each recorder's own cost;
//! - `httpx`, what the official openai and anthropic clients use: reported beside its floor
//!   (httpx straight to the upstream). httpx by itself costs ~0.4-1 ms of Python per request,
//!   paid alike under VCR.py (which answers inside it) and Retrace, so it caps the ratio at
//!   VCR.py / httpx-alone whatever the recorder costs (~4-5x here).
//!
//! Each run is also replayed by this binary's minimal client (the daemon's cost without Python's
//! on top) with the daemon's CPU per call beside it.
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

use crate::env::{note, Config};
use crate::proxy_net::{chat_body, chat_path, cpu_seconds, percentile, Http, Proc};
use crate::report::{print, Line, Target};

/// The cassette VCR.py replays.
const CASSETTE: usize = 200;
/// Recording client threads (setup).
const RECORDERS: usize = 4;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> Option<PathBuf> {
    let venv = std::env::var_os("RETRACE_BENCH_VENV")
        .map_or_else(|| workspace().join("target/bench-venv"), PathBuf::from);
    let python = venv.join("bin/python");
    let ok =
        Command::new(&python).args(["-c", "import vcr, httpx"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

fn script(python: &PathBuf, args: &[String]) -> Value {
    let out = Command::new(python)
        .arg(workspace().join("bench/vcr_baseline.py"))
        .args(args)
        .output()
        .expect("running bench/vcr_baseline.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.trim().is_empty() {
        note(stderr.trim());
    }
    assert!(out.status.success(), "bench/vcr_baseline.py failed ({}): {stdout}", out.status);
    serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("the script's JSON line")
}

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let Some(python) = python() else {
        note(
            "proxy vcr: no virtualenv with vcrpy and httpx (python3 -m venv target/bench-venv && \
             target/bench-venv/bin/pip install vcrpy httpx, or set RETRACE_BENCH_VENV); skipped",
        );
        return;
    };
    let sizes: &[usize] = if cfg.quick { &[200, 2_000] } else { &[200, 2_000, 20_000] };
    note(&format!(
        "proxy vcr: VCR.py replaying a {CASSETTE}-interaction cassette vs Retrace replaying runs of {sizes:?} calls, through the same client"
    ));
    let home = cfg.temp_dir("proxy-vcr");
    let upstream = Proc::upstream();
    let upstream_v1 = format!("{}/v1", upstream.url());
    let daemon = Proc::daemon(&home.path().join("store"), &upstream_v1, &upstream.url());
    let template = String::from_utf8(chat_body("sim", false, "TAGTAGTAG", 987_654_321)).expect("UTF-8");
    let repeats = cfg.repeats.to_string();
    let with = |cmd: &str, client: &str, rest: &[&str]| -> Vec<String> {
        let mut args: Vec<String> =
            vec![cmd.into(), "--client".into(), client.into(), "--template".into(), template.clone()];
        args.extend(rest.iter().map(|a| (*a).to_owned()));
        args
    };

    // VCR.py and the client's own floor, per client.
    let mut sides = Vec::new();
    for client in CLIENTS {
        let dir = home.path().display().to_string();
        let n = CASSETTE.to_string();
        let replay_cassette = |matching: &str, repeats: &str| {
            let args = [
                "--upstream",
                &upstream_v1,
                "--dir",
                &dir,
                "--n",
                &n,
                "--match",
                matching,
                "--repeats",
                repeats,
            ];
            script(&python, &with("vcr", client.name, &args))
        };
        let vcr = replay_cassette("default", &repeats);
        note(&format!("VCR.py ({}): {vcr}", client.name));
        let vcr_us = vcr["per_request_us"].as_f64().unwrap_or(f64::NAN);
        let info =
            |name: &str, value: f64, unit: &'static str| Line::new(name, value, unit, None, Target::Info);
        print(lines, info(&format!("vcr.py replay {CASSETTE}-cassette ({})", client.name), vcr_us, "us/req"));
        print(
            lines,
            info(
                &format!("vcr.py ({}): single request p50 (load excluded)", client.name),
                vcr["call_p50_us"].as_f64().unwrap_or(f64::NAN),
                "us",
            ),
        );
        if client.name == "httpx" && !cfg.quick {
            let body = replay_cassette("body", "1");
            note(&format!("VCR.py matching bodies: {body}"));
            let us = body["per_request_us"].as_f64().unwrap_or(f64::NAN);
            print(
                lines,
                info(&format!("vcr.py replay {CASSETTE}-cassette, body matching (httpx)"), us, "us/req"),
            );
        }
        let direct = script(
            &python,
            &with("direct", client.name, &["--upstream", &upstream_v1, "--n", &n, "--repeats", &repeats]),
        );
        let floor_us = direct["per_request_us"].as_f64().unwrap_or(f64::NAN);
        print(lines, info(&format!("{} to the upstream directly (floor)", client.name), floor_us, "us/req"));
        sides.push((client, vcr_us, floor_us));
    }

    let mut api = Http::connect(&daemon.addr);
    let mut first: Vec<Option<(usize, f64)>> = vec![None; sides.len()];
    for &n in sizes {
        let tag = format!("size-{n}");
        let run = api.new_run(&format!("bench-vcr-{n}"));
        let began = Instant::now();
        std::thread::scope(|s| {
            for t in 0..RECORDERS {
                let (path, addr, tag) = (chat_path(&run), &daemon.addr, &tag);
                s.spawn(move || {
                    let mut http = Http::connect(addr);
                    for i in (t..n).step_by(RECORDERS) {
                        let reply = http.post(&path, &chat_body("sim", false, tag, i));
                        assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
                    }
                });
            }
        });
        api.finish(&run);
        note(&format!("recorded {n} calls in {:.1} s; replaying", began.elapsed().as_secs_f64()));
        let reps = if n >= 20_000 { "1".to_owned() } else { repeats.clone() };
        for (side, &(client, vcr_us, floor_us)) in sides.iter().enumerate() {
            let (base, ns) = (daemon.url(), n.to_string());
            let rest = ["--base", &base, "--source", &run, "--tag", &tag, "--n", &ns, "--repeats", &reps];
            let r = script(&python, &with("retrace", client.name, &rest));
            note(&format!("retrace {n} ({}): {r}", client.name));
            let per = r["per_request_us"].as_f64().unwrap_or(f64::NAN);
            let bad =
                r["non200"].as_f64().unwrap_or(0.0) + r["replays_not_completed"].as_f64().unwrap_or(0.0);
            if client.held {
                let name = format!("proxy.replay {n}-call run vs vcr.py ({})", client.name);
                print(lines, Line::new(&name, per, "us/req", Some(vcr_us), Target::TimesBelow(8.0)));
            } else {
                let name = format!("proxy.replay {n}: vcr.py / retrace, both {}", client.name);
                print(lines, Line::new(&name, vcr_us / per, "x", None, Target::Info));
            }
            let name = format!("proxy.replay {n} ({}) vs its floor", client.name);
            print(lines, Line::new(&name, per, "us/req", Some(floor_us), Target::Info));
            let p50 = r["call_p50_us"].as_f64().unwrap_or(f64::NAN);
            let name = format!("proxy.replay {n} ({}): single request p50", client.name);
            print(lines, Line::new(&name, p50, "us", None, Target::Info));
            if bad > 0.0 {
                let name = format!("proxy.replay {n} ({}): non-200 or not completed", client.name);
                print(lines, Line::new(&name, bad, "", None, Target::Info));
            }
            match first[side] {
                None => first[side] = Some((n, per)),
                Some((n0, per0)) => print(
                    lines,
                    Line::new(
                        &format!("proxy.replay per req ({}), {n} vs {n0} calls", client.name),
                        per,
                        "us/req",
                        Some(per0),
                        if client.held { Target::RatioAtMost(1.5) } else { Target::Info },
                    ),
                ),
            }
        }
        let (rust_per, daemon_cpu) =
            rust_client_replay(&mut api, &daemon, &run, &tag, n, reps.parse().unwrap_or(1));
        // The daemon's own replay cost, without Python's HTTP client on top: VCR.py only runs
        // under a Python client, so shown, not held to the target.
        let info =
            |name: String, value: f64, unit: &'static str| Line::new(&name, value, unit, None, Target::Info);
        print(lines, info(format!("proxy.replay {n}: Rust client per req"), rust_per, "us/req"));
        for &(client, vcr_us, _) in &sides {
            print(
                lines,
                info(
                    format!("proxy.replay {n}: vcr.py ({}) / Rust client", client.name),
                    vcr_us / rust_per,
                    "x",
                ),
            );
        }
        print(lines, info(format!("proxy.replay {n}: daemon CPU per call"), daemon_cpu, "us"));
    }
}

/// A Python HTTP client the comparison runs under, on both sides.
#[derive(Clone, Copy, Debug)]
struct PyClient {
    /// `--client` of `bench/vcr_baseline.py`.
    name: &'static str,
    /// Whether its lines are held to the target (else reported).
    held: bool,
}

/// The lean client first (held to the target), then the official clients' httpx.
const CLIENTS: [PyClient; 2] =
    [PyClient { name: "http.client", held: true }, PyClient { name: "httpx", held: false }];

/// Replays `run` `repeats` times with this process's minimal client (one keep-alive connection,
/// the same bodies in the same order as the script): per request over the whole replay, open
/// included, and the daemon's CPU per call (user + system), medians.
fn rust_client_replay(
    api: &mut Http,
    daemon: &Proc,
    run: &str,
    tag: &str,
    n: usize,
    repeats: usize,
) -> (f64, f64) {
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| chat_body("sim", false, tag, i)).collect();
    let (mut per, mut cpu) = (Vec::new(), Vec::new());
    let mut http = Http::connect(&daemon.addr);
    for _ in 0..repeats.max(1) {
        let cpu0 = cpu_seconds(daemon.pid());
        let began = Instant::now();
        let replay = http.new_replay(run);
        let path = chat_path(&replay);
        for body in &bodies {
            let reply = http.post(&path, body);
            assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
        }
        per.push(began.elapsed().as_secs_f64() * 1e6 / n as f64);
        if let (Some(a), Some(b)) = (cpu0, cpu_seconds(daemon.pid())) {
            cpu.push((b - a) * 1e6 / n as f64);
        }
        let (status, divergence) = api.finish(&replay);
        if status != "ok" || !divergence.is_null() {
            note(&format!("the Rust-client replay of {n} calls ended {status}: {divergence}"));
        }
    }
    (percentile(&per, 50.0), percentile(&cpu, 50.0))
}
