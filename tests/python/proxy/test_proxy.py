"""The recording proxy, end to end, with the official `openai` and `anthropic` Python clients.

Real processes over loopback HTTP, no mocks: `retrace simulate` is the upstream for the
recordings (conftest.py) and is stopped before any replay, so a replay that reached for an
upstream would fail. Programs write the bytes their clients received (the example's `--dump`,
taken by an httpx transport that tees the response stream) so record and replay are compared
byte for byte.
"""
from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import time

from conftest import (
    ANTHROPIC_KEY,
    APP,
    BIN,
    OPENAI_KEY,
    PY,
    QUIRKS,
    REPO,
    Simulator,
    dump_by_call,
    first_difference,
    read_dump,
)
from dropping import Dropping

APP_CALLS = {
    "chat.plain",
    "chat.stream",
    "responses.stream",
    "embeddings",
    "anthropic.plain",
    "anthropic.stream",
} | {f"concurrent.{i}" for i in range(8)}

GZIP_MAGIC = b"\x1f\x8b"


def body_of(call: dict, attempt: int = 0) -> str:
    return call["attempts"][attempt]["body"]


def program_stdout(done) -> str:
    """The program's stdout (`record --json` adds its one line after it)."""
    out = done.stdout.splitlines()
    if out and done.run_id and "--json" in done.args:
        out = out[:-1]
    return "\n".join(out)


def assert_same_dump(recorded, replayed, what: str) -> None:
    a, b = read_dump(recorded), read_dump(replayed)
    assert a, f"{what}: the recording wrote no dump"
    assert a == b, f"{what}: replay differs from what the client received live: {first_difference(a, b)}"


# ---- a. byte-identical replay, upstream stopped ---------------------------------------------


def test_a_recorded_app_saw_every_kind_of_call(recordings):
    """The recording itself: the example made all its calls through the proxy, live."""
    recordings.ok("app")
    calls = dump_by_call(recordings.dump("app"))
    assert set(calls) == APP_CALLS
    for name, call in calls.items():
        assert [a["status"] for a in call["attempts"]] == [200], f"{name}: {call['attempts']}"
    assert body_of(calls["chat.stream"]).endswith("data: [DONE]\n\n")
    assert "event: response.completed\n" in body_of(calls["responses.stream"])
    # The simulator's ping has spaces in its JSON, as the real API's does: raw bytes kept.
    assert 'event: ping\ndata: {"type": "ping"}\n\n' in body_of(calls["anthropic.stream"])
    assert body_of(calls["anthropic.stream"]).rstrip().endswith('data: {"type":"message_stop"}')
    assert calls["anthropic.plain"]["attempts"][0]["path"] == "/proxy/anthropic/v1/messages"
    assert calls["chat.plain"]["attempts"][0]["path"] == "/proxy/openai/v1/chat/completions"


def test_a_replay_gives_the_clients_identical_bytes_with_upstream_stopped(recordings, retrace, tmp_path):
    run = recordings.ok("app")
    assert recordings.sim.stopped
    dump = tmp_path / "replay.jsonl"
    done = retrace.replay(run, APP_DUMP=str(dump))
    assert done.returncode == 0, done.explain()
    assert "every step matched" in done.stderr, done.explain()
    assert_same_dump(recordings.dump("app"), dump, "openai + anthropic clients")
    assert done.stdout.strip() == program_stdout(recordings.runs["app"]).strip()


def test_a_api_keys_are_never_stored(recordings, retrace, tmp_path):
    for name in ("app", "gzip", "429"):
        run = recordings.ok(name)
        out = tmp_path / f"{name}.trace"
        done = retrace("export", run, "-o", str(out))
        assert done.returncode == 0, done.explain()
        text = out.read_text(encoding="utf-8")
        assert OPENAI_KEY not in text and ANTHROPIC_KEY not in text, f"{name}: an API key is in the export"
        assert "never-stored" not in text


