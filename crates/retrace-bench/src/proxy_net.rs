//! What the proxy benches share: the processes they run (the local upstream and `retrace serve`,
//! each a child process of this binary running the same code as `retrace simulate` and
//! `retrace serve`), a small blocking HTTP/1.1 client that timestamps the first response byte
//! and every chunk of a chunked body, the daemon's API calls, and the request bodies.
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use retrace_server::{AppState, ServerConfig};
use retrace_store::{open_store, StoreConfig};
use serde_json::{json, Value};

/// The hidden subcommand the proxy benches' child processes run.
pub const CHILD: &str = "__proxy-child";

/// A child process serving HTTP on `addr` until its stdin closes (or it is killed on drop).
#[derive(Debug)]
pub struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    /// `127.0.0.1:port`.
    pub addr: String,
}

impl Proc {
    /// The local OpenAI/Anthropic stand-in (`retrace simulate`), in its own process.
    pub fn upstream() -> Proc {
        Proc::spawn(&["upstream"])
    }

    /// `retrace serve` over a SQLite store in `home` (default durability), forwarding OpenAI
    /// calls to `openai` (with `/v1`) and Anthropic calls to `anthropic`.
    pub fn daemon(home: &Path, openai: &str, anthropic: &str) -> Proc {
        Proc::spawn(&["serve", &home.display().to_string(), openai, anthropic])
    }

    fn spawn(args: &[&str]) -> Proc {
        let exe = std::env::current_exe().expect("locating the bench binary");
        let mut child = Command::new(exe)
            .arg(CHILD)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting a proxy bench process");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("reading the child's address");
        let addr = line.trim().to_owned();
        assert!(!addr.is_empty(), "the {args:?} process printed no address");
        let stdin = child.stdin.take();
        Proc { child, stdin, addr }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU seconds (user + system) `pid` has used so far, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the command: state is field 3, utime 14 and stime 15 (1-based over the whole line).
    let (utime, stime): (f64, f64) = (fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?);
    Some((utime + stime) / clock_ticks())
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The child processes' entry point: `upstream`, or `serve HOME OPENAI ANTHROPIC`.
pub fn child(args: &[String]) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    let stop = async {
        let _ =
            tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink())).await;
    };
    match args {
        [what] if what == "upstream" => runtime.block_on(async {
            let providers = retrace_demo::providers::Providers::start("127.0.0.1:0").await.expect("upstream");
            announce(&providers.addr().to_string());
            stop.await;
            providers.stop().await;
        }),
        [what, home, openai, anthropic] if what == "serve" => {
            let store =
                open_store(&StoreConfig::in_home(Path::new(home))).expect("opening the daemon's store");
            let config = ServerConfig {
                upstream_openai: openai.clone(),
                upstream_anthropic: anthropic.clone(),
                ..ServerConfig::default()
            };
            runtime.block_on(async {
                let bound = retrace_server::bind("127.0.0.1:0").await.expect("binding the daemon");
                announce(&bound.addr.to_string());
                let state = AppState::new(store, config);
                retrace_server::serve(bound, state, stop).await.expect("serving");
            });
        }
        _ => {
            eprintln!("usage: {CHILD} upstream | serve HOME OPENAI_URL ANTHROPIC_URL");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}

fn announce(addr: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{addr}");
    let _ = out.flush();
}

/// One response, timed from the moment the request started going out.
#[derive(Debug)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// When the request started going out.
    pub started: Instant,
    /// When its first byte arrived.
    pub first_byte: Duration,
    /// When each chunk of a chunked body was complete (empty for a sized body).
    pub chunks: Vec<Duration>,
    /// The body (chunks joined).
    pub body: Vec<u8>,
}

/// A keep-alive HTTP/1.1 connection, blocking, `TCP_NODELAY`.
#[derive(Debug)]
pub struct Http {
    stream: TcpStream,
    host: String,
    buf: Vec<u8>,
    at: usize,
}

impl Http {
    /// Connects to `addr` (`host:port`).
    pub fn connect(addr: &str) -> Http {
        let stream = TcpStream::connect(addr).expect("connecting");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        Http { stream, host: addr.to_owned(), buf: Vec::with_capacity(64 << 10), at: 0 }
    }

    /// `POST path` with a JSON body.
    pub fn post(&mut self, path: &str, body: &[u8]) -> Reply {
        self.request("POST", path, body)
    }

