//! The recording proxy (issue 5): what `retrace serve` adds to a model call, in record and in
//! replay, against calling the local upstream directly in the same run.
//!
//! Three processes, as in use: the upstream (the OpenAI/Anthropic stand-in of `retrace
//! simulate`), the daemon (`retrace serve`'s code over a SQLite store in a temp folder, default
//! durability), and this process, the client: one blocking keep-alive connection each to the
//! upstream and the daemon, calls interleaved direct / proxied so both see the same machine.
//!
//! - time to first byte, non-streaming and streaming chat completions, p50 and p99, direct vs
//!   through the daemon in record and in replay (target: ≤ +1 ms p50, ≤ +5 ms p99);
//! - the delay the proxy adds to each stream chunk in record (target: ≤ 1 ms p99), measured
//!   exactly against a timestamping upstream in this process (each chunk's arrival minus its
//!   write), and, for context, paired against the simulator's `-slow` model (20 ms apart), whose
//!   own timer jitter is shown beside it as the floor;
//! - then [`crate::proxy_load`] (64 concurrent replays under wrk) and [`crate::proxy_vcr`]
//!   (per-request replay cost against VCR.py).
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::env::{note, Config};
use crate::proxy_net::{chat_body, chat_path, percentile, us, Http, Proc, Reply, DIRECT_CHAT};
use crate::report::{print, Line, Target};

/// Added time to first byte allowed at p50 and p99, µs.
const TTFB_P50_BUDGET: f64 = 1_000.0;
const TTFB_P99_BUDGET: f64 = 5_000.0;
/// Added delay per stream chunk allowed at p99, µs.
const CHUNK_P99_BUDGET: f64 = 1_000.0;

/// Runs the bench and prints its lines. `RETRACE_BENCH_PROXY=ttfb,chunks,load,vcr` picks parts.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    let parts = std::env::var("RETRACE_BENCH_PROXY").unwrap_or_default();
    let wants = |part: &str| parts.is_empty() || parts.split(',').any(|p| p.trim() == part);
    if wants("ttfb") {
        ttfb(cfg, lines);
    }
    if wants("chunks") {
        chunks(cfg, lines);
    }
    if wants("load") {
        crate::proxy_load::run(cfg, lines);
    }
    if wants("vcr") {
        crate::proxy_vcr::run(cfg, lines);
    }
}

/// The time-to-first-byte samples of one phase, µs.
#[derive(Default)]
struct Ttfb {
    direct_json: Vec<f64>,
    proxy_json: Vec<f64>,
    direct_stream: Vec<f64>,
    proxy_stream: Vec<f64>,
    refused: usize,
}

/// One phase: `n` rounds of (direct json, proxied json, direct stream, proxied stream).
fn phase(direct: &mut Http, daemon: &mut Http, run: &str, tag: &str, n: usize) -> Ttfb {
    let mut t = Ttfb::default();
    let path = chat_path(run);
    for i in 0..n {
        let (json, stream) = (chat_body("sim", false, tag, i), chat_body("sim", true, tag, i));
        let d = direct.post(DIRECT_CHAT, &json);
        let p = daemon.post(&path, &json);
        let ds = direct.post(DIRECT_CHAT, &stream);
        let ps = daemon.post(&path, &stream);
        for r in [&d, &ds] {
            assert_eq!(r.status, 200, "the upstream answered {}", String::from_utf8_lossy(&r.body));
        }
        for r in [&p, &ps] {
            if r.status != 200 {
                t.refused += 1;
                if t.refused == 1 {
                    note(&format!("proxy answered {}: {}", r.status, String::from_utf8_lossy(&r.body)));
                }
            }
        }
        t.direct_json.push(us(d.first_byte));
        t.proxy_json.push(us(p.first_byte));
        t.direct_stream.push(us(ds.first_byte));
        t.proxy_stream.push(us(ps.first_byte));
    }
    t
}

