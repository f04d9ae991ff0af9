"""Two agents in two OS processes of one run: the planner sends, the reviewer receives and
decides. `--planner-dies` makes the planner's process exit before it sends; with
`--model-first` the planner's step before that is a model call through `agent.openai()` (the
daemon's upstream), not a tool."""
import subprocess
import sys
import time

import retrace

role = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else None
dies = "--planner-dies" in sys.argv

if role is None:
    procs = [subprocess.Popen([sys.executable, __file__, r, *sys.argv[1:]]) for r in ("planner", "reviewer")]
    codes = [p.wait() for p in procs]
    sys.exit(max(codes))

run = retrace.connect()
if role == "planner":
    a = run.agent("planner")
    if "--model-first" in sys.argv:
        a.openai().chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "plan"}])
    else:
        a.tool("sql.query", {"q": "select 1"}, lambda: {"rows": 1})
    if dies:
        print(f"planner exits at {time.time():.3f}", file=sys.stderr, flush=True)
        sys.exit(0)
    a.send("reviewer", {"ready": True}, kind="backfill_ready")
else:
    a = run.agent("reviewer")
    try:
        m = a.recv(timeout=20)
    except retrace.Divergence as d:
        print(f"reviewer released at {time.time():.3f}", file=sys.stderr)
        print("reviewer:", d.code, d, file=sys.stderr)
        sys.exit(1)
    a.decide("approve" if m and m.kind == "backfill_ready" else "reject")
    print("reviewer heard", m.kind)
