"""An agent of a run and the steps it takes: each step is written once, as a flow (a generator
of what it needs done), and driven with blocking calls or on the event loop."""
from __future__ import annotations

import asyncio
import functools
import inspect
import math
import os
import random
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generator, Optional

from . import _off
from ._errors import ApprovalRequired, DryRun, NotPermitted, RetraceError
from ._errors import failure_text, replayed_failure
from ._values import checked_name as _checked_name, plain as _plain, text as _text

if TYPE_CHECKING:
    from ._run import Run

_CLASSES = ("deterministic", "time_bound", "side_effect")
# How a daemon answers a route it doesn't serve (`fallback` in retrace-server's lib.rs): a 404
# whose message starts so. A daemon older than the SDK answers a newer route this way.
_NO_ROUTE = "retrace: no route for "


def _segment(name: str) -> str:
    """``name`` as one path segment: an agent named ``team/alice`` is not two segments."""
    return urllib.parse.quote(name, safe="")


@dataclass(frozen=True)
class Message:
    """A message an agent heard: the seq of its send, its sender, its body, the event that
    caused the send (``parent``, or None), and its kind."""

    seq: int
    sender: str
    body: Any
    parent: Optional[int] = None
    kind: Optional[str] = None


def _named(name: Any, what: str) -> None:
    """Refuses an empty name before anything is sent: a step named by nothing says nothing in the
    log, and a message to no agent could never be received."""
    if isinstance(name, str) and not name:
        raise RetraceError(0, "usage", f"{what} is empty")


def _str(value: Any, what: str) -> None:
    """Refuses a name or kind that is not a str before anything is sent (QA23 D3: the daemon's
    parser error named a byte column, not the argument)."""
    if not isinstance(value, str):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise RetraceError(0, "usage", f"{what} must be a str, got {type(value).__name__} {shown}")


def _opt_str(value: Any, what: str) -> None:
    """[`_str`] for an argument that may be None."""
    if value is not None:
        _str(value, what)


def _parent(parent: Any, what: str) -> None:
    """A message's ``parent``: None, or the seq of an event (a whole number of 1 or more)."""
    if parent is not None and (isinstance(parent, bool) or not isinstance(parent, int) or parent < 1):
        raise RetraceError(0, "usage", f"{what}: parent={parent!r}; want the seq of the event that caused "
                                       f"the message (a whole number of 1 or more), or None")


