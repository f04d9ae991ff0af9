"""`RETRACE_MODE` and `RETRACE_RUN` (SPEC §3) as `retrace.connect()` reads them, against a real
daemon (`retrace serve`), as the Rust runtime reads them (`Session::from_env_with`): unset is
`record`; `replay` and `fork` need a run; any other value (`OFF`, an empty one, one with spaces)
is refused. A refused mode is a `usage` error raised before anything is sent to the daemon or
run: it would otherwise record a new run live, side effects included. A run named to replay
that is no replay run yet gets a new replay, and a finished record run takes no more steps. As
`retrace replay` and `retrace fork` refuse them, `replay` naming a run still being recorded and
`fork` naming a run that is no fork are refused too, before any step runs."""
import json
import urllib.request

import pytest

import retrace
from test_checks import daemon, events  # noqa: F401 (a fixture)

WANT = "want record, replay, fork or off (unset, it is record)"
BAD_MODES = [
    ({"RETRACE_MODE": "replay"}, "RETRACE_MODE=replay needs RETRACE_RUN (the run to replay)"),
    ({"RETRACE_MODE": "replay", "RETRACE_RUN": ""}, "RETRACE_MODE=replay needs RETRACE_RUN (the run to replay)"),
    ({"RETRACE_MODE": "fork"}, "RETRACE_MODE=fork needs RETRACE_RUN (the fork run to execute)"),
    ({"RETRACE_MODE": "OFF"}, f"RETRACE_MODE='OFF': {WANT}"),
    ({"RETRACE_MODE": "bogus"}, f"RETRACE_MODE='bogus': {WANT}"),
    ({"RETRACE_MODE": ""}, f"RETRACE_MODE='': {WANT}"),
    ({"RETRACE_MODE": " off"}, f"RETRACE_MODE=' off': {WANT}"),
    ({"RETRACE_MODE": "record\n"}, f"RETRACE_MODE='record\\n': {WANT}"),
    ({"RETRACE_MODE": "Replay", "RETRACE_RUN": "01run"}, f"RETRACE_MODE='Replay': {WANT}"),
]


def runs(daemon):
    with urllib.request.urlopen(f"{daemon}/api/runs", timeout=10) as r:
        return {run["run_id"]: run for run in json.loads(r.read())}


def recorded(daemon):
    """A finished record run holding one side effect, `email.send`, that returned `{"sent": 1}`."""
    run = retrace.connect(url=daemon, name="source")
    assert run.agent("ops").tool("email.send", {"to": "ops"}, lambda: {"sent": 1}, cls="side_effect") == {"sent": 1}
    run.finish()
    return run.id


@pytest.mark.parametrize("env,why", BAD_MODES, ids=[repr(env) for env, _ in BAD_MODES])
def test_a_bad_mode_is_refused_before_anything_is_sent_or_runs(daemon, monkeypatch, env, why):
    monkeypatch.setenv("RETRACE_URL", daemon)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    before = runs(daemon)
    sent = []
    with pytest.raises(retrace.RetraceError) as refused:
        run = retrace.connect()
        run.agent("ops").tool("email.send", {"to": "ops"}, lambda: sent.append("live"), cls="side_effect")
    assert (refused.value.status, refused.value.code) == (0, "usage")
    assert refused.value.message.startswith(why), refused.value.message
    near = env["RETRACE_MODE"].strip().lower()
    if WANT in why and near in ("record", "replay", "fork", "off"):
        assert f"did you mean {near!r}?" in refused.value.message, refused.value.message
    assert sent == [], "the side effect never runs"
    assert runs(daemon) == before, "nothing reaches the daemon: no run is made"
    # Passing the URL or a name changes nothing: the mode is checked first.
    with pytest.raises(retrace.RetraceError, match="^usage: RETRACE_MODE="):
        retrace.connect(url=daemon, name="named")
    assert runs(daemon) == before


