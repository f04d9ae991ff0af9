//! The runtime's transport to a Retrace daemon (`RETRACE_URL`): HTTP/1.1 keep-alive JSON over
//! `std::net::TcpStream`, the daemon being loopback-local. It sends what the Python SDK sends
//! (`X-Retrace-Process: <pid>`, `Authorization: Bearer $RETRACE_TOKEN` when set) and reads the
//! daemon's answers the same way: a 409 carrying a divergence report is a
//! [`RuntimeError::Divergence`], any other error answer a [`RuntimeError::Daemon`].
//!
//! Async callers go through [`Client::post_async`], which runs the blocking exchange on tokio's
//! blocking pool, so an agent awaiting a long `recv` never holds a runtime worker.
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use parking_lot::Mutex;
use retrace_core::Divergence;
use serde_json::Value;

use crate::error::{RuntimeError, RuntimeResult};

/// Idle connections kept for reuse; more are closed once answered.
const IDLE_MAX: usize = 64;

/// A keep-alive JSON client of one daemon.
#[derive(Debug)]
pub(crate) struct Client {
    /// The daemon's URL as given (`http://127.0.0.1:7420`), for messages.
    url: String,
    /// `host:port`.
    authority: String,
    token: Option<String>,
    idle: Mutex<Vec<BufReader<TcpStream>>>,
}

impl Client {
    /// A client of the daemon at `url` (`http://HOST:PORT`), presenting `token` when given.
    pub(crate) fn new(url: &str, token: Option<String>) -> RuntimeResult<Client> {
        let url = url.trim_end_matches('/').to_owned();
        let authority = url
            .strip_prefix("http://")
            .filter(|a| !a.is_empty() && !a.contains('/'))
            .ok_or_else(|| RuntimeError::Usage(format!("RETRACE_URL must be http://HOST:PORT, not {url:?}")))?
            .to_owned();
        Ok(Client { url, authority, token, idle: Mutex::new(Vec::new()) })
    }

    /// `GET path`: the answer's JSON.
    pub(crate) fn get(&self, path: &str) -> RuntimeResult<Value> {
        self.call("GET", path, None)
    }

