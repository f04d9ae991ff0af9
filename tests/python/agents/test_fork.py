"""Forking the Python trio (three processes, the official openai client through the proxy,
SDK tools and messages) with its two deliveries swapped moves the reviewer's decision, with the
upstream stopped (the model call is served from the source run at zero tokens); replaying the
fork reproduces it."""
import json
import re

from agents_harness import PY, OPENAI_KEY, Retrace, Simulator

APP = "examples/python/agents/app_procs.py"

# The fork's id, from the line `retrace fork` writes on standard error.
FORK_ID = re.compile(r"^retrace: forking \S+ at seq \d+ as (\w+):", re.M)


def reviewer_line(done):
    return next(line for line in done.lines if line.startswith("reviewer "))


def test_a_swap_moves_the_decision_and_the_fork_replays(tmp_path):
    rt = Retrace(tmp_path / "home")
    sim = Simulator(tmp_path / "sim.log")
    try:
        rec = rt("record", "--json", "--upstream-openai", sim.openai_url, "--", PY, APP, OPENAI_API_KEY=OPENAI_KEY)
    finally:
        sim.stop()
    assert rec.returncode == 0, rec.explain()
    assert sim.stopped
    run = json.loads(rec.lines[-1])["run"]
    timeline = rt("show", run).stdout
    deliveries = [int(m.group(1)) for m in re.finditer(r"^\s*(\d+)\s+\d+\s+\w+.*deliver <- ", timeline, re.M)]
    assert len(deliveries) == 2, timeline
    before = "approve" if '"decision": "approve"' in reviewer_line(rec) else "reject"
    after = "reject" if before == "approve" else "approve"

    fork = rt("fork", run, "--edit", f"swap:{deliveries[0]},{deliveries[1]}")
    assert fork.returncode == 0, fork.explain()
    assert f'"decision": "{after}"' in reviewer_line(fork), fork.explain()
    assert f"decision moved: reviewer on step:backfill_users: {before} -> {after}" in fork.stderr, fork.explain()
    assert "fork 0 in / 0 out live" in fork.stderr, "the model call came from the source run"
    fork_id = FORK_ID.search(fork.stderr).group(1)

    for _ in range(3):
        again = rt("replay", fork_id)
        assert again.returncode == 0, again.explain()
        assert reviewer_line(again) == reviewer_line(fork)
    assert rt("verify", "--all").returncode == 0
