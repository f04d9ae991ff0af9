"""Tools that raise, of each class: prints what the program caught. In record the tool's own
exception comes back once its failure is recorded; in replay, where no tool runs, a
retrace.StepError carries the recorded failure."""
import retrace

run = retrace.connect()
worker = run.agent("worker")
for cls, ttl_s in (("deterministic", None), ("time_bound", 60), ("side_effect", None)):
    try:
        worker.tool(f"divide.{cls}", {"by": 0}, lambda: 1 / 0, cls=cls, ttl_s=ttl_s)
    except (ZeroDivisionError, retrace.StepError) as e:
        print(cls, type(e).__name__, e)
run.finish()