# ---- b. concurrent calls replay 20 times in a row -------------------------------------------


def test_b_concurrent_calls_replay_20_times_in_a_row(recordings, retrace, tmp_path):
    run = recordings.ok("concurrent")
    assert set(dump_by_call(recordings.dump("concurrent"))) == {f"concurrent.{i}" for i in range(8)}
    orders = set()
    for i in range(20):
        dump = tmp_path / f"replay-{i}.jsonl"
        # A different seeded jitter each time: the 8 threads reach the proxy in another order.
        done = retrace.replay(run, APP_DUMP=str(dump), APP_JITTER_SEED=str(i))
        assert done.returncode == 0, f"replay {i + 1} of 20:\n{done.explain()}"
        assert_same_dump(recordings.dump("concurrent"), dump, f"replay {i + 1} of 20")
        m = re.search(r"concurrent start order: ([\d,]+)", done.stderr)
        assert m, done.explain()
        orders.add(m.group(1))
    assert len(orders) > 1, "every replay started its threads in the same order: timing did not vary"


def test_b_identical_calls_in_flight_at_once_are_said_to_be_ambiguous_and_own_agents_replay_apart(
    recordings, retrace, tmp_path
):
    """Best-of-3 with the official client: identical calls at once can't be told apart over HTTP,
    so which caller gets which answer in replay is not fixed (QA10 D2, QA11 D1). `record` says so;
    with an agent per caller, each replays its own answer."""
    said = recordings.runs["bestof"].stderr
    assert "made identical calls at once" in said and "X-Retrace-Agent" in said, said
    assert "made identical calls at once" not in recordings.runs["bestof-agents"].stderr
    run = recordings.ok("bestof-agents")
    recorded = dump_by_call(recordings.dump("bestof-agents"))
    assert len({json.dumps(c, sort_keys=True) for c in recorded.values()}) == 3, "three different answers"
    for i in range(3):
        dump = tmp_path / f"bestof-{i}.jsonl"
        done = retrace.replay(run, APP_DUMP=str(dump))
        assert done.returncode == 0, f"replay {i + 1}:\n{done.explain()}"
        assert_same_dump(recordings.dump("bestof-agents"), dump, f"replay {i + 1}")


def test_b_a_call_the_client_gave_up_on_is_given_up_on_again_in_replay(recordings, retrace, tmp_path):
    """The official client's timeout runs out before the upstream answers, on both attempts.
    Replay used to answer at once: the client got a reply it never had and took another path
    (QA10 D1). Now it gives up again, and the patient call after it gets the recorded answer."""
    run = recordings.ok("timeout")
    recorded = dump_by_call(recordings.dump("timeout"))
    assert recorded["timeout.impatient"]["result"] == "<APITimeoutError>", recorded["timeout.impatient"]
    assert len(recorded["timeout.impatient"]["attempts"]) == 2, "the client retried once"
    dump = tmp_path / "timeout.jsonl"
    started = time.monotonic()
    done = retrace.replay(run, APP_DUMP=str(dump))
    assert done.returncode == 0, done.explain()
    assert_same_dump(recordings.dump("timeout"), dump, "replay")
    assert time.monotonic() - started < 30, "held only until the client gave up"
    shown = retrace("show", run)
    assert shown.returncode == 0 and shown.stdout.count("[client left]") == 2, shown.explain()


def test_b_models_list_and_count_tokens_are_recorded_and_replayed(recordings, retrace, tmp_path):
    """The official clients' calls besides model calls replay too (they used to pass through
    unrecorded, and a replay refused them)."""
    run = recordings.ok("routes")
    recorded = dump_by_call(recordings.dump("routes"))
    assert recorded["routes.models"]["result"], recorded["routes.models"]
    assert isinstance(recorded["routes.count_tokens"]["result"], int), recorded["routes.count_tokens"]
    names = [e["name"] for e in retrace.show_json(run)["events"] if e.get("name")]
    assert names[:2] == ["openai/GET v1/models", "anthropic/v1/messages/count_tokens"], names
    dump = tmp_path / "routes.jsonl"
    done = retrace.replay(run, APP_DUMP=str(dump))
    assert done.returncode == 0, done.explain()
    assert_same_dump(recordings.dump("routes"), dump, "replay")


