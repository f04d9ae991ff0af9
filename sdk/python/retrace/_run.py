"""A run on the daemon: ``connect`` finds or makes it in the mode ``RETRACE_MODE`` says, and
``Run.finish`` (or the exit hook, for a run the program forgot to finish) ends it."""
from __future__ import annotations

import atexit
import functools
import os
import secrets
import sys
from typing import Any, Optional

from . import _off
from ._agent import Agent, _no_route, _segment
from ._values import checked_name as _checked_name
from ._errors import Divergence, RetraceError
from . import _http as _http_mod
from ._http import Http as _Http
from ._values import text as _text

_MODES = ("record", "replay", "fork", "off")
# What a mode that takes a launcher's run needs RETRACE_RUN to name (`Session::from_env_with` in
# retrace-runtime's session/open.rs says the same).
_NEEDS_RUN = {"replay": "the run to replay", "fork": "the fork run to execute"}


def _mode(run: Optional[str]) -> str:
    """``RETRACE_MODE``, checked as the Rust runtime checks it (``Session::from_env_with``),
    before anything is sent or run: unset, it is ``record``; a value other than ``record``,
    ``replay``, ``fork`` or ``off`` as written here (``OFF``, an empty value, one with spaces) is
    refused, and so are ``replay`` and ``fork`` with no run to take (``run``: ``connect(run=...)``
    or ``RETRACE_RUN``). Either would otherwise record a new run live, side effects included."""
    mode = os.environ.get("RETRACE_MODE", "record")
    if mode not in _MODES:
        near = mode.strip().lower()
        hint = f"; did you mean {near!r}? (a mode is written in lowercase, without spaces)" if near in _MODES else ""
        raise RetraceError(0, "usage", f"RETRACE_MODE={mode!r}: want record, replay, fork or off "
                           f"(unset, it is record){hint}")
    if mode in _NEEDS_RUN and not run:
        raise RetraceError(0, "usage", f"RETRACE_MODE={mode} needs RETRACE_RUN ({_NEEDS_RUN[mode]}): run the "
                           f"program under `retrace {mode} RUN -- ...`, which sets both")
    return mode


def _field(payload: Any, key: str) -> Any:
    """`payload[key]` of a daemon's answer; an answer without it came from another server."""
    if not isinstance(payload, dict) or key not in payload:
        raise _http_mod.not_a_daemon(f"its answer has no {key!r}: {str(payload)[:80]}")
    return payload[key]


