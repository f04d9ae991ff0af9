//! 64 concurrent replay sessions of 64 recorded runs on one `retrace serve`, driven by wrk as a
//! second process (target: ≥ 2,000 requests/s on a 2-core machine). Each run records `per_run`
//! distinct chat completions (setup: 16 client threads through the daemon, its rate reported);
//! then 64 replays are opened through the API and wrk, for a fixed time, sends each replay's
//! recorded calls in recorded order, each wrk thread cycling through its 32 sessions; a session
//! whose calls are all consumed opens a fresh replay of its run through the API (a request of the
//! load, counted apart) and goes on with it, so 64 sessions stay open and no call is asked for
//! twice. Only proxied 200s count; 409s (divergences) are reported apart and must be 0. wrk's
//! and the daemon's CPU shares come from `bash time` and `/proc/<pid>/stat`.
use std::fmt::Write as _;
use std::process::Command;
use std::time::Instant;

use crate::env::{note, Config};
use crate::proxy_net::{chat_body, chat_path, cpu_seconds, Http, Proc};
use crate::report::{print, Line, Target};

/// Concurrent replay sessions.
const RUNS: usize = 64;
/// wrk's threads and connections.
const WRK_THREADS: usize = 2;
const WRK_CONNECTIONS: usize = 64;
/// Recording client threads (setup).
const RECORDERS: usize = 16;

/// Runs the bench and prints its lines.
pub fn run(cfg: &Config, lines: &mut Vec<Line>) {
    if Command::new("wrk").arg("--version").output().is_err() {
        note("proxy load: wrk is not installed (apt-get install -y wrk); skipped");
        return;
    }
    let per_run = cfg.pick(50, 200);
    let duration =
        std::env::var("RETRACE_BENCH_WRK_DURATION").unwrap_or_else(|_| cfg.pick("5s", "15s").into());
    note(&format!(
        "proxy load: {RUNS} runs x {per_run} calls recorded, {RUNS} replays under wrk -t{WRK_THREADS} -c{WRK_CONNECTIONS}"
    ));
    let home = cfg.temp_dir("proxy-load");
    let upstream = Proc::upstream();
    let daemon = Proc::daemon(home.path(), &format!("{}/v1", upstream.url()), &upstream.url());
    let mut api = Http::connect(&daemon.addr);

    let runs: Vec<String> = (0..RUNS).map(|r| api.new_run(&format!("bench-load-{r}"))).collect();
    let began = Instant::now();
    std::thread::scope(|s| {
        for t in 0..RECORDERS {
            let (runs, addr) = (&runs, &daemon.addr);
            s.spawn(move || {
                let mut http = Http::connect(addr);
                for (r, run) in runs.iter().enumerate().filter(|(r, _)| r % RECORDERS == t) {
                    let path = chat_path(run);
                    for i in 0..per_run {
                        let reply = http.post(&path, &chat_body("sim", false, &format!("load-{r}"), i));
                        assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
                    }
                }
            });
        }
    });
    let recorded = (RUNS * per_run) as f64 / began.elapsed().as_secs_f64();
    for run in &runs {
        api.finish(run);
    }
    print(
        lines,
        Line::new(
            &format!("proxy.record {RUNS} runs, {RECORDERS} clients (setup)"),
            recorded,
            "req/s",
            None,
            Target::Info,
        ),
    );

    let replays: Vec<String> = runs.iter().map(|r| api.new_replay(r)).collect();
    let script = home.path().join("replay.lua");
    std::fs::write(&script, lua(&runs, &replays, per_run)).expect("writing the wrk script");
    if std::env::var_os("RETRACE_BENCH_WRK_DEBUG").is_some() {
        note(&format!("wrk script: {}", script.display()));
    }
    let daemon_cpu = cpu_seconds(daemon.pid());
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "TIMEFORMAT='CPU %U %S %R'; time wrk -t{WRK_THREADS} -c{WRK_CONNECTIONS} -d{} --timeout 30s -s '{}' '{}'",
            duration,
            script.display(),
            daemon.url()
        ))
        .output()
        .expect("running wrk");
    let daemon_cpu = match (daemon_cpu, cpu_seconds(daemon.pid())) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let result = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .map(|l| l.split_whitespace().map(|x| x.parse::<f64>().unwrap_or(f64::NAN)).collect::<Vec<f64>>());
    let Some([ok, conflict, other, sent, duration_us, p50_us, p99_us, opened, checks]) =
        result.as_deref().map(|v| {
            let mut a = [f64::NAN; 9];
            for (slot, x) in a.iter_mut().zip(v) {
                *slot = *x;
            }
            a
        })
    else {
        note(&format!("wrk gave no result ({}):\n{stdout}\n{stderr}", out.status));
        return;
    };
    let cpu = stderr
        .lines()
        .find_map(|l| l.strip_prefix("CPU "))
        .map(|l| l.split_whitespace().map(|x| x.parse::<f64>().unwrap_or(f64::NAN)).collect::<Vec<f64>>());
    let secs = duration_us / 1e6;
    let rate = ok / secs;
    note(&format!(
        "wrk: {ok} x 200, {conflict} x 409, {other} other, {sent} proxied calls sent in {secs:.2} s, \
         {opened} fresh replays opened, {checks} health checks; latency p50 {:.2} ms p99 {:.2} ms (wrk's, all requests)",
        p50_us / 1e3,
        p99_us / 1e3
    ));
    print(
        lines,
        Line::new(
            &format!("proxy.replay {RUNS} sessions under wrk (200s)"),
            rate,
            "req/s",
            None,
            Target::AtLeast(2_000.0),
        ),
    );
    print(lines, Line::new("proxy.replay load: 409 answers", conflict, "calls", None, Target::Info));
    print(lines, Line::new("proxy.replay load: other non-200", other, "calls", None, Target::Info));
    if let Some([user, sys, real]) = cpu.as_deref().map(|v| [v[0], v[1], v[2]]) {
        print(
            lines,
            Line::new(
                "proxy.replay load: wrk CPU (% of one core)",
                (user + sys) / real * 100.0,
                "%",
                None,
                Target::Info,
            ),
        );
        if let Some(d) = daemon_cpu {
            print(
                lines,
                Line::new(
                    "proxy.replay load: daemon CPU (% of one core)",
                    d / real * 100.0,
                    "%",
                    None,
                    Target::Info,
                ),
            );
            if ok > 0.0 {
                print(
                    lines,
                    Line::new(
                        "proxy.replay load: daemon CPU per call",
                        d * 1e6 / ok,
                        "us",
                        None,
                        Target::Info,
                    ),
                );
            }
        }
    }
    print(lines, Line::new("proxy.replay load: fresh replays opened", opened, "runs", None, Target::Info));
}

