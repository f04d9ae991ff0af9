"""The privacy canary (issue 7's proof): a program feeds a known secret of every rule kind
through every surface Retrace records — tool outputs and arguments, messages, env values, model
requests and responses (streamed in the OpenAI Chat, OpenAI Responses and Anthropic shapes with
each secret split across several chunks; gzip-compressed; JSON-escaped), response headers and a
fork's edit file — and the run is recorded, replayed, forked, exported and served through the
API. Then every byte the project wrote (database, WAL, blob files, exports, its own log lines,
the API's answers) is scanned: no canary may appear.

Real processes over loopback: `retrace simulate` as the providers, `retrace record|replay|fork|
export|serve`, the official openai and anthropic clients through the proxy, the SDK.
"""
from __future__ import annotations

import json
import re
import sys
import time
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "agents"))
sys.path.insert(0, str(HERE))
import agents_harness as h  # noqa: E402
import canaries as C  # noqa: E402

APP = HERE / "canary_app.py"
VAULT_KEY = "dmF1bHQta2V5LWZvci10aGUtY2FuYXJ5LXRlc3QtMzI="  # 32 bytes, base64
OTHER_MASK_KEY = "b3RoZXItbWFzay1rZXktb2YtYW5vdGhlci1tYWNoaW4="  # 32 bytes: a machine without the key

# The project's config for this test: the default rules plus an application field and a
# response header of the simulator.
CONFIG = """
[mask]
defaults = true

[[mask.rules]]
name = "ssn"
kind = "ssn"
json_path = "$..ssn"

[[mask.rules]]
name = "echo-header"
kind = "header"
header = "x-echo"
"""