fn ttfb(cfg: &Config, lines: &mut Vec<Line>) {
    let n = cfg.pick(300, 2_000);
    let warm = cfg.pick(50, 200);
    note(&format!(
        "proxy ttfb: {n} rounds of direct/proxied chat completions, json and stream, record then replay \
         (upstream and daemon are separate processes; SQLite store, batch durability)"
    ));
    let home = cfg.temp_dir("proxy-ttfb");
    let upstream = Proc::upstream();
    let daemon = Proc::daemon(home.path(), &format!("{}/v1", upstream.url()), &upstream.url());
    let mut direct = Http::connect(&upstream.addr);
    let mut api = Http::connect(&daemon.addr);
    let mut proxied = Http::connect(&daemon.addr);

    let (warm_run, run) = (api.new_run("bench-proxy-warm"), api.new_run("bench-proxy-ttfb"));
    phase(&mut direct, &mut proxied, &warm_run, "warm", warm);
    let record = phase(&mut direct, &mut proxied, &run, "ttfb", n);
    for r in [&warm_run, &run] {
        api.finish(r);
    }
    let (warm_replay, replay_run) = (api.new_replay(&warm_run), api.new_replay(&run));
    phase(&mut direct, &mut proxied, &warm_replay, "warm", warm);
    let replay = phase(&mut direct, &mut proxied, &replay_run, "ttfb", n);
    let (status, divergence) = api.finish(&replay_run);
    if status != "ok" || !divergence.is_null() {
        note(&format!("the ttfb replay ended {status}: {divergence}"));
    }
    api.finish(&warm_replay);

    for (mode, t) in [("record", &record), ("replay", &replay)] {
        for (kind, direct, proxy) in
            [("json", &t.direct_json, &t.proxy_json), ("stream", &t.direct_stream, &t.proxy_stream)]
        {
            for (p, budget) in [(50.0, TTFB_P50_BUDGET), (99.0, TTFB_P99_BUDGET)] {
                let (d, x) = (percentile(direct, p), percentile(proxy, p));
                note(&format!(
                    "ttfb {mode} {kind} p{p:.0}: direct {d:.0} us, proxied {x:.0} us, added {:.0} us",
                    x - d
                ));
                budget_line(
                    lines,
                    &format!("proxy.ttfb {mode} {kind} p{p:.0} (+{} ms max)", budget / 1000.0),
                    x,
                    d,
                    budget,
                );
            }
        }
        let refused = t.refused as f64;
        print(
            lines,
            Line::new(&format!("proxy.ttfb {mode}: non-200 answers"), refused, "calls", None, Target::Info),
        );
    }
}

/// A line for `measured` against `floor` held to `floor + budget`: the ratio's target is
/// `1 + budget / floor`, so PASS means at most `budget` µs added.
fn budget_line(lines: &mut Vec<Line>, name: &str, measured: f64, floor: f64, budget: f64) {
    let floor = floor.max(1.0);
    print(lines, Line::new(name, measured, "us", Some(floor), Target::RatioAtMost(1.0 + budget / floor)));
}

/// An upstream in this process that answers every request with a chat completion stream of
/// `EVENTS` chunks `gap` apart, and notes when it wrote each (the same clock as the client's).
struct Tap {
    addr: String,
    sent: Arc<Mutex<Vec<Instant>>>,
}

/// Events of a tap stream: role, six words, finish, usage, `[DONE]` (as the simulator's).
const EVENTS: usize = 10;

impl Tap {
    fn start(gap: Duration) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the tap upstream");
        let addr = listener.local_addr().expect("tap address").to_string();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let log = sent.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let log = log.clone();
                std::thread::spawn(move || tap_serve(conn, gap, &log));
            }
        });
        Tap { addr, sent }
    }

    fn take(&self) -> Vec<Instant> {
        std::mem::take(&mut *self.sent.lock().expect("tap log"))
    }
}

fn tap_serve(conn: TcpStream, gap: Duration, log: &Mutex<Vec<Instant>>) {
    let _ = conn.set_nodelay(true);
    let mut reader = BufReader::new(conn.try_clone().expect("cloning the tap connection"));
    let mut conn = conn;
    loop {
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.trim().eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n\
                    x-request-id: req_tap\r\ntransfer-encoding: chunked\r\n\r\n";
        if conn.write_all(head.as_bytes()).is_err() {
            return;
        }
        for k in 0..EVENTS {
            std::thread::sleep(gap);
            let event = tap_event(k);
            let chunk = format!("{:x}\r\n{event}\r\n", event.len());
            log.lock().expect("tap log").push(Instant::now());
            if conn.write_all(chunk.as_bytes()).is_err() {
                return;
            }
        }
        if conn.write_all(b"0\r\n\r\n").is_err() {
            return;
        }
    }
}

fn tap_event(k: usize) -> String {
    const WORDS: [&str; 6] = ["the", "backfill", "looks", "safe", "to", "ship"];
    let base = r#""id":"chatcmpl-tap","object":"chat.completion.chunk","created":1767225600,"model":"sim-2026-11-01""#;
    match k {
        0 => format!(
            "data: {{{base},\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        ),
        1..=6 => format!(
            "data: {{{base},\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" {}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n",
            WORDS[k - 1]
        ),
        7 => format!(
            "data: {{{base},\"choices\":[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}]}}\n\n"
        ),
        8 => format!(
            "data: {{{base},\"choices\":[],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":6,\"total_tokens\":18}}}}\n\n"
        ),
        _ => "data: [DONE]\n\n".to_owned(),
    }
}

/// Each chunk's delay from the tap's write to the client's read, µs: (non-terminal, terminal).
fn delays(reply: &Reply, sent: &[Instant]) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    let arrived: Vec<Instant> = reply.chunks.iter().map(|d| reply.started + *d).collect();
    assert_eq!(arrived.len(), sent.len(), "one HTTP chunk per event ({} vs {})", arrived.len(), sent.len());
    let all: Vec<f64> = arrived.iter().zip(sent).map(|(a, s)| us(a.saturating_duration_since(*s))).collect();
    let (body, last) = all.split_at(all.len() - 1);
    (body.to_vec(), last.to_vec())
}

