"""The Python SDK against a real daemon: `retrace record -- python agents_prog.py`, then
`retrace replay RUN` with nothing live, several times; a changed step is a Divergence."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
BIN = os.environ.get("RETRACE_BIN", str(HERE.parents[2] / "target" / "release" / "retrace"))
PROG = [sys.executable, str(HERE / "agents_prog.py")]


def retrace(home, *args, check=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRACE_")}
    env["RETRACE_HOME"] = str(home)
    r = subprocess.run([BIN, *args], env=env, capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"retrace {' '.join(args)} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    r = retrace(home, "record", "--json", "--", *PROG)
    run = json.loads(r.stdout.strip().splitlines()[-1])["run"]
    return home, run, r.stdout.strip().splitlines()[:-1]


def test_every_kind_of_step_is_recorded(recorded):
    home, run, printed = recorded
    show = retrace(home, "show", run).stdout
    for label in ("tool_call sql.query", "clock wall", "random id", "env HOME", "send -> reviewer",
                  "intent email.send", "tool_call email.send", "tool_call fx.rate", "deliver <- planner",
                  "decision approve", "tool_call flaky.api"):
        assert label in show or label.replace("decision approve", "decision reject") in show, f"{label}\n{show}"
    assert "deliver (timed out)" in show
    assert retrace(home, "verify", run).returncode == 0
    assert any("idempotency" in line or "key" in line for line in printed if line.startswith("planner"))


def test_replays_exactly_with_nothing_live(recorded):
    home, run, printed = recorded
    for _ in range(5):
        r = retrace(home, "replay", run)
        assert r.stdout.strip().splitlines() == printed, r.stdout + r.stderr
        assert "ok: every step matched" in r.stderr


def test_a_changed_step_is_a_divergence(recorded):
    home, run, _ = recorded
    r = retrace(home, "replay", run, "--", *PROG, "b", check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "step_mismatch" in r.stderr and "$.body.variant" in r.stderr, r.stderr


def test_the_sdk_needs_a_daemon(monkeypatch):
    import retrace as sdk
    monkeypatch.delenv("RETRACE_URL", raising=False)
    with pytest.raises(sdk.RetraceError, match="RETRACE_URL"):
        sdk.connect()


PROCS = [sys.executable, str(HERE / "procs_prog.py")]


@pytest.mark.parametrize("first", ["tool", "model"])
def test_agents_in_several_processes_replay_and_an_exited_process_is_a_stall_at_once(tmp_path, first):
    """Whatever the planner's steps so far were: an SDK step, or only a model call through its
    `openai()` client (QA23 D1: that agent was never tied to its process, and the reviewer
    waited out the 30 s stall timeout)."""
    import time
    from daemons import free_port, started
    upstream, extra = [], []
    if first == "model":
        port = free_port()
        sim = started(["simulate", "--addr", f"127.0.0.1:{port}"], port, dict(os.environ))
        upstream, extra = ["--upstream-openai", f"http://127.0.0.1:{port}/v1"], ["--model-first"]
    try:
        r = retrace(tmp_path, "record", "--json", *upstream, "--", *PROCS, *extra)
    finally:
        if first == "model":
            sim.kill()
            sim.wait()
    run = json.loads(r.stdout.strip().splitlines()[-1])["run"]
    assert "reviewer heard backfill_ready" in r.stdout
    for _ in range(3):
        assert retrace(tmp_path, "replay", run).returncode == 0
    started = time.monotonic()
    r = retrace(tmp_path, "replay", run, "--", *PROCS, *extra, "--planner-dies", check=False)
    elapsed = time.monotonic() - started
    assert r.returncode == 1, r.stdout + r.stderr
    assert "stall" in r.stderr, r.stderr
    assert elapsed < 10, f"the stall took {elapsed:.1f}s: it should be declared when the planner's process exits, not after the 30 s timeout"
    exited = float(re.search(r"planner exits at ([0-9.]+)", r.stderr).group(1))
    released = float(re.search(r"reviewer released at ([0-9.]+)", r.stderr).group(1))
    assert 0 <= released - exited < 1.0, f"the waiting reviewer was released {released - exited:.2f}s after the planner's process exited"
    assert 'agent "reviewer" waits for deliver from planner' in r.stderr, "the report names the awaited step"
