#!/usr/bin/env python3
"""The migration trio as three asyncio tasks on one event loop, with the Retrace Python SDK.

    retrace record --upstream-openai http://127.0.0.1:8100/v1 -- python examples/python/agents/app_async.py
    retrace replay RUN

- planner: asks a model for a plan (the official `openai` client from `agent.openai()`, Chat
  Completions), reads `sql.query` (deterministic), sends `backfill_ready` to the reviewer.
- schema: reads `fx.rate` (time_bound, ttl_s=60), sleeps a random, unrecorded time, sends
  `column_renamed` to the reviewer.
- reviewer: hears two messages, decides `approve` if `backfill_ready` came first, else `reject`
  (the order-dependent bug), then calls `notify` (side_effect, with a dry_run).

Every task sleeps random, unrecorded times, and several steps are plain blocking SDK calls made
from inside a coroutine (they block the whole loop while they run): in replay those are answered
at once from the log, so the loop never deadlocks; only `arecv` waits, on the loop (no thread).

Prints one line per agent (sorted, JSON) with what it got; a replay prints the same lines.
"""
from __future__ import annotations

import asyncio
import sys

import retrace

import trio


async def planner(run: retrace.Run, opts, out: dict) -> None:
    a = run.agent("planner", role="planner")
    await asyncio.sleep(trio.jitter(opts.max_sleep))
    llm = a.openai()
    # The official client's blocking call, in a thread so the loop keeps running meanwhile.
    reply = await asyncio.to_thread(
        llm.chat.completions.create,
        model=trio.MODEL,
        messages=[{"role": "system", "content": "You plan database migrations."},
                  {"role": "user", "content": trio.PLAN_PROMPT}],
    )
    plan = reply.choices[0].message.content
    await asyncio.sleep(trio.jitter(opts.max_sleep) + trio.extra_delay(opts, "planner"))
    # Plain blocking SDK calls from inside the coroutine: the loop is blocked while they run.
    rows = a.tool("sql.query", {"q": trio.sql_text(opts.variant)}, trio.live_sql_query,
                  cls="deterministic", version="2")
    started = a.now()
    batch = a.random_id()
    seq = await a.asend("reviewer", {"rows": rows["rows_to_backfill"], "batch": batch}, kind="backfill_ready")
    out["planner"] = {"plan": plan, "model": reply.model, "rows": rows, "started": started, "batch": batch,
                      "sent_seq": seq}


async def schema(run: retrace.Run, opts, out: dict) -> None:
    a = run.agent("schema", role="schema")
    quote = await a.atool("fx.rate", {"pair": "EURUSD"}, trio.live_fx_rate, cls="time_bound", ttl_s=60)
    await asyncio.sleep(trio.jitter(opts.max_sleep) + trio.extra_delay(opts, "schema"))  # unrecorded
    seq = a.send("reviewer", {"column": "users.full_name", "rate": quote["rate"]}, kind="column_renamed")
    out["schema"] = {"fx": quote, "sent_seq": seq}


async def reviewer(run: retrace.Run, opts, out: dict) -> None:
    a = run.agent("reviewer", role="reviewer")
    await asyncio.sleep(trio.jitter(opts.max_sleep))
    first = await a.arecv(timeout=30)
    second = await a.arecv(timeout=30)
    heard = [(m.kind, m.sender, m.seq) if m else None for m in (first, second)]
    decision = trio.verdict(first.kind if first else None)
    a.decide(decision, target=trio.TARGET)  # blocking, on the loop
    await asyncio.sleep(trio.jitter(opts.max_sleep))
    note = a.tool("notify", {"channel": "#migrations", "decision": decision}, trio.live_notify,
                  cls="side_effect", version="1", dry_run=trio.dry_notify)
    out["reviewer"] = {"heard": heard, "decision": decision, "notify": note}


async def main() -> int:
    opts = trio.options()
    run = retrace.connect()
    out: dict = {}
    results = await asyncio.gather(planner(run, opts, out), schema(run, opts, out), reviewer(run, opts, out),
                                   return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    for e in failed:
        print(f"app_async: {type(e).__name__}: {e}", file=sys.stderr)
    run.finish(1 if failed else 0)
    trio.print_summary(out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
