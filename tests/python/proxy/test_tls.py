"""The proxy reaches providers over HTTPS, as it must for api.openai.com and api.anthropic.com.

The upstream is a real TLS server on loopback (Python's `ssl`, with a certificate signed by a
CA the test makes with `openssl`), answering a chat completion. `retrace record` trusts that CA
through `SSL_CERT_FILE`, as a company's own CA would be trusted; without it the certificate is
refused and the proxy says why.
"""
from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import OPENAI_KEY, PY

ANSWER = "served over TLS"

CLIENT = """
import openai
client = openai.OpenAI(max_retries=0)
reply = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
print("answer:", reply.choices[0].message.content)
"""


def make_certificates(dir: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate for 127.0.0.1 signed by it: (ca, cert, key)."""
    ca_key, ca, key, csr, cert = (dir / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    ext = dir / "server.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
            "-days", "2", "-subj", "/CN=retrace test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return ca, cert, key


class Completion(BaseHTTPRequestHandler):
    calls = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        length = int(self.headers.get("content-length", "0"))
        request = json.loads(self.rfile.read(length))
        type(self).calls += 1
        body = json.dumps({
            "id": "chatcmpl-tls",
            "object": "chat.completion",
            "created": 1,
            "model": request["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": ANSWER}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
        }).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def https_upstream(tmp_path):
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test's certificates")
    ca, cert, key = make_certificates(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Completion)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Completion.calls = 0
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/v1", ca, server
    finally:
        server.shutdown()
        server.server_close()


def test_record_reaches_an_https_upstream_and_replays_without_it(retrace, https_upstream):
    url, ca, server = https_upstream
    done = retrace("record", "--json", "--upstream-openai", url, "--", PY, "-c", CLIENT,
                   OPENAI_API_KEY=OPENAI_KEY, SSL_CERT_FILE=str(ca))
    assert done.returncode == 0, done.explain()
    assert f"answer: {ANSWER}" in done.stdout, done.explain()
    assert Completion.calls == 1

    server.shutdown()
    server.server_close()
    replayed = retrace.replay(done.run_id, PY, "-c", CLIENT)
    assert replayed.returncode == 0, replayed.explain()
    assert f"answer: {ANSWER}" in replayed.stdout, replayed.explain()
    assert Completion.calls == 1, "replay must not reach the upstream"


def test_an_untrusted_upstream_certificate_is_refused_and_named(retrace, https_upstream):
    url, _ca, _server = https_upstream
    # No SSL_CERT_FILE: the test CA is in neither the system's roots nor Mozilla's.
    done = retrace("record", "--json", "--upstream-openai", url, "--", PY, "-c", CLIENT,
                   OPENAI_API_KEY=OPENAI_KEY, SSL_CERT_FILE=None)
    assert done.returncode != 0, done.explain()
    assert Completion.calls == 0
    said = done.stdout + done.stderr
    assert "certificate" in said.lower() and url in said, done.explain()
