"""The multi-agent example (examples/python/agents) end to end, with real processes: recorded
against `retrace simulate`, the simulator stopped, then replayed 20 times in a row with nothing
live, each replay printing the recording's summary; a replay whose live timing favours the other
message order still hears the recorded one (both decisions, approve and reject, are covered); a
changed tool argument is a divergence.

Both variants: three asyncio tasks on one event loop (random unrecorded sleeps, blocking SDK
calls from coroutines), and three OS processes started by a parent (inheriting RETRACE_*).
"""
from __future__ import annotations

import json
import time

import pytest

# Helpers live in agents_harness.py, not a conftest.py: tests/python/proxy's test module does
# `from conftest import ...`, and a second conftest module in the same session would shadow it.
from agents_harness import BIN, OPENAI_KEY, PY, Retrace, Simulator

APPS = {
    "async": "examples/python/agents/app_async.py",  # relative to the repository, as a person types it
    "procs": "examples/python/agents/app_procs.py",
}
SLEEP = ["--max-sleep", "0.1"]  # random unrecorded sleeps up to 0.1 s per agent step (keeps the suite short)
REPLAYS = 20


def summary(lines: list[str]) -> dict[str, dict]:
    """The program's summary: one `AGENT {json}` line per agent."""
    out = {}
    for line in lines:
        agent, _, values = line.partition(" ")
        out[agent] = json.loads(values)
    return out


@pytest.fixture(scope="module")
def retrace(tmp_path_factory) -> Retrace:
    """The binary on a store of this module's own."""
    if not BIN.exists():
        pytest.exit(f"no retrace binary at {BIN}: run tests/python/run.sh (it builds one)", returncode=2)
    return Retrace(tmp_path_factory.mktemp("agents-home"))


@pytest.fixture(scope="module")
def recorded(retrace: Retrace, tmp_path_factory) -> dict[str, tuple[str, list[str]]]:
    """Records both variants against one simulator, then stops it: every replay below runs with
    no upstream at all. Returns {name: (run id, summary lines)}: `async` and `procs` as they come
    (random order of the two messages), `async-approve` and `procs-approve` with the schema
    agent's send delayed 4 s (the planner first imports openai and asks the model, which can take
    seconds on a loaded machine), so that backfill_ready comes first and the reviewer approves."""
    sim = Simulator(tmp_path_factory.mktemp("sim") / "simulate.log")
    runs = {}
    try:
        for name, app in APPS.items():
            for suffix, extra in (("", []), ("-approve", ["--delay", "schema=4.0"])):
                done = retrace("record", "--json", "--upstream-openai", sim.openai_url, "--", PY, app, *SLEEP, *extra,
                               OPENAI_API_KEY=OPENAI_KEY)
                assert done.returncode == 0, done.explain()
                *printed, last = done.lines
                run = json.loads(last)["run"]
                assert len(run) >= 20 and run.isalnum(), f"no run id on the last line\n{done.explain()}"
                assert len(printed) == 3, done.explain()
                runs[name + suffix] = (run, printed)
    finally:
        sim.stop()
    assert sim.stopped, "the simulator is still answering"
    return runs


@pytest.mark.parametrize("variant", [*APPS, *(f"{v}-approve" for v in APPS)])
def test_recording_holds_every_kind_of_step(retrace: Retrace, recorded, variant):
    run, printed = recorded[variant]
    got = summary(printed)
    assert set(got) == {"planner", "schema", "reviewer"}, printed
    assert not any(v.get("missing") for v in got.values()), printed
    heard = got["reviewer"]["heard"]
    assert sorted(h[0] for h in heard) == ["backfill_ready", "column_renamed"], heard
    # The order-dependent bug, as recorded: approve only when backfill_ready came first.
    assert got["reviewer"]["decision"] == ("approve" if heard[0][0] == "backfill_ready" else "reject")
    if variant.endswith("-approve"):
        assert got["reviewer"]["decision"] == "approve", printed
    assert got["reviewer"]["notify"]["sent"] is True
    assert got["reviewer"]["notify"]["idempotency_key"] == f"{run}/reviewer/notify#1"
    assert got["planner"]["model"].startswith("gpt-4o-mini")
    show = retrace("show", run)
    assert show.returncode == 0, show.explain()
    for label in ("tool_call sql.query", "tool_call fx.rate", "intent notify", "tool_call notify", "clock wall",
                  "random id", "send -> reviewer", "deliver <- planner", "deliver <- schema", "decision"):
        assert label in show.stdout, f"{label!r} not in\n{show.stdout}"
    verify = retrace("verify", run)
    assert verify.returncode == 0, verify.explain()
    exported = retrace("export", run).stdout
    assert OPENAI_KEY not in exported
    # Each agent was declared with its role (run.agent(id, role=id)): every event of it holds
    # it, the planner's model call through the proxy included.
    events = [e for e in map(json.loads, exported.splitlines()) if "agent_id" in e and "seq" in e]
    roles = {(e["agent_id"], e["type"], e.get("role")) for e in events}
    assert all(role == agent for agent, _, role in roles), sorted(roles, key=str)
    assert ("planner", "model_call", "planner") in roles, sorted(roles, key=str)


@pytest.mark.parametrize("variant", list(APPS))
def test_replays_exactly_20_times_with_the_upstream_stopped(retrace: Retrace, recorded, variant):
    run, printed = recorded[variant]
    times = []
    for i in range(REPLAYS):
        done = retrace("replay", run, OPENAI_API_KEY=None)
        times.append(done.seconds)
        assert done.returncode == 0, f"replay {i + 1} of {REPLAYS}:\n{done.explain()}"
        assert done.lines == printed, f"replay {i + 1} of {REPLAYS} printed another summary:\n{done.explain()}"
        assert "ok: every step matched" in done.stderr, done.explain()
    print(f"{variant}: {REPLAYS} replays, {sum(times):.1f}s in all, "
          f"median {sorted(times)[len(times) // 2]:.2f}s, max {max(times):.2f}s")


@pytest.mark.parametrize("variant", list(APPS))
def test_a_changed_tool_argument_is_a_divergence(retrace: Retrace, recorded, variant):
    run, _ = recorded[variant]
    started = time.monotonic()
    done = retrace("replay", run, "--", PY, APPS[variant], *SLEEP, "--variant", "x", OPENAI_API_KEY=None)
    assert done.returncode == 1, done.explain()
    assert "step_mismatch" in done.stderr and "tool_call sql.query" in done.stderr, done.explain()
    assert "first difference at $.q" in done.stderr, done.explain()
    assert "replay" in done.stderr and "diverged" in done.stderr, done.explain()
    # The waiting reviewer is released with the divergence, not left to a stall timeout.
    assert time.monotonic() - started < 15, done.explain()


@pytest.mark.parametrize("variant", [*APPS, *(f"{v}-approve" for v in APPS)])
def test_replay_gives_the_recorded_order_not_the_live_one(retrace: Retrace, recorded, variant):
    """Replayed with the first sender of the recording delayed 1 s (live, the other message
    would now come first), the reviewer still hears the recorded order and decides as recorded."""
    run, printed = recorded[variant]
    first = summary(printed)["reviewer"]["heard"][0][1]
    app = APPS[variant.removesuffix("-approve")]
    done = retrace("replay", run, "--", PY, app, *SLEEP, "--delay", f"{first}=1.0", OPENAI_API_KEY=None)
    assert done.returncode == 0, done.explain()
    assert done.lines == printed, done.explain()
