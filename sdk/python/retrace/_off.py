"""``RETRACE_MODE=off``: the program runs without Retrace and nothing contacts a daemon. Tools
run directly; what needs more than a function call is done here, in process: messages between
the agents of this process (:class:`Mailboxes`) and prompt templates read from the program's own
``prompts`` folder (:func:`template`)."""
from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Generator, Optional

from ._errors import RetraceError

# How long every agent of the process must have been waiting (or gone) before a `recv` gives up:
# long enough for threads that are still starting to create their agents.
_STALL_GRACE_S = 0.5
_ASYNC_POLL_S = 0.01


class Mailboxes:
    """Messages between the agents of one process, in the order sent. A `recv` that no agent
    of this process can ever answer (all of them wait in `recv` or have exited) raises: the
    sender may be in another process, which only the daemon can connect."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._boxes: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self._agents: set[str] = set()
        self._waiting: collections.Counter = collections.Counter()
        self._exited: set[str] = set()
        self._seq = 0

    def join(self, agent: str) -> None:
        with self._cond:
            self._agents.add(agent)
            self._exited.discard(agent)
            self._cond.notify_all()

    def exit(self, agent: str) -> None:
        with self._cond:
            self._exited.add(agent)
            self._cond.notify_all()

    def post(self, sender: str, to: str, body: Any, kind: str, parent: Optional[int]) -> int:
        """Queues a message for ``to``; returns its number in this process (its ``seq``)."""
        with self._cond:
            self._seq += 1
            self._boxes[to].append({"seq": self._seq, "sender": sender, "body": body, "parent": parent,
                                    "kind": kind})
            self._cond.notify_all()
            return self._seq

    def take(self, agent: str, timeout: Optional[float]) -> Optional[dict]:
        """The next message for ``agent``, or None after ``timeout`` seconds."""
        with self._cond:
            looks = self._looks(agent, timeout)
            try:
                while True:
                    self._cond.wait(next(looks))
            except StopIteration as done:
                return done.value
            finally:
                looks.close()

    async def atake(self, agent: str, timeout: Optional[float]) -> Optional[dict]:
        """:meth:`take` on the event loop, holding no thread; cancelled, it takes no message."""
        looks = self._looks(agent, timeout)
        try:
            while True:
                with self._cond:
                    wait = next(looks)
                await asyncio.sleep(min(wait, _ASYNC_POLL_S))
        except StopIteration as done:
            return done.value
        finally:
            with self._cond:
                looks.close()

    def _looks(self, agent: str, timeout: Optional[float]) -> Generator[float, None, Optional[dict]]:
        """One look at ``agent``'s mailbox per step, made with the lock held: yields how long
        to wait before the next, returns the message (or None at the deadline)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        stalled_since: Optional[float] = None
        self._waiting[agent] += 1
        try:
            while True:
                if self._boxes[agent]:
                    return self._boxes[agent].popleft()
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return None
                if self._agents <= set(self._waiting) | self._exited:
                    stalled_since = now if stalled_since is None else stalled_since
                    if now - stalled_since >= _STALL_GRACE_S:
                        raise RetraceError(0, "stall", f"RETRACE_MODE=off: agent {agent!r} waits for a message no "
                                           "agent can send: every agent of this process waits in recv or has exited. "
                                           "Without a daemon, messages go only between the agents of one process; "
                                           "agents in several processes need one (`retrace record -- ...`)")
                else:
                    stalled_since = None
                waits = [_STALL_GRACE_S if stalled_since is None else stalled_since + _STALL_GRACE_S - now]
                if deadline is not None:
                    waits.append(deadline - now)
                yield max(min(waits), 0.0)
        finally:
            self._waiting[agent] -= 1
            if not self._waiting[agent]:
                del self._waiting[agent]


_TEMPLATE_ID = re.compile(r"([A-Za-z0-9_-][A-Za-z0-9._-]*)@([A-Za-z0-9_-][A-Za-z0-9._-]*)")


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def template(template_id: str, vars: dict) -> str:
    """The daemon's ``template()`` in process: ``prompts/<name>/<version>.txt`` (or under
    ``RETRACE_PROMPTS``) with ``{name}`` placeholders filled in one pass, strings as they are and
    other values as compact JSON. A placeholder is a name of ASCII letters, digits and ``_`` in
    braces; one without a value raises ``template_var``; every other brace is text."""
    parts = _TEMPLATE_ID.fullmatch(template_id)
    if not parts:
        raise RetraceError(0, "usage", f"template {template_id!r}: want name@version, each of letters, digits, "
                           "'.', '_' or '-' and not starting with '.'")
    path = Path(os.environ.get("RETRACE_PROMPTS") or "prompts") / parts[1] / f"{parts[2]}.txt"
    try:
        text = path.read_text()
    except OSError as e:
        raise RetraceError(0, "unknown_template", f"prompt template {template_id}: reading {path}: {e}") from None
    missing = next((m for m in _PLACEHOLDER.finditer(text) if m[1] not in vars), None)
    if missing is not None:
        line = text.count("\n", 0, missing.start()) + 1
        given = ", ".join(sorted(vars)) or "none"
        raise RetraceError(0, "template_var", f"prompt template {template_id} ({path}): placeholder {{{missing[1]}}} "
                           f"on line {line} has no value (given: {given})")

    def fill(m: "re.Match[str]") -> str:
        value = vars[m[1]]
        return value if isinstance(value, str) else json.dumps(
            value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return _PLACEHOLDER.sub(fill, text)
