"""What the two variants of the migration trio share: the live tool functions (each returns
something random, so a replay that printed the same values proves nothing ran live), the
review rule with its order-dependent bug, and the summary format.

Not a Retrace API: plain helpers of the example.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from typing import Any

AGENTS = ("planner", "schema", "reviewer")
MODEL = os.environ.get("APP_CHAT_MODEL", "gpt-4o-mini")
PLAN_PROMPT = "Plan the migration: rename users.name to users.full_name, then backfill it."
TARGET = "step:backfill_users"


def options(argv: list[str] | None = None, with_agent: bool = False) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--variant", default="", help="changes sql.query's argument: a replay with it diverges")
    p.add_argument("--max-sleep", type=float, default=0.3, help="upper bound of the random, unrecorded sleeps (s)")
    p.add_argument("--delay", action="append", default=[], metavar="AGENT=S",
                   help="an extra unrecorded sleep before AGENT sends its message (forces an order in record; "
                        "replay must reproduce the recorded order whatever it is)")
    if with_agent:
        p.add_argument("--agent", choices=AGENTS, help="run only this agent (the child processes)")
    return p.parse_args(argv)


def sql_text(variant: str) -> str:
    q = "select count(*) from users where full_name is null"
    return f"{q} -- {variant}" if variant else q


def jitter(max_sleep: float) -> float:
    """A random, unrecorded delay: record and every replay schedule the agents differently."""
    return random.uniform(0, max_sleep)


def extra_delay(opts: argparse.Namespace, agent: str) -> float:
    """The `--delay AGENT=S` for this agent (0 when none): unrecorded, like the jitter."""
    return sum(float(d.split("=", 1)[1]) for d in opts.delay if d.split("=", 1)[0] == agent)


# --- live tool functions: run only in record ------------------------------------------------

def live_sql_query() -> dict:
    return {"rows_to_backfill": random.randint(1_000, 1_000_000)}


def live_fx_rate() -> dict:
    return {"pair": "EURUSD", "rate": round(random.uniform(1.0, 1.2), 6), "fetched_at": time.time()}


def live_notify(idempotency_key: str) -> dict:
    # A real side effect would post to a chat channel, idempotently on the key.
    return {"sent": True, "idempotency_key": idempotency_key, "message_id": f"m{random.getrandbits(48):012x}"}


def dry_notify(args: Any) -> dict:
    """What a fork hands back for a changed or new notify: it never runs there."""
    return {"sent": False, "dry_run": True, "args": args}


# --- the review rule --------------------------------------------------------------------------

def verdict(first_kind: str | None) -> str:
    """The order-dependent bug: approve only when backfill_ready arrived first. The backfill is
    equally safe either way; the reviewer's rule should look at both messages, not their order."""
    return "approve" if first_kind == "backfill_ready" else "reject"


def summary_line(agent: str, values: dict) -> str:
    return f"{agent} {json.dumps(values, sort_keys=True)}"


def print_summary(out: dict[str, dict]) -> None:
    for agent in AGENTS:
        print(summary_line(agent, out.get(agent, {"missing": True})), flush=True)
