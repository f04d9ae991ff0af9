"""Tools that raise, of each class: prints what the program caught. In record the tool's own
exception comes back once its failure is recorded; in replay, where no tool runs, a
retrace.StepError carries the recorded failure, and is also an instance of the recorded class
when that class can be found (a built-in one, or one this program defines, nested or not), so
the same `except` clause takes it, with the attributes its message shows (an OSError's errno and
filename), it pickles, and the program prints the same lines."""
import pickle

import retrace


class QuotaError(Exception):
    """An exception class of the program's own."""


class Strict(Exception):
    """One that can't be built from its message alone: replay makes it without its __init__,
    with the message as its only argument (a StepError and a Strict all the same)."""

    def __init__(self, code: int, why: str):
        super().__init__(f"{code} {why}")


class Jobs:
    class Failed(Exception):
        """A nested class: recorded as `__main__.Jobs.Failed`."""


def over_quota():
    raise QuotaError("over quota")


def strict():
    raise Strict(7, "refused")


def missing():
    return {}["k"]


run = retrace.connect()
worker = run.agent("worker")
for cls, ttl_s in (("deterministic", None), ("time_bound", 60), ("side_effect", None)):
    try:
        worker.tool(f"divide.{cls}", {"by": 0}, lambda: 1 / 0, cls=cls, ttl_s=ttl_s)
    except ZeroDivisionError as e:
        print(cls, type(e).__name__, e)
try:
    worker.tool("billing.charge", {}, over_quota)
except QuotaError as e:
    print("quota", type(e).__name__, e)
    again = pickle.loads(pickle.dumps(e))
    print("pickled", isinstance(again, QuotaError), again)
try:
    worker.tool("jobs.run", {}, lambda: (_ for _ in ()).throw(Jobs.Failed("job 7")))
except Jobs.Failed as e:
    print("jobs", type(e).__qualname__, e)
try:
    worker.tool("config.read", {}, lambda: open("/nonexistent/retrace-config.toml").read())
except FileNotFoundError as e:
    print("config", e.errno, e.strerror, e.filename)
try:
    worker.tool("lookup", {}, missing)
except KeyError as e:
    print("lookup", type(e).__name__, e)
try:
    worker.tool("queue.next", {}, lambda: next(iter([])))
except StopIteration as e:
    print("queue", type(e).__name__, repr(str(e)))
try:
    worker.tool("strict", {}, strict)
except (Strict, retrace.StepError) as e:
    print("strict", isinstance(e, Strict), isinstance(e, retrace.StepError))
run.finish()
