"""`RETRACE_MODE=off` (SPEC §3): the program runs without Retrace. RETRACE_URL points at a port
nothing listens on, so any request to a daemon would fail: tools run directly and hand back
their own results and exceptions, messages go between the agents of the process, templates come
from the program's `prompts/` folder, and a `recv` only another process could answer raises."""
import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import retrace
from daemons import free_port

HERE = Path(__file__).parent
ONE_PROCESS = "messages go only between the agents of one process"


@pytest.fixture
def off(tmp_path, monkeypatch):
    monkeypatch.setenv("RETRACE_MODE", "off")
    monkeypatch.setenv("RETRACE_URL", f"http://127.0.0.1:{free_port()}")
    for var in ("RETRACE_RUN", "RETRACE_PROMPTS", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_tools_and_reads_run_directly(off, monkeypatch):
    run = retrace.connect()
    assert run.mode == "off" and run.id.startswith("off-")
    planner = run.agent("planner", prompt_template="planner@v1")
    rows = {3, 1, 2}
    assert planner.tool("sql.query", {"q": "select id"}, lambda: rows) is rows, "the function's own result"
    boom = ValueError("no such table")

    def fail():
        raise boom

    with pytest.raises(ValueError) as raised:
        planner.tool("sql.query", {"q": "select nothing"}, fail)
    assert raised.value is boom
    sent = [planner.tool("email.send", {"to": "ops"}, lambda idempotency_key: idempotency_key, cls="side_effect")
            for _ in range(2)]
    assert sent == [f"{run.id}/planner/email.send#1", f"{run.id}/planner/email.send#2"]
    with pytest.raises(retrace.RetraceError, match="want one of deterministic, time_bound, side_effect"):
        planner.tool("email.send", {"to": "ops"}, fail, cls="side-effect")

    assert abs(planner.now() - time.time()) < 5
    assert len({planner.random_id(), planner.random_id()}) == 2
    monkeypatch.setenv("APP_FLAG", "on")
    assert planner.env("APP_FLAG") == "on"
    planner.decide("approve", target="step:backfill_users")

    (off / "prompts" / "planner").mkdir(parents=True)
    (off / "prompts" / "planner" / "v1.txt").write_text('Plan {table}: {n} rows, {opts}, as {"ok": 1}.')
    want = 'Plan users: 3 rows, {"a":true,"b":[1,2]}, as {"ok": 1}.'  # the daemon's filling, to the byte
    assert planner.template(table="users", n=3, opts={"b": (1, 2), "a": True}) == want
    assert planner.template({"table": "users", "n": 3, "opts": {"a": True, "b": [1, 2]}}) == want
    # One pass: a value holding `{n}` is inserted as it is.
    assert planner.template(table="{n}", n=3, opts=None) == 'Plan {n}: 3 rows, null, as {"ok": 1}.'
    with pytest.raises(retrace.RetraceError, match=r"placeholder \{n\} on line 1 has no value \(given: opts, table\)"):
        planner.template(table="users", opts=1)
    with pytest.raises(retrace.RetraceError, match="planner@v9: reading prompts/planner/v9.txt"):
        planner.template(template="planner@v9")

    client = planner.openai(api_key="sk-test-off")
    assert "/proxy/" not in str(client.base_url) and client.api_key == "sk-test-off"
    assert run.finish() == {"run_id": run.id}


def test_messages_go_between_the_agents_of_the_process(off):
    run = retrace.connect()
    heard = {}

    def planner():
        a = run.agent("planner")
        asked = a.send("reviewer", {"rows": 3}, kind="backfill_ready")
        reply = a.recv(timeout=10)
        heard["planner"] = (reply.sender, reply.body, reply.kind, reply.parent == asked)

    def reviewer():
        a = run.agent("reviewer")
        m = a.recv()
        a.send("planner", {"ok": True}, kind="verdict", parent=m.seq)
        heard["reviewer"] = (m.sender, m.body, m.kind, m.parent, a.recv(timeout=0.05))

    threads = [threading.Thread(target=f) for f in (reviewer, planner)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    run.finish()
    assert heard == {"planner": ("reviewer", {"ok": True}, "verdict", True),
                     "reviewer": ("planner", {"rows": 3}, "backfill_ready", None, None)}


def test_a_recv_no_agent_of_the_process_can_answer_raises(off):
    run = retrace.connect()
    reviewer, planner = run.agent("reviewer"), run.agent("planner")
    planner.exit()
    for timeout in (None, 30):
        started = time.monotonic()
        with pytest.raises(retrace.RetraceError, match=ONE_PROCESS) as stalled:
            reviewer.recv(timeout=timeout)
        assert stalled.value.code == "stall" and "agent 'reviewer'" in stalled.value.message
        assert time.monotonic() - started < 5
    with pytest.raises(retrace.RetraceError, match=ONE_PROCESS):
        asyncio.run(reviewer.arecv())


def test_the_async_twins(off):
    async def main():
        run = retrace.connect()
        a, b = run.agent("a"), run.agent("b")

        async def double():
            return 4

        assert await a.atool("double", {"x": 2}, double) == 4
        assert await a.atool("pair", {}, lambda: (1, 2)) == (1, 2)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(b.arecv(), 0.1)  # cancelled: takes no message
        seq = await a.asend("b", {"x": 1})
        m = await b.arecv(timeout=5)
        assert (m.seq, m.sender, m.body) == (seq, "a", {"x": 1})
        assert await b.arecv(timeout=0.05) is None
        await b.adecide("done")
        assert await run.afinish() == {"run_id": run.id}

    asyncio.run(main())


def test_a_program_runs_without_a_daemon_and_one_split_over_processes_says_why_it_cant(off):
    r = subprocess.run([sys.executable, str(HERE / "agents_prog.py")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    planner, reviewer, schema = r.stdout.strip().splitlines()
    assert planner.startswith("planner (") and "'key': 'off-" in planner, planner
    assert reviewer == "reviewer ('backfill_ready', 'column_renamed', None, 'approve', True)" or \
        reviewer == "reviewer ('column_renamed', 'backfill_ready', None, 'reject', True)", reviewer
    assert schema.startswith("schema 0.")

    started = time.monotonic()
    r = subprocess.run([sys.executable, str(HERE / "procs_prog.py")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert ONE_PROCESS in r.stderr and "agent 'reviewer'" in r.stderr, r.stderr
    assert time.monotonic() - started < 15
