#!/usr/bin/env python3
"""The migration trio as three OS processes, with the Retrace Python SDK.

    retrace record --upstream-openai http://127.0.0.1:8100/v1 -- python examples/python/agents/app_procs.py
    retrace replay RUN

The main process starts one child per agent (`sys.executable` on this same script with
`--agent NAME`, in a random order); the children inherit RETRACE_URL / RETRACE_RUN /
OPENAI_BASE_URL from `retrace record` or `replay`, so all three are agents of one run, talking
through the daemon. Each child prints its result as one JSON line on its stdout, which the main
process collects; the main process prints the summary (one line per agent, sorted) and exits
nonzero if any child failed.

- planner: a plan from a model (official `openai` client via `agent.openai()`), `sql.query`
  (deterministic), then `backfill_ready` to the reviewer.
- schema: `fx.rate` (time_bound, ttl_s=60), a random unrecorded sleep, then `column_renamed`.
- reviewer: two messages; `approve` if `backfill_ready` came first, else `reject` (the
  order-dependent bug); then `notify` (side_effect, with a dry_run).
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import trio


def planner(run, opts) -> dict:
    a = run.agent("planner", role="planner")
    time.sleep(trio.jitter(opts.max_sleep))
    reply = a.openai().chat.completions.create(
        model=trio.MODEL,
        messages=[{"role": "system", "content": "You plan database migrations."},
                  {"role": "user", "content": trio.PLAN_PROMPT}],
    )
    plan = reply.choices[0].message.content
    rows = a.tool("sql.query", {"q": trio.sql_text(opts.variant)}, trio.live_sql_query,
                  cls="deterministic", version="2")
    started = a.now()
    batch = a.random_id()
    time.sleep(trio.jitter(opts.max_sleep) + trio.extra_delay(opts, "planner"))
    seq = a.send("reviewer", {"rows": rows["rows_to_backfill"], "batch": batch}, kind="backfill_ready")
    return {"plan": plan, "model": reply.model, "rows": rows, "started": started, "batch": batch, "sent_seq": seq}


def schema(run, opts) -> dict:
    a = run.agent("schema", role="schema")
    quote = a.tool("fx.rate", {"pair": "EURUSD"}, trio.live_fx_rate, cls="time_bound", ttl_s=60)
    time.sleep(trio.jitter(opts.max_sleep) + trio.extra_delay(opts, "schema"))  # unrecorded
    seq = a.send("reviewer", {"column": "users.full_name", "rate": quote["rate"]}, kind="column_renamed")
    return {"fx": quote, "sent_seq": seq}


def reviewer(run, opts) -> dict:
    a = run.agent("reviewer", role="reviewer")
    time.sleep(trio.jitter(opts.max_sleep))
    first = a.recv(timeout=30)
    second = a.recv(timeout=30)
    heard = [(m.kind, m.sender, m.seq) if m else None for m in (first, second)]
    decision = trio.verdict(first.kind if first else None)
    a.decide(decision, target=trio.TARGET)
    note = a.tool("notify", {"channel": "#migrations", "decision": decision}, trio.live_notify,
                  cls="side_effect", version="1", dry_run=trio.dry_notify)
    return {"heard": heard, "decision": decision, "notify": note}


def child(opts) -> int:
    import retrace

    run = retrace.connect()
    try:
        result = {"planner": planner, "schema": schema, "reviewer": reviewer}[opts.agent](run, opts)
    except retrace.Divergence as e:
        where = ", ".join(f"{k} {v}" for k, v in (("seq", e.seq), ("path", e.path)) if v is not None)
        print(f"app_procs[{opts.agent}]: divergence: {e}" + (f" ({where})" if where else ""), file=sys.stderr)
        return 3
    except Exception as e:  # noqa: BLE001 - reported, and the exit status says it failed
        print(f"app_procs[{opts.agent}]: {type(e).__name__}: {e}", file=sys.stderr)
        return 4
    run.finish()
    print(json.dumps(result), flush=True)
    return 0


def parent(opts) -> int:
    order = list(trio.AGENTS)
    random.shuffle(order)  # unrecorded: every run starts the processes in another order
    procs = {}
    for name in order:
        argv = [sys.executable, os.path.abspath(__file__), "--agent", name, "--variant", opts.variant,
                "--max-sleep", str(opts.max_sleep)] + [f"--delay={d}" for d in opts.delay]
        procs[name] = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)  # inherits RETRACE_*
    out, failed = {}, []
    for name, p in procs.items():
        stdout, _ = p.communicate()
        if p.returncode != 0:
            failed.append(f"{name} exited {p.returncode}")
            continue
        out[name] = json.loads(stdout.strip().splitlines()[-1])
    trio.print_summary(out)
    if failed:
        print("app_procs: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    opts = trio.options(with_agent=True)
    sys.exit(child(opts) if opts.agent else parent(opts))