def _timeout(timeout: Any, what: str) -> Optional[float]:
    """A ``recv`` timeout in seconds: None (or an infinity) waits as long as it takes; anything
    but a number of 0 or more is refused before it is sent (``usage``)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
        raise RetraceError(0, "usage", f"{what}: timeout={timeout!r}; want seconds (a number of 0 or more), or None "
                           "to wait as long as it takes")
    return None if math.isinf(timeout) else timeout


# A step is written once, as a flow: a generator that yields what it needs done (a request to
# the daemon, or the program's own function run) and gets the result sent back. `Agent._drive`
# runs a flow with blocking calls, `Agent._adrive` on the event loop: the sync API and its
# async twins take the same steps by the same rules.
class _Post:
    """Send ``body`` to the agent's ``route``: the flow gets the daemon's answer. ``optional``: a
    route a daemon older than this SDK lacks; the flow gets None from such a daemon."""

    def __init__(self, route: str, body: Any, optional: bool = False):
        self.route, self.body, self.optional = route, body, optional


def _no_route(e: RetraceError) -> bool:
    return e.status == 404 and e.message.startswith(_NO_ROUTE)


class _Run:
    """Run the program's function: the flow gets ``(value, None)`` or ``(None, exception)``.
    ``inline``: a cheap built-in read (clock, random, env) that never needs a thread."""

    def __init__(self, fn: Callable[[], Any], inline: bool = False):
        self.fn, self.inline = fn, inline


class _Raise:
    """A flow's result that its driver raises: the program's own exception, which raised inside
    the flow would become a RuntimeError if it is a StopIteration (PEP 479)."""

    def __init__(self, error: BaseException):
        self.error = error


_Flow = Generator[Any, Any, Any]


class Agent:
    """One agent of a run. Safe to use from several threads, and from several tasks of one
    event loop through the async twins (``atool``, ``arecv``, ...), which take the same steps
    without a thread: an agent awaiting ``arecv`` holds a connection, not a thread."""

    def __init__(self, run: Run, agent_id: str, role: Optional[str], prompt_template: Optional[str]):
        self.run, self.id, self.role, self.prompt_template = run, agent_id, role, prompt_template
        self._base = f"/api/runs/{_segment(run.id)}/agents/{_segment(agent_id)}"
        self._occurrences: dict[str, int] = {}
        self._lock = threading.Lock()
        self._claimed = 0  # the process that has claimed the agent (see _claim_flow)

    # ---- the two drivers -------------------------------------------------------------------

    # A function's exception, whatever it is, is recorded and then raised again: an Exception, a
    # `sys.exit()` or Ctrl-C inside it, a cancellation of the task awaiting it (an asyncio
    # timeout around a twin). Replay raises the same at the same step. The exception is raised
    # outside the `except StopIteration` that ends the flow, so its chain is its own.

    def _drive(self, flow: _Flow) -> Any:
        sent: Any = None
        while True:
            try:
                op = flow.send(sent)
            except StopIteration as done:
                result = done.value
                break
            if isinstance(op, _Post):
                try:
                    sent = self.run._http.call("POST", f"{self._base}/{op.route}", op.body)
                except RetraceError as e:
                    if not (op.optional and _no_route(e)):
                        raise
                    sent = None
            else:
                try:
                    sent = (op.fn(), None)
                except BaseException as e:  # the failure is recorded, then raised again
                    sent = (None, e)
        if isinstance(result, _Raise):
            raise result.error
        return result

    async def _adrive(self, flow: _Flow) -> Any:
        sent: Any = None
        while True:
            try:
                op = flow.send(sent)
            except StopIteration as done:
                result = done.value
                break
            if isinstance(op, _Post):
                try:
                    sent = await self.run._http.aio.call("POST", f"{self._base}/{op.route}", op.body)
                except RetraceError as e:
                    if not (op.optional and _no_route(e)):
                        raise
                    sent = None
                continue
            try:
                if op.inline:
                    value = op.fn()
                elif inspect.iscoroutinefunction(op.fn):
                    value = await op.fn()
                else:  # a plain (maybe blocking) function must not stall the loop
                    value = await asyncio.to_thread(op.fn)
                if inspect.isawaitable(value):
                    value = await value
                sent = (value, None)
            except BaseException as e:
                sent = (None, e)
        if isinstance(result, _Raise):
            if isinstance(result.error, asyncio.CancelledError) and hasattr(result.error, "_retrace_failure"):
                # Recorded cancelled (a timeout around the twin, another task's cancel()): the
                # step never finished, so it doesn't here either, until what cancelled it in
                # record cancels it again.
                await asyncio.get_running_loop().create_future()
            raise result.error
        # Only a dry_run callable can hand back an awaitable: a recorded output is JSON.
        return await result if inspect.isawaitable(result) else result

    # ---- the flows -------------------------------------------------------------------------

    def _step_flow(self, kind: str, name: str, request: Any, fn: Callable[[], Any], tool: Optional[dict] = None,
                   dry_run: Optional[Callable[[Any], Any]] = None, inline: bool = False) -> _Flow:
        _str(name, f"{'tool' if kind == 'tool_call' else kind} of agent {self.id!r}: its name")
        # A step named by nothing says nothing in the log (QA34 S5: a tool's empty name passed).
        _named(name, f"{'tool' if kind == 'tool_call' else kind} of agent {self.id!r}: its name")
        if self.run.mode == "off":  # no Retrace: the function's own result, or its own exception
            value, error = yield _Run(fn, inline)
            return value if error is None else _Raise(error)
        what = f"{'tool' if kind == 'tool_call' else kind} {name!r} of agent {self.id!r}"
        _text(name, f"{what}: its name holds")
        if self.run._owned and self.run._finished:
            # The daemon would refuse the step only after its function ran (QA34 D2: a paid call
            # made, then thrown away): refused first, as a new agent's claim would be.
            raise RetraceError(0, "run_finished", f"{what}: run {self.run.id} was ended by run.finish(); "
                                                  "it takes no more steps")
        body: dict = {"type": kind, "name": name, "request": request}
        if tool is not None:
            body["tool"] = tool
        side_effect = tool is not None and tool.get("class") == "side_effect"
        raised = None  # the program's own exception, raised again once its failure is recorded
        if self.run.mode == "record" and not side_effect:
            yield from self._claim_flow()
            started = time.monotonic()
            report, raised = self._report(what, (yield _Run(fn, inline)))
            # It ran before the step is posted: its own time, not the post's (QA25 D3).
            report["latency_ms"] = int((time.monotonic() - started) * 1000)
            body.update(report)
        answer = yield _Post("steps", body)
        if answer["status"] == "run":  # a side effect after its intent, a changed step of a fork
            done: dict = {"step": answer["step"]}
            if answer.get("dry_run") and dry_run is not None:  # a fork's side effect: never run
                report, raised = self._report(what, (yield _Run(lambda: dry_run(request), inline)))
            else:
                report, raised = self._report(what, (yield _Run(fn, inline)))
            done.update(report)
            answer = yield _Post("steps", done)
        if answer["status"] == "error" and raised is not None:
            return _Raise(raised)
        return self._result(answer, dry_run)

    def _claim_flow(self) -> _Flow:
        """Before the first step of this agent in this process whose function runs before the
        step is sent: the daemon ties the agent to this process, or says another has it
        (``agent_owned``), before the function has run. Once per process (a forked child claims
        again); a daemon older than this SDK has no such route, and is not asked again."""
        if self._claimed == os.getpid() or not self.run._claims_served:
            return
        if (yield _Post("claim", {}, optional=True)) is None:
            self.run._claims_served = False
        self._claimed = os.getpid()

    @staticmethod
    def _report(what: str, ran: tuple) -> tuple:
        """What the daemon records of a function that ran (``{"output": ...}`` or
        ``{"error": ...}``), and the exception to raise once it is recorded: the function's own,
        or the refusal of an output JSON can't hold (the function has run by then)."""
        value, error = ran
        if error is None:
            try:
                return {"output": _plain(value, f"{what} ran, but its output holds")}, None
            except RetraceError as refused:
                error = refused
        return {"error": failure_text(error)}, error

    @staticmethod
    def _result(answer: dict, dry_run: Optional[Callable[[Any], Any]]) -> Any:
        status = answer["status"]
        if status == "done":
            return answer["output"]
        if status == "error":  # replay: the function failed when it was recorded
            # Returned, not raised: a recorded StopIteration's twin raised inside the flow (a
            # generator) would become a RuntimeError (PEP 479).
            return _Raise(replayed_failure(answer["error"]))
        if status == "approval_required":
            raise ApprovalRequired(answer["approval"], answer["error"])
        if status == "refused":
            raise NotPermitted(answer["error"])
        if status == "dry_run":
            if dry_run is not None:
                return dry_run(answer["args"])
            raise DryRun(answer["tool"], answer["args"])
        raise RetraceError(0, "protocol", f"unexpected answer {answer!r}")

    def _tool_flow(self, name: str, args: Any, fn: Callable[..., Any], cls: str, version: str,
                   ttl_s: Optional[int], dry_run: Optional[Callable[[Any], Any]]) -> _Flow:
        # Checked before anything runs or is sent: the daemon would refuse the step only after a
        # live function (maybe a side effect) had run, leaving nothing recorded.
        what = f"tool {name!r} of agent {self.id!r}"
        if cls not in _CLASSES:
            raise RetraceError(0, "usage", f"{what}: cls={cls!r}; want one of {', '.join(_CLASSES)}")
        if cls == "time_bound" and (not isinstance(ttl_s, int) or isinstance(ttl_s, bool) or ttl_s <= 0):
            raise RetraceError(0, "usage", f"{what}: a time_bound tool needs ttl_s, a whole number of seconds "
                               f"above 0 (got ttl_s={ttl_s!r})")
        if cls != "time_bound" and ttl_s is not None:
            raise RetraceError(0, "usage", f"{what}: ttl_s is for time_bound tools only; a {cls} tool takes "
                               f"none (got ttl_s={ttl_s!r})")
        request = args if self.run.mode == "off" else _plain(args, f"{what}: the arguments hold")
        call = fn
        if cls == "side_effect":
            # Every side effect of the tool counts, as each logs an intent: `retrace resolve`
            # counts those to name the key (`idempotency_key` in its resolve.rs).
            with self._lock:
                n = self._occurrences.get(name, 0) + 1
                self._occurrences[name] = n
            if "idempotency_key" in _params(fn):
                call = functools.partial(fn, idempotency_key=f"{self.run.id}/{self.id}/{name}#{n}")
        tool = {"version": str(version), "class": cls, "ttl_s": ttl_s}
        if cls == "side_effect" and dry_run is not None:
            tool["dry_run"] = True  # a fork asks for the dry run and records what it returns
        return self._step_flow("tool_call", name, request, call, tool, dry_run)

    def _now_flow(self) -> _Flow:
        out = yield from self._step_flow("clock", "wall", {}, lambda: {"unix_ms": int(time.time() * 1000)},
                                         inline=True)
        return out["unix_ms"] / 1000.0

    def _random_id_flow(self) -> _Flow:
        out = yield from self._step_flow("random", "id", {}, lambda: {"id": f"{random.getrandbits(128):032x}"},
                                         inline=True)
        return out["id"]

    def _env_flow(self, name: str) -> _Flow:
        _named(name, f"env() of agent {self.id!r}: the variable's name")
        out = yield from self._step_flow("env", name, {"name": name}, lambda: {"value": os.environ.get(name)},
                                         inline=True)
        return out["value"]

    def _template_flow(self, vars: Optional[dict], template: Optional[str], named: dict) -> _Flow:
        chosen = template or self.prompt_template
        if not chosen:
            raise RetraceError(0, "usage", f"agent {self.id!r} has no prompt template: "
                               "pass prompt_template= to run.agent() or template= here")
        vars = _plain({**(vars or {}), **named}, f"template {chosen!r} of agent {self.id!r}: the vars hold")
        if self.run.mode == "off":
            return _off.template(chosen, vars)
        _text(chosen, f"template {chosen!r} of agent {self.id!r}: its name holds")
        body = {"template": chosen, "vars": vars}
        # The program's prompts folder, where it runs now, when it has one: not the folder of
        # wherever the daemon was started (a daemon with tokens reads only its own).
        prompts = os.path.abspath(os.environ.get("RETRACE_PROMPTS") or "prompts")
        if os.path.isdir(prompts):
            body["prompts_dir"] = prompts
        return (yield _Post("template", body))["text"]

    def _send_flow(self, to: str, body: Any, kind: str, parent: Optional[int]) -> _Flow:
        _str(to, f"send() of agent {self.id!r}: the recipient (to)")
        _str(kind, f"send() of agent {self.id!r}: the message's kind")
        _parent(parent, f"send() of agent {self.id!r}")
        _named(to, f"send() of agent {self.id!r}: the recipient's name (no agent can be named so)")
        # No agent could ever receive it: the id every route refuses (QA39 D3).
        _checked_name(to, f"send() of agent {self.id!r}: the recipient", 256)
        if self.run.mode == "off":
            return self.run._bus.post(self.id, to, body, kind, parent)
        what = f"message from agent {self.id!r} to {to!r}"
        _text(to, f"{what}: the recipient's name holds")
        _text(kind, f"{what}: its kind holds")
        body = _plain(body, f"{what}: the body holds")
        answer = yield _Post("send", {"to": to, "kind": kind, "body": body, "parent": parent})
        return answer["seq"]

    @staticmethod
    def _recv_flow(timeout: Optional[float]) -> _Flow:
        return _message((yield _Post("recv", {"timeout_s": timeout}))["message"])

    def _decide_flow(self, action: str, target: Optional[str]) -> _Flow:
        _str(action, f"decide() of agent {self.id!r}: the action")
        _opt_str(target, f"decide() of agent {self.id!r}: the target")
        _named(action, f"decide() of agent {self.id!r}: the action")
        if self.run.mode != "off":  # without Retrace a decision is the program's own business
            what = f"decision {action!r} of agent {self.id!r}"
            _text(action, f"{what}: the action holds")
            _text(target, f"{what}: the target holds")
            yield _Post("decide", {"action": action, "target": target})

    def _exit_flow(self) -> _Flow:
        if self.run.mode == "off":
            self.run._bus.exit(self.id)
        else:
            yield _Post("exit", {})

    # ---- the steps -------------------------------------------------------------------------

    def template(self, vars: Optional[dict] = None, template: Optional[str] = None, **named: Any) -> str:
        """The text of this agent's prompt template (``prompt_template`` of :meth:`Run.agent`, or
        ``template``, as ``name@version``), read from ``prompts/<name>/<version>.txt`` (or
        ``RETRACE_PROMPTS``) where the daemon runs, with ``{name}`` placeholders filled from
        keyword arguments (``template(table="users")``) and ``vars`` (a dict, for names such as
        ``template``). The agent's following model calls carry the template's id and digest, and a
        fork's ``prompt:AGENT=VERSION`` edit hands back that version's text instead."""
        return self._drive(self._template_flow(vars, template, named))

    def tool(self, name: str, args: Any, fn: Callable[..., Any], cls: str = "deterministic", version: str = "1",
             ttl_s: Optional[int] = None, dry_run: Optional[Callable[[Any], Any]] = None) -> Any:
        """Calls a tool: in record runs ``fn()`` and records its result (or error); in replay
        returns the recorded result and ``fn`` never runs. ``cls`` is ``deterministic``,
        ``time_bound`` (with ``ttl_s``, whole seconds above 0) or ``side_effect`` (whose intent is
        stored before it runs; never run by replay or fork; a fork hands back ``dry_run(args)`` and
        records it as the step's output, so replaying the fork hands back the same value without
        calling it). A side-effect ``fn`` that accepts ``idempotency_key`` gets a stable one:
        ``run/agent/tool#n``, for the agent's ``n``-th side effect of that tool (the key
        ``retrace resolve`` names).

        ``args`` and what ``fn`` returns must be values JSON can hold (a str holding a lone
        surrogate, from bytes that aren't UTF-8, is none): anything else is refused
        with a :class:`RetraceError` (``not_json``) naming the step and the JSON path, ``args``
        before anything runs, an output once ``fn`` has run (and recorded as the step's failure).
        When ``fn`` raises, the failure is recorded and ``fn``'s own exception is raised again; in
        replay, where ``fn`` never runs, a recorded failure raises :class:`StepError`."""
        return self._drive(self._tool_flow(name, args, fn, cls, version, ttl_s, dry_run))

    def now(self) -> float:
        """The wall clock (Unix seconds): live in record, recorded in replay."""
        return self._drive(self._now_flow())

    def random_id(self) -> str:
        """A random id (32 hex digits): live in record, recorded in replay."""
        return self._drive(self._random_id_flow())

    def env(self, name: str) -> Optional[str]:
        """An environment variable: live in record, recorded in replay."""
        return self._drive(self._env_flow(name))

    def send(self, to: str, body: Any, kind: str = "message", parent: Optional[int] = None) -> int:
        """Sends a message to agent ``to``; returns the seq of its ``send`` event. ``parent`` names
        the event that caused it (the receiver's ``Message.parent``). A ``body`` JSON can't hold is
        refused before it is sent, as :meth:`tool` refuses its ``args``."""
        return self._drive(self._send_flow(to, body, kind, parent))

    def recv(self, timeout: Optional[float] = None) -> Optional[Message]:
        """The next message for this agent (``Message(seq, sender, body, parent, kind)``), or None
        when ``timeout`` seconds pass (a recorded timeout, which replay reproduces at once)."""
        timeout = _timeout(timeout, f"recv() of agent {self.id!r}")
        if self.run.mode == "off":
            return _message(self.run._bus.take(self.id, timeout))
        return self._drive(self._recv_flow(timeout))

    def decide(self, action: str, target: Optional[str] = None) -> None:
        """Records a decision; in replay a different decision is a divergence."""
        self._drive(self._decide_flow(action, target))

    def exit(self) -> None:
        """Says this agent takes no more steps (a replay waiting on it stalls at once)."""
        self._drive(self._exit_flow())

    # Async twins: the same flows on the event loop, over the asyncio transport. No thread,
    # except while a plain (not `async def`) tool function runs: that goes to a worker thread
    # so a blocking tool doesn't stall the loop. An `async def` tool is awaited on the loop.
    async def atemplate(self, vars: Optional[dict] = None, template: Optional[str] = None, **named: Any) -> str:
        return await self._adrive(self._template_flow(vars, template, named))

    async def atool(self, name: str, args: Any, fn: Callable[..., Any], cls: str = "deterministic",
                    version: str = "1", ttl_s: Optional[int] = None,
                    dry_run: Optional[Callable[[Any], Any]] = None) -> Any:
        return await self._adrive(self._tool_flow(name, args, fn, cls, version, ttl_s, dry_run))

    async def anow(self) -> float:
        return await self._adrive(self._now_flow())

    async def arandom_id(self) -> str:
        return await self._adrive(self._random_id_flow())

    async def aenv(self, name: str) -> Optional[str]:
        return await self._adrive(self._env_flow(name))

    async def asend(self, to: str, body: Any, kind: str = "message", parent: Optional[int] = None) -> int:
        return await self._adrive(self._send_flow(to, body, kind, parent))

    async def arecv(self, timeout: Optional[float] = None) -> Optional[Message]:
        timeout = _timeout(timeout, f"arecv() of agent {self.id!r}")
        if self.run.mode == "off":
            return _message(await self.run._bus.atake(self.id, timeout))
        return await self._adrive(self._recv_flow(timeout))

    async def adecide(self, action: str, target: Optional[str] = None) -> None:
        await self._adrive(self._decide_flow(action, target))

    async def aexit(self) -> None:
        await self._adrive(self._exit_flow())

    # ---- model clients ---------------------------------------------------------------------

    def _proxy(self, provider: str) -> str:
        run, agent = _segment(self.run.id), _segment(self.id)
        return f"{self.run._http.url}/proxy/run/{run}/agent/{agent}/{provider}"

    def _client(self, provider: str, key_var: str, kwargs: dict) -> dict:
        """The client's arguments: routed through the proxy for this run and agent, or, in mode
        ``off``, left to the client (its own environment and defaults)."""
        if self.run.mode == "off":
            return kwargs
        if "base_url" in kwargs:
            raise RetraceError(0, "usage", f"{provider}(base_url=...): the client of agent {self.id!r} talks to "
                               "Retrace's proxy, which forwards to the upstream the daemon was started with "
                               "(retrace record --upstream-openai / --upstream-anthropic)")
        kwargs.setdefault("api_key", os.environ.get(key_var, "retrace-placeholder"))
        token = self.run._http.token
        headers = dict(kwargs.pop("default_headers", None) or {})
        if token:
            headers["X-Retrace-Token"] = token
        # Its calls tie the agent to this process, as its steps do: a replay waiting on the agent
        # then stalls at once when this process exits.
        headers["X-Retrace-Process"] = str(os.getpid())
        return dict(**kwargs, base_url=self._proxy(provider) + ("/v1" if provider == "openai" else ""),
                    default_headers=headers)

    def openai(self, **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` client whose calls are this agent's model steps."""
        import openai
        return openai.OpenAI(**self._client("openai", "OPENAI_API_KEY", kwargs))

    def anthropic(self, **kwargs: Any) -> Any:
        """An ``anthropic.Anthropic`` client whose calls are this agent's model steps."""
        import anthropic
        return anthropic.Anthropic(**self._client("anthropic", "ANTHROPIC_API_KEY", kwargs))

    def aopenai(self, **kwargs: Any) -> Any:
        """An ``openai.AsyncOpenAI`` client whose calls are this agent's model steps."""
        import openai
        return openai.AsyncOpenAI(**self._client("openai", "OPENAI_API_KEY", kwargs))

    def aanthropic(self, **kwargs: Any) -> Any:
        """An ``anthropic.AsyncAnthropic`` client whose calls are this agent's model steps."""
        import anthropic
        return anthropic.AsyncAnthropic(**self._client("anthropic", "ANTHROPIC_API_KEY", kwargs))


def _message(m: Optional[dict]) -> Optional[Message]:
    if m is None:
        return None
    return Message(m["seq"], m["sender"], m["body"], parent=m.get("parent"), kind=m.get("kind"))


def _params(fn: Callable[..., Any]) -> set:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()
