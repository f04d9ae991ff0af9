"""SDK step round trip vs a bare keep-alive round trip to a no-op route of the same daemon
(issue: SDK step ≤ 1.5× the bare round trip). Starts `retrace serve` on a free port with a
temporary store, then measures, interleaved, N rounds of:
  - bare:   httpx.Client GET /api/health (keep-alive)
  - record: agent.tool(...) in a record run (one POST with the completed step)
  - replay: the same tool steps answered from the log in a replay run
Prints medians and p99 in microseconds and the ratios.

    target/python-venv/bin/python bench/sdk_roundtrip.py [N]
"""
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx
import retrace

ROOT = Path(__file__).resolve().parents[1]
BIN = os.environ.get("RETRACE_BIN", str(ROOT / "target" / "release" / "retrace"))
N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    home = tempfile.mkdtemp()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRACE_")}
    env["RETRACE_HOME"] = home
    daemon = subprocess.Popen([BIN, "serve", "--addr", f"127.0.0.1:{port}"], env=env, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{base}/api/health", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        bare_client = httpx.Client(base_url=base)
        rec = retrace.connect(url=base, name="sdk-bench")
        agent = rec.agent("a")
        bare, record = [], []
        for i in range(N):
            t = time.perf_counter_ns()
            bare_client.get("/api/health")
            bare.append(time.perf_counter_ns() - t)
            t = time.perf_counter_ns()
            agent.tool("noop", {"i": i}, lambda: {"ok": i})
            record.append(time.perf_counter_ns() - t)
        rec.finish()
        replay_id = bare_client.post(f"/api/runs/{rec.id}/replay").json()["run_id"]
        rep = retrace.connect(url=base, run=replay_id)
        ragent = rep.agent("a")
        replay, bare2 = [], []
        for i in range(N):
            t = time.perf_counter_ns()
            bare_client.get("/api/health")
            bare2.append(time.perf_counter_ns() - t)
            t = time.perf_counter_ns()
            out = ragent.tool("noop", {"i": i}, lambda: (_ for _ in ()).throw(AssertionError("ran in replay")))
            replay.append(time.perf_counter_ns() - t)
            assert out == {"ok": i}
        outcome = bare_client.post(f"/api/runs/{replay_id}/finish", json={"exit_status": 0}).json()
        assert outcome["status"] == "ok", outcome
        import http.client
        raw = http.client.HTTPConnection("127.0.0.1", port)
        stdlib = []
        for _ in range(N):
            t = time.perf_counter_ns()
            raw.request("GET", "/api/health")
            raw.getresponse().read()
            stdlib.append(time.perf_counter_ns() - t)
        print(f"bare http.client GET (the SDK's own transport): p50 {statistics.median(stdlib)/1000:6.1f} µs")
        for name, xs, floor in (("record", record, bare), ("replay", replay, bare2)):
            m, f = statistics.median(xs) / 1000, statistics.median(floor) / 1000
            verdict = "PASS" if m <= 1.5 * f else "MISS"
            print(f"sdk {name:6} tool step: p50 {m:7.1f} µs  p99 {pct(xs, .99)/1000:7.1f} µs | bare GET p50 {f:6.1f} µs | ratio {m/f:4.2f}× (target ≤ 1.5×) {verdict}")
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)


if __name__ == "__main__":
    main()
