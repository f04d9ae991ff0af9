"""`retrace resolve` names the idempotency key the side effect was handed, so a person can look
the call up where it may have landed (the provider's dashboard, a payments log)."""
import json
import sys
from pathlib import Path

from test_sdk import retrace

HERE = Path(__file__).parent


def test_resolve_names_the_key_the_side_effect_received(tmp_path):
    keys = tmp_path / "keys.txt"
    rec = retrace(tmp_path / "home", "record", "--json", "--", sys.executable, str(HERE / "crash_prog.py"),
                  str(keys), check=False)
    assert rec.returncode == 9, rec.stderr
    run = json.loads(rec.stdout.strip().splitlines()[-1])["run"]
    received = keys.read_text().split()
    # N counts the agent's side effects of that tool, whether or not their function takes a key.
    assert received == [f"{run}/payer/pay#2", f"{run}/payer/pay#3"], received

    events = [json.loads(line) for line in retrace(tmp_path / "home", "export", run).stdout.splitlines()[1:]]
    intents = [e["seq"] for e in events if e.get("type") == "intent"]
    resolved = retrace(tmp_path / "home", "resolve", run, str(intents[-1]), "--not-executed")
    assert f"idempotency key {received[-1]})" in resolved.stderr, resolved.stderr
