"""Retrace's Python SDK: a thin client of the Retrace daemon (``retrace serve``, or the one that
``retrace record`` / ``replay`` start for the program they run).

Every step an agent takes (a tool call, a clock read, a random id, an env read, a message, a
decision) goes through the daemon, which runs it through Retrace's one step pipeline: in record
the SDK runs the step and reports what happened; in replay the daemon answers from the log and
nothing runs; a call the log doesn't hold raises :class:`Divergence`. Model calls go through the
daemon's proxy with the official clients (:meth:`Agent.openai`, :meth:`Agent.anthropic`).

    import retrace
    run = retrace.connect()
    planner = run.agent("planner", role="planner")
    rows = planner.tool("sql.query", {"q": "select 1"}, lambda: [{"one": 1}])  # your query here
    planner.decide("approve", target="step:backfill")
    run.finish()

Async twins (``await planner.atool(...)``, ``arecv``, ``asend``, ...) take the same steps on the
event loop over an asyncio keep-alive client: an agent awaiting ``arecv`` holds no thread.

Under ``RETRACE_MODE=off`` the program runs without Retrace: tool functions run directly, and
messages go between the agents of the process without a daemon.

Pure Python, standard library only.
"""
from __future__ import annotations

__all__ = [
    "connect", "Run", "Agent", "Message", "Divergence", "DryRun", "StepError", "RetraceError",
    "ApprovalRequired", "NotPermitted",
]

from ._agent import Agent, Message
from ._errors import ApprovalRequired, Divergence, DryRun, NotPermitted, RetraceError, StepError
from ._run import Run, connect
