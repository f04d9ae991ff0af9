"""The SDK against a daemon that wants tokens (`RETRACE_SERVE_TOKENS`): with RETRACE_TOKEN it
sends `Authorization: Bearer` on the API and `X-Retrace-Token` on the proxy (the provider's own
key still reaching the provider); without one it is 401, with too low a role 403."""
import json
import os
import urllib.error
import urllib.request

import pytest

import retrace
from daemons import free_ports, started

VIEWER = "viewer-token-for-the-sdk-test"
DEBUGGER = "debugger-token-for-the-sdk-test"


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RETRACE_", "OPENAI_", "ANTHROPIC_"))}
    env["RETRACE_HOME"] = str(tmp_path / "home")
    env["RETRACE_SERVE_TOKENS"] = f"viewer:{VIEWER},debugger:{DEBUGGER}"
    sim_port, port = free_ports(2)
    sim = started(["simulate", "--addr", f"127.0.0.1:{sim_port}"], sim_port, env)
    serve = started(["serve", "--addr", f"127.0.0.1:{port}",
                     "--upstream-openai", f"http://127.0.0.1:{sim_port}/v1"], port, env)
    url = f"http://127.0.0.1:{port}"
    for var in ("RETRACE_RUN", "RETRACE_MODE", "RETRACE_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RETRACE_URL", url)
    try:
        yield url
    finally:
        for proc in (serve, sim):
            proc.terminate()
            proc.wait(timeout=10)


def get(url, token=None):
    request = urllib.request.Request(url, headers={"authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_sdk_sends_its_token_on_the_api_and_on_the_proxy(daemon, monkeypatch):
    monkeypatch.setenv("RETRACE_TOKEN", DEBUGGER)
    run = retrace.connect(name="tokens")
    agent = run.agent("planner")
    assert agent.tool("double", {"x": 2}, lambda: 4) == 4
    client = agent.openai(api_key="sk-provider-key-for-the-simulator")
    reply = client.chat.completions.create(model="gpt-sim", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content
    run.finish()

    status, body = get(f"{daemon}/api/runs/{run.id}/events", VIEWER)
    assert status == 200, body
    events = json.loads(body)["events"]
    assert [e["type"] for e in events] == ["tool_call", "model_call"]
    assert b"sk-provider-key" not in get(f"{daemon}/api/runs/{run.id}/export", VIEWER)[1]


def test_no_token_is_401_and_a_viewer_may_not_record(daemon, monkeypatch):
    with pytest.raises(retrace.RetraceError) as refused:
        retrace.connect()
    assert (refused.value.status, refused.value.code) == (401, "unauthorized")
    monkeypatch.setenv("RETRACE_TOKEN", VIEWER)
    with pytest.raises(retrace.RetraceError) as refused:
        retrace.connect()
    assert (refused.value.status, refused.value.code) == (403, "forbidden")
    assert "debugger" in refused.value.message
    assert get(f"{daemon}/api/health")[0] == 200
    assert get(f"{daemon}/api/runs", VIEWER)[0] == 200
