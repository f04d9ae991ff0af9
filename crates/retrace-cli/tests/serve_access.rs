//! `retrace serve` access control from the outside: an address beyond loopback is refused
//! without tokens (exit 2, nothing opened), a tokens file others can read is refused, and with
//! tokens the daemon serves on 0.0.0.0 and wants them. A second signal stops a daemon that
//! waits on an open request.
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "viewer-token-for-the-cli-test";

fn serve(home: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_retrace"));
    command.arg("serve").args(args).env("RETRACE_HOME", home);
    for var in ["RETRACE_STORE", "RETRACE_BLOBS", "RETRACE_SERVE_TOKENS", "RETRACE_TOKEN"] {
        command.env_remove(var);
    }
    command.envs(env.iter().copied()).stdin(Stdio::null());
    command
}

fn refused(output: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "stderr lacks {needle:?}:\n{stderr}");
    }
}

#[test]
fn a_non_loopback_address_without_tokens_is_refused_before_anything_opens() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let output = serve(&home, &["--addr", addr], &[]).output().unwrap();
        refused(&output, &[&format!("refusing to serve on {addr} without tokens"), "RETRACE_SERVE_TOKENS"]);
    }
    assert!(!home.exists(), "the store was opened for a daemon that refused to start");
    let weak =
        serve(&home, &["--addr", "0.0.0.0:0"], &[("RETRACE_SERVE_TOKENS", "viewer:short")]).output().unwrap();
    refused(&weak, &["RETRACE_SERVE_TOKENS entry 1", "at least 16"]);
    let role = serve(&home, &[], &[("RETRACE_SERVE_TOKENS", &format!("root:{TOKEN}"))]).output().unwrap();
    refused(&role, &["unknown role \"root\""]);
    assert!(!String::from_utf8_lossy(&role.stderr).contains(TOKEN), "a token is never echoed");
}

#[test]
fn a_tokens_file_others_can_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, format!("# role token\nviewer {TOKEN}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let path = file.to_str().unwrap();
    let output =
        serve(&dir.path().join("home"), &["--addr", "0.0.0.0:0", "--tokens", path], &[]).output().unwrap();
    refused(&output, &["other users can access it (mode 644)", &format!("chmod 600 {path}")]);
}

/// Kills the daemon when the test ends, however it ends.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A GET over a fresh connection: the status.
fn get(port: u16, path: &str, token: Option<&str>) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = token.map(|t| format!("authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.1\r\nhost: x\r\n{auth}connection: close\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.get(9..12)?.parse().ok()
}

#[test]
fn with_tokens_it_serves_on_every_address_and_wants_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, format!("viewer {TOKEN}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let port = std::net::TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port();
    let addr = format!("0.0.0.0:{port}");
    let child = serve(&dir.path().join("home"), &["--addr", &addr, "--tokens", file.to_str().unwrap()], &[])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _daemon = Daemon(child);
    let started = Instant::now();
    while get(port, "/api/health", None).is_none() {
        assert!(started.elapsed() < Duration::from_secs(20), "the daemon never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(get(port, "/api/health", None), Some(200), "health needs no token");
    assert_eq!(get(port, "/api/runs", None), Some(401));
    assert_eq!(get(port, "/api/runs", Some("wrong-token-wrong-token")), Some(401));
    assert_eq!(get(port, "/api/runs", Some(TOKEN)), Some(200));
}

/// Stopping a daemon that holds a request open (a long `recv` here; a proxied stream that never
/// ends alike): the first SIGTERM lets it end for a while and says so, a second stops the
/// daemon at once (QA17 D1: it waited for good, and every later signal went unheard).
#[test]
fn a_second_signal_stops_a_daemon_waiting_on_an_open_request() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let child =
        serve(&dir.path().join("home"), &["--addr", &addr], &[]).stderr(Stdio::piped()).spawn().unwrap();
    let mut daemon = Daemon(child);
    let started = Instant::now();
    while get(port, "/api/health", None).is_none() {
        assert!(started.elapsed() < Duration::from_secs(20), "the daemon never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
    let post = |stream: &mut TcpStream, path: &str, body: &str| {
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(format!("{head}{body}").as_bytes()).unwrap();
    };
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    post(&mut stream, "/api/runs", "{}");
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = vec![0; 4096];
    let n = stream.read(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    let run = answer.split("\"run_id\":\"").nth(1).and_then(|r| r.split('"').next()).unwrap().to_owned();
    let mut waiting = TcpStream::connect(("127.0.0.1", port)).unwrap();
    post(&mut waiting, &format!("/api/runs/{run}/agents/a/recv"), "{}");
    std::thread::sleep(Duration::from_millis(300));
    let pid = nix::unistd::Pid::from_raw(daemon.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(daemon.0.try_wait().unwrap().is_none(), "the first signal lets the open request end");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let stopped = Instant::now();
    while daemon.0.try_wait().unwrap().is_none() {
        assert!(stopped.elapsed() < Duration::from_secs(5), "the second signal stops the daemon");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut said = String::new();
    daemon.0.stderr.take().unwrap().read_to_string(&mut said).unwrap();
    assert!(said.contains("letting open requests end (at most 10 s; Ctrl-C again stops now)"), "{said}");
    assert!(said.contains("stopping now, with requests still open"), "{said}");
}
