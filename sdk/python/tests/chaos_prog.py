"""Four senders each send three numbered messages to one receiver before it starts receiving,
so up to four are deliverable at once; then the receiver takes all twelve and prints who it
heard, in order (`s2:0 s0:0 ...`). The sends come from one thread in a fixed round-robin order,
and the receiver waits past the bus's largest chaos delay (20 ms) first, so a chaos seed alone
decides the delivery order."""
import time

import retrace

SENDERS, EACH = 4, 3

run = retrace.connect()
senders = [run.agent(f"s{i}") for i in range(SENDERS)]
receiver = run.agent("receiver")
for n in range(EACH):
    for s in senders:
        s.send("receiver", {"n": n}, kind="numbered")
time.sleep(0.1)  # unrecorded: every message is past its chaos delay when the first recv starts
heard = []
for _ in range(SENDERS * EACH):
    m = receiver.recv(timeout=10)
    heard.append(f"{m.sender}:{m.body['n']}")
run.finish()
print(" ".join(heard))
