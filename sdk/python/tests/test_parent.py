"""`Message.parent` (SPEC §6) against a real daemon: a message carries the causal parent its
send named (None when it named none), in record and, identically, in replay; the send event
stores it as its `causal_parent`."""
import json
import sys
from pathlib import Path

from test_sdk import retrace

HERE = Path(__file__).parent
PROG = [sys.executable, str(HERE / "parent_prog.py")]


def test_a_message_carries_its_sends_parent_in_record_and_replay(tmp_path):
    r = retrace(tmp_path, "record", "--json", "--", *PROG)
    *printed, last = r.stdout.strip().splitlines()
    run = json.loads(last)["run"]
    heard = {line.split()[0]: line.split()[1:] for line in printed}
    request_seq, request_parent, _ = heard["reviewer"]
    reply_seq, reply_parent, reply_kind = heard["planner"]
    assert request_parent == "None", printed
    assert reply_parent == request_seq and reply_kind == "reply", printed

    events = json.loads(retrace(tmp_path, "show", run, "--json").stdout)["events"]
    sends = {e["seq"]: e for e in events if e["type"] == "send"}
    assert sends[int(request_seq)].get("causal_parent") is None, sends
    assert sends[int(reply_seq)]["causal_parent"] == int(request_seq), sends

    for _ in range(3):
        rep = retrace(tmp_path, "replay", run)
        assert rep.stdout.strip().splitlines() == printed, rep.stdout + rep.stderr
        assert "ok: every step matched" in rep.stderr, rep.stderr
