"""A fork of an SDK program never runs a changed side effect: it calls the program's
``dry_run``, records what it returned as the step's output (source ``dry_run``), and replaying
the fork hands the program that value without calling ``dry_run`` or the side effect."""
import json
import re
import sys
from pathlib import Path

from test_sdk import retrace

# The fork's id, from the line `retrace fork` writes on standard error.
FORK_ID = re.compile(r"^retrace: forking \S+ at seq \d+ as (\w+):", re.M)

HERE = Path(__file__).parent
PROG = [sys.executable, str(HERE / "dryrun_prog.py")]


def test_a_forks_dry_run_is_recorded_and_replayed(tmp_path):
    home = tmp_path / "home"
    rec = retrace(home, "record", "--json", "--", *PROG)
    *printed, last = rec.stdout.strip().splitlines()
    run = json.loads(last)["run"]
    assert json.loads(printed[-1]) == {"queued": True, "to": "ops"}
    assert "SIDE EFFECT RAN" in rec.stderr

    show = retrace(home, "show", run).stdout
    lookup = re.search(r"^\s*(\d+)\s.*tool_call oncall\.lookup", show, re.M)
    assert lookup, show
    edit = tmp_path / "sre.json"
    edit.write_text(json.dumps({"to": "sre"}))
    fork = retrace(home, "fork", run, "--edit", f"tool-output:{lookup.group(1)}=@{edit}")
    printed = fork.stdout.strip().splitlines()
    fork_id = FORK_ID.search(fork.stderr).group(1)
    assert json.loads(printed[-1]) == {"queued": False, "would_send_to": "sre"}
    assert "DRY RUN CALLED" in fork.stderr and "SIDE EFFECT RAN" not in fork.stderr, fork.stderr

    events = [json.loads(line) for line in retrace(home, "export", fork_id).stdout.splitlines()[1:]]
    sent = [e for e in events if e.get("type") == "tool_call" and e.get("name") == "email.send"]
    assert sent and sent[-1]["source"] == "dry_run", sent
    assert sent[-1].get("error") is None, "the dry run is the step's output, not a failure"

    for _ in range(2):
        again = retrace(home, "replay", fork_id)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout.strip().splitlines()[0]) == {"queued": False, "would_send_to": "sre"}
        assert "DRY RUN CALLED" not in again.stderr and "SIDE EFFECT RAN" not in again.stderr, again.stderr
    assert retrace(home, "verify", fork_id).returncode == 0


def test_dry_run_keeps_its_tool_arguments_and_message():
    import pickle

    import retrace as sdk
    args = {"to": "ops", "body": "hi"}
    e = sdk.DryRun("email.send", args)
    assert (e.tool, e.tool_args) == ("email.send", args)
    assert e.args == ("email.send", args), "Exception's own args: what it was made with"
    assert str(e) == "dry run: side effect email.send was not executed in this fork (args {'to': 'ops', 'body': 'hi'})"
    again = pickle.loads(pickle.dumps(e))
    assert (type(again), again.tool, again.tool_args, str(again)) == (sdk.DryRun, "email.send", args, str(e))