fn chunks(cfg: &Config, lines: &mut Vec<Line>) {
    let rounds = cfg.pick(40, 200);
    let slow_rounds = cfg.pick(8, 30);
    let gap = Duration::from_millis(5);
    note(&format!(
        "proxy chunks: {rounds} streams of {EVENTS} chunks {} ms apart from a timestamping upstream, \
         direct and recorded through the daemon; {slow_rounds} rounds against the simulator's -slow model",
        gap.as_millis()
    ));
    let tap = Tap::start(gap);
    let upstream = Proc::upstream();
    let home = cfg.temp_dir("proxy-chunks");
    let daemon = Proc::daemon(home.path(), &format!("http://{}/v1", tap.addr), &upstream.url());
    let mut api = Http::connect(&daemon.addr);
    let mut proxied = Http::connect(&daemon.addr);
    let mut direct = Http::connect(&tap.addr);
    let run = api.new_run("bench-proxy-chunks");
    let path = chat_path(&run);
    let (mut direct_body, mut direct_last, mut proxy_body, mut proxy_last) = (vec![], vec![], vec![], vec![]);
    for i in 0..rounds + 5 {
        let body = chat_body("sim", true, "chunks", i);
        tap.take();
        let d = direct.post(DIRECT_CHAT, &body);
        let (b, l) = delays(&d, &tap.take());
        let p = proxied.post(&path, &body);
        let (pb, pl) = delays(&p, &tap.take());
        if i >= 5 {
            direct_body.extend(b);
            direct_last.extend(l);
            proxy_body.extend(pb);
            proxy_last.extend(pl);
        }
    }
    api.finish(&run);
    for p in [50.0, 99.0] {
        let (d, x) = (percentile(&direct_body, p), percentile(&proxy_body, p));
        note(&format!("chunk delay p{p:.0} (non-terminal): direct {d:.0} us, proxied {x:.0} us"));
    }
    let (d50, x50) = (percentile(&direct_body, 50.0), percentile(&proxy_body, 50.0));
    print(lines, Line::new("proxy.chunk record delay p50", x50, "us", Some(d50.max(1.0)), Target::Info));
    let (d99, x99) = (percentile(&direct_body, 99.0), percentile(&proxy_body, 99.0));
    budget_line(lines, "proxy.chunk record delay p99 (+1 ms max)", x99, d99, CHUNK_P99_BUDGET);
    let (d, x) = (percentile(&direct_last, 50.0), percentile(&proxy_last, 50.0));
    print(
        lines,
        Line::new("proxy.chunk terminal (waits for ack) p50", x, "us", Some(d.max(1.0)), Target::Info),
    );
    let (d, x) = (percentile(&direct_last, 99.0), percentile(&proxy_last, 99.0));
    print(
        lines,
        Line::new("proxy.chunk terminal (waits for ack) p99", x, "us", Some(d.max(1.0)), Target::Info),
    );

    // The brief's own pairing: the simulator's `-slow` stream, direct twice and proxied once per
    // round; each chunk's arrival (from its request) proxied minus direct, beside direct minus
    // direct, which is the simulator's timer jitter alone.
    let daemon2 =
        Proc::daemon(home.path().join("slow").as_path(), &format!("{}/v1", upstream.url()), &upstream.url());
    let mut api2 = Http::connect(&daemon2.addr);
    let mut proxied2 = Http::connect(&daemon2.addr);
    let mut direct2 = Http::connect(&upstream.addr);
    let run2 = api2.new_run("bench-proxy-slow");
    let path2 = chat_path(&run2);
    let (mut noise, mut added) = (vec![], vec![]);
    for i in 0..slow_rounds {
        let body = chat_body("sim-slow", true, "slow", i);
        let a = direct2.post(DIRECT_CHAT, &body);
        let p = proxied2.post(&path2, &body);
        let b = direct2.post(DIRECT_CHAT, &body);
        for (k, ((pa, aa), ba)) in p.chunks.iter().zip(&a.chunks).zip(&b.chunks).enumerate() {
            if k + 1 < p.chunks.len() {
                added.push(us(*pa) - us(*aa));
                noise.push((us(*ba) - us(*aa)).abs());
            }
        }
    }
    api2.finish(&run2);
    let abs: Vec<f64> = added.iter().map(|x| x.abs()).collect();
    print(
        lines,
        Line::new(
            "proxy.chunk -slow paired |proxied-direct| p50",
            percentile(&abs, 50.0),
            "us",
            Some(percentile(&noise, 50.0).max(1.0)),
            Target::Info,
        ),
    );
    print(
        lines,
        Line::new(
            "proxy.chunk -slow paired |proxied-direct| p99",
            percentile(&abs, 99.0),
            "us",
            Some(percentile(&noise, 99.0).max(1.0)),
            Target::Info,
        ),
    );
}
