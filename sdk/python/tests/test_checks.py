"""What the SDK refuses before a step runs or is sent, against a real daemon (`retrace serve`):
a tool class or `ttl_s` the daemon would refuse only after the tool had run (a side effect with
nothing recorded), and values JSON can't hold (SPEC §2), which would otherwise reach the log
stringified (a set in an order that changes between processes), or refused by the daemon only
after the tool had run (a str holding a lone surrogate, as `surrogateescape` decodes bytes that
aren't UTF-8, in a value or a name). Each refusal names the agent, the step and, for a value,
its JSON path."""
import asyncio
import json
import os
import urllib.error
import urllib.request

import pytest

import retrace
from daemons import free_port, started

CLASSES = "want one of deterministic, time_bound, side_effect"
NEEDS_TTL = "a time_bound tool needs ttl_s, a whole number of seconds above 0"
NO_TTL = "ttl_s is for time_bound tools only"
BAD_TOOLS = [
    ({"cls": "side-effect"}, "cls='side-effect'; " + CLASSES),
    ({"cls": "bogus"}, "cls='bogus'; " + CLASSES),
    ({"cls": "time_bound"}, NEEDS_TTL + " (got ttl_s=None)"),
    ({"cls": "time_bound", "ttl_s": 0}, NEEDS_TTL),
    ({"cls": "time_bound", "ttl_s": -60}, NEEDS_TTL),
    ({"cls": "time_bound", "ttl_s": 1.5}, NEEDS_TTL),
    ({"cls": "time_bound", "ttl_s": True}, NEEDS_TTL),
    ({"cls": "deterministic", "ttl_s": 60}, NO_TTL + "; a deterministic tool takes none"),
    ({"cls": "side_effect", "ttl_s": 60}, NO_TTL + "; a side_effect tool takes none"),
]

# A str holding a lone surrogate: what `surrogateescape` makes of the bytes b"caf\xe9".
CAFE = b"caf\xe9".decode("utf-8", "surrogateescape")
LONE = "the lone surrogate '\\udce9'"