def test_b_a_client_that_gave_up_on_a_hung_upstream_gives_up_again_and_ctrl_c_ends_the_wait(retrace, tmp_path):
    """QA11 D4 and D5. The client gives up (0.5 s) on an upstream that never answers: the call
    stops there, recorded as the proxy's own 504 for a client that left, and replay holds it
    back so the client times out again instead of getting the 504. And `record`, which waits
    for a stream the program left (it is recorded whole), stops waiting on SIGTERM: exit 143,
    the run stored interrupted."""
    sim = Simulator(tmp_path / "simulate.log")
    try:
        recorded = tmp_path / "hang.jsonl"
        started = time.monotonic()
        done = retrace("record", "--json", "--upstream-openai", sim.openai_url, "--", PY, QUIRKS, "hang",
                       APP_DUMP=str(recorded), OPENAI_API_KEY=OPENAI_KEY)
        assert done.returncode == 0, done.explain()
        assert time.monotonic() - started < 30, "no wait for the upstream the client left"
        run = json.loads(done.stdout.strip().splitlines()[-1])["run"]
        assert dump_by_call(recorded)["hang"]["result"] == "<APITimeoutError>"
        replayed = tmp_path / "hang-replay.jsonl"
        again = retrace.replay(run, APP_DUMP=str(replayed))
        assert again.returncode == 0, again.explain()
        assert_same_dump(recorded, replayed, "replay of a call the client gave up on")
        shown = retrace("show", run)
        assert "[client left]" in shown.stdout, shown.explain()
        assert "[HTTP 504]" not in shown.stdout, "the 504 is the proxy's own note, not the upstream's"

        argv = [str(BIN), "record", "--upstream-openai", sim.openai_url, "--", PY, QUIRKS, "stall"]
        proc = subprocess.Popen(argv, cwd=REPO, env=retrace.env(OPENAI_API_KEY=OPENAI_KEY),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        seen = ""
        while "waiting for 1 model call " not in seen and time.monotonic() < deadline:
            seen += proc.stderr.readline()
        assert "Ctrl-C stops waiting" in seen, seen
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        _, rest = proc.communicate(timeout=20)
        assert proc.returncode == 143, seen + rest
        assert time.monotonic() - stopped < 5, "the wait ended at the signal, not at the upstream timeout"
        assert "stored interrupted" in rest, rest
    finally:
        sim.stop()


# ---- c. divergence ----------------------------------------------------------------------------


def test_c_changed_prompt_is_a_divergence_answered_409_without_retry(recordings, retrace, tmp_path):
    run = recordings.ok("app")
    dump = tmp_path / "variant.jsonl"
    done = retrace.replay(run, PY, APP, "--variant", "x", "--dump", str(dump))
    assert done.returncode == 1, done.explain()
    assert re.search(r"step_mismatch|unexpected_step", done.stderr), done.explain()
    assert "$.messages[0].content" in done.stderr, done.explain()  # the first differing JSON path
    assert "(variant x)" in done.stderr, done.explain()

    calls = dump_by_call(dump)
    plain = calls["chat.plain"]
    assert plain["result"] == {"error": "ConflictError", "status": 409}
    # One attempt: the client (max_retries=2 by default) did not retry the proxy's 409.
    assert len(plain["attempts"]) == 1, plain["attempts"]
    attempt = plain["attempts"][0]
    assert attempt["status"] == 409
    assert attempt["headers"].get("x-should-retry") == "false"
    error = json.loads(attempt["body"])["error"]  # the provider's error shape
    assert "step_mismatch" in error["message"] or "unexpected_step" in error["message"]
    assert "API error: ConflictError 409" in done.stderr  # what the program itself reported


# ---- d. gzip ----------------------------------------------------------------------------------


def export_blobs(retrace, run: str, path) -> list[bytes]:
    done = retrace("export", run, "-o", str(path))
    assert done.returncode == 0, done.explain()
    raw = path.read_bytes()
    blobs = []
    for line in raw.decode("utf-8").splitlines():
        item = json.loads(line)
        if "blob" not in item:
            continue
        if "text" in item:
            blobs.append(item["text"].encode("utf-8"))
        elif "base64" in item:
            blobs.append(base64.b64decode(item["base64"]))
    return [raw] + blobs


def events_by_model(retrace, run: str) -> dict[str, int]:
    return {e["model"]["name"]: e["seq"] for e in retrace.show_json(run)["events"] if e.get("model")}


def test_d_gzip_responses_are_stored_decoded_and_replay_identically(recordings, retrace, tmp_path):
    run = recordings.ok("gzip")
    calls = dump_by_call(recordings.dump("gzip"))
    assert set(calls) == {"gzip.chat", "gzip.embeddings", "gzip.anthropic", "gzip.request"}
    for name, call in calls.items():
        assert [a["status"] for a in call["attempts"]] == [200], f"{name}: {call}"

    for blob in export_blobs(retrace, run, tmp_path / "gzip.trace"):
        assert GZIP_MAGIC not in blob, "the export holds gzip-compressed bytes"
        # Recorded bodies that are not JSON/text would be base64 inside the document.
        for b64 in re.findall(rb'"(?:body_b64|b64)":"([^"]*)"', blob):
            assert GZIP_MAGIC not in base64.b64decode(b64), "a recorded body is gzip-compressed"

    seqs = events_by_model(retrace, run)
    for model, call in (("sim-gzip", "gzip.chat"), ("claude-gzip", "gzip.anthropic"), ("emb-gzip", "gzip.embeddings")):
        shown = retrace.show_json(run, seqs[model])
        doc = shown["output"]["json"]
        assert doc["status"] == 200
        assert "body" in doc and isinstance(doc["body"], dict), f"{model}: body not stored as readable JSON: {doc}"
        assert not any(k.lower() == "content-encoding" for k, _ in doc["headers"]), doc["headers"]
    chat_text = retrace.show_json(run, seqs["sim-gzip"])["output"]["json"]["body"]["choices"][0]["message"]["content"]
    assert chat_text == calls["gzip.chat"]["result"]
    done = retrace("show", run, "--seq", str(seqs["sim-gzip"]))
    assert done.returncode == 0 and chat_text in done.stdout, done.explain()

    dump = tmp_path / "gzip-replay.jsonl"
    done = retrace.replay(run, APP_DUMP=str(dump))
    assert done.returncode == 0, done.explain()
    assert_same_dump(recordings.dump("gzip"), dump, "gzip")


def test_d_gzip_request_body_is_stored_decoded(recordings, retrace):
    run = recordings.ok("gzip")
    seq = events_by_model(retrace, run)["gpt-4o-mini"]  # the one call not on a *-gzip model
    shown = retrace.show_json(run, seq)
    request = shown["request"]["json"]
    assert request["messages"][0]["content"] == "compressed request body 7f3a", shown["request"]
    text = retrace("show", run, "--seq", str(seq))
    assert text.returncode == 0 and '"compressed request body 7f3a"' in text.stdout, text.explain()


# ---- e. a recorded 429 ----------------------------------------------------------------------


def test_e_recorded_429_replays_with_retry_after_ms_1(recordings, retrace, tmp_path):
    run = recordings.ok("429")
    recorded = dump_by_call(recordings.dump("429"))["ratelimited"]
    # Live, the client honoured retry-after: 3 once (max_retries=1), then gave up.
    assert [a["status"] for a in recorded["attempts"]] == [429, 429]
    assert all(a["headers"].get("retry-after") == "3" for a in recorded["attempts"])
    shown = retrace("show", run)
    assert shown.returncode == 0 and shown.stdout.count("[HTTP 429]") == 2, shown.explain()
    live = float(re.search(r"elapsed ([\d.]+)", recordings.runs["429"].stderr).group(1))
    assert live >= 2.5, f"the live client did not wait for retry-after (elapsed {live}s)"

    dump = tmp_path / "429-replay.jsonl"
    started = time.monotonic()
    done = retrace.replay(run, APP_DUMP=str(dump))
    wall = time.monotonic() - started
    assert done.returncode == 0, done.explain()
    replayed = dump_by_call(dump)["ratelimited"]
    assert replayed["result"] == {"error": "RateLimitError", "status": 429}
    assert [a["status"] for a in replayed["attempts"]] == [429, 429]
    for rec, rep in zip(recorded["attempts"], replayed["attempts"]):
        assert rep["body"] == rec["body"]
        assert rep["headers"].get("retry-after-ms") == "1", rep["headers"]
        assert "retry-after" not in rep["headers"], rep["headers"]
    in_program = float(re.search(r"elapsed ([\d.]+)", done.stderr).group(1))
    assert in_program < 1.0, f"the replayed call and its retry took {in_program}s"
    # The whole replay, less Python's import of the clients (seconds on a loaded 2-core box,
    # and not the proxy's doing), is under 2 s; the recording waited 3 s for the retry alone.
    imports = float(re.search(r"imports ([\d.]+)", done.stderr).group(1))
    assert wall - imports < 2.0, f"replay took {wall:.2f}s ({imports:.2f}s of it importing the clients)"
    # The log keeps the original header.
    seq = retrace.show_json(run)["events"][0]["seq"]
    headers = retrace.show_json(run, seq)["output"]["json"]["headers"]
    assert ["retry-after", "3"] in [[k.lower(), v] for k, v in headers], headers


# ---- a truncated stream ------------------------------------------------------------------------


def test_truncated_stream_replays_as_the_client_saw_it_live(recordings, retrace, tmp_path):
    """The upstream breaks the stream off: recorded as truncated, and replay gives the client
    what it got live (the same status, headers and bytes, then the same broken connection)."""
    run = recordings.ok("truncate")
    recorded = dump_by_call(recordings.dump("truncate"))["truncated"]
    assert recorded["result"].endswith("<APIConnectionError>"), recorded
    seq = retrace.show_json(run)["events"][0]["seq"]
    assert retrace.show_json(run, seq)["output"]["json"]["end"] == "truncated"
    shown = retrace("show", run)
    assert shown.returncode == 0 and "[cut short]" in shown.stdout, shown.explain()
    dump = tmp_path / "truncate-replay.jsonl"
    done = retrace.replay(run, APP_DUMP=str(dump))
    assert done.returncode == 0, done.explain()
    assert_same_dump(recordings.dump("truncate"), dump, "truncated stream")


# ---- a dropped connection --------------------------------------------------------------------


def test_a_dropped_connection_is_retried_as_without_retrace_and_replays_exactly(retrace, tmp_path):
    """The upstream drops the first connection of each call. Without Retrace the clients'
    default retries get the answer; under `record` they must too (the proxy's 502 leaves the
    retry to the client), and replay, with the upstream stopped, answers the failed attempt and
    the retry as recorded."""
    upstream = Dropping()
    try:
        direct = retrace.env(OPENAI_API_KEY=OPENAI_KEY, ANTHROPIC_API_KEY=ANTHROPIC_KEY)
        direct.update(OPENAI_BASE_URL=upstream.openai_url, ANTHROPIC_BASE_URL=upstream.anthropic_url)
        alone = subprocess.run(
            [PY, QUIRKS, "dropfirst"], cwd=REPO, env=direct, capture_output=True, text=True, timeout=120
        )
        assert alone.returncode == 0, f"without retrace:\n{alone.stdout}\n{alone.stderr}"
        recorded_dump = tmp_path / "dropfirst.recorded.jsonl"
        done = retrace.record(upstream, PY, QUIRKS, "dropfirst", APP_DUMP=str(recorded_dump))
        assert done.returncode == 0, done.explain()
        assert program_stdout(done) == alone.stdout.strip(), "recording changed what the program got"
        assert upstream.seen == {"sim-dropfirst": 4, "claude-dropfirst": 4}, upstream.seen
    finally:
        upstream.stop()
    run = done.run_id
    recorded = dump_by_call(recorded_dump)
    for name in ("dropfirst.chat", "dropfirst.anthropic"):
        attempts = recorded[name]["attempts"]
        assert [a["status"] for a in attempts] == [502, 200], attempts
        assert "x-should-retry" not in attempts[0]["headers"], attempts[0]["headers"]
        assert recorded[name]["result"] == "answered once the connection was retried"
    events = retrace.show_json(run)["events"]
    assert len(events) == 4, events

    replayed_dump = tmp_path / "dropfirst.replayed.jsonl"
    again = retrace.replay(run, APP_DUMP=str(replayed_dump))
    assert again.returncode == 0, again.explain()
    # The same attempts, byte for byte, except that the replayed 502 says `retry-after-ms: 1`
    # (as a recorded rate limit does), so the retry follows at once, not after the backoff.
    replayed = dump_by_call(replayed_dump)
    for name in ("dropfirst.chat", "dropfirst.anthropic"):
        failed = replayed[name]["attempts"][0]
        assert failed["headers"].pop("retry-after-ms", None) == "1", failed["headers"]
    assert replayed == recorded, "dropped connection: replay differs from what the client received live"


# ---- f. launcher errors, and verify ---------------------------------------------------------


def test_f_record_of_a_missing_program_exits_2_naming_it(retrace):
    done = retrace("record", "--", "no-such-program-7c1e", "--flag")
    assert done.returncode == 2, done.explain()
    assert "no-such-program-7c1e" in done.stderr, done.explain()


def test_f_verify_passes_on_every_recorded_run(recordings, retrace):
    """Includes the runs with concurrent calls of one agent (app, concurrent): their events are
    numbered in completion order and each must still carry an increasing Lamport clock."""
    failed = []
    for name in recordings.runs:
        run = recordings.ok(name)
        done = retrace("verify", run)
        if done.returncode != 0:
            failed.append(f"{name}:\n{done.explain()}")
    done = retrace("verify", "--all")
    if done.returncode != 0:
        failed.append(f"--all:\n{done.explain()}")
    assert not failed, "\n".join(failed)


def test_b_the_unrecorded_upload_warning_masks_a_secret_in_its_path(retrace, tmp_path):
    """QA27 D6. A body no step can key (a multipart upload) goes to the upstream unrecorded, and
    `record` says so on standard error, naming the route. A key in that route's path is masked
    there like anywhere else: the warning used to print the raw path."""
    secret = "sk-proj-" + "Q7x" * 12
    program = (
        "import os, httpx2 as httpx\n"
        f"url = os.environ['OPENAI_BASE_URL'].rstrip('/') + '/uploads/{secret}/parts'\n"
        "files = {'data': ('part.bin', b'RIFF....', 'application/octet-stream')}\n"
        "r = httpx.post(url, files=files, headers={'authorization': 'Bearer ' + os.environ['OPENAI_API_KEY']})\n"
        "print('status', r.status_code, r.headers.get('x-retrace-proxy'))\n"
    )
    sim = Simulator(tmp_path / "simulate.log")
    try:
        done = retrace.record(sim, PY, "-c", program)
    finally:
        sim.stop()
    assert done.returncode == 0, done.explain()
    assert "unrecorded" in done.stdout, done.explain()
    assert "went to the upstream unrecorded" in done.stderr, done.explain()
    assert secret not in done.stderr and secret not in done.stdout, done.explain()
    assert "POST /v1/uploads/" in done.stderr, done.explain()
