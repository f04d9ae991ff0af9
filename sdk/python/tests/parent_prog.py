"""Message.parent (SPEC §6): the event a send names as its cause. The planner sends a request
with no parent; the reviewer answers it naming the request's send (`parent=m.seq`) and the
planner hears that parent. Prints each message heard as `AGENT seq parent`."""
import threading

import retrace

run = retrace.connect()
lines = {}


def planner():
    a = run.agent("planner")
    asked = a.send("reviewer", {"q": "approve?"}, kind="request")
    reply = a.recv(timeout=10)
    assert reply.parent == asked, (reply, asked)
    lines["planner"] = f"planner {reply.seq} {reply.parent} {reply.kind}"


def reviewer():
    a = run.agent("reviewer")
    m = a.recv(timeout=10)
    a.send("planner", {"a": "yes"}, kind="reply", parent=m.seq)
    lines["reviewer"] = f"reviewer {m.seq} {m.parent} {m.kind}"


threads = [threading.Thread(target=f) for f in (planner, reviewer)]
for t in threads:
    t.start()
for t in threads:
    t.join()
run.finish()
for k in sorted(lines):
    print(lines[k])
