"""A receiver and two senders; with MUTE set (in a fork) s2 sends nothing and exits after
EXIT_AFTER seconds, while r may already be waiting for its message."""
import os
import threading
import time

import retrace

run = retrace.connect()
r, s1, s2 = run.agent("r"), run.agent("s1"), run.agent("s2")
s1.send("r", {"n": 1}, kind="m1")


def s2_body():
    if os.environ.get("MUTE"):
        time.sleep(float(os.environ.get("EXIT_AFTER", "0")))
        s2.exit()
        return
    s2.send("r", {"n": 2}, kind="m2")


t = threading.Thread(target=s2_body)
t.start()
if not os.environ.get("MUTE") or os.environ.get("JOIN_FIRST"):
    t.join()
a = r.recv(timeout=2)
b = r.recv(timeout=2)
t.join()
r.decide("heard", target=f"{a and a.kind},{b and b.kind}")
print("r heard", a and a.kind, b and b.kind)
run.finish()
