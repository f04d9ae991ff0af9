"""The SDK's HTTP transport at its edges: a step larger than the daemon accepts is `too_large`,
not "the daemon has stopped" (QA34 D4), and a request is sent again only on a kept-alive
connection the daemon had closed, never on a fresh one, where the daemon may already have
applied it (QA34 S7)."""
import asyncio
import os
import socket
import threading

import pytest

import retrace
from daemons import free_port, started


@pytest.fixture
def small_daemon(tmp_path, monkeypatch):
    """`retrace serve --max-body 1 MiB` on a fresh store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRACE_")}
    env.update(RETRACE_HOME=str(tmp_path / "home"))
    port = free_port()
    serve = started(["serve", "--addr", f"127.0.0.1:{port}", "--max-body", str(1 << 20)], port, env)
    for var in ("RETRACE_URL", "RETRACE_RUN", "RETRACE_MODE", "RETRACE_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.terminate()
        serve.wait(timeout=10)


def test_a_step_over_the_daemons_body_limit_is_too_large_and_the_run_goes_on(small_daemon):
    run = retrace.connect(url=small_daemon, name="too-large")
    planner = run.agent("planner")
    big = "x" * (3 << 20)
    with pytest.raises(retrace.RetraceError) as refused:
        planner.tool("fetch", {}, lambda: big)
    assert refused.value.code == "too_large", refused.value
    assert "--max-body" in refused.value.message, refused.value.message
    with pytest.raises(retrace.RetraceError) as refused:
        asyncio.run(planner.atool("fetch.async", {}, lambda: big))
    assert refused.value.code == "too_large", refused.value
    # The connection is made again: the run records the next step and finishes.
    assert planner.tool("fetch.small", {}, lambda: "ok") == "ok"
    run.finish()


class OneShotServer:
    """A loopback server that answers the first request on each connection as a daemon would
    (keep-alive, then closes that connection), or reads a request and closes without answering;
    it counts the requests it read."""

    def __init__(self, answer: bool):
        self.answer = answer
        self.requests = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                if not data:
                    continue
                self.requests += 1
                if self.answer:
                    body = b'{"ok": true}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                                 + str(len(body)).encode() + b"\r\nconnection: keep-alive\r\n\r\n" + body)
                # Closed at once: a kept-alive connection the server then dropped.

    def close(self):
        self.sock.close()


def test_a_request_is_sent_again_only_on_a_reused_connection():
    from retrace._http import Http

    # Answered, then the connection is closed behind the client's back: the next request on it
    # fails before any answer, and is sent again on a new connection.
    server = OneShotServer(answer=True)
    try:
        http = Http(server.url)
        assert http.call("GET", "/api/health") == {"ok": True}
        assert http.call("POST", "/api/x", {"n": 1}) == {"ok": True}
        assert server.requests == 2, "the stale connection's failure was retried once, on a new one"
    finally:
        server.close()

    # A fresh connection that fails after the request was read is not retried: the server may
    # have applied it.
    server = OneShotServer(answer=False)
    try:
        http = Http(server.url)
        with pytest.raises(retrace.RetraceError) as failed:
            http.call("POST", "/api/x", {"n": 1})
        assert failed.value.code == "no_daemon", failed.value
        assert server.requests == 1, f"sent {server.requests} times"
    finally:
        server.close()
