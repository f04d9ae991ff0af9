"""Retrace's Python SDK: a thin client of the Retrace daemon (``retrace serve``, or the one that
``retrace record`` / ``replay`` start for the program they run).

Every step an agent takes (a tool call, a clock read, a random id, an env read, a message, a
decision) goes through the daemon, which runs it through Retrace's one step pipeline: in record
the SDK runs the step and reports what happened; in replay the daemon answers from the log and
nothing runs; a call the log doesn't hold raises :class:`Divergence`. Model calls go through the
daemon's proxy with the official clients (:meth:`Agent.openai`, :meth:`Agent.anthropic`).

    import retrace
    run = retrace.connect()
    planner = run.agent("planner", role="planner")
    rows = planner.tool("sql.query", {"q": "select 1"}, lambda: db.query("select 1"))
    planner.decide("approve", target="step:backfill")
    run.finish()

Pure Python, standard library only.
"""
from __future__ import annotations

import asyncio
import http.client
import inspect
import json
import os
import random
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = [
    "connect", "Run", "Agent", "Message", "Divergence", "DryRun", "StepError", "RetraceError",
    "ApprovalRequired", "NotPermitted",
]


class RetraceError(Exception):
    """The daemon refused a request (bad input, unknown run, store failure...)."""

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


class DryRun(Exception):
    """A fork reached a changed or new side effect that has no ``dry_run``: it did not run."""

    def __init__(self, tool: str, args: Any):
        super().__init__(f"dry run: side effect {tool} was not executed in this fork (args {args!r})")
        self.tool, self.args = tool, args


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
    """The step's function failed (live), or failed when it was recorded (replay)."""


@dataclass(frozen=True)
class Message:
    """A message an agent heard: the seq of its send, its sender, its body, the event that
    caused the send (``parent``, or None), and its kind."""

    seq: int
    sender: str
    body: Any
    parent: Optional[int] = None
    kind: Optional[str] = None


class _Http:
    """One keep-alive connection per thread to the daemon."""

    def __init__(self, url: str):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"RETRACE_URL must be http://HOST:PORT, not {url!r}")
        self.url = url.rstrip("/")
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.token = os.environ.get("RETRACE_TOKEN")
        self.local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=None)
            self.local.conn = conn
        return conn

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        # The daemon ties each agent to one process, and declares a replay stalled at once
        # when the process that owes the awaited step has exited.
        headers = {"content-type": "application/json", "x-retrace-process": str(os.getpid())}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        for attempt in (0, 1):
            conn = self._conn()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                break
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
        payload = json.loads(raw) if raw else None
        if response.status >= 400:
            error = (payload or {}).get("error", {}) if isinstance(payload, dict) else {}
            if response.status == 409 and error.get("divergence") is not None:
                raise Divergence(response.status, error.get("message", ""), error["divergence"])
            raise RetraceError(response.status, error.get("code", "error"), error.get("message", raw.decode(errors="replace")))
        return payload


def connect(url: Optional[str] = None, run: Optional[str] = None, name: Optional[str] = None) -> "Run":
    """Connects to the daemon (``RETRACE_URL``) for a run (``RETRACE_RUN``, set by
    ``retrace record`` / ``replay``). With no run, creates a new run to record into."""
    url = url or os.environ.get("RETRACE_URL")
    if not url:
        raise RetraceError(0, "no_daemon", "RETRACE_URL is not set: run the program under `retrace record -- ...`, "
                           "or start `retrace serve` and set RETRACE_URL=http://127.0.0.1:7420")
    http_ = _Http(url)
    run = run or os.environ.get("RETRACE_RUN")
    owned = False
    if not run:
        run = http_.call("POST", "/api/runs", {"name": name} if name else {})["run_id"]
        owned = True
    meta = http_.call("GET", f"/api/runs/{urllib.parse.quote(run)}")
    return Run(http_, meta["run_id"], meta["mode"], owned)


