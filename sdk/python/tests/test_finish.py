"""`Run.finish()` of a replay the SDK started (`RETRACE_MODE=replay` naming a recorded run) judges
how it ended, as the Rust runtime's `Session::finish` does, against a real daemon
(`retrace serve`): steps left unconsumed or another exit status raise `retrace.Divergence` with
its code, seq, agent and keys, and the replay is stored `diverged` with that report; a
divergence the program caught mid-run is raised again. `afinish` does the same."""
import asyncio

import pytest

import retrace
from test_checks import daemon, events  # noqa: F401 (a fixture)
from test_mode import runs

FINISH = ["finish", "afinish"]


def recorded(daemon):
    """A finished record run: agent `ops` ran `sql.query` twice, then the run ended with 0."""
    run = retrace.connect(url=daemon, name="source")
    ops = run.agent("ops")
    assert ops.tool("sql.query", {"q": 1}, lambda: [1]) == [1]
    assert ops.tool("sql.query", {"q": 2}, lambda: [2]) == [2]
    assert run.finish()["status"] == "ok"
    return run.id


def replay(daemon, monkeypatch, source):
    """A new replay of `source`, started by the SDK, which its `finish` ends."""
    monkeypatch.setenv("RETRACE_URL", daemon)
    monkeypatch.setenv("RETRACE_MODE", "replay")
    monkeypatch.setenv("RETRACE_RUN", source)
    run = retrace.connect()
    assert run.mode == "replay" and run.id != source
    return run


def ended(run, finish, exit_status=0):
    if finish == "finish":
        return run.finish(exit_status)
    return asyncio.run(run.afinish(exit_status))


@pytest.mark.parametrize("finish", FINISH)
def test_a_replay_that_leaves_steps_unconsumed_raises_at_finish_and_is_stored_diverged(daemon, monkeypatch, finish):
    source = recorded(daemon)
    second = events(daemon, source)[1]
    run = replay(daemon, monkeypatch, source)
    assert run.agent("ops").tool("sql.query", {"q": 1}, lambda: pytest.fail("ran live")) == [1]
    with pytest.raises(retrace.Divergence) as diverged:
        ended(run, finish)
    d = diverged.value
    assert (d.code, d.seq, d.agent, d.expected, d.got) == ("steps_left", second["seq"], "ops", second["key"], None)
    assert d.report["step"] == "tool_call sql.query"
    assert d.message.splitlines() == [
        f'divergence [steps_left] at seq {second["seq"]}, agent "ops"',
        "  step:      tool_call sql.query",
        f"  expected:  {second['key']}",
        f'  agent "ops": first unconsumed step is seq {second["seq"]} (tool_call sql.query)',
    ], d.message
    stored = runs(daemon)[run.id]
    assert (stored["status"], stored["divergence"], stored["exit_status"]) == ("diverged", d.report, 0)


@pytest.mark.parametrize("finish", FINISH)
def test_a_replay_that_exits_with_another_status_raises_at_finish(daemon, monkeypatch, finish):
    source = recorded(daemon)
    run = replay(daemon, monkeypatch, source)
    ops = run.agent("ops")
    assert [ops.tool("sql.query", {"q": q}, lambda: pytest.fail("ran live")) for q in (1, 2)] == [[1], [2]]
    with pytest.raises(retrace.Divergence) as diverged:
        ended(run, finish, exit_status=3)
    d = diverged.value
    assert (d.code, d.seq, d.agent) == ("exit_status", None, "*")
    assert d.report["detail"] == ["recorded exit status 0, replay exited 3"]
    stored = runs(daemon)[run.id]
    assert (stored["status"], stored["divergence"], stored["exit_status"]) == ("diverged", d.report, 3)


@pytest.mark.parametrize("finish", FINISH)
def test_a_divergence_caught_mid_run_is_raised_again_at_finish(daemon, monkeypatch, finish):
    source = recorded(daemon)
    run = replay(daemon, monkeypatch, source)
    with pytest.raises(retrace.Divergence) as mid_run:
        run.agent("ops").tool("sql.query", {"q": 9}, lambda: pytest.fail("ran live"))
    assert (mid_run.value.code, mid_run.value.path) == ("step_mismatch", "$.q")
    with pytest.raises(retrace.Divergence) as at_finish:
        ended(run, finish)
    assert at_finish.value.report == mid_run.value.report
    assert runs(daemon)[run.id]["status"] == "diverged"


@pytest.mark.parametrize("finish", FINISH)
def test_a_replay_that_ends_as_recorded_returns_the_run_as_stored(daemon, monkeypatch, finish):
    source = recorded(daemon)
    run = replay(daemon, monkeypatch, source)
    ops = run.agent("ops")
    assert [ops.tool("sql.query", {"q": q}, lambda: pytest.fail("ran live")) for q in (1, 2)] == [[1], [2]]
    done = ended(run, finish)
    assert (done["run_id"], done["status"], done["divergence"], done["source_run"]) == (run.id, "ok", None, source)
    assert runs(daemon)[run.id]["status"] == "ok"
