"""Fifty receivers as asyncio tasks on one event loop, all awaiting `arecv` at once, while a
sender task sends each of them a message carrying a live random id. Every task uses only the
async twins; the program samples the process's thread count while all fifty wait and prints it
(`threads N ...`) before one `rK sender n rid 2n True` line per receiver, sorted; each receiver
also awaits an `async def` tool. Under the old twins
(`asyncio.to_thread`) each waiter held a worker thread, and with the default executor's few
workers the sender's own call queued behind them."""
import asyncio
import threading

import retrace

N = 50


async def receiver(agent: retrace.Agent, waiting: set, out: dict) -> None:
    waiting.add(agent.id)
    m = await agent.arecv(timeout=60)
    doubled = await agent.atool("double", {"n": m.body["n"]}, double_later(m.body["n"]))
    stamp = await agent.anow()
    out[agent.id] = (m.sender, m.body["n"], m.body["rid"], doubled, stamp > 0)


def double_later(n: int):
    async def double() -> int:  # an async tool: awaited on the loop
        await asyncio.sleep(0)
        return 2 * n
    return double


async def sender(agent: retrace.Agent, waiting: set, threads: list) -> None:
    while len(waiting) < N:  # every receiver has started its arecv
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)  # unrecorded: their requests are with the daemon by now
    threads.append(threading.active_count())
    for n in range(N):
        rid = await agent.arandom_id()
        await agent.asend(f"r{n}", {"n": n, "rid": rid}, kind="hello")
    # A plain tool function runs in a worker thread (so a blocking one doesn't stall the loop).
    threads.append(await agent.atool("where", {}, lambda: threading.current_thread() is not threading.main_thread()))


async def main() -> None:
    run = retrace.connect()
    waiting: set = set()
    out: dict = {}
    threads: list = []
    receivers = [receiver(run.agent(f"r{n}"), waiting, out) for n in range(N)]
    await asyncio.gather(sender(run.agent("sender"), waiting, threads), *receivers)
    await run.afinish()
    print("threads", threads[0], "plain tool off the loop:", threads[1])
    for name in sorted(out, key=lambda a: int(a[1:])):
        print(name, *out[name])


asyncio.run(main())
