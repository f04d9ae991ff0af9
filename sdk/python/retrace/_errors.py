"""The exceptions the SDK raises (re-exported by ``retrace``)."""
from __future__ import annotations

import json
import sys
from typing import Any, Optional


class RetraceError(Exception):
    """The daemon refused a request (bad input, unknown run, store failure...), or the SDK refused
    a step before sending it (``status`` 0; ``code`` ``usage``, or ``not_json`` for a value or a
    name JSON can't hold)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, message


class Divergence(RetraceError):
    """Replay found the program asking for something other than what the log holds."""

    def __init__(self, status: int, message: str, report: dict):
        super().__init__(status, report.get("code", "divergence"), message)
        self.report = report
        self.seq: Optional[int] = report.get("seq")
        self.agent: Optional[str] = report.get("agent")
        self.expected: Optional[str] = report.get("expected")
        self.got: Optional[str] = report.get("got")
        self.path: Optional[str] = report.get("path")

    @classmethod
    def ended(cls, report: dict) -> "Divergence":
        """The divergence a run ended with (``divergence`` of the run the daemon's
        ``POST /api/runs/RUN/finish`` answers, found when the run ended: steps left unconsumed, other
        final decisions, another exit status; or earlier, mid-run). That answer carries the report
        alone, so its message is written here as the daemon writes one (the Rust ``Display``), less
        the line saying what the code means; ``status`` is 409, as for a divergence found mid-run."""
        head = f"divergence [{report.get('code', 'divergence')}]"
        if report.get("seq") is not None:
            head += f" at seq {report['seq']}"
        lines = [f"{head}, agent {json.dumps(report.get('agent'))}"]
        if report.get("step"):
            lines.append(f"  step:      {report['step']}")
        if report.get("expected"):
            lines.append(f"  expected:  {report['expected']}")
        if report.get("got"):
            lines.append(f"  got:       {report['got']}")
        if report.get("path"):
            lines.append(f"  first difference at {report['path']}")
        lines += [f"  {line}" for line in report.get("detail") or []]
        return cls(409, "\n".join(lines), report)


class DryRun(Exception):
    """A fork reached a changed or new side effect that has no ``dry_run``: it did not run.
    ``.tool`` is the tool's name and ``.tool_args`` the arguments it was called with;
    ``.args`` is Exception's own ``(tool, tool_args)``, so the exception pickles and re-raises
    as it was made."""

    def __init__(self, tool: str, tool_args: Any):
        super().__init__(tool, tool_args)
        self.tool, self.tool_args = tool, tool_args

    def __str__(self) -> str:
        return f"dry run: side effect {self.tool} was not executed in this fork (args {self.tool_args!r})"


class ApprovalRequired(Exception):
    """A side effect is held by the autonomy policy until a person runs
    ``retrace approve ID --reason TEXT``; call it again with the same arguments afterwards.
    ``.id`` is the approval's id. Recorded, so replay raises it again at the same call."""

    def __init__(self, id: str, message: str):
        super().__init__(message)
        self.id = id


class NotPermitted(Exception):
    """The autonomy policy (or a person, through ``retrace approve --refuse``) refused a side
    effect: the message names the agent's rung and the bar. Recorded, so replay refuses again."""


class StepError(Exception):
    """The step's function failed when it was recorded: raised where the function does not run
    (replay, a step a fork answers from its source). Where it runs (record, a changed step of a
    fork), the failure is recorded and the function's own exception is raised again.

    Where the recorded exception's class can be found (a built-in one, or one of a module the
    program has imported), the StepError raised is also an instance of that class, with the
    same name and message, so ``except ValueError:`` takes the path it took in record; otherwise
    it is a plain StepError whose message is the recorded failure, ``ValueError: ...``."""


def failure_text(error: BaseException) -> str:
    """What is recorded of an exception: its class (module-qualified unless built in), then its
    message: ``ValueError: bad input``, ``billing.QuotaError: over quota``."""
    cls = type(error)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    try:
        message = str(error)
        if not isinstance(message, str):
            raise TypeError("__str__ returned a non-str")
    except Exception:  # noqa: BLE001 - a broken __str__ is the program's; the failure is still recorded
        # (QA34 D1: it escaped the SDK, nothing was recorded and the program got an AttributeError).
        try:
            message = f"(its message can't be read) {object.__repr__(error)} args={error.args!r}"
        except Exception:  # noqa: BLE001
            message = "(its message can't be read)"
    # As text JSON can hold: a lone surrogate (from undecodable bytes) escaped.
    return f"{name}: {message}".encode("utf-8", "backslashreplace").decode("utf-8")


_AS: dict = {}  # recorded exception class -> its StepError twin


