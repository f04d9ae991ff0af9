"""One side effect under the autonomy policy: on ApprovalRequired the program writes the
approval's id to $APPROVAL_FILE and asks again until the call goes through (or is refused)."""
import os
import sys
import time

import retrace

run = retrace.connect()
ops = run.agent("ops")
for _ in range(300):
    try:
        out = ops.tool("email.send", {"to": "ceo"}, lambda: {"sent": True}, cls="side_effect")
        print("sent", out["sent"])
        break
    except retrace.ApprovalRequired as e:
        with open(os.environ["APPROVAL_FILE"], "w") as f:
            f.write(e.id)
        time.sleep(0.1)
    except retrace.NotPermitted as e:
        print("refused:", e, file=sys.stderr)
        print("refused")
        break
run.finish()
