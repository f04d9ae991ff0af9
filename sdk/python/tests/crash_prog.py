"""Side effects, the last of which dies between its intent and its completion: the process exits
inside the function, after writing down the idempotency key it was handed (to argv[1])."""
import os
import sys

import retrace

run = retrace.connect()
payer = run.agent("payer")
payer.tool("mail.send", {"to": "ops"}, lambda idempotency_key: {"sent": True}, cls="side_effect")
payer.tool("pay", {"amount": 5}, lambda: {"paid": True}, cls="side_effect")  # takes no key: still counts


def pay(idempotency_key):
    with open(sys.argv[1], "a") as keys:
        keys.write(idempotency_key + "\n")
    if idempotency_key.endswith("#3"):
        os._exit(9)  # the payment may or may not have gone out
    return {"paid": True}


payer.tool("pay", {"amount": 10}, pay, cls="side_effect")
payer.tool("pay", {"amount": 20}, pay, cls="side_effect")
run.finish()
