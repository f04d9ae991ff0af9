"""Helpers for the multi-agent example's tests: the `retrace` binary on a store of the test
module's own, and `retrace simulate` as a real process on a free loopback port. (Not a
conftest.py: tests/python/proxy imports its own conftest by name, in the same session.)"""
from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
BIN = Path(os.environ.get("RETRACE_BIN", REPO / "target" / "release" / "retrace"))
PY = sys.executable  # the venv's python: it has the pinned openai and the SDK
MASK_KEY = base64.b64encode(bytes(range(32))).decode()
OPENAI_KEY = "sk-test-agents-2f7c91d0-never-stored"

# Variables of the outer environment that would change what the children do.
SCRUB = {"OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID", "ANTHROPIC_BASE_URL",
         "ANTHROPIC_API_KEY", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class Done:
    """A finished `retrace` command."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def lines(self) -> list[str]:
        return self.stdout.strip().splitlines()

    def explain(self) -> str:
        return (f"$ {' '.join(self.args)}\nexit {self.returncode} after {self.seconds:.2f}s\n"
                f"--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}")


class Retrace:
    """The `retrace` binary on one store; commands run from the repository's top level."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def env(self, **extra: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in SCRUB and not k.startswith("RETRACE_")}
        env.update(RETRACE_HOME=str(self.home), RETRACE_MASK_KEY=MASK_KEY, PYTHONDONTWRITEBYTECODE="1",
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        for k, v in extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def __call__(self, *args: str, timeout: float = 120, **env: str | None) -> Done:
        argv = [str(BIN), *args]
        started = time.monotonic()
        p = subprocess.run(argv, cwd=REPO, env=self.env(**env), capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        return Done(argv, p.returncode, p.stdout, p.stderr, time.monotonic() - started)


class Simulator:
    """`retrace simulate`: a local stand-in for the OpenAI API, as its own process."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.log = open(log, "wb")
        self.proc = subprocess.Popen([str(BIN), "simulate", "--addr", f"127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while not port_open(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"retrace simulate did not start (see {log})")
            time.sleep(0.05)

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    @property
    def stopped(self) -> bool:
        return self.proc.poll() is not None and not port_open(self.port)