    /// `POST path` with `body`: the answer's JSON. Blocks the calling thread (on a worker of a
    /// multi-thread tokio runtime, inside `block_in_place`).
    pub(crate) fn post(&self, path: &str, body: &Value) -> RuntimeResult<Value> {
        use tokio::runtime::{Handle, RuntimeFlavor};
        if Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread) {
            tokio::task::block_in_place(|| self.call("POST", path, Some(body)))
        } else {
            self.call("POST", path, Some(body))
        }
    }

    /// [`Client::post`] for async callers: on tokio's blocking pool when a runtime is running.
    /// Dropped before its answer (the task cancelled, its runtime shutting down), it closes its
    /// connection: the blocking exchange then ends at once rather than holding the runtime's
    /// shutdown until the daemon answers (a `recv` with no timeout never might), and the daemon
    /// drops the request (a cancelled `recv` takes no message).
    pub(crate) async fn post_async(self: &Arc<Self>, path: &str, body: Value) -> RuntimeResult<Value> {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let (client, path) = (self.clone(), path.to_owned());
                let guard = Cancel::default();
                let cancel = guard.0.clone();
                let answer = handle
                    .spawn_blocking(move || {
                        client.call_cancellable("POST", &path, Some(&body), Some(&cancel))
                    })
                    .await
                    .map_err(|e| self.error("internal", format!("the request's thread failed: {e}")))?;
                guard.0.lock().answered = true;
                answer
            }
            Err(_) => self.call("POST", path, Some(&body)),
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> RuntimeResult<Value> {
        self.call_cancellable(method, path, body, None)
    }

    fn call_cancellable(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        cancel: Option<&Arc<Mutex<Cancellable>>>,
    ) -> RuntimeResult<Value> {
        let payload = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let exchange = |conn: BufReader<TcpStream>| {
            if let Some(cancel) = cancel {
                cancel.lock().watch(conn.get_ref())?;
            }
            self.exchange(conn, method, path, &payload)
        };
        // A reused connection the daemon closed while idle fails before any answer: once more on
        // a fresh one. A fresh connection that fails is reported.
        let pooled = self.idle.lock().pop();
        let (status, raw, conn) = match pooled {
            Some(conn) => match exchange(conn) {
                Ok(answer) => answer,
                Err(_) => exchange(self.connect()?).map_err(|e| self.io(e))?,
            },
            None => exchange(self.connect()?).map_err(|e| self.io(e))?,
        };
        if let Some(conn) = conn {
            let mut idle = self.idle.lock();
            if idle.len() < IDLE_MAX {
                idle.push(conn);
            }
        }
        self.answer(status, &raw)
    }

    fn connect(&self) -> RuntimeResult<BufReader<TcpStream>> {
        let stream = TcpStream::connect(&self.authority).map_err(|e| {
            self.error("unreachable", format!("can't connect ({e}); is the daemon running? (RETRACE_URL)"))
        })?;
        let _ = stream.set_nodelay(true);
        Ok(BufReader::new(stream))
    }

    /// One request and its answer: status, body, and the connection when it can be reused.
    fn exchange(
        &self,
        mut conn: BufReader<TcpStream>,
        method: &str,
        path: &str,
        payload: &[u8],
    ) -> std::io::Result<(u16, Vec<u8>, Option<BufReader<TcpStream>>)> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\nX-Retrace-Process: {}\r\n",
            self.authority,
            payload.len(),
            std::process::id()
        );
        if let Some(token) = &self.token {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        head.push_str("\r\n");
        let stream = conn.get_mut();
        stream.write_all(head.as_bytes())?;
        stream.write_all(payload)?;
        stream.flush()?;
        let status_line = read_line(&mut conn)?;
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| invalid(format!("bad status line {status_line:?}")))?;
        let (mut length, mut chunked, mut close) = (None, false, false);
        loop {
            let line = read_line(&mut conn)?;
            if line.is_empty() {
                break;
            }
            let Some((name, value)) = line.split_once(':') else { continue };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse::<usize>().ok(),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        let body = match (chunked, length) {
            (true, _) => read_chunked(&mut conn)?,
            (false, Some(n)) => {
                let mut body = vec![0; n];
                conn.read_exact(&mut body)?;
                body
            }
            (false, None) => {
                let mut body = Vec::new();
                conn.read_to_end(&mut body)?;
                close = true;
                body
            }
        };
        Ok((status, body, (!close).then_some(conn)))
    }

    /// The payload of an answer, or the error it names.
    fn answer(&self, status: u16, raw: &[u8]) -> RuntimeResult<Value> {
        let payload: Value = if raw.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(raw).map_err(|e| {
                self.error("protocol", format!("answered {status} with a body that is not JSON: {e}"))
            })?
        };
        if status < 400 {
            return Ok(payload);
        }
        let error = payload.get("error").cloned().unwrap_or(Value::Null);
        if status == 409 {
            if let Some(report) = error.get("divergence").filter(|d| !d.is_null()) {
                let d: Divergence = serde_json::from_value(report.clone()).map_err(|e| {
                    self.error("protocol", format!("a divergence report that does not decode: {e}"))
                })?;
                return Err(d.into());
            }
        }
        let code = error.get("code").and_then(Value::as_str).unwrap_or("error");
        let message = error.get("message").and_then(Value::as_str).map(str::to_owned);
        Err(self.error(code, message.unwrap_or_else(|| format!("HTTP {status}"))))
    }

    pub(crate) fn error(&self, code: &str, message: impl Into<String>) -> RuntimeError {
        RuntimeError::Daemon { url: self.url.clone(), code: code.to_owned(), message: message.into() }
    }

    fn io(&self, e: std::io::Error) -> RuntimeError {
        self.error("unreachable", format!("the connection failed: {e}"))
    }
}

/// What a dropped [`Client::post_async`] closes: the connection its exchange is on.
#[derive(Debug, Default)]
pub(crate) struct Cancellable {
    stream: Option<TcpStream>,
    answered: bool,
    cancelled: bool,
}

impl Cancellable {
    /// The exchange is about to run on `stream`: a clone of it is kept to close, unless the
    /// request was cancelled already.
    fn watch(&mut self, stream: &TcpStream) -> std::io::Result<()> {
        if self.cancelled {
            return Err(std::io::Error::new(std::io::ErrorKind::Interrupted, "the request was cancelled"));
        }
        self.stream = Some(stream.try_clone()?);
        Ok(())
    }
}

/// Closes the watched connection when dropped before the answer came.
#[derive(Debug, Default)]
struct Cancel(Arc<Mutex<Cancellable>>);

impl Drop for Cancel {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        if state.answered {
            return;
        }
        state.cancelled = true;
        if let Some(stream) = state.stream.take() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn invalid(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
}

/// One header line without its `\r\n`; an empty line ends the headers.
fn read_line(conn: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    let mut line = String::new();
    if conn.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the daemon closed the connection",
        ));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

fn read_chunked(conn: &mut BufReader<TcpStream>) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let size_line = read_line(conn)?;
        let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| invalid(format!("bad chunk size {size_line:?}")))?;
        if size == 0 {
            // Trailers, up to the empty line.
            while !read_line(conn)?.is_empty() {}
            return Ok(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        conn.read_exact(&mut body[start..])?;
        read_line(conn)?;
    }
}
