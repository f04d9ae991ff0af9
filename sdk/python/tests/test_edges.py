"""The SDK where programs get unusual (QA16): forked processes, asyncio timeouts around twins,
sys.exit() inside a tool, exception classes that can't be built from their message, a forgotten
run.finish(), recv timeouts that are no number of seconds, dict keys that collide as JSON, and a
process speaking for another's agent. Each records and replays the same."""
import json
import math
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import retrace
from test_checks import daemon, events  # noqa: F401 - the fixture
from test_sdk import retrace as cli

HERE = Path(__file__).parent
PROG = [sys.executable, str(HERE / "edges_prog.py")]


def record_and_replay(tmp_path, scenario, status=0):
    rec = cli(tmp_path, "record", "--json", "--", *PROG, scenario, check=False)
    *printed, last = rec.stdout.strip().splitlines()
    assert rec.returncode == status, rec.stdout + rec.stderr
    run = json.loads(last)["run"]
    rep = cli(tmp_path, "replay", run, check=False)
    assert rep.returncode == 0 and "ok: every step matched" in rep.stderr, rep.stdout + rep.stderr
    assert rep.stdout.strip().splitlines() == printed, rep.stdout + rep.stderr
    return printed


def test_a_forked_child_gets_its_own_answers(tmp_path):
    printed = record_and_replay(tmp_path, "forked")
    assert printed == ["parent wrong 0 child exit 0"]


def test_a_twin_cancelled_by_a_timeout_is_recorded_and_times_out_again_in_replay(tmp_path):
    printed = record_and_replay(tmp_path, "cancelled")
    assert printed == ["deterministic timed out", "side_effect timed out", "cached"]


def test_sys_exit_inside_a_tool_is_recorded_and_exits_the_same_in_replay(tmp_path):
    assert record_and_replay(tmp_path, "exits", status=4) == ["before"]


def test_a_refused_output_and_a_json_decode_error_keep_their_class_in_replay(tmp_path):
    printed = record_and_replay(tmp_path, "classes")
    assert printed == ["refused RetraceError not_json",
                       "parse True Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"]


def test_a_recording_that_ends_inside_a_side_effect_says_so_and_how_to_resolve_it(tmp_path):
    rec = cli(tmp_path, "record", "--", *PROG, "dies", check=False)
    assert rec.returncode == 3, rec.stdout + rec.stderr
    assert "seq 1 (tool_call email.send) logged its intent but not its completion" in rec.stderr, rec.stderr
    assert "retrace resolve " in rec.stderr and " 1 --outcome @FILE | --not-executed" in rec.stderr, rec.stderr


def test_a_tools_exception_keeps_its_own_chain(daemon):
    run = retrace.connect(url=daemon, name="chain")
    a = run.agent("a")

    def lookup():
        try:
            return {}["user"]
        except KeyError:
            raise ValueError("no user")

    with pytest.raises(ValueError) as raised:
        a.tool("lookup", {}, lookup)
    assert isinstance(raised.value.__context__, KeyError), repr(raised.value.__context__)
    run.finish()


def test_recv_refuses_a_timeout_that_is_no_number_of_seconds_and_waits_on_infinity(daemon):
    run = retrace.connect(url=daemon, name="timeouts")
    a, b = run.agent("a"), run.agent("b")
    for bad in (-1, math.nan, "0.1", True):
        with pytest.raises(retrace.RetraceError) as refused:
            b.recv(timeout=bad)
        assert refused.value.code == "usage" and "recv() of agent 'b': timeout=" in refused.value.message
    a.send("b", {"n": 1})
    assert b.recv(timeout=math.inf).body == {"n": 1}
    run.finish()


def test_keys_that_collide_as_json_are_refused_before_the_tool_runs(daemon):
    run = retrace.connect(url=daemon, name="keys")
    ran = []
    with pytest.raises(retrace.RetraceError) as refused:
        run.agent("a").tool("t", {1: "one", "1": "uno"}, lambda: ran.append(1))
    assert refused.value.code == "not_json" and '"1"' in refused.value.message, refused.value.message
    assert ran == []
    run.finish()


def test_a_process_that_does_not_own_the_agent_is_refused_before_its_function_runs(daemon, tmp_path):
    run = retrace.connect(url=daemon, name="owned")
    run.agent("a").tool("mine", {}, lambda: 1)
    marker = tmp_path / "ran"
    child = f"""
import retrace
run = retrace.connect()
try:
    run.agent("a").tool("theirs", {{}}, lambda: open({str(marker)!r}, "w").write("ran"))
except retrace.RetraceError as e:
    print(e.code)
"""
    env = dict(os.environ, RETRACE_URL=daemon, RETRACE_RUN=run.id, RETRACE_MODE="record")
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "agent_owned", out.stdout + out.stderr
    assert not marker.exists(), "the tool ran before the refusal"
    run.finish()


def test_a_run_the_program_forgot_to_finish_is_finished_as_it_exits(daemon):
    prog = """
import retrace
run = retrace.connect(name="forgot")
print(run.id)
run.agent("a").tool("t", {}, lambda: 1)
"""
    env = dict(os.environ, RETRACE_URL=daemon)
    out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=60)
    run_id = out.stdout.strip()
    assert "was not finished (run.finish()): finished it as the program exited, with exit status 0" in out.stderr
    with urllib.request.urlopen(f"{daemon}/api/runs/{run_id}", timeout=10) as r:
        assert json.loads(r.read())["status"] == "ok"
    assert [e["name"] for e in events(daemon, run_id) if e["type"] == "tool_call"] == ["t"]


def test_a_terminal_ctrl_c_reaches_the_recorded_program_once(tmp_path):
    """Ctrl-C at a terminal reaches the whole foreground process group, `retrace record` and its
    program both: forwarded again, it would cut the program's own cleanup short."""
    import pty
    import select
    import time

    from test_sdk import BIN

    prog = tmp_path / "cleanup.py"
    prog.write_text("import sys, time\ntry:\n    print('ready', flush=True)\n    time.sleep(30)\n"
                    "except KeyboardInterrupt:\n    time.sleep(0.5)\n    print('cleaned up', flush=True)\n"
                    "    sys.exit(3)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRACE_")}
    env["RETRACE_HOME"] = str(tmp_path / "home")
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(BIN, [BIN, "record", "--", sys.executable, str(prog)], env)
    out, deadline, interrupted = b"", time.monotonic() + 60, False
    while time.monotonic() < deadline:
        if not interrupted and b"ready" in out:
            os.write(fd, b"\x03")  # the terminal's Ctrl-C: SIGINT from the kernel to the group
            interrupted = True
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    _, status = os.waitpid(pid, 0)
    said = out.decode(errors="replace")
    assert "cleaned up" in said and "Traceback" not in said, said
    assert os.waitstatus_to_exitcode(status) == 3, said
