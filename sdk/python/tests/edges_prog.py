"""Programs for test_edges.py, one per scenario (the first argument): each prints what it saw,
and record and replay must print the same and end the same way."""
import asyncio
import json
import os
import sys

import retrace

scenario = sys.argv[1]
run = retrace.connect()


def forked() -> None:
    """After one call, fork: parent and child each take steps on their own agent; each must get
    its own answers (a shared keep-alive socket would hand each the other's)."""
    run.agent("parent").tool("warm", {}, lambda: "up")
    pid = os.fork()
    me = "child" if pid == 0 else "parent"
    agent = run.agent(f"{me}-worker")
    wrong = sum(agent.tool("echo", {"i": i}, lambda i=i: f"{me}-{i}") != f"{me}-{i}" for i in range(40))
    if pid == 0:
        os._exit(0 if wrong == 0 else 3)
    _, status = os.waitpid(pid, 0)
    print("parent wrong", wrong, "child exit", os.waitstatus_to_exitcode(status))


async def cancelled() -> None:
    """A twin cancelled by the program's own timeout: recorded, and timed out again in replay."""
    a = run.agent("a")

    async def slow():
        await asyncio.sleep(30)
        return "late"

    for cls in ("deterministic", "side_effect"):
        try:
            print(await asyncio.wait_for(a.atool(f"slow.{cls}", {}, slow, cls=cls), timeout=0.3))
        except asyncio.TimeoutError:
            print(cls, "timed out")
    print(await a.atool("fallback", {}, lambda: "cached"))


def exits() -> None:
    """A tool that ends the program: recorded as the step's failure, so replay exits the same."""
    a = run.agent("a")
    print("before")
    sys.stdout.flush()
    a.tool("fatal", {}, lambda: sys.exit(4))
    print("never")


def classes() -> None:
    """Failures whose class replay must keep: a refused output (RetraceError) and a
    json.JSONDecodeError (its __init__ wants the document and the position)."""
    a = run.agent("a")
    try:
        a.tool("ratio", {}, lambda: {"r": float("nan")})
    except retrace.RetraceError as e:
        print("refused", type(e).__name__, e.code)
    try:
        a.tool("parse", {}, lambda: json.loads("{"))
    except ValueError as e:
        print("parse", isinstance(e, json.JSONDecodeError), e)


def dies() -> None:
    """The program dies while a side effect runs: its intent is stored, its completion never."""
    run.agent("a").tool("email.send", {"to": "ops"}, lambda: os._exit(3), cls="side_effect")


{"forked": forked, "dies": dies, "cancelled": lambda: asyncio.run(cancelled()), "exits": exits, "classes": classes}[scenario]()
run.finish()