/// The wrk script: each thread takes every `WRK_THREADS`-th replay and cycles through them,
/// sending each one's recorded calls in order, and opening a fresh replay of a run whose
/// current replay has answered all its calls.
fn lua(sources: &[String], replays: &[String], per_run: usize) -> String {
    const TAG: &str = "TAGTAGTAG";
    const NUM: usize = 987_654_321;
    let template = String::from_utf8(chat_body("sim", false, TAG, NUM)).expect("UTF-8");
    let (p1, rest) = template.split_once(TAG).expect("tag in template");
    let (p2, p3) = rest.split_once(&NUM.to_string()).expect("number in template");
    let mut s = String::new();
    let _ = writeln!(s, "local nthreads = {WRK_THREADS}\nlocal per_run = {per_run}");
    let _ = writeln!(s, "local p1, p2, p3 = [==[{p1}]==], [==[{p2}]==], [==[{p3}]==]");
    s.push_str("local all = {\n");
    for (r, id) in replays.iter().enumerate() {
        let _ = writeln!(
            s,
            "  {{ src = \"{}\", path = \"{}\", tag = \"load-{r}\" }},",
            sources[r],
            crate::proxy_net::chat_path(id)
        );
    }
    s.push_str("}\n");
    s.push_str(
        r#"
local threads = {}
local next_id = 0
function setup(thread)
  thread:set("tid", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

local headers = { ["Content-Type"] = "application/json" }
function init(args)
  mine, by_src = {}, {}
  for i, r in ipairs(all) do
    if (i - 1) % nthreads == tid then
      local slot = { src = r.src, path = r.path, tag = r.tag, next = 0, opening = false }
      table.insert(mine, slot)
      by_src[r.src] = slot
    end
  end
  rr = 0
  sent, ok, conflict, other, opened, checks = 0, 0, 0, 0, 0, 0
  health = wrk.format("GET", "/api/health")
end

-- wrk calls request() once in thread 0 before the run, to check the script, and discards what
-- it returns: answer that call with a health check, not with a recorded call.
local verified = false
function request()
  if tid == 0 and not verified then
    verified = true
    return health
  end
  for _ = 1, #mine do
    rr = rr % #mine + 1
    local r = mine[rr]
    if not r.opening then
      if r.next < per_run then
        local i = r.next
        r.next = i + 1
        sent = sent + 1
        return wrk.format("POST", r.path, headers, p1 .. r.tag .. p2 .. i .. p3)
      end
      -- every recorded call of this replay is consumed: open a fresh replay of the same run
      r.opening = true
      return wrk.format("POST", "/api/runs/" .. r.src .. "/replay")
    end
  end
  return health
end

function response(status, hdrs, body)
  if status == 200 and string.find(body, '"mode":"replay"', 1, true) then
    local id = string.match(body, '"run_id":"([^"]+)"')
    local r = by_src[string.match(body, '"source_run":"([^"]+)"')]
    r.path = "/proxy/run/" .. id .. "/agent/bench/openai/v1/chat/completions"
    r.next = 0
    r.opening = false
    opened = opened + 1
  elseif status == 200 and string.find(body, '"ok":true', 1, true) then
    checks = checks + 1
  elseif status == 200 then
    ok = ok + 1
  elseif status == 409 then
    conflict = conflict + 1
  else
    other = other + 1
  end
end

function done(summary, latency, requests)
  local o, c, x, n, op, h = 0, 0, 0, 0, 0, 0
  for _, t in ipairs(threads) do
    o = o + t:get("ok")
    c = c + t:get("conflict")
    x = x + t:get("other")
    n = n + t:get("sent")
    op = op + t:get("opened")
    h = h + t:get("checks")
  end
  io.write(string.format("RESULT %d %d %d %d %d %d %d %d %d\n", o, c, x, n, summary.duration,
    latency:percentile(50), latency:percentile(99), op, h))
end
"#,
    );
    s
}
