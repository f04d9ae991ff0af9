"""Per-step cost of persisting an 8-step agent loop: Retrace's Python SDK against Apache Burr's
SQLite persister and LangGraph's SqliteSaver, each beside its own no-persistence baseline,
measured interleaved in one process (so a busy neighbour on the machine hits every row alike).

Every loop is the same 8 pure state updates (``step`` and a running ``total``, a small dict); a
loop persists a fresh thread of them:
  - retrace:   a new record run on a real `retrace serve` (SQLite store in a temporary
               RETRACE_HOME); one agent records each update as a tool step (the step is
               acknowledged, i.e. committed, before it returns); finish. Baseline: the plain
               function calls. Two daemons: durability `batch` (the default: acknowledged at
               commit, fsync within 10 ms) and `event` (fsync before each acknowledgment).
  - burr:      a new Application (fresh app_id) over one prebuilt Graph of 8 actions, run to the
               last; SQLitePersister saves the state after each action (its defaults: rollback
               journal, synchronous=FULL, a commit per save). Baseline: no persister.
  - langgraph: one compiled StateGraph of 8 nodes invoked on a fresh thread_id; SqliteSaver (WAL,
               synchronous=FULL, a commit per checkpoint) with durability "async" (the default:
               a step's checkpoint is written while the next step runs) and "sync" (written
               before the next step starts, as Retrace does). Baseline: no checkpointer.
Per step = one loop's wall time / 8, open and finish included (a Retrace run's creation, Burr's
build, LangGraph's input checkpoint); the `steps only` row times Retrace's 8 steps alone.
Overhead = the row's median minus its framework's baseline median.

    bench/frameworks.sh [--loops N] [--warmup N] [--json]      # makes target/bench-venv itself
    target/bench-venv/bin/python bench/frameworks.py [--loops N] [--json]

Measured with `bench/frameworks.sh --loops 200 --warmup 20` on the project's machine (2 cores,
shared with two cargo builds: load average 4.3), python 3.11.7, SQLite 3.40.1, apache-burr 0.43.0,
langgraph 1.2.24 (+ checkpoint 4.3.2, checkpoint-sqlite 3.1.2); p50 per step, overhead over
the framework's own baseline in brackets:
    retrace, batch (default)  1694 µs (+1693); its 8 steps alone  951 µs
    retrace, event (fsync)    3818 µs (+3817); its 8 steps alone 2730 µs
    burr, SQLitePersister    16098 µs (+15992)
    langgraph, async (dflt)   9129 µs (+8664)
    langgraph, sync           6266 µs (+5801)
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Callable, TypedDict

os.environ.setdefault("LANGSMITH_TRACING", "false")

import retrace  # noqa: E402
from burr.core import ApplicationBuilder, GraphBuilder, State, action  # noqa: E402
from burr.core.persistence import SQLitePersister  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = os.environ.get("RETRACE_BIN", str(ROOT / "target" / "release" / "retrace"))
STEPS = 8


def update(state: dict, k: int) -> dict:
    """The one state update every framework runs at step k."""
    return {"step": k + 1, "total": state["total"] + k}


# ---- Retrace -----------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """`retrace serve` on a free loopback port over a SQLite store in its own temporary home."""

    def __init__(self, home: Path, durability: str):
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RETRACE_")}
        env.update(RETRACE_HOME=str(home), RETRACE_DURABILITY=durability)
        self.proc = subprocess.Popen([BIN, "serve", "--addr", f"127.0.0.1:{self.port}"], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/api/health", timeout=1).read()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"retrace serve did not start ({BIN})")
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def retrace_loop(url: str, steps_only: list) -> Callable[[int], dict]:
    def loop(i: int) -> dict:
        run = retrace.connect(url=url, name=f"bench-{i}")
        agent = run.agent("agent")
        state = {"step": 0, "total": 0}
        started = time.perf_counter_ns()
        for k in range(STEPS):
            state = agent.tool(f"step{k}", state, lambda s=state, k=k: update(s, k))
        steps_only.append(time.perf_counter_ns() - started)
        run.finish()
        return state
    return loop


def plain_loop(_i: int) -> dict:
    state = {"step": 0, "total": 0}
    for k in range(STEPS):
        state = update(state, k)
    return state


# ---- Burr --------------------------------------------------------------------------------

def burr_graph():
    def make(k: int):
        @action(reads=["step", "total"], writes=["step", "total"])
        def act(state: State) -> State:
            return state.update(**update({"total": state["total"]}, k))
        return act

    names = [f"s{k}" for k in range(STEPS)]
    return (GraphBuilder()
            .with_actions(**{n: make(k) for k, n in enumerate(names)})
            .with_transitions(*zip(names, names[1:]))
            .build())


def burr_loop(graph, persister) -> Callable[[int], dict]:
    def loop(_i: int) -> dict:
        builder = (ApplicationBuilder().with_graph(graph).with_state(step=0, total=0).with_entrypoint("s0")
                   .with_identifiers(app_id=uuid.uuid4().hex))
        if persister is not None:
            builder = builder.with_state_persister(persister)
        _, _, state = builder.build().run(halt_after=[f"s{STEPS - 1}"])
        return {"step": state["step"], "total": state["total"]}
    return loop


# ---- LangGraph ---------------------------------------------------------------------------

class GraphState(TypedDict):
    step: int
    total: int


def langgraph_builder() -> StateGraph:
    g = StateGraph(GraphState)
    for k in range(STEPS):
        g.add_node(f"s{k}", lambda state, k=k: update(state, k))
    g.add_edge(START, "s0")
    for k in range(STEPS - 1):
        g.add_edge(f"s{k}", f"s{k + 1}")
    g.add_edge(f"s{STEPS - 1}", END)
    return g


def langgraph_loop(graph, durability) -> Callable[[int], dict]:
    def loop(_i: int) -> dict:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        kwargs = {"durability": durability} if durability else {}
        return dict(graph.invoke({"step": 0, "total": 0}, config, **kwargs))
    return loop


# ---- the measurement -----------------------------------------------------------------------

def pct(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in ("apache-burr", "langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "retrace"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    out["retrace-cli"] = subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.strip()
    out["sqlite"] = sqlite3.sqlite_version
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loops", type=int, default=200, help="measured loops per row (default 200)")
    ap.add_argument("--warmup", type=int, default=20, help="unmeasured loops per row first (default 20)")
    ap.add_argument("--dir", default=None, help="where the temporary stores go (default: the system temp dir)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    args = ap.parse_args()

    expected = plain_loop(0)
    with tempfile.TemporaryDirectory(prefix="retrace-frameworks-", dir=args.dir) as tmp:
        tmp = Path(tmp)
        daemons = {d: Daemon(tmp / f"retrace-{d}", d) for d in ("batch", "event")}
        burr_db = SQLitePersister.from_values(str(tmp / "burr.db"), table_name="burr_state")
        burr_db.initialize()
        lg_conn = sqlite3.connect(str(tmp / "langgraph.db"), check_same_thread=False)
        saver = SqliteSaver(lg_conn)
        saver.setup()
        graph = burr_graph()
        lg = langgraph_builder()
        lg_plain, lg_saved = lg.compile(), lg.compile(checkpointer=saver)
        steps_only = {d: [] for d in daemons}
        rows = [  # (framework, variant, loop, is_baseline)
            ("retrace", "baseline: plain calls", plain_loop, True),
            ("retrace", "SDK -> serve, durability=batch (default)", retrace_loop(daemons["batch"].url, steps_only["batch"]), False),
            ("retrace", "SDK -> serve, durability=event (fsync/step)", retrace_loop(daemons["event"].url, steps_only["event"]), False),
            ("burr", "baseline: no persister", burr_loop(graph, None), True),
            ("burr", "SQLitePersister (journal=delete, sync=FULL)", burr_loop(graph, burr_db), False),
            ("langgraph", "baseline: no checkpointer", langgraph_loop(lg_plain, None), True),
            ("langgraph", "SqliteSaver, durability=async (default)", langgraph_loop(lg_saved, None), False),
            ("langgraph", "SqliteSaver, durability=sync", langgraph_loop(lg_saved, "sync"), False),
        ]
        times: list[list[int]] = [[] for _ in rows]
        try:
            for i in range(args.warmup + args.loops):
                if i == args.warmup:
                    for d in steps_only.values():
                        d.clear()
                for r, (_, name, loop, _) in enumerate(rows):  # interleaved: every row sees the same noise
                    started = time.perf_counter_ns()
                    got = loop(i)
                    elapsed = time.perf_counter_ns() - started
                    assert got == expected, f"{name}: {got} != {expected}"
                    if i >= args.warmup:
                        times[r].append(elapsed)
        finally:
            for d in daemons.values():
                d.stop()
            lg_conn.close()
            burr_db.cleanup()

    results, baseline = [], {}
    for (framework, variant, _, is_baseline), xs in zip(rows, times):
        per_step = [x / STEPS / 1000 for x in xs]
        med = statistics.median(per_step)
        if is_baseline:
            baseline[framework] = med
        results.append({"framework": framework, "variant": variant, "per_step_p50_us": med,
                        "per_step_p99_us": pct(per_step, 0.99),
                        "overhead_per_step_us": None if is_baseline else med - baseline[framework]})
        if framework == "retrace" and not is_baseline:
            durability = "batch" if "batch" in variant else "event"
            only = [x / STEPS / 1000 for x in steps_only[durability]]
            results.append({"framework": framework, "variant": f"steps only ({durability}): run open/finish excluded",
                            "per_step_p50_us": statistics.median(only), "per_step_p99_us": pct(only, 0.99),
                            "overhead_per_step_us": statistics.median(only) - baseline[framework]})

    report = {"loops": args.loops, "warmup": args.warmup, "steps_per_loop": STEPS, "cpus": os.cpu_count(),
              "machine": platform.machine(), "versions": versions(), "rows": results}
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
        return
    v = report["versions"]
    print(f"{STEPS}-step loop, {args.loops} loops (+{args.warmup} warm-up), interleaved; {os.cpu_count()} cpus; "
          f"python {v['python']}, sqlite {v['sqlite']}")
    print(f"{v['retrace-cli']} (sdk {v['retrace']}), apache-burr {v['apache-burr']}, langgraph {v['langgraph']} "
          f"(checkpoint {v['langgraph-checkpoint']}, checkpoint-sqlite {v['langgraph-checkpoint-sqlite']})")
    print(f"{'framework':10} {'variant':52} {'p50 µs/step':>12} {'p99 µs/step':>12} {'overhead p50':>13}")
    for row in results:
        over = row["overhead_per_step_us"]
        variant = ("  " if row["variant"].startswith("steps only") else "") + row["variant"]
        print(f"{row['framework']:10} {variant:52} {row['per_step_p50_us']:12.1f} {row['per_step_p99_us']:12.1f} "
              f"{'' if over is None else f'{over:+.1f}':>13}")


if __name__ == "__main__":
    main()
