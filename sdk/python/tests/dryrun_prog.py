"""A side effect whose arguments come from a tool: a fork that edits the tool's output changes
the side effect, which a fork never runs; it hands back (and records) the program's dry run."""
import json
import sys

import retrace

run = retrace.connect()
notifier = run.agent("notifier")
target = notifier.tool("oncall.lookup", {"team": "db"}, lambda: {"to": "ops"})


def send(idempotency_key):
    print("SIDE EFFECT RAN", file=sys.stderr)
    return {"queued": True, "to": target["to"]}


def preview(args):
    print("DRY RUN CALLED", file=sys.stderr)
    return {"queued": False, "would_send_to": args["to"]}


out = notifier.tool("email.send", {"to": target["to"]}, send, cls="side_effect", dry_run=preview)
print(json.dumps(out, sort_keys=True))
run.finish()