def connect(url: Optional[str] = None, run: Optional[str] = None, name: Optional[str] = None) -> "Run":
    """Connects to the daemon (``RETRACE_URL``) for a run (``RETRACE_RUN``, set by
    ``retrace record`` / ``replay`` / ``fork``), in that run's mode. With no run, creates a new
    run to record into. ``RETRACE_MODE=replay`` naming a run that is not a replay run (a recorded
    run) starts a new replay of it, which :meth:`Run.finish` ends; ``replay`` and ``fork`` need a
    run, and any other mode than ``record``, ``replay``, ``fork`` and ``off`` is refused
    (:class:`RetraceError`, ``usage``) before anything is sent or run. So are, as ``retrace replay``
    and ``retrace fork`` refuse them, ``replay`` naming a run still being recorded (status
    ``running``) and ``fork`` naming a run that is no fork run (the fork run ``retrace fork`` makes):
    neither records steps live into the run. ``RETRACE_MODE=off`` connects to nothing: the run's
    mode is ``off`` (see :class:`Run`)."""
    mode = _mode(run or os.environ.get("RETRACE_RUN"))
    if mode == "off":
        return Run(None, f"off-{secrets.token_hex(8)}", "off", owned=False)
    if name is not None:
        _agent_str(name, "connect(name=...): the run's name")
    _text(name, f"connect(name={name!r}): the run's name holds")
    launched = os.environ.get("RETRACE_RUN") and os.environ.get("RETRACE_URL")
    if launched and not run and url and url.rstrip("/") != os.environ["RETRACE_URL"].rstrip("/"):
        # Under `retrace record` / `replay` the run is that command's daemon's: the steps must
        # go there, or the replay finds none of them and the program's go to another run.
        print(f"retrace: RETRACE_RUN is set by the retrace command running this program: connecting "
              f"to its daemon {os.environ['RETRACE_URL']}, not {url}", file=sys.stderr)
        url = None
    url = url or os.environ.get("RETRACE_URL")
    if not url:
        raise RetraceError(0, "no_daemon", "RETRACE_URL is not set: run the program under `retrace record -- ...`, "
                           "or start `retrace serve` and set RETRACE_URL=http://127.0.0.1:7420")
    http_ = _Http(url)
    run = run or os.environ.get("RETRACE_RUN")
    _text(run, f"run {run!r}: its id holds")
    owned = False
    if not run:
        run = _field(http_.call("POST", "/api/runs", {"name": name} if name else {}), "run_id")
        owned = True
    meta = http_.call("GET", f"/api/runs/{_segment(run)}")
    _field(meta, "mode")
    status = meta.get("status", "running")
    if mode == "replay" and meta["mode"] != "replay":
        # A recorded run (or a fork) named to replay: a new replay of it, as the Rust runtime
        # starts one (`DaemonRun::Replay`), not steps recorded live into it. One still being
        # recorded is refused first, as `retrace replay` refuses it (`check_finished` in
        # retrace-cli's launcher.rs): its log is still growing, and the daemon would refuse it
        # only after making a replay run that nothing ends.
        if status == "running":
            raise RetraceError(0, "usage", f"run {meta['run_id']} is a {meta['mode']} run with status running: it "
                               "is still being recorded; replay it once it has finished")
        made = http_.call("POST", f"/api/runs/{_segment(meta['run_id'])}/replay", {})
        return Run(http_, made["run_id"], "replay", owned=True)
    if meta["mode"] == "record" and status != "running":
        # The daemon would refuse the first step, after a live function had run.
        raise RetraceError(0, "usage", f"run {meta['run_id']} is a record run with status {status}: it "
                           "takes no more steps; unset RETRACE_RUN to record a new run, or set RETRACE_MODE=replay "
                           "to replay it")
    if mode == "fork" and meta["mode"] != "fork":
        # `fork` executes the fork run `retrace fork` made, as the Rust runtime's `Session::fork`
        # does ("not a fork"). Joining a record run would record into it live, side effects
        # included; a replay run would replay.
        raise RetraceError(0, "usage", f"run {meta['run_id']} is a {meta['mode']} run with status {status}, not a "
                           f"fork: RETRACE_MODE=fork executes the fork run that `retrace fork` makes; fork this run "
                           f"with `retrace fork {meta['run_id']} -- ...`"
                           + (" once it has finished" if status == "running" else ""))
    return Run(http_, meta["run_id"], meta["mode"], owned)


