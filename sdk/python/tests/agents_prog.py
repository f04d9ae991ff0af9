"""Three agents as threads taking every kind of SDK step: run under `retrace record --` and
`retrace replay`. Prints a deterministic summary of what each agent got."""
import os
import random
import sys
import threading
import time

import retrace

run = retrace.connect()
variant = sys.argv[1] if len(sys.argv) > 1 else "a"
out = {}


def planner():
    a = run.agent("planner", role="planner")
    rows = a.tool("sql.query", {"q": "select count(*) from users"}, lambda: {"count": random.randint(1, 10**6)})
    stamp = a.now()
    rid = a.random_id()
    home = a.env("HOME")
    a.send("reviewer", {"kind": "backfill_ready", "rows": rows["count"], "variant": variant}, kind="backfill_ready")
    queued = a.tool("email.send", {"to": "ops"}, lambda idempotency_key: {"queued": True, "key": idempotency_key},
                    cls="side_effect", dry_run=lambda args: {"queued": False})
    out["planner"] = (rows, stamp, rid, home, queued)


def schema():
    a = run.agent("schema", role="schema")
    time.sleep(random.random() / 50)  # unrecorded timing: replay must not care
    quote = a.tool("fx.rate", {"pair": "EURUSD"}, lambda: round(random.random(), 6), cls="time_bound", ttl_s=60)
    a.send("reviewer", {"kind": "column_renamed", "quote": quote}, kind="column_renamed")
    out["schema"] = quote


def reviewer():
    a = run.agent("reviewer", role="reviewer")
    first = a.recv(timeout=10)
    second = a.recv(timeout=10)
    third = a.recv(timeout=0.05)
    verdict = "approve" if first.kind == "backfill_ready" else "reject"
    a.decide(verdict, target="step:backfill_users")
    try:
        a.tool("flaky.api", {"n": 1}, lambda: 1 / 0)
    except (ZeroDivisionError, retrace.StepError) as e:  # its own exception in record, StepError in replay
        failed = "division by zero" in str(e)
    out["reviewer"] = (first.kind, second.kind, third, verdict, failed)


threads = [threading.Thread(target=f) for f in (planner, schema, reviewer)]
for t in threads:
    t.start()
for t in threads:
    t.join()
run.finish()
for k in sorted(out):
    print(k, out[k])
