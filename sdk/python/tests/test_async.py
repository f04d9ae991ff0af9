"""The async twins are native asyncio (an HTTP/1.1 keep-alive client over
`asyncio.open_connection`): fifty agents awaiting `arecv` on one event loop hold no thread
each, record, and replay exactly. A cancelled request closes its connection, and the daemon
drops the wait with it: the message goes to the next `arecv`. `aopenai()` and `aanthropic()`
are the official async clients, routed through the proxy like their blocking twins."""
import asyncio
import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest

import retrace
from daemons import free_ports, started
from test_sdk import retrace as cli

HERE = Path(__file__).parent
PROG = [sys.executable, str(HERE / "async_many_prog.py")]


def test_fifty_waiters_on_one_loop_hold_no_thread_and_replay_exactly(tmp_path):
    r = cli(tmp_path, "record", "--json", "--", *PROG)
    *printed, last = r.stdout.strip().splitlines()
    run = json.loads(last)["run"]
    # Sampled while all fifty awaited arecv: the main thread alone (no executor worker).
    assert printed[0] == "threads 1 plain tool off the loop: True", printed[0]
    heard = [line.split() for line in printed[1:]]
    assert len(heard) == 50
    for n, (name, sender, got, rid, doubled, stamped) in enumerate(heard):
        assert (name, sender, got, doubled, stamped) == (f"r{n}", "sender", str(n), str(2 * n), "True")
        assert len(rid) == 32
    for _ in range(3):
        rep = cli(tmp_path, "replay", run)
        assert rep.stdout.strip().splitlines() == printed, rep.stdout + rep.stderr
        assert "ok: every step matched" in rep.stderr, rep.stderr


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    """`retrace serve` on a fresh store, its upstreams a `retrace simulate`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RETRACE_", "OPENAI_", "ANTHROPIC_"))}
    env["RETRACE_HOME"] = str(tmp_path / "home")
    sim_port, port = free_ports(2)
    sim = started(["simulate", "--addr", f"127.0.0.1:{sim_port}"], sim_port, env)
    serve = started(["serve", "--addr", f"127.0.0.1:{port}", "--upstream-openai", f"http://127.0.0.1:{sim_port}/v1",
                     "--upstream-anthropic", f"http://127.0.0.1:{sim_port}"], port, env)
    for var in ("RETRACE_URL", "RETRACE_RUN", "RETRACE_MODE", "RETRACE_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for proc in (serve, sim):
            proc.terminate()
            proc.wait(timeout=10)


def test_a_cancelled_arecv_closes_its_connection_and_takes_no_message(daemon):
    async def main():
        run = retrace.connect(url=daemon, name="cancel")
        r, s = run.agent("r"), run.agent("s")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(r.arecv(timeout=30), 0.3)
        await asyncio.sleep(0.2)  # the daemon notices the closed connection and drops the wait
        seq = await s.asend("r", {"x": 1})
        m = await r.arecv(timeout=5)
        assert (m.seq, m.sender, m.body) == (seq, "s", {"x": 1})
        assert await r.arecv(timeout=0.05) is None
        # Sequential calls reuse one kept-alive connection.
        await s.aenv("HOME")
        idle = run._http.aio._idle[asyncio.get_running_loop()]
        assert len(idle) == 1, idle
        outcome = await run.afinish()
        assert outcome["status"] == "ok", outcome
        assert not run._http.aio._idle.get(asyncio.get_running_loop())

    asyncio.run(main())


def test_aopenai_and_aanthropic_are_the_async_clients_routed_through_the_proxy(daemon):
    async def main():
        run = retrace.connect(url=daemon, name="async-clients")
        agent = run.agent("planner")
        oa = agent.aopenai(api_key="sk-provider-key-for-the-simulator")
        an = agent.aanthropic(api_key="sk-ant-provider-key-for-the-simulator")
        o, a = await asyncio.gather(
            oa.chat.completions.create(model="gpt-sim", messages=[{"role": "user", "content": "hi"}]),
            an.messages.create(model="claude-sim", max_tokens=16, messages=[{"role": "user", "content": "hi"}]))
        assert o.choices[0].message.content and a.content[0].text
        await oa.close()
        await an.close()
        await run.afinish()
        return run.id

    run_id = asyncio.run(main())
    with urllib.request.urlopen(f"{daemon}/api/runs/{run_id}/events", timeout=10) as r:
        events = json.loads(r.read())["events"]
    assert sorted(e["type"] for e in events) == ["model_call", "model_call"], events


def test_a_run_whose_program_was_killed_is_interrupted_while_the_daemon_lives(daemon, tmp_path):
    """A program killed with SIGKILL never runs its exit hook: the run it created was left
    `running` for as long as the daemon lived, refused by `delete` and `replay` (QA24 D4). Once
    its process is gone (and no other process speaks for its agents) the daemon stores it
    `interrupted`, keeping what it recorded."""
    import subprocess
    import time
    prog = tmp_path / "killed.py"
    prog.write_text("import time\nimport retrace\nrun = retrace.connect()\nrun.agent('a').tool('t', {}, lambda: 1)\n"
                    "print(run.id, flush=True)\ntime.sleep(60)\n")
    env = dict(os.environ, RETRACE_URL=daemon)
    proc = subprocess.Popen([sys.executable, str(prog)], env=env, stdout=subprocess.PIPE, text=True)
    run_id = proc.stdout.readline().strip()

    def status():
        with urllib.request.urlopen(f"{daemon}/api/runs/{run_id}", timeout=10) as r:
            return json.load(r)["status"]

    assert status() == "running"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while status() == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status() == "interrupted"
    # A run whose program finished it is left as it ended.
    run = retrace.connect(url=daemon, name="finished")
    run.agent("a").tool("t", {}, lambda: 1)
    assert run.finish()["status"] == "ok"
