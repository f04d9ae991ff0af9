"""The README's example runs as written (QA34 D7: it named `db`, `send_fn` and `reviewer`, none
defined): recorded, then replayed exactly, under the `retrace` binary."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
BIN = os.environ.get("RETRACE_BIN", str(HERE.parents[2] / "target" / "release" / "retrace"))


def test_the_readme_example_records_and_replays(tmp_path):
    readme = (HERE.parent / "README.md").read_text()
    example = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    (tmp_path / "app.py").write_text(example + "print(len(rows), sent, prompt)\n")
    (tmp_path / "prompts" / "planner").mkdir(parents=True)
    (tmp_path / "prompts" / "planner" / "v3.txt").write_text("Plan the backfill of {table}.")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRACE_")}
    env["RETRACE_HOME"] = str(tmp_path / "home")
    rec = subprocess.run([BIN, "record", "--json", "--", sys.executable, "app.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert rec.returncode == 0, rec.stderr
    printed = rec.stdout.splitlines()[0]
    assert printed == "1 {'queued': True} Plan the backfill of users.", rec.stdout
    run = json.loads(rec.stdout.strip().splitlines()[-1])["run"]
    rep = subprocess.run([BIN, "replay", run], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout.splitlines()[0] == printed