class Run:
    """One run on the daemon: its agents take steps through it.

    In mode ``off`` (``RETRACE_MODE=off``) there is no daemon and nothing is recorded: tool
    functions, clock, random and env reads run directly and hand back their own results and
    exceptions; ``send`` and ``recv`` carry messages between the agents of this process (a
    ``recv`` no agent of the process can answer raises, naming the reason); ``decide`` does
    nothing; ``template`` reads ``prompts/`` (or ``RETRACE_PROMPTS``) where the program runs;
    ``openai()`` and the other clients talk to the provider directly."""

    def __init__(self, http_: Optional[_Http], run_id: str, mode: str, owned: bool):
        self._http, self.id, self.mode, self._owned = http_, run_id, mode, owned
        self._agents: dict[str, Agent] = {}
        self._bus = _off.Mailboxes() if mode == "off" else None
        self._roles_served = True  # False once the daemon said it has no route for roles
        self._claims_served = True  # False once it said it has none for claims
        self._finished = False
        if owned:
            # A run this process created that nothing else ends: finished at exit if the program
            # didn't, rather than left `running` for good (and replay refusing it as recording).
            _watch_exit()
            self._at_exit = functools.partial(_finish_at_exit, self, os.getpid())
            atexit.register(self._at_exit)

    def agent(self, agent_id: str, role: Optional[str] = None, prompt_template: Optional[str] = None) -> "Agent":
        """The agent ``agent_id`` of this run. ``role`` is recorded on each of its events from
        now on, its model calls through ``openai()`` / ``anthropic()`` included."""
        _agent_str(agent_id, "run.agent(): the agent id")
        if role is not None:
            _agent_str(role, f"agent {agent_id!r}: its role")
        if self.mode != "off":  # both go to the daemon: its name in the route of each of its steps
            _text(agent_id, f"agent {agent_id!r}: its name holds")
            _text(role, f"agent {agent_id!r}: its role holds")
            # Refused here as the daemon refuses them, so an agent it would refuse is never
            # registered, and finish() doesn't owe it an exit (QA34 D3).
            _checked_name(agent_id, "the agent id", 256)
            if role is not None:
                _checked_name(role, f"agent {agent_id!r}: its role", 128)
        new = agent_id not in self._agents
        if new:
            self._agents[agent_id] = Agent(self, agent_id, None, prompt_template)
            if self._bus is not None:
                self._bus.join(agent_id)
        agent = self._agents[agent_id]
        if role is not None and (new or role != agent.role):
            if self.mode != "off" and self._roles_served:
                self._declare_role(agent, role)
            agent.role = role
        return agent

    def _declare_role(self, agent: "Agent", role: str) -> None:
        """Tells the daemon ``agent``'s role. A daemon older than this SDK has no such route: it
        answers 404 "no route for ..." (its fallback), and the run goes on without roles, said
        once on standard error. Any other error is raised."""
        try:
            self._http.call("POST", f"{agent._base}/role", {"role": role})
        except RetraceError as e:
            if not _no_route(e):
                raise
            self._roles_served = False
            print(f"retrace: the daemon at {self._http.url} is older than this SDK: it has no route to "
                  f"declare an agent's role, so run {self.id} records no roles (upgrade the retrace "
                  f"binary to record them)", file=sys.stderr)

    def _ending(self) -> None:
        self._finished = True
        if self._owned:
            atexit.unregister(self._at_exit)

    def finish(self, exit_status: int = 0) -> dict:
        """Ends the run. Under ``retrace record`` / ``replay`` the launcher ends it with the
        program's exit status, so this only says the agents are done; so does a run joined through
        ``RETRACE_RUN`` that this program didn't create (``POST /api/runs/RUN/replay`` on a bare
        ``retrace serve``): whoever created it ends it, with ``POST /api/runs/RUN/finish``.

        A run this program created is ended here: ``finish`` returns the run as the daemon stored
        it (``status``, ``exit_status``, ``decisions``...). A replay it started (``RETRACE_MODE=replay``
        naming a recorded run) is checked as it ends, as the Rust runtime checks one: steps left
        unconsumed, other final decisions or another ``exit_status`` than the recording's store it
        ``diverged`` and raise :class:`Divergence` (``code`` ``steps_left``, ``decisions`` or
        ``exit_status``, with ``seq``, ``agent``...); so does a divergence found earlier in the run.

        ``finish`` says every agent is done and ends the run even when one of them can't be told
        so (a divergence found at its exit, say); the first such error is raised afterwards, else
        the divergence the run ended with."""
        _exit_status(exit_status)
        failed = None
        self._ending()
        for a in self._agents.values():
            try:
                a.exit()
            except RetraceError as e:
                # Another process's agent (its steps here were refused): not this one's to end.
                if e.code != "agent_owned":
                    failed = failed or e
        done = {"run_id": self.id}
        if self._owned:
            done = self._http.call("POST", f"/api/runs/{_segment(self.id)}/finish", {"exit_status": exit_status})
        if failed is not None:
            raise failed
        return _ended(done)

    async def afinish(self, exit_status: int = 0) -> dict:
        """:meth:`finish` on the event loop; then closes the loop's idle connections."""
        if self._http is None:
            return self.finish(exit_status)
        aio = self._http.aio
        _exit_status(exit_status)
        self._ending()
        try:
            failed = None
            for a in self._agents.values():
                try:
                    await a.aexit()
                except RetraceError as e:
                    if e.code != "agent_owned":
                        failed = failed or e
            done = {"run_id": self.id}
            if self._owned:
                done = await aio.call("POST", f"/api/runs/{_segment(self.id)}/finish", {"exit_status": exit_status})
            if failed is not None:
                raise failed
            return _ended(done)
        finally:
            await aio.aclose()