def test_the_modes_a_launcher_sets_and_an_unset_one_still_work(daemon, monkeypatch):
    monkeypatch.setenv("RETRACE_URL", daemon)
    source = recorded(daemon)
    for env in ({}, {"RETRACE_MODE": "record"}, {"RETRACE_RUN": ""}):
        for var in ("RETRACE_MODE", "RETRACE_RUN"):
            monkeypatch.delenv(var, raising=False)
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        run = retrace.connect()  # a new run, recorded live
        assert run.mode == "record" and run.id != source
        assert run.agent("ops").tool("sql.query", {}, lambda: [1]) == [1]
        run.finish()
        assert runs(daemon)[run.id]["status"] == "ok"

    # What `retrace replay RUN -- CMD` sets: RETRACE_MODE=replay and RETRACE_RUN naming the
    # replay run it made. The program joins it; whoever made it ends it.
    with urllib.request.urlopen(urllib.request.Request(f"{daemon}/api/runs/{source}/replay", data=b"{}"),
                                timeout=10) as r:
        made = json.loads(r.read())["run_id"]
    monkeypatch.setenv("RETRACE_MODE", "replay")
    monkeypatch.setenv("RETRACE_RUN", made)
    joined = retrace.connect()
    assert (joined.id, joined.mode) == (made, "replay")
    assert joined.agent("ops").tool("email.send", {"to": "ops"}, lambda: pytest.fail("ran live"),
                                    cls="side_effect") == {"sent": 1}
    joined.finish()
    assert runs(daemon)[made]["status"] == "running", "a joined run is ended by whoever made it"

    monkeypatch.setenv("RETRACE_MODE", "off")
    before = runs(daemon)
    off = retrace.connect()
    assert off.mode == "off" and off.agent("ops").tool("t", {}, lambda: {1}) == {1}
    assert runs(daemon) == before


def test_replay_naming_a_recorded_run_replays_it_and_a_finished_record_run_takes_no_steps(daemon, monkeypatch):
    """As the Rust runtime's `DaemonRun::Replay`: a new replay of the run named, never steps
    recorded live into it (which, for a run still recording, would run its side effects)."""
    monkeypatch.setenv("RETRACE_URL", daemon)
    source = recorded(daemon)
    monkeypatch.setenv("RETRACE_MODE", "replay")
    monkeypatch.setenv("RETRACE_RUN", source)
    replay = retrace.connect()
    assert replay.mode == "replay" and replay.id != source
    assert runs(daemon)[replay.id]["source_run"] == source
    assert replay.agent("ops").tool("email.send", {"to": "ops"}, lambda: pytest.fail("ran live"),
                                    cls="side_effect") == {"sent": 1}
    replay.finish()
    assert runs(daemon)[replay.id]["status"] == "ok", "the replay it made, it ends"
    assert [e["type"] for e in events(daemon, source)] == ["intent", "tool_call"], "the source is unchanged"

    for mode in ("record", "fork"):
        monkeypatch.setenv("RETRACE_MODE", mode)
        ran = []
        with pytest.raises(retrace.RetraceError) as refused:
            retrace.connect().agent("ops").tool("sql.query", {}, lambda: ran.append(1))
        assert refused.value.code == "usage"
        assert refused.value.message.startswith(f"run {source} is a record run with status ok: it takes no more "
                                                "steps"), refused.value.message
        assert ran == []


@pytest.mark.parametrize("mode", ["fork", "replay"])
def test_fork_or_replay_naming_a_run_still_being_recorded_is_refused_before_anything_is_sent_or_runs(
        daemon, monkeypatch, mode):
    """As `retrace fork` and `retrace replay` refuse a run still being recorded (`check_finished`
    in retrace-cli's launcher.rs), and the Rust runtime's `Session::fork` a run that is not a
    fork: never steps recorded live into it, side effects included, nor a replay of a log that is
    still growing (the daemon would refuse that only after making a replay run nothing ends)."""
    monkeypatch.setenv("RETRACE_URL", daemon)
    live = retrace.connect(name="live")  # still recording: its program is running
    assert live.agent("ops").tool("sql.query", {}, lambda: [1]) == [1]
    before = runs(daemon)
    assert before[live.id]["status"] == "running"
    monkeypatch.setenv("RETRACE_MODE", mode)
    monkeypatch.setenv("RETRACE_RUN", live.id)
    sent = []
    with pytest.raises(retrace.RetraceError) as refused:
        run = retrace.connect()
        run.agent("ops").tool("email.send", {"to": "ops"}, lambda: sent.append("live"), cls="side_effect")
    assert (refused.value.status, refused.value.code) == (0, "usage")
    why = {"fork": "not a fork", "replay": "it is still being recorded; replay it once it has finished"}[mode]
    assert refused.value.message.startswith(f"run {live.id} is a record run with status running"), refused.value.message
    assert why in refused.value.message, refused.value.message
    assert sent == [], "the side effect never runs"
    assert runs(daemon) == before, "no replay run is made, and the recording is untouched"
    assert [e["type"] for e in events(daemon, live.id)] == ["tool_call"]

    live.finish()  # its recorder ends it as it would have
    assert runs(daemon)[live.id]["status"] == "ok"
