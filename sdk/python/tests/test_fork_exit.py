"""SPEC §7, deliveries in a fork: a message counts as absent once its sender has exited, whether
the receiver was already waiting for it or not (QA29 D2: a receiver already waiting sat out the
whole --stall-timeout and the fork stopped on a false stall)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
BIN = os.environ.get("RETRACE_BIN", str(HERE.parents[2] / "target" / "release" / "retrace"))
PROG = [sys.executable, str(HERE / "exit_wake_prog.py")]


@pytest.mark.parametrize("when", ["before", "while_waiting"])
def test_a_fork_receiver_goes_on_when_the_sender_it_waits_for_exits(tmp_path, when):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRACE_")}
    env["RETRACE_HOME"] = str(tmp_path / "home")
    rec = subprocess.run([BIN, "record", "--json", "--", *PROG], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert rec.returncode == 0, rec.stderr
    assert rec.stdout.startswith("r heard m1 m2"), rec.stdout
    run = json.loads(rec.stdout.strip().splitlines()[-1])["run"]
    events = json.loads(subprocess.run([BIN, "show", run, "--json"], cwd=tmp_path, env=env, capture_output=True,
                                       text=True, timeout=60).stdout)["events"]
    delivered = [e["seq"] for e in events if e["type"] == "deliver"]
    assert len(delivered) == 2, events
    fork_env = dict(env, MUTE="1")
    if when == "before":
        fork_env["JOIN_FIRST"] = "1"
    else:
        fork_env["EXIT_AFTER"] = "1"
    started = time.monotonic()
    fork = subprocess.run([BIN, "fork", run, "--at", "1", "--edit", f"swap:{delivered[0]},{delivered[1]}",
                           "--stall-timeout", "20", "--", *PROG], cwd=tmp_path, env=fork_env,
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert fork.returncode == 0, fork.stderr
    assert "r heard m1 None" in fork.stdout, fork.stdout
    assert took < 15, f"the fork waited out the stall timeout: {took:.1f}s\n{fork.stderr}"