    /// Sends one request and reads its whole response.
    pub fn request(&mut self, method: &str, path: &str, body: &[u8]) -> Reply {
        let mut out = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            self.host,
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body);
        self.buf.clear();
        self.at = 0;
        let started = Instant::now();
        self.stream.write_all(&out).expect("sending a request");
        let first = self.fill(started);
        let head_end = loop {
            if let Some(p) = find(&self.buf, b"\r\n\r\n") {
                break p;
            }
            self.fill(started);
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        self.at = head_end + 4;
        let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line");
        let header = |name: &str| {
            head.lines().skip(1).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_ascii_lowercase())
            })
        };
        let mut reply = Reply { status, started, first_byte: first, chunks: Vec::new(), body: Vec::new() };
        if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            loop {
                let line_end = loop {
                    if let Some(p) = find(&self.buf[self.at..], b"\r\n") {
                        break self.at + p;
                    }
                    self.fill(started);
                };
                let size_text = String::from_utf8_lossy(&self.buf[self.at..line_end]).into_owned();
                let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                    .expect("a chunk size");
                let mut when = started.elapsed();
                while self.buf.len() < line_end + 2 + size + 2 {
                    when = self.fill(started);
                }
                reply.body.extend_from_slice(&self.buf[line_end + 2..line_end + 2 + size]);
                self.at = line_end + 2 + size + 2;
                if size == 0 {
                    break;
                }
                reply.chunks.push(when);
            }
        } else if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
            while self.buf.len() < self.at + len {
                self.fill(started);
            }
            reply.body.extend_from_slice(&self.buf[self.at..self.at + len]);
        } else {
            let mut rest = Vec::new();
            self.stream.read_to_end(&mut rest).expect("reading to the end");
            reply.body.extend_from_slice(&self.buf[self.at..]);
            reply.body.extend_from_slice(&rest);
        }
        reply
    }

    /// Reads more bytes; returns when they arrived.
    fn fill(&mut self, started: Instant) -> Duration {
        let mut tmp = [0u8; 16 << 10];
        let n = self.stream.read(&mut tmp).expect("reading a response");
        assert!(n > 0, "the server closed the connection mid-response");
        self.buf.extend_from_slice(&tmp[..n]);
        started.elapsed()
    }

    /// `POST path` on the daemon's API; the JSON answer.
    pub fn api(&mut self, path: &str, body: &Value) -> Value {
        let reply = self.post(path, &serde_json::to_vec(body).expect("JSON"));
        let value: Value = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
        assert!(reply.status == 200, "{path} answered {}: {value}", reply.status);
        value
    }

    /// A new record run; its id.
    pub fn new_run(&mut self, name: &str) -> String {
        self.api("/api/runs", &json!({"name": name}))["run_id"].as_str().expect("run_id").to_owned()
    }

    /// A new replay run of `run`; its id.
    pub fn new_replay(&mut self, run: &str) -> String {
        self.api(&format!("/api/runs/{run}/replay"), &json!({}))["run_id"]
            .as_str()
            .expect("run_id")
            .to_owned()
    }

    /// Finishes `run`; its status and divergence, if any.
    pub fn finish(&mut self, run: &str) -> (String, Value) {
        let v = self.api(&format!("/api/runs/{run}/finish"), &json!({"exit_status": 0}));
        (v["status"].as_str().unwrap_or("?").to_owned(), v["divergence"].clone())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The proxy path of an OpenAI chat completion for `run` (path form, agent `bench`).
pub fn chat_path(run: &str) -> String {
    format!("/proxy/run/{run}/agent/bench/openai/v1/chat/completions")
}

/// The upstream's own path of a chat completion.
pub const DIRECT_CHAT: &str = "/v1/chat/completions";

/// A chat completion request (~450 B): `tag` and `i` make it distinct.
pub fn chat_body(model: &str, stream: bool, tag: &str, i: usize) -> Vec<u8> {
    let mut body = json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a careful release assistant. Answer in one short sentence, and say when you are unsure."},
            {"role": "user", "content": format!("[{tag}] question {i}: the migration adds a NOT NULL column with a default; is the backfill safe to ship before it finishes?")}
        ],
        "temperature": 0.2,
        "max_tokens": 64
    });
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    serde_json::to_vec(&body).expect("JSON")
}

/// The `p`-th percentile (0..=100, nearest rank) of `xs`.
pub fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// Microseconds of `d`.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
