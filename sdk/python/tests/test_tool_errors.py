"""A tool that raises (SPEC §6): in record the failure is recorded, then the program gets the
tool's own exception object back, so `except ZeroDivisionError:` behaves as it does without
Retrace; in replay, where the tool never runs, the recorded failure raises retrace.StepError."""
import asyncio
import json
import sys
from pathlib import Path

import pytest

import retrace
from test_checks import daemon, events  # noqa: F401 - the fixture
from test_sdk import retrace as cli

HERE = Path(__file__).parent
PROG = [sys.executable, str(HERE / "errors_prog.py")]


def test_record_raises_the_tools_own_exception_once_its_failure_is_recorded(daemon):
    run = retrace.connect(url=daemon, name="errors")
    worker = run.agent("worker")
    boom = ZeroDivisionError("division by zero")

    def fail():
        raise boom

    async def afail():
        raise boom

    for cls, ttl_s in (("deterministic", None), ("time_bound", 60), ("side_effect", None)):
        with pytest.raises(ZeroDivisionError) as raised:
            worker.tool(f"divide.{cls}", {}, fail, cls=cls, ttl_s=ttl_s)
        assert raised.value is boom
        with pytest.raises(ZeroDivisionError) as raised:
            asyncio.run(worker.atool(f"divide.{cls}", {}, afail, cls=cls, ttl_s=ttl_s))
        assert raised.value is boom
    # Even a StopIteration, which a generator (the SDK's step flows) would turn into a RuntimeError.
    with pytest.raises(StopIteration):
        worker.tool("queue.next", {}, lambda: next(iter([])))
    run.finish()
    failed = [e["error"] for e in events(daemon, run.id) if e["type"] == "tool_call"]
    assert failed == ["ZeroDivisionError: division by zero"] * 6 + ["StopIteration: "], failed


def test_replay_raises_a_step_error_the_same_except_clause_takes(tmp_path):
    rec = cli(tmp_path, "record", "--json", "--", *PROG)
    *printed, last = rec.stdout.strip().splitlines()
    run = json.loads(last)["run"]
    took = [f"{cls} ZeroDivisionError division by zero" for cls in ("deterministic", "time_bound", "side_effect")]
    took += ["quota QuotaError over quota", "pickled True over quota", "jobs Jobs.Failed job 7",
             "config 2 No such file or directory /nonexistent/retrace-config.toml",
             "lookup KeyError 'k'", "queue StopIteration ''"]
    assert printed == took + ["strict True False"], rec.stdout + rec.stderr
    rep = cli(tmp_path, "replay", run)
    # The same lines: each StepError is also the recorded class, with its message (and an
    # OSError's errno and filename), and it pickles; a class that can't be built from its message
    # alone is made without its __init__ (QA16 D5: a json.JSONDecodeError stays a ValueError).
    assert rep.stdout.strip().splitlines() == took + ["strict True True"], rep.stdout + rep.stderr
    assert "ok: every step matched" in rep.stderr, rep.stderr


def test_a_recorded_failure_names_its_class_with_its_module_unless_built_in(daemon):
    run = retrace.connect(url=daemon, name="names")
    worker = run.agent("worker")

    class Local(Exception):
        pass

    def fail():
        raise Local("no")

    with pytest.raises(Local):
        worker.tool("local", {}, fail)
    with pytest.raises(KeyError):
        worker.tool("key", {}, lambda: {}["k"])
    run.finish()
    failed = [e["error"] for e in events(daemon, run.id) if e["type"] == "tool_call"]
    assert failed == [f"{__name__}.test_a_recorded_failure_names_its_class_with_its_module_unless_built_in."
                      "<locals>.Local: no", "KeyError: 'k'"], failed