# (value, the JSON path of what JSON can't hold, how the refusal shows it)
NOT_JSON = [
    ({"ids": {3, 1, 2}}, "$.ids", "set {1, 2, 3}"),
    ({"rows": [{"seen": frozenset({"a"})}]}, "$.rows[0].seen", "frozenset frozenset({'a'})"),
    ({"conn": object()}, "$.conn", "an instance of object"),
    ({"p": [0.5, float("nan")]}, "$.p[1]", "float nan"),
    ({"limit": float("inf")}, "$.limit", "float inf"),
    ({"by pair": {("EUR", "USD"): 1.1}}, '$["by pair"]["(\'EUR\', \'USD\')"]', "the tuple key"),
    ({"q": CAFE}, "$.q", f"{LONE} in the str 'caf\\udce9'"),
    ({"by name": {CAFE: 1}}, '$["by name"]["caf\\udce9"]', f"{LONE} in the key 'caf\\udce9'"),
    ({"rows": ["\U0001f600", "half \ud83d"]}, "$.rows[1]", "the lone surrogate '\\ud83d' in the str 'half \\ud83d'"),
]


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    """`retrace serve` on a fresh store; its prompt templates under `tmp_path / "prompts"`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRACE_")}
    env.update(RETRACE_HOME=str(tmp_path / "home"), RETRACE_PROMPTS=str(tmp_path / "prompts"))
    port = free_port()
    serve = started(["serve", "--addr", f"127.0.0.1:{port}"], port, env)
    for var in ("RETRACE_URL", "RETRACE_RUN", "RETRACE_MODE", "RETRACE_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.terminate()
        serve.wait(timeout=10)


def events(daemon, run_id):
    with urllib.request.urlopen(f"{daemon}/api/runs/{run_id}/events", timeout=10) as r:
        return json.loads(r.read())["events"]


def test_a_bad_tool_class_or_ttl_is_refused_before_the_tool_runs_or_is_sent(daemon):
    run = retrace.connect(url=daemon, name="bad-class")
    ops = run.agent("ops")
    ran = []

    async def send_async():
        ran.append("async")

    for kwargs, why in BAD_TOOLS:
        with pytest.raises(retrace.RetraceError) as refused:
            ops.tool("email.send", {"to": "ops"}, lambda: ran.append("sync"), **kwargs)
        assert refused.value.code == "usage"
        assert refused.value.message.startswith(f"tool 'email.send' of agent 'ops': {why}"), refused.value.message
        with pytest.raises(retrace.RetraceError, match="tool 'email.send' of agent 'ops'") as refused:
            asyncio.run(ops.atool("email.send", {"to": "ops"}, send_async, **kwargs))
        assert refused.value.code == "usage"
    assert ran == [], "a refused tool never runs"
    assert ops.tool("fx.rate", {}, lambda: 1.1, cls="time_bound", ttl_s=60) == 1.1
    run.finish()
    assert [e["name"] for e in events(daemon, run.id)] == ["fx.rate"], "a refused step is never sent"


def test_arguments_and_message_bodies_json_cant_hold_are_refused_before_anything_runs(daemon):
    run = retrace.connect(url=daemon, name="not-json-in")
    planner = run.agent("planner", prompt_template="planner@v1")
    ran = []
    for value, path, shown in NOT_JSON:
        with pytest.raises(retrace.RetraceError) as refused:
            planner.tool("sql.query", value, lambda: ran.append(1))
        assert refused.value.code == "not_json"
        assert refused.value.message.startswith(f"tool 'sql.query' of agent 'planner': the arguments hold {shown}")
        assert f" at {path}, which JSON can't hold" in refused.value.message, refused.value.message
        with pytest.raises(retrace.RetraceError) as refused:
            planner.send("reviewer", value, kind="rows")
        assert refused.value.message.startswith(f"message from agent 'planner' to 'reviewer': the body holds {shown}")
        assert f" at {path}," in refused.value.message, refused.value.message
        with pytest.raises(retrace.RetraceError, match=r"^not_json: template 'planner@v1' of agent 'planner': the "
                           r"vars hold"):
            planner.template(value)
    with pytest.raises(retrace.RetraceError, match=r"^not_json: tool 'sql.query' of agent 'planner': .* at \$\.ids"):
        asyncio.run(planner.atool("sql.query", {"ids": {1}}, lambda: ran.append(1)))
    with pytest.raises(retrace.RetraceError, match=r"^not_json: message from agent 'planner' to 'reviewer'"):
        asyncio.run(planner.asend("reviewer", {"at": {1.5}}))
    assert ran == []
    # A tuple is a JSON array: it is sent, and comes back as a list, as replay hands it back;
    # bytes and datetimes travel as their text, the same in every process (SPEC §6).
    assert planner.tool("sql.query", {"ids": (1, 2)}, lambda: (3, 4)) == [3, 4]
    import datetime
    at = datetime.datetime(2026, 12, 4, 9, 30)
    assert planner.tool("sql.query", {"since": at}, lambda: {"raw": b"\x00", "at": at}) == {
        "raw": "b'\\x00'", "at": "2026-12-04 09:30:00"}
    # A surrogate pair is one character split in two, as JSON writes it: it travels as that one.
    assert planner.tool("sql.query", {"face": "\ud83d\ude00"}, lambda: ["\ud83d\ude00"]) == ["\U0001f600"]
    run.finish()
    assert [e["type"] for e in events(daemon, run.id)] == ["tool_call"] * 3, "a refused step is never sent"


@pytest.mark.parametrize("cls", ["deterministic", "side_effect"])
def test_an_output_json_cant_hold_is_refused_and_recorded_as_the_steps_failure(daemon, cls):
    run = retrace.connect(url=daemon, name="not-json-out")
    planner = run.agent("planner")
    for value, path, shown in NOT_JSON:
        with pytest.raises(retrace.RetraceError) as refused:
            planner.tool("sql.query", {}, lambda: value, cls=cls)
        assert refused.value.code == "not_json"
        assert refused.value.message.startswith(f"tool 'sql.query' of agent 'planner' ran, but its output holds "
                                                f"{shown}"), refused.value.message
        assert f" at {path}, which JSON can't hold" in refused.value.message, refused.value.message

    async def rows():
        return {"ids": {1, 2}}

    with pytest.raises(retrace.RetraceError, match=r"ran, but its output holds set \{1, 2\} at \$\.ids"):
        asyncio.run(planner.atool("sql.query", {}, rows, cls=cls))
    run.finish()
    calls = [e for e in events(daemon, run.id) if e["type"] == "tool_call"]
    assert len(calls) == len(NOT_JSON) + 1, calls
    for event, (_, path, _) in zip(calls, NOT_JSON):
        assert event["error"].startswith("retrace.RetraceError: not_json: tool 'sql.query' of agent 'planner' ran, but")
        assert f" at {path}," in event["error"], event
    if cls == "side_effect":  # every intent has its completion: nothing waits for `retrace resolve`
        intents = [e for e in events(daemon, run.id) if e["type"] == "intent"]
        assert [e["seq"] for e in intents] == [e["causal_parent"] for e in calls]


def test_names_holding_a_lone_surrogate_are_refused_before_anything_runs_or_is_sent(daemon):
    """The daemon would refuse the request whole ("bad request body: unexpected end of hex
    escape"), after a record step's function had run; an agent's name in a route is no URL."""
    run = retrace.connect(url=daemon, name="lone-names")
    planner = run.agent("planner")
    ran = []
    refused = [
        (lambda: retrace.connect(url=daemon, name=CAFE), "connect(name='caf\\udce9'): the run's name holds"),
        (lambda: retrace.connect(url=daemon, run=CAFE), "run 'caf\\udce9': its id holds"),
        (lambda: run.agent(CAFE), "agent 'caf\\udce9': its name holds"),
        (lambda: run.agent("reviewer", role=CAFE), "agent 'reviewer': its role holds"),
        (lambda: planner.tool(CAFE, {}, lambda: ran.append(1)), "tool 'caf\\udce9' of agent 'planner': its name holds"),
        (lambda: planner.tool(CAFE, {}, lambda: ran.append(1), cls="side_effect"), "tool 'caf\\udce9' of agent"),
        (lambda: asyncio.run(planner.atool(CAFE, {}, lambda: ran.append(1))), "tool 'caf\\udce9' of agent"),
        (lambda: planner.env(CAFE), "env 'caf\\udce9' of agent 'planner': its name holds"),
        (lambda: planner.send(CAFE, {}), "message from agent 'planner' to 'caf\\udce9': the recipient's name holds"),
        (lambda: planner.send("reviewer", {}, kind=CAFE), "message from agent 'planner' to 'reviewer': its kind holds"),
        (lambda: planner.decide(CAFE), "decision 'caf\\udce9' of agent 'planner': the action holds"),
        (lambda: planner.decide("approve", target=CAFE), "decision 'approve' of agent 'planner': the target holds"),
        (lambda: planner.template(template=CAFE), "template 'caf\\udce9' of agent 'planner': its name holds"),
    ]
    runs_before = _runs(daemon)
    for call, what in refused:
        with pytest.raises(retrace.RetraceError) as refusal:
            call()
        assert (refusal.value.status, refusal.value.code) == (0, "not_json"), refusal.value
        assert refusal.value.message.startswith(what), refusal.value.message
        assert f"{LONE}, which JSON can't hold" in refusal.value.message, refusal.value.message
    assert ran == [], "a refused tool never runs"
    assert _runs(daemon) == runs_before, "no run is made for a refused name"
    assert planner.tool("t", {}, lambda: 1) == 1
    run.finish()
    assert [(e["agent_id"], e["name"]) for e in events(daemon, run.id)] == [("planner", "t")]


def test_empty_names_are_refused_before_anything_is_sent(daemon):
    """A message to "" could never be received, and an empty env name or action says nothing in
    the log: each is a usage error before anything is sent (QA10 D5)."""
    run = retrace.connect(url=daemon, name="empty-names")
    planner = run.agent("planner")
    for call, what in [
        (lambda: planner.send("", {}), "send() of agent 'planner': the recipient's name"),
        (lambda: asyncio.run(planner.asend("", {})), "send() of agent 'planner'"),
        (lambda: planner.env(""), "env() of agent 'planner': the variable's name is empty"),
        (lambda: planner.decide(""), "decide() of agent 'planner': the action is empty"),
        # Not a str at all: the argument is named, not the daemon's parser column (QA23 D3).
        (lambda: planner.send("reviewer", "hello", {"kind": "oops"}),
         "send() of agent 'planner': the message's kind must be a str, got dict"),
        (lambda: planner.send(7, {}), "send() of agent 'planner': the recipient (to) must be a str, got int 7"),
        (lambda: planner.tool(42, {}, lambda: 1), "tool of agent 'planner': its name must be a str, got int 42"),
    ]:
        with pytest.raises(retrace.RetraceError) as refusal:
            call()
        assert (refusal.value.status, refusal.value.code) == (0, "usage"), refusal.value
        assert refusal.value.message.startswith(what), refusal.value.message
    assert planner.tool("t", {}, lambda: 1) == 1
    run.finish()
    assert [e["name"] for e in events(daemon, run.id)] == ["t"], "nothing of the refused steps was recorded"


def test_a_failure_whose_message_holds_a_lone_surrogate_is_recorded_and_replayed_escaped(daemon):
    run = retrace.connect(url=daemon, name="lone-failure")
    planner = run.agent("planner")
    failure = ValueError(f"can't read {CAFE}")

    def read():
        raise failure

    with pytest.raises(ValueError) as raised:  # the function's own exception, once recorded
        planner.tool("file.read", {}, read)
    assert raised.value is failure
    run.finish()
    [event] = events(daemon, run.id)
    assert event["error"] == "ValueError: can't read caf\\udce9", event
    replay = retrace.connect(url=daemon, run=_replay_of(daemon, run.id))
    with pytest.raises(ValueError, match=r"^can't read caf\\udce9$") as replayed:
        replay.agent("planner").tool("file.read", {}, read)
    assert isinstance(replayed.value, retrace.StepError)
    replay.finish()


def _runs(daemon):
    with urllib.request.urlopen(f"{daemon}/api/runs", timeout=10) as r:
        return [run["run_id"] for run in json.loads(r.read())]


def _replay_of(daemon, run_id):
    request = urllib.request.Request(f"{daemon}/api/runs/{run_id}/replay", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())["run_id"]


def test_under_a_retrace_command_its_daemon_wins_over_url(daemon, monkeypatch, capsys):
    """`retrace record` / `replay` set RETRACE_URL and RETRACE_RUN: a program that also passes
    `url=` (its own `retrace serve`) must still take its steps to the command's daemon."""
    launched = retrace.connect(url=daemon, name="launched")
    monkeypatch.setenv("RETRACE_URL", daemon)
    monkeypatch.setenv("RETRACE_RUN", launched.id)
    closed = f"http://127.0.0.1:{free_port()}"
    run = retrace.connect(url=closed)
    assert run.id == launched.id
    assert f"connecting to its daemon {daemon}, not {closed}" in capsys.readouterr().err
    assert run.agent("a").tool("t", {}, lambda: 1) == 1
    launched.finish()


def test_ints_beyond_64_bits_are_refused_and_those_within_kept_exactly(daemon):
    """SPEC §2 keeps an integer's digits so two ids never share a key; the daemon's step routes
    hold 64-bit integers exactly, and would keep only the nearest double of a wider one."""
    run = retrace.connect(url=daemon, name="wide-ints")
    planner = run.agent("planner")
    ran = []
    with pytest.raises(retrace.RetraceError) as refused:
        planner.tool("lookup", {"ids": [1, 2 ** 70]}, lambda: ran.append(1))
    assert refused.value.code == "not_json"
    assert refused.value.message == (
        "tool 'lookup' of agent 'planner': the arguments hold the int 1180591620717411303424 at $.ids[1], beyond "
        "64 bits, which a step can't keep exactly: pass it as a string (str(n)) first"), refused.value.message
    assert ran == []
    with pytest.raises(retrace.RetraceError, match=r"ran, but its output holds the int -9223372036854775809 at \$\.id,"):
        planner.tool("lookup", {}, lambda: {"id": -(2 ** 63) - 1})
    edges = {"max": 2 ** 64 - 1, "min": -(2 ** 63), "digits": "123456789012345678901234567890"}
    assert planner.tool("lookup", edges, lambda: edges) == edges
    run.finish()
    calls = [e for e in events(daemon, run.id) if e["type"] == "tool_call"]
    assert len(calls) == 2 and calls[0]["error"].startswith("retrace.RetraceError: not_json:"), calls
    # A client other than the SDK gets the daemon's own refusal, naming the path.
    other = retrace.connect(url=daemon, name="wide-ints-raw")
    body = b'{"type": "clock", "name": "wall", "output": {"unix_ms": 123456789012345678901}}'
    request = urllib.request.Request(f"{daemon}/api/runs/{other.id}/agents/a/steps", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(request, timeout=10)
    assert raw.value.code == 400
    assert "the integer 123456789012345678901 at $.output.unix_ms is beyond 64 bits" in raw.value.read().decode()
    other.finish()


def test_an_agent_name_with_a_slash_is_one_agent_and_finish_ends_the_run_anyway(daemon):
    run = retrace.connect(url=daemon, name="slashed")
    alice = run.agent("team/alice", role="planner")
    assert alice.tool("t", {}, lambda: 1) == 1
    client = alice.openai(default_headers={"X-Org": "acme"})
    assert client.default_headers["X-Org"] == "acme"
    assert "/agent/team%2Falice/openai/v1" in str(client.base_url)
    with pytest.raises(retrace.RetraceError, match=r"^usage: openai\(base_url=...\)"):
        alice.openai(base_url="http://127.0.0.1:1/v1")
    run.finish()
    assert [(e["agent_id"], e["role"]) for e in events(daemon, run.id)] == [("team/alice", "planner")]
    with urllib.request.urlopen(f"{daemon}/api/runs/{run.id}", timeout=10) as r:
        assert json.loads(r.read())["status"] == "ok"


def test_a_daemon_that_cant_be_reached_is_a_retrace_error(daemon):
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(retrace.RetraceError) as unreachable:
        retrace.connect(url=closed)
    assert unreachable.value.code == "no_daemon"
    assert f"the Retrace daemon at {closed} can't be reached (ConnectionRefusedError" in unreachable.value.message
    run = retrace.connect(url=daemon, name="gone")
    agent = run.agent("a")
    agent.now()
    run._http.url = closed  # as if the daemon had stopped: the same address, nothing listening
    run._http.host, run._http.port = "127.0.0.1", int(closed.rsplit(":", 1)[1])
    run._http.local.conn = None
    with pytest.raises(retrace.RetraceError, match=r"^no_daemon: "):
        agent.now()
    run._http._async = None
    with pytest.raises(retrace.RetraceError, match=r"^no_daemon: "):
        asyncio.run(agent.anow())


def test_an_address_that_answers_but_is_no_daemon_is_a_retrace_error():
    """RETRACE_URL naming another server (a web server, the model's upstream) is said as such,
    not as a JSONDecodeError or a KeyError from inside the SDK (QA10 D4)."""
    import http.server
    import threading

    class Other(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            kind = self.server.kind
            body = {"html": b"<html>not here</html>", "json": b"{}", "empty": b""}[kind]
            # `retrace simulate` answers an unknown route 404 with no body at all (QA12 D16).
            self.send_response(200 if kind == "json" else 404)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    for kind in ("html", "json", "empty"):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
        server.kind = kind
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            with pytest.raises(retrace.RetraceError) as other:
                retrace.connect(url=f"http://127.0.0.1:{server.server_address[1]}")
            assert other.value.code == "not_a_daemon", other.value
            assert "answered, but not as a Retrace daemon" in other.value.message
        finally:
            server.shutdown()
    # A malformed RETRACE_URL is the SDK's own usage error, not a ValueError.
    with pytest.raises(retrace.RetraceError) as malformed:
        retrace.connect(url="notaurl")
    assert malformed.value.code == "usage" and "http://HOST:PORT" in malformed.value.message


def test_a_tool_the_sdk_ran_before_posting_it_is_recorded_with_its_own_latency(daemon):
    """The SDK runs a tool before it posts the step: the step's latency is the function's time,
    not the post's (QA25 D3: every such tool was recorded as 0 ms)."""
    import time
    run = retrace.connect(url=daemon, name="latency")
    planner = run.agent("planner")
    planner.tool("slow", {}, lambda: time.sleep(0.25) or 1)
    planner.tool("fast", {}, lambda: 2)
    run.finish()
    latency = {e["name"]: e["latency_ms"] for e in events(daemon, run.id)}
    assert latency["slow"] >= 240, latency
    assert latency["fast"] < 200, latency


class _BrokenStr(Exception):
    """An exception whose message can't be read: its __str__ raises."""

    def __str__(self):
        return f"HTTP {self.status}"  # never set


def test_a_tool_exception_whose_str_fails_is_recorded_and_raised_again(daemon):
    """QA34 D1: the SDK's own AttributeError escaped, nothing was recorded, and a replay
    diverged; the failure is recorded (its message said unreadable) and the tool's own
    exception raised again, as for any other."""
    run = retrace.connect(url=daemon, name="broken-str")
    a = run.agent("a")

    def call():
        raise _BrokenStr({"body": "x"})

    with pytest.raises(_BrokenStr):
        a.tool("api.call", {"q": 1}, call)
    run.finish()
    [step] = [e for e in events(daemon, run.id) if e["type"] == "tool_call"]
    assert "_BrokenStr: (its message can't be read)" in json.dumps(step), step


def test_arguments_of_the_wrong_type_are_refused_naming_them(daemon):
    """QA34 D5: these failed with urllib's TypeError or the daemon's parser naming a byte column."""
    run = retrace.connect(url=daemon, name="types")
    a = run.agent("a")
    for call, said in [
        (lambda: run.agent(123), "run.agent(): the agent id must be a str"),
        (lambda: run.agent("r", role=5), "its role must be a str"),
        (lambda: a.decide(None), "the action must be a str"),
        (lambda: a.decide("x", target=5), "the target must be a str"),
        (lambda: a.send("b", {}, parent="7"), "parent='7'"),
        (lambda: retrace.connect(url=daemon, name=5), "the run's name must be a str"),
        (lambda: run.finish(3.0), "finish(exit_status=3.0)"),
        (lambda: a.tool("", {}, lambda: 1), "its name is empty"),
    ]:
        with pytest.raises(retrace.RetraceError) as refused:
            call()
        assert refused.value.code == "usage" and said in str(refused.value), refused.value
    run.finish()


def test_an_agent_the_daemon_would_refuse_is_refused_first_and_owes_no_exit(daemon):
    """QA34 D3: a refused agent stayed registered and finish() raised its refusal again."""
    run = retrace.connect(url=daemon, name="names")
    run.agent("planner").tool("plan", {}, lambda: 1)
    for bad, said in [("", "is empty"), ("x" * 300, "at most 256"), ("tab\there", "control character")]:
        with pytest.raises(retrace.RetraceError) as refused:
            run.agent(bad)
        assert refused.value.code == "usage" and said in str(refused.value), refused.value
    assert run.finish()["status"] == "ok"


def test_a_step_after_finish_is_refused_before_its_function_runs(daemon):
    """QA34 D2: the tool function ran (a paid call), then the daemon refused the step."""
    run = retrace.connect(url=daemon, name="late")
    a = run.agent("a")
    a.tool("first", {}, lambda: 1)
    run.finish()
    calls = []
    with pytest.raises(retrace.RetraceError) as refused:
        a.tool("quote", {"sym": "X"}, lambda: calls.append("charged"), cls="time_bound", ttl_s=60)
    assert refused.value.code == "run_finished" and calls == [], (refused.value, calls)


def test_a_run_finished_at_exit_is_stored_ok_though_standard_error_is_closed(daemon, tmp_path):
    """QA34 D6: the exit hook printed before finishing; a closed stderr left the run interrupted."""
    import subprocess
    import sys
    prog = ("import retrace, sys\nrun = retrace.connect(name='forget')\nprint(run.id, flush=True)\n"
            "run.agent('a').tool('t', {'x': 1}, lambda: 1)\nsys.stderr.close()\n")
    env = dict(os.environ, RETRACE_URL=daemon)
    out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=60)
    run_id = out.stdout.strip()
    with urllib.request.urlopen(f"{daemon}/api/runs/{run_id}", timeout=10) as r:
        stored = json.loads(r.read())
    assert (stored["status"], stored["exit_status"]) == ("ok", 0), stored


def test_a_recipient_no_agent_could_be_is_refused_by_the_sdk_and_the_daemon(daemon):
    """A message to an id every route refuses (a newline, 300 characters, only spaces) could
    never be received: refused before it is sent, and by the daemon (QA39 D3: recorded, seq 1)."""
    run = retrace.connect(url=daemon, name="no-such-recipient")
    planner = run.agent("planner")
    for to, why in [("x\ny", "holds a control character"), ("t" * 300, "300 characters long"), ("  ", "is blank")]:
        with pytest.raises(retrace.RetraceError) as refused:
            planner.send(to, {"n": 1})
        assert refused.value.code == "usage", refused.value
        assert why in refused.value.message, refused.value.message
        request = urllib.request.Request(f"{daemon}/api/runs/{run.id}/agents/planner/send",
                                         data=json.dumps({"to": to, "body": 1}).encode(), method="POST")
        with pytest.raises(urllib.error.HTTPError) as answered:
            urllib.request.urlopen(request, timeout=10)
        assert answered.value.code == 400
        assert "the recipient can't be an agent" in answered.value.read().decode()
    with pytest.raises(retrace.RetraceError, match="is blank"):
        run.agent("   ")
    run.finish()
    assert events(daemon, run.id) == [], "nothing was recorded"