def _recorded_class(name: str) -> Optional[type]:
    """The class a recorded failure names (``ValueError``, ``billing.QuotaError``,
    ``app.jobs.Job.Failed`` for a nested one), if the program has imported its module."""
    import builtins

    if "." not in name:
        return getattr(builtins, name, None)
    parts = name.split(".")
    # The longest imported module the name starts with, then attributes down to the class.
    for cut in range(len(parts) - 1, 0, -1):
        found = sys.modules.get(".".join(parts[:cut]))
        if found is None:
            continue
        for attr in parts[cut:]:
            found = getattr(found, attr, None)
        return found if isinstance(found, type) else None
    return None


def _twin_args(found: type, message: str) -> tuple:
    """The arguments that rebuild an exception of class ``found`` whose ``str()`` was ``message``:
    the message itself, or what it shows of the original arguments where ``str()`` is not the
    argument (a KeyError's key, an OSError's errno and strerror, a StopIteration's value)."""
    import ast
    import re

    def literal(text: str) -> object:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return text

    if issubclass(found, KeyError) or issubclass(found, StopIteration) or issubclass(found, SystemExit):
        return (literal(message),)
    if issubclass(found, RetraceError) and not issubclass(found, Divergence):
        code, _, said = message.partition(": ")
        return (0, code, said)
    if issubclass(found, OSError):
        shown = re.fullmatch(r"\[Errno (-?\d+)\] (.*?)(?:: (.*?))?(?: -> (.*))?", message, re.S)
        if shown:
            errno, strerror, filename, filename2 = shown.groups()
            args: list = [int(errno), strerror]
            if filename is not None:
                args.append(literal(filename))
                if filename2 is not None:
                    args += [None, literal(filename2)]
            return tuple(args)
    return (message,)


def _reduce_twin(self: BaseException) -> tuple:
    # A twin class is made at run time, so pickle can't find it by name: it is rebuilt from the
    # recorded failure instead (in another process too, where the program imports the class).
    return (replayed_failure, (self._retrace_failure,))  # type: ignore[attr-defined]


# What a program's exit, its interruption or a task's cancellation inside a step is recorded as
# (``SystemExit: 4``), and raised as again in replay: the exception itself, not a StepError,
# which an ``except Exception:`` would catch where the original went through.
_NOT_ERRORS = {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt,
               "asyncio.exceptions.CancelledError": None}


def replayed_failure(text: str) -> BaseException:
    """The exception a recorded failure (:func:`failure_text`) raises where its function does
    not run: a StepError that is also the recorded class where that class can be found (built
    from the message, or else made without its ``__init__``, with the message as its only
    argument). It pickles (the twin is rebuilt from ``text``). A recorded ``SystemExit``,
    ``KeyboardInterrupt`` or cancellation raises that exception itself."""
    name, sep, message = text.partition(": ")
    if sep and name in _NOT_ERRORS:
        if name == "asyncio.exceptions.CancelledError":
            import asyncio

            cancelled = asyncio.CancelledError(*([message] if message else []))
            cancelled._retrace_failure = text  # type: ignore[attr-defined]
            return cancelled
        return _NOT_ERRORS[name](*_twin_args(_NOT_ERRORS[name], message)) if message else _NOT_ERRORS[name]()
    found = _recorded_class(name) if sep else None
    if isinstance(found, type) and issubclass(found, Exception) and not issubclass(found, StepError):
        twin = _AS.get(found)
        if twin is None:
            try:
                twin = type(found.__name__, (StepError, found), {"__module__": found.__module__,
                                                                 "__qualname__": found.__qualname__,
                                                                 "__reduce__": _reduce_twin})
            except TypeError:  # a class that can't be a base (a layout conflict, @final)
                return StepError(text)
            _AS[found] = twin
        for build in (lambda: twin(*_twin_args(found, message)), lambda: _bare(twin, message)):
            try:
                error = build()
                if str(error) == message:
                    error._retrace_failure = text
                    return error
            except Exception:  # its __init__ wants more than the message, its __str__ more than args
                continue
    return StepError(text)


def _bare(twin: type, message: str) -> BaseException:
    """An instance of ``twin`` made without its ``__init__`` (whose arguments the recorded
    message doesn't give back: a ``json.JSONDecodeError``'s document and position), with the
    message as its only argument; attributes its ``__init__`` would set are missing."""
    error = twin.__new__(twin, message)
    error.args = (message,)
    return error


for _error in (RetraceError, Divergence, DryRun, ApprovalRequired, NotPermitted, StepError):
    _error.__module__ = "retrace"  # raised and shown as retrace.Divergence, ...
