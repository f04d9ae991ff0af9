"""The autonomy ladder with the Python SDK and real processes: a side effect held by the policy
raises ApprovalRequired, `retrace approve` in another process releases it, and `retrace replay`
reproduces the hold and the approval from the log; a refusal raises NotPermitted."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
BIN = os.environ.get("RETRACE_BIN", str(HERE.parents[2] / "target" / "release" / "retrace"))
PROG = [sys.executable, str(HERE / "approval_prog.py")]


def env_for(home, approval_file):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRACE_")}
    env["RETRACE_HOME"] = str(home)
    env["APPROVAL_FILE"] = str(approval_file)
    return env


def project(tmp_path, below):
    (tmp_path / "retrace.toml").write_text(
        f'[project]\nname = "billing"\n[autonomy]\nside_effect_min_clean = 3\nside_effect_min_traces = 2\n'
        f'below = "{below}"\napproval_timeout_s = 0\n'
    )
    return tmp_path


def test_a_held_call_is_approved_from_another_process_and_replays(tmp_path):
    cwd = project(tmp_path, "hold")
    home, approval = tmp_path / "home", tmp_path / "approval"
    env = env_for(home, approval)
    rec = subprocess.Popen([BIN, "record", "--json", "--", *PROG], cwd=cwd, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not approval.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert approval.exists(), rec.communicate(timeout=5)
    held = approval.read_text().strip()
    assert held.startswith("ap_")
    agents = subprocess.run([BIN, "agents"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert "ops" not in agents.stdout or "unproven" in agents.stdout
    assert 'tool(cls="side_effect")' in agents.stdout, agents.stdout
    # The held call is listed, with its run and tool, until it is decided.
    pending = subprocess.run([BIN, "approve", "--pending", "--json"], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=60)
    assert pending.returncode == 0, pending.stderr
    listed = json.loads(pending.stdout)
    assert [p["id"] for p in listed] == [held], listed
    assert listed[0]["agent"] and listed[0]["tool"] and listed[0]["waited_s"] >= 0, listed
    table = subprocess.run([BIN, "approve", "--pending"], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=60)
    assert held in table.stdout and "WAITED" in table.stdout, table.stdout
    ok = subprocess.run([BIN, "approve", held, "--reason", "checked the list with ada@example.com"], cwd=cwd,
                        env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    # The reason is masked before it is stored, in the approvals table too (QA27 D2).
    import sqlite3
    with sqlite3.connect(home / "retrace.db") as db:
        decisions = [row[0] for row in db.execute("SELECT decision FROM approvals")]
    assert decisions and all("ada@example.com" not in d and "rtk_email_" in d for d in decisions), decisions
    out, err = rec.communicate(timeout=60)
    assert rec.returncode == 0, err
    after = subprocess.run([BIN, "approve", "--pending", "--json"], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=60)
    assert json.loads(after.stdout) == [], "a decided call is no longer listed"
    lines = out.strip().splitlines()
    assert lines[0] == "sent True", out
    run = json.loads(lines[-1])["run"]
    show = subprocess.run([BIN, "show", run], cwd=cwd, env=env, capture_output=True, text=True, timeout=60).stdout
    assert "approval timed_out" in show and "approval approved" in show, show
    approval.unlink()
    rep = subprocess.run([BIN, "replay", run], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout.strip().splitlines()[0] == "sent True"
    assert approval.read_text().strip() == held, "replay raised ApprovalRequired with the recorded id"
    again = subprocess.run([BIN, "approve", held, "--reason", "twice"], cwd=cwd, env=env, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 1, again.stderr


def test_a_refused_call_raises_not_permitted_and_replays_refused(tmp_path):
    cwd = project(tmp_path, "refuse")
    env = env_for(tmp_path / "home", tmp_path / "approval")
    rec = subprocess.run([BIN, "record", "--json", "--", *PROG], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert rec.returncode == 0, rec.stderr
    assert rec.stdout.startswith("refused"), rec.stdout
    assert "rung unproven" in rec.stderr and "retrace approve" in rec.stderr, rec.stderr
    run = json.loads(rec.stdout.strip().splitlines()[-1])["run"]
    rep = subprocess.run([BIN, "replay", run], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout.startswith("refused"), rep.stdout