class Run:
    """One run on the daemon: its agents take steps through it."""

    def __init__(self, http_: _Http, run_id: str, mode: str, owned: bool):
        self._http, self.id, self.mode, self._owned = http_, run_id, mode, owned
        self._agents: dict[str, Agent] = {}

    def agent(self, agent_id: str, role: Optional[str] = None, prompt_template: Optional[str] = None) -> "Agent":
        """The agent ``agent_id`` of this run."""
        if agent_id not in self._agents:
            self._agents[agent_id] = Agent(self, agent_id, role, prompt_template)
        return self._agents[agent_id]

    def finish(self, exit_status: int = 0) -> dict:
        """Ends the run. Under ``retrace record`` / ``replay`` the launcher ends it with the
        program's exit status, so this only says the agents are done."""
        for a in self._agents.values():
            a.exit()
        if not self._owned:
            return {"run_id": self.id}
        return self._http.call("POST", f"/api/runs/{self.id}/finish", {"exit_status": exit_status})


class Agent:
    """One agent of a run. Safe to use from several threads."""

    def __init__(self, run: Run, agent_id: str, role: Optional[str], prompt_template: Optional[str]):
        self.run, self.id, self.role, self.prompt_template = run, agent_id, role, prompt_template
        self._base = f"/api/runs/{urllib.parse.quote(run.id)}/agents/{urllib.parse.quote(agent_id)}"
        self._occurrences: dict[str, int] = {}
        self._lock = threading.Lock()

    def _post(self, route: str, body: Any) -> Any:
        return self.run._http.call("POST", f"{self._base}/{route}", body)

    def _step(self, kind: str, name: str, request: Any, fn: Callable[[], Any], tool: Optional[dict] = None,
              dry_run: Optional[Callable[[Any], Any]] = None) -> Any:
        body: dict = {"type": kind, "name": name, "request": request}
        if tool is not None:
            body["tool"] = tool
        side_effect = tool is not None and tool.get("class") == "side_effect"
        if self.run.mode == "record" and not side_effect:
            try:
                body["output"] = _json_roundtrip(fn())
            except Exception as e:  # the failure is recorded, then raised again
                body["error"] = f"{type(e).__name__}: {e}"
        answer = self._post("steps", body)
        if answer["status"] == "run":
            done: dict = {"step": answer["step"]}
            try:
                done["output"] = _json_roundtrip(fn())
            except Exception as e:
                done["error"] = f"{type(e).__name__}: {e}"
            answer = self._post("steps", done)
        return self._result(answer, dry_run)

    @staticmethod
    def _result(answer: dict, dry_run: Optional[Callable[[Any], Any]]) -> Any:
        status = answer["status"]
        if status == "done":
            return answer["output"]
        if status == "error":
            raise StepError(answer["error"])
        if status == "approval_required":
            raise ApprovalRequired(answer["approval"], answer["error"])
        if status == "refused":
            raise NotPermitted(answer["error"])
        if status == "dry_run":
            if dry_run is not None:
                return dry_run(answer["args"])
            raise DryRun(answer["tool"], answer["args"])
        raise RetraceError(0, "protocol", f"unexpected answer {answer!r}")

    def template(self, vars: Optional[dict] = None, template: Optional[str] = None) -> str:
        """The text of this agent's prompt template (``prompt_template`` of :meth:`Run.agent`, or
        ``template``, as ``name@version``), read from ``prompts/<name>/<version>.txt`` (or
        ``RETRACE_PROMPTS``) where the daemon runs, with ``{name}`` placeholders filled from
        ``vars``. The agent's following model calls carry the template's id and digest, and a
        fork's ``prompt:AGENT=VERSION`` edit hands back that version's text instead."""
        chosen = template or self.prompt_template
        if not chosen:
            raise RetraceError(0, "usage", f"agent {self.id!r} has no prompt template: "
                               "pass prompt_template= to run.agent() or template= here")
        return self._post("template", {"template": chosen, "vars": vars or {}})["text"]

    def tool(self, name: str, args: Any, fn: Callable[..., Any], cls: str = "deterministic", version: str = "1",
             ttl_s: Optional[int] = None, dry_run: Optional[Callable[[Any], Any]] = None) -> Any:
        """Calls a tool: in record runs ``fn()`` and records its result (or error); in replay
        returns the recorded result and ``fn`` never runs. ``cls`` is ``deterministic``,
        ``time_bound`` (with ``ttl_s``) or ``side_effect`` (whose intent is stored before it runs;
        never run by replay or fork; a fork hands back ``dry_run(args)``). A side-effect ``fn``
        that accepts ``idempotency_key`` gets a stable one: ``run/agent/occurrence``."""
        call = fn
        if cls == "side_effect" and "idempotency_key" in _params(fn):
            with self._lock:
                n = self._occurrences.get(name, 0) + 1
                self._occurrences[name] = n
            key = f"{self.run.id}/{self.id}/{name}#{n}"
            call = lambda: fn(idempotency_key=key)  # noqa: E731
        tool = {"version": str(version), "class": cls, "ttl_s": ttl_s}
        return self._step("tool_call", name, _json_roundtrip(args), call, tool, dry_run)

    def now(self) -> float:
        """The wall clock (Unix seconds): live in record, recorded in replay."""
        out = self._step("clock", "wall", {}, lambda: {"unix_ms": int(time.time() * 1000)})
        return out["unix_ms"] / 1000.0

    def random_id(self) -> str:
        """A random id (32 hex digits): live in record, recorded in replay."""
        return self._step("random", "id", {}, lambda: {"id": f"{random.getrandbits(128):032x}"})["id"]

    def env(self, name: str) -> Optional[str]:
        """An environment variable: live in record, recorded in replay."""
        return self._step("env", name, {"name": name}, lambda: {"value": os.environ.get(name)})["value"]

    def send(self, to: str, body: Any, kind: str = "message", parent: Optional[int] = None) -> int:
        """Sends a message to agent ``to``; returns the seq of its ``send`` event."""
        return self._post("send", {"to": to, "kind": kind, "body": _json_roundtrip(body), "parent": parent})["seq"]

    def recv(self, timeout: Optional[float] = None) -> Optional[Message]:
        """The next message for this agent (``Message(seq, sender, body, parent, kind)``), or None
        when ``timeout`` seconds pass (a recorded
        timeout, which replay reproduces at once)."""
        m = self._post("recv", {"timeout_s": timeout})["message"]
        if m is None:
            return None
        return Message(m["seq"], m["sender"], m["body"], parent=m.get("parent"), kind=m.get("kind"))

    def decide(self, action: str, target: Optional[str] = None) -> None:
        """Records a decision; in replay a different decision is a divergence."""
        self._post("decide", {"action": action, "target": target})

    def exit(self) -> None:
        """Says this agent takes no more steps (a replay waiting on it stalls at once)."""
        self._post("exit", {})

    def _proxy(self, provider: str) -> str:
        run, agent = urllib.parse.quote(self.run.id), urllib.parse.quote(self.id)
        return f"{self.run._http.url}/proxy/run/{run}/agent/{agent}/{provider}"

    def openai(self, **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` client whose calls are this agent's model steps."""
        import openai
        kwargs.setdefault("api_key", os.environ.get("OPENAI_API_KEY", "retrace-placeholder"))
        return openai.OpenAI(base_url=self._proxy("openai") + "/v1", default_headers=self._headers(), **kwargs)

    def anthropic(self, **kwargs: Any) -> Any:
        """An ``anthropic.Anthropic`` client whose calls are this agent's model steps."""
        import anthropic
        kwargs.setdefault("api_key", os.environ.get("ANTHROPIC_API_KEY", "retrace-placeholder"))
        return anthropic.Anthropic(base_url=self._proxy("anthropic"), default_headers=self._headers(), **kwargs)

    def _headers(self) -> dict:
        token = self.run._http.token
        return {"X-Retrace-Token": token} if token else {}

    # Async twins: the blocking call runs in a thread, so other tasks on the loop keep running.
    async def atool(self, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self.tool, *args, **kwargs)

    async def anow(self) -> float:
        return await asyncio.to_thread(self.now)

    async def arandom_id(self) -> str:
        return await asyncio.to_thread(self.random_id)

    async def aenv(self, name: str) -> Optional[str]:
        return await asyncio.to_thread(self.env, name)

    async def asend(self, *args: Any, **kwargs: Any) -> int:
        return await asyncio.to_thread(self.send, *args, **kwargs)

    async def arecv(self, timeout: Optional[float] = None) -> Optional[Message]:
        return await asyncio.to_thread(self.recv, timeout)

    async def adecide(self, action: str, target: Optional[str] = None) -> None:
        return await asyncio.to_thread(self.decide, action, target)


def _json_roundtrip(value: Any) -> Any:
    """What replay will hand back: the value as JSON decodes it (tuples become lists...)."""
    return json.loads(json.dumps(value, allow_nan=False, default=str))


def _params(fn: Callable[..., Any]) -> set:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()
