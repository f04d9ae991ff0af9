"""Issue 8's first proof, as a team would live it: the migration trio's trace is committed; a
change to the planner's prompt makes `retrace gate` fail, naming the first divergent step;
`gate --accept` re-records against the (simulated) provider, writes the new trace beside the old
one and shows which steps changed; the accepted trace then passes with no network at all.

The example is copied into a project folder of the test's own, so its prompt can be edited.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

from agents_harness import BIN, OPENAI_KEY, PY, REPO, Done, Retrace, Simulator


def run(retrace: Retrace, cwd: Path, *args: str, **env: str | None) -> Done:
    argv = [str(BIN), *args]
    started = time.monotonic()
    p = subprocess.run(argv, cwd=cwd, env=retrace.env(**env), capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    return Done(argv, p.returncode, p.stdout, p.stderr, time.monotonic() - started)


def test_a_prompt_change_fails_the_gate_and_accept_rerecords_it(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for name in ("app_async.py", "trio.py"):
        shutil.copy(REPO / "examples/python/agents" / name, project / name)
    retrace = Retrace(tmp_path / "home")
    traces = project / "traces"
    traces.mkdir()

    sim = Simulator(tmp_path / "simulate.log")
    try:
        rec = run(retrace, project, "record", "--json", "--upstream-openai", sim.openai_url, "--", PY, "app_async.py",
                  "--max-sleep", "0.05", OPENAI_API_KEY=OPENAI_KEY)
        assert rec.returncode == 0, rec.explain()
        run_id = json.loads(rec.lines[-1])["run"]
        ex = run(retrace, project, "export", run_id, "-o", str(traces / "trio.jsonl"))
        assert ex.returncode == 0, ex.explain()
    finally:
        sim.stop()

    # Unchanged code passes with no upstream and no API key.
    ok = run(retrace, project, "gate", "traces", OPENAI_API_KEY=None)
    assert ok.returncode == 0, ok.explain()

    # Someone edits the planner's prompt.
    trio = project / "trio.py"
    text = trio.read_text()
    assert "PLAN_PROMPT = " in text
    trio.write_text(text.replace("then backfill it.", "then backfill it in batches of 1000."))
    failed = run(retrace, project, "gate", "traces", "--junit", str(tmp_path / "junit.xml"), OPENAI_API_KEY=None)
    assert failed.returncode == 1, failed.explain()
    report = failed.stdout + failed.stderr
    assert "DIVERGED" in report and "planner" in report, failed.explain()
    assert "messages" in report, f"the first differing path should be in the prompt\n{failed.explain()}"
    assert "<failure" in (tmp_path / "junit.xml").read_text()

    # Deliberate re-recording, against the provider.
    sim = Simulator(tmp_path / "simulate2.log")
    try:
        accepted = run(retrace, project, "gate", "traces", "--accept", "--upstream-openai", sim.openai_url,
                       OPENAI_API_KEY=OPENAI_KEY, CI=None)
    finally:
        sim.stop()
    new = traces / "trio.accepted.jsonl"
    assert new.exists(), accepted.explain()
    assert (traces / "trio.jsonl").exists(), "the old trace must never be overwritten"
    assert "changed" in (accepted.stdout + accepted.stderr), accepted.explain()

    # Reviewed and moved into place, the new trace passes with no network.
    new.replace(traces / "trio.jsonl")
    passed = run(retrace, project, "gate", "traces", OPENAI_API_KEY=None)
    assert passed.returncode == 0, passed.explain()
