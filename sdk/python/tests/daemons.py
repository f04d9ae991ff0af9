"""What the tests that start `retrace serve` or `retrace simulate` share: the binary, free
loopback ports and a started daemon."""
import os
import socket
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).parent
BIN = os.environ.get("RETRACE_BIN", str(HERE.parents[2] / "target" / "release" / "retrace"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n):
    """`n` distinct free ports: each held until all are chosen. Two `free_port()` calls in a row
    may hand out the same port, and the daemon then failed to bind while its readiness check
    reached the simulator on it (a 404 with no body at `POST /api/runs`)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def started(args, port, env):
    """`retrace ARGS` running with `env`, once it accepts connections on `port`."""
    proc = subprocess.Popen([BIN, *args], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"retrace {args[0]} did not start on port {port}")
            time.sleep(0.05)