class Project:
    """`retrace` run from a project folder holding retrace.toml, logging every stderr."""

    def __init__(self, root: Path) -> None:
        self.root, self.home, self.logs = root, root / ".retrace", root / "logs"
        self.logs.mkdir(parents=True)
        (root / "retrace.toml").write_text(CONFIG)
        self.retrace = h.Retrace(self.home)
        self.n = 0

    def __call__(self, *args: str, timeout: float = 180, **env: str | None) -> h.Done:
        env.setdefault("RETRACE_VAULT_KEY", VAULT_KEY)
        env.setdefault("CANARY_ENV_SECRET", C.ENV_SECRET)
        argv = [str(h.BIN), *args]
        started = time.monotonic()
        import subprocess

        p = subprocess.run(argv, cwd=self.root, env=self.retrace.env(**env), capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
        self.n += 1
        (self.logs / f"{self.n:02}-{args[0]}.stderr").write_text(p.stderr)
        return h.Done(argv, p.returncode, p.stdout, p.stderr, time.monotonic() - started)


def app_output(done: h.Done) -> dict:
    # The program's JSON line, not the `record --json` line after it.
    lines = [line for line in done.lines if line.startswith("{") and '"exit_status"' not in line]
    assert lines, done.explain()
    return json.loads(lines[-1])


def scan(paths: list[Path], blobs: dict[str, bytes]) -> list[str]:
    """Every (place, needle) where a canary occurs."""
    hits = []
    for root in paths:
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for f in files:
            data = f.read_bytes()
            hits += [f"{f}: {n}" for n in C.NEEDLES if n.encode() in data]
    for place, data in blobs.items():
        hits += [f"{place}: {n}" for n in C.NEEDLES if n.encode() in data]
    return hits


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return Project(tmp_path_factory.mktemp("canary"))


def test_no_canary_reaches_anything_retrace_writes(project: Project, tmp_path: Path) -> None:
    sim = h.Simulator(project.logs / "simulate.log")
    anthropic_url = sim.openai_url.removesuffix("/v1")
    try:
        rec = project("record", "--json", "--name", "canary", "--upstream-openai", sim.openai_url,
                      "--upstream-anthropic", anthropic_url, "--", h.PY, str(APP))
        assert rec.returncode == 0, rec.explain()
        run = json.loads(rec.lines[-1])["run"]
        live = app_output(rec)
        # In record the program gets its own values back; only what is persisted is masked.
        assert live["mode"] == "record" and live["got_email_back"] is True, live
        assert "<EMAIL>" in live["customer"] and "<CARD>" in live["customer"], live
        assert "<EMAIL>" in live["chat_stream"] and "<OPENAI_KEY>" in live["chat_stream"], live
        assert "<ANTHROPIC_KEY>" in live["anthropic_stream"] and "<IBAN>" in live["responses_stream"], live
        assert "<ENV_SECRET>" in live["env"], live

        # The fork's edit file holds a new secret; the edit is masked like any input.
        shown = project("show", run, "--json")
        assert shown.returncode == 0, shown.explain()
        events = json.loads(shown.stdout)["events"]
        lookup = next(e["seq"] for e in events if e.get("name") == "crm.lookup" and e["type"] == "tool_call")
        edit = tmp_path / "edit.json"
        edit.write_text(json.dumps({"email": C.FORK_EMAIL, "card": C.CARD, "iban": C.IBAN, "ssn": C.SSN,
                                    "deploy_key": C.PRIVATE_KEY}))
        fork = project("fork", run, "--edit", f"tool-output:{lookup}=@{edit}", "--upstream-openai",
                       sim.openai_url, "--upstream-anthropic", anthropic_url)
        assert fork.returncode == 0, fork.explain()
        fork_id = next(i for i in re.findall(r"\b[0-9a-z]{26}\b", fork.stdout + fork.stderr) if i != run)
    finally:
        sim.stop()

    # Replay with the network gone: the program gets tokens where secrets were.
    rep = project("replay", run)
    assert rep.returncode == 0, rep.explain()
    replayed = app_output(rep)
    assert replayed["mode"] == "replay" and replayed["got_email_back"] is False, replayed
    assert "rtk_email_" in replayed["customer"] and "rtk_email_" in replayed["chat_stream"], replayed
    assert "rtk_" in replayed["anthropic_stream"] and "rtk_" in replayed["responses_stream"], replayed
    assert "rtk_" in replayed["escaped"] and "rtk_" in replayed["echo_header"], replayed

    exports = tmp_path / "exports"
    exports.mkdir()
    for rid in (run, fork_id):
        ex = project("export", rid, "-o", str(exports / f"{rid}.jsonl"))
        assert ex.returncode == 0, ex.explain()

    # Another machine: a fresh store holding only the exported trace. Under the same mask key it
    # replays offline; under another key it is refused before anything runs, naming both keys.
    machines = tmp_path / "machines"
    for name, key, status in (("same-key", h.MASK_KEY, 0), ("other-key", OTHER_MASK_KEY, 2)):
        project.retrace = h.Retrace(machines / name)
        imported = project("import", str(exports / f"{run}.jsonl"), RETRACE_MASK_KEY=key)
        assert imported.returncode == 0, imported.explain()
        elsewhere = project("replay", run, RETRACE_MASK_KEY=key)
        assert elsewhere.returncode == status, elsewhere.explain()
        if status == 0:
            assert app_output(elsewhere) == replayed, elsewhere.explain()
        else:
            assert "mask key" in elsewhere.stderr and "mk_" in elsewhere.stderr, elsewhere.explain()
    project.retrace = h.Retrace(project.home)

    # Served through the API: whatever it answers must be masked too.
    port = h.free_port()
    import subprocess

    serve_log = open(project.logs / "serve.stderr", "wb")
    server = subprocess.Popen([str(h.BIN), "serve", "--addr", f"127.0.0.1:{port}"], cwd=project.root,
                              env=project.retrace.env(), stdout=serve_log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
    answers: dict[str, bytes] = {}
    try:
        deadline = time.monotonic() + 15
        while not h.port_open(port):
            assert server.poll() is None and time.monotonic() < deadline, "serve did not start"
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        paths = ["/api/runs", f"/api/runs/{run}", f"/api/runs/{fork_id}", f"/api/runs/{run}/events",
                 f"/api/runs/{run}/export", f"/api/runs/{fork_id}/export"]
        for path in paths:
            try:
                with urllib.request.urlopen(base + path, timeout=30) as r:
                    answers[path] = r.read()
            except urllib.error.HTTPError as e:
                answers[path] = e.read()
        served = [p for p, body in answers.items() if body and not body.startswith(b'{"error"')]
        assert f"/api/runs/{run}" in served, answers
        for blob in {b for e in events for b in (e.get("request_ref"), e.get("output_ref")) if b}:
            with urllib.request.urlopen(f"{base}/api/blobs/{blob}", timeout=30) as r:
                answers[f"/api/blobs/{blob}"] = r.read()
    finally:
        server.terminate()
        server.wait(timeout=10)
        serve_log.close()

    hits = scan([project.home, exports, project.logs, machines], answers)
    assert not hits, "canaries found in what Retrace wrote:\n" + "\n".join(hits)
    # The scan saw the real thing: a store with a WAL-mode database, blobs and tokens.
    db = project.home / "retrace.db"
    assert db.exists() and db.stat().st_size > 0
    assert b"rtk_email_" in (exports / f"{run}.jsonl").read_bytes()

    # Deleting the runs deletes the originals only they held (QA38 D1: the vault key still
    # revealed a deleted run's secrets); the audit log keeps every attempt.
    token = re.search(rb"rtk_email_[a-z2-7]{26}", (exports / f"{run}.jsonl").read_bytes()).group().decode()
    before = project("vault", "reveal", token, "--reason", "erasure check")
    assert before.returncode == 0, before.explain()
    deleted = project("delete", fork_id, run, "--json")
    assert deleted.returncode == 0, deleted.explain()
    assert json.loads(deleted.stdout)["vault_originals_deleted"] > 0, deleted.explain()
    after = project("vault", "reveal", token, "--reason", "erasure check")
    assert after.returncode == 1 and "no original" in after.stderr, after.explain()
