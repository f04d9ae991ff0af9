"""Fixtures for the proxy tests: the `retrace` binary, a store per test session, the simulator
as a real process, and the recordings the tests replay.

Everything runs as real processes over loopback HTTP: `retrace simulate` stands in for the
providers, `retrace record -- python ...` records the official clients through the embedded
proxy, and the tests replay with the simulator stopped.
"""
from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
BIN = Path(os.environ.get("RETRACE_BIN", REPO / "target" / "release" / "retrace"))
PY = sys.executable  # the venv's python: it has the pinned openai and anthropic
APP = "examples/python/unmodified/app.py"  # relative to REPO, as a person would type it
QUIRKS = "tests/python/proxy/quirks.py"

# A fixed mask key (the project's tests never generate one) and an API key that must never
# reach the store.
MASK_KEY = base64.b64encode(bytes(range(32))).decode()
OPENAI_KEY = "sk-test-openai-4be1d0c2-never-stored"
ANTHROPIC_KEY = "sk-ant-test-7d3e9a1f-never-stored"

# Variables of the outer environment that would change what the children do.
SCRUB = (
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_ORG_ID",
    "OPENAI_PROJECT_ID",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "RETRACE_URL",
    "RETRACE_MODE",
    "RETRACE_RUN",
    "RETRACE_STORE",
    "RETRACE_BLOBS",
    "RETRACE_TOKEN",
    "APP_DUMP",
    "APP_VARIANT",
    "APP_JITTER_SEED",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
)


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
    def run_id(self) -> str:
        """The run `record --json` named on the last line of its standard output."""
        lines = self.stdout.strip().splitlines()
        try:
            return json.loads(lines[-1])["run"] if lines else ""
        except (ValueError, KeyError, TypeError):
            return ""

    def explain(self) -> str:
        return (
            f"$ {' '.join(self.args)}\nexit {self.returncode} after {self.seconds:.2f}s\n"
            f"--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}"
        )


class Retrace:
    """The `retrace` binary on one store (RETRACE_HOME under the test session's temp dir)."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def env(self, **extra: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in SCRUB}
        env["RETRACE_HOME"] = str(self.home)
        env["RETRACE_MASK_KEY"] = MASK_KEY
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        for k, v in extra.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def __call__(self, *args: str, timeout: float = 120, **env: str | None) -> Done:
        argv = [str(BIN), *args]
        started = time.monotonic()
        p = subprocess.run(
            argv, cwd=REPO, env=self.env(**env), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        return Done(argv, p.returncode, p.stdout, p.stderr, time.monotonic() - started)

    def record(self, sim: "Simulator", *cmd: str, **env: str | None) -> Done:
        return self(
            "record",
            "--json",
            "--upstream-openai",
            sim.openai_url,
            "--upstream-anthropic",
            sim.anthropic_url,
            "--",
            *cmd,
            OPENAI_API_KEY=OPENAI_KEY,
            ANTHROPIC_API_KEY=ANTHROPIC_KEY,
            **env,
        )

    def replay(self, run: str, *cmd: str, **env: str | None) -> Done:
        # No API keys: replay sets placeholders for the child.
        args = ["replay", run] + (["--", *cmd] if cmd else [])
        return self(*args, OPENAI_API_KEY=None, ANTHROPIC_API_KEY=None, **env)

    def show_json(self, run: str, seq: int | None = None) -> dict:
        args = ["show", run, "--json"] + (["--seq", str(seq)] if seq is not None else [])
        done = self(*args)
        assert done.returncode == 0, done.explain()
        return json.loads(done.stdout)


class Simulator:
    """`retrace simulate` as its own process on a free loopback port."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(
            [str(BIN), "simulate", "--addr", f"127.0.0.1:{self.port}"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while not port_open(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"retrace simulate did not start (see {log})")
            time.sleep(0.05)

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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


def read_dump(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def dump_by_call(path: Path) -> dict[str, dict]:
    return {d["call"]: d for d in (json.loads(line) for line in read_dump(path))}


def first_difference(recorded: list[str], replayed: list[str]) -> str:
    """Names the first call whose dump line differs, and where."""
    rec = {json.loads(l)["call"]: l for l in recorded}
    rep = {json.loads(l)["call"]: l for l in replayed}
    for name in sorted(set(rec) | set(rep)):
        a, b = rec.get(name), rep.get(name)
        if a != b:
            if a is None or b is None:
                return f"call {name}: only in {'replay' if a is None else 'recording'}"
            i = next(i for i in range(min(len(a), len(b)) + 1) if a[i : i + 1] != b[i : i + 1])
            return f"call {name} differs at char {i}:\n  recorded: ...{a[max(0, i - 80) : i + 120]}\n  replayed: ...{b[max(0, i - 80) : i + 120]}"
    return "no difference"


@dataclass
class Recordings:
    """What was recorded against the simulator, before it was stopped."""

    sim: Simulator
    dumps: Path
    runs: dict[str, Done] = field(default_factory=dict)

    def dump(self, name: str) -> Path:
        return self.dumps / f"{name}.recorded.jsonl"

    def ok(self, name: str) -> str:
        """The run id of a recording that must have succeeded."""
        done = self.runs[name]
        assert done.returncode == 0, f"recording {name} failed:\n{done.explain()}"
        run = done.run_id
        assert len(run) >= 20 and run.isalnum(), f"recording {name}: no `record --json` line last\n{done.explain()}"
        return run


@pytest.fixture(scope="session")
def retrace(tmp_path_factory) -> Retrace:
    if not BIN.exists():
        pytest.exit(f"no retrace binary at {BIN}: run tests/python/run.sh (it builds one)", returncode=2)
    return Retrace(tmp_path_factory.mktemp("retrace-home"))


@pytest.fixture(scope="session")
def recordings(retrace: Retrace, tmp_path_factory) -> Recordings:
    """Records every program the tests replay, against one simulator, then stops it: every
    replay below runs with no upstream at all."""
    dumps = tmp_path_factory.mktemp("dumps")
    sim = Simulator(dumps / "simulate.log")
    rec = Recordings(sim, dumps)
    try:
        plans = {
            "app": [PY, APP],
            "concurrent": [PY, APP, "--only", "concurrent"],
            "gzip": [PY, QUIRKS, "gzip"],
            "429": [PY, QUIRKS, "429"],
            "truncate": [PY, QUIRKS, "truncate"],
            "bestof": [PY, QUIRKS, "bestof"],
            "bestof-agents": [PY, QUIRKS, "bestof-agents"],
            "timeout": [PY, QUIRKS, "timeout"],
            "routes": [PY, QUIRKS, "routes"],
        }
        # Bursts of 16 concurrent calls of one agent, for `verify` (a race between the Lamport
        # tick and the append showed up in about half of such runs).
        for i in range(3):
            plans[f"burst{i}"] = [PY, APP, "--only", "concurrent", "--threads", "16"]
        for name, cmd in plans.items():
            rec.runs[name] = retrace.record(sim, *cmd, APP_DUMP=str(rec.dump(name)))
    finally:
        sim.stop()
    assert sim.stopped, "the simulator is still answering"
    return rec