def _agent_str(value: Any, what: str) -> None:
    if not isinstance(value, str):
        raise RetraceError(0, "usage", f"{what} must be a str, got {type(value).__name__} {value!r:.60}")


def _exit_status(status: Any) -> None:
    """``finish(exit_status)``: a whole number a process can exit with (32 bits), checked before
    anything is sent (QA34 D5: refused by the daemon's parser after every agent was told it exited)."""
    if isinstance(status, bool) or not isinstance(status, int) or not -(2 ** 31) <= status < 2 ** 31:
        raise RetraceError(0, "usage", f"finish(exit_status={status!r}): want a whole number (the "
                                       f"program's exit status, 0 for success)")


_UNCAUGHT: list = []  # set once an exception ends the program (sys.excepthook)


def _watch_exit() -> None:
    """Notes an uncaught exception, so a run finished at exit says the program failed."""
    if getattr(sys.excepthook, "_retrace", False):
        return
    previous = sys.excepthook

    def hook(kind: type, value: BaseException, tb: Any) -> None:
        _UNCAUGHT.append(kind)
        previous(kind, value, tb)

    hook._retrace = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _finish_at_exit(run: "Run", pid: int) -> None:
    """Ends a run this process created and never finished (``run.finish()`` forgotten), with exit
    status 1 after an uncaught exception, else 0 (a ``sys.exit(n)``'s code is out of an exit
    hook's sight), and says so on standard error. Not in a forked child: the run is its parent's."""
    if run._finished or os.getpid() != pid:
        return
    status = 1 if _UNCAUGHT else 0
    # Finished first, then said: a standard error that is a closed pipe (`2>&1 | head -1`) must
    # not leave the run unfinished (QA34 D6: stored interrupted).
    failed = None
    try:
        run.finish(status)
    except RetraceError as e:
        failed = e
    try:
        print(f"retrace: run {run.id} was not finished (run.finish()): finished it as the program exited, with "
              f"exit status {status}{' (an uncaught exception)' if _UNCAUGHT else ''}; call run.finish(status) "
              "before exiting to record the program's own", file=sys.stderr)
        if failed is not None:
            print(f"retrace: run {run.id}: {failed}", file=sys.stderr)
    except (OSError, ValueError):
        pass


def _ended(done: dict) -> dict:
    """What :meth:`Run.finish` returns of the daemon's answer to ``POST /api/runs/RUN/finish`` (the
    run as stored), with what the run ended with raised, as the Rust runtime's ``finish_remote``
    raises it: its divergence (the run is stored ``diverged``), or the error that ended it
    otherwise (``error``: a recording that could not be read to its end, the run ``failed``; or
    one whose events could not all be stored)."""
    if done.get("divergence") is not None:
        raise Divergence.ended(done["divergence"])
    if done.get("error"):
        # The daemon answered 200, having ended the run: the error is what it ended with.
        raise RetraceError(200, "finish", f"run {done.get('run_id')}: {done['error']}")
    return done
