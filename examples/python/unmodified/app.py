#!/usr/bin/env python3
"""An ordinary program that talks to OpenAI and Anthropic with their official clients.

It has no Retrace import. Recorded with `retrace record -- python app.py`, replayed with
`retrace replay RUN`: the clients read OPENAI_BASE_URL / ANTHROPIC_BASE_URL, which `retrace`
points at its proxy.

Calls, each under a stable name:
  chat.plain          Chat Completions, not streaming
  chat.stream         Chat Completions, streaming (with usage)
  responses.stream    Responses API, streaming
  embeddings          Embeddings, two inputs
  anthropic.plain     Anthropic Messages, not streaming
  anthropic.stream    Anthropic Messages, streaming
  concurrent.0..N-1   N chat completions at once from a thread pool (even ones stream)

Options:
  --only all|sequential|concurrent   which calls to make (default all)
  --threads N                        size of the concurrent batch (default 8)
  --variant X                        changes chat.plain's prompt (env APP_VARIANT), to show a
                                     divergence in replay
  --dump FILE                        (env APP_DUMP) write, per call, the raw bytes the client
                                     received for every HTTP attempt, as JSON lines sorted by
                                     call name, so two runs can be compared byte for byte
Environment: APP_JITTER_SEED=S makes the concurrent workers start in a seeded random order;
APP_CHAT_MODEL, APP_EMBED_MODEL, APP_CLAUDE_MODEL choose the models.

The dump is taken by an httpx transport that tees the response stream; the clients parse the
responses as usual. Without --dump the clients are constructed with defaults.

Output on stdout is deterministic in form (sorted by call name); the words depend on the
model's answers. Exit status: 0, or 3 when a call failed with an API error.
"""
from __future__ import annotations

import argparse
import base64
import concurrent.futures
import gzip
import json
import os
import random
import sys
import threading
import time
import zlib

import httpx2
import openai

# `anthropic` is imported in main() only when the Anthropic calls run: `--only concurrent`
# starts a second faster without it.
anthropic = None


def api_errors() -> tuple:
    """The clients' HTTP status errors (ConflictError, RateLimitError, ...)."""
    return (openai.APIStatusError,) + ((anthropic.APIStatusError,) if anthropic else ())

CHAT_MODEL = os.environ.get("APP_CHAT_MODEL", "gpt-4o-mini")
EMBED_MODEL = os.environ.get("APP_EMBED_MODEL", "text-embedding-3-small")
CLAUDE_MODEL = os.environ.get("APP_CLAUDE_MODEL", "claude-sonnet-5-5")

# Which call the current thread is making; the tee files each HTTP attempt under it.
_current = threading.local()


def current_call() -> str:
    return getattr(_current, "name", "?")


class Calls:
    """Every HTTP attempt of every call, with the bytes received, under the call's name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.attempts: dict[str, list[dict]] = {}
        self.results: dict[str, object] = {}

    def attempt(self, name: str, request: httpx2.Request) -> dict:
        a = {"method": request.method, "path": request.url.path, "status": None, "headers": {}, "wire": bytearray()}
        with self._lock:
            self.attempts.setdefault(name, []).append(a)
        return a

    def result(self, name: str, value: object) -> None:
        with self._lock:
            self.results[name] = value


# Response headers kept in the dump (the body is always kept whole).
DUMP_HEADERS = ("content-type", "content-encoding", "x-request-id", "x-should-retry", "retry-after", "retry-after-ms")


def decoded(wire: bytes, encoding: str | None) -> bytes:
    """The body as the client's JSON/SSE parser saw it: the wire bytes, decoded."""
    if encoding in ("gzip", "x-gzip"):
        return gzip.decompress(wire)
    if encoding == "deflate":
        return zlib.decompress(wire)
    return wire


class _TeeStream(httpx2.SyncByteStream):
    def __init__(self, inner, sink: bytearray) -> None:
        self._inner, self._sink = inner, sink

    def __iter__(self):
        for part in self._inner:
            self._sink.extend(part)
            yield part

    def close(self) -> None:
        self._inner.close()


class Tee(httpx2.BaseTransport):
    """An httpx transport that passes everything through and keeps a copy of what came back."""

    def __init__(self, calls: Calls) -> None:
        self._inner = httpx2.HTTPTransport()
        self._calls = calls

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        a = self._calls.attempt(current_call(), request)
        response = self._inner.handle_request(request)
        a["status"] = response.status_code
        a["headers"] = {h: response.headers[h] for h in DUMP_HEADERS if h in response.headers}
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_TeeStream(response.stream, a["wire"]),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._inner.close()


def dump_lines(calls: Calls) -> list[str]:
    lines = []
    for name in sorted(set(calls.attempts) | set(calls.results)):
        attempts = []
        for a in calls.attempts.get(name, []):
            wire = bytes(a["wire"])
            body = decoded(wire, a["headers"].get("content-encoding"))
            attempts.append(
                {
                    "method": a["method"],
                    "path": a["path"],
                    "status": a["status"],
                    "headers": a["headers"],
                    "body": body.decode("utf-8", errors="surrogateescape"),
                    "wire_b64": base64.b64encode(wire).decode(),
                }
            )
        lines.append(json.dumps({"call": name, "attempts": attempts, "result": calls.results.get(name)}, sort_keys=True))
    return lines


# ---- the program's model calls ----------------------------------------------------------


def call(calls: Calls, name: str, fn):
    """Runs one named call; an API error is kept as the call's result and re-raised."""
    _current.name = name
    try:
        value = fn()
    except api_errors() as e:
        calls.result(name, {"error": type(e).__name__, "status": e.status_code})
        raise
    finally:
        _current.name = "?"
    calls.result(name, value)
    return value


def chat_plain(oa: openai.OpenAI, prompt: str) -> str:
    r = oa.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": prompt}], temperature=0)
    return r.choices[0].message.content


def chat_stream(oa: openai.OpenAI, prompt: str) -> str:
    stream = oa.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": prompt}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text = []
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                text.append(choice.delta.content)
    return "".join(text)


def responses_stream(oa: openai.OpenAI) -> str:
    text, status = [], None
    for event in oa.responses.create(model=CHAT_MODEL, input="Name three release risks.", stream=True):
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        elif event.type == "response.completed":
            status = event.response.status
    return f"{''.join(text)} [{status}]"


def embeddings(oa: openai.OpenAI) -> list:
    r = oa.embeddings.create(model=EMBED_MODEL, input=["release plan", "backfill users"])
    return [[round(x, 6) for x in d.embedding] for d in r.data]


def anthropic_plain(an: "anthropic.Anthropic") -> str:
    r = an.messages.create(
        model=CLAUDE_MODEL, max_tokens=64, messages=[{"role": "user", "content": "Review the migration plan."}]
    )
    return "".join(b.text for b in r.content if b.type == "text")


def anthropic_stream(an: "anthropic.Anthropic") -> str:
    text, stop = [], None
    stream = an.messages.create(
        model=CLAUDE_MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": "Summarise the review in one line."}],
        stream=True,
    )
    for event in stream:
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            text.append(event.delta.text)
        elif event.type == "message_delta":
            stop = event.delta.stop_reason
    return f"{''.join(text)} [{stop}]"


def concurrent_batch(calls: Calls, oa: openai.OpenAI, threads: int, jitter_seed: str | None) -> None:
    """N calls at once. With a jitter seed, each worker first sleeps 0-30 ms (seeded), so the
    calls reach the server in a different order from one seed to the next; the order they
    started in goes to stderr (never to stdout or the dump, which must not depend on it)."""
    order: list[int] = []
    lock = threading.Lock()

    def one(i: int):
        if jitter_seed is not None:
            time.sleep(random.Random(f"{jitter_seed}/{i}").uniform(0, 0.03))
        with lock:
            order.append(i)
        prompt = f"Concurrent question #{i}: what should worker {i} check?"
        fn = (lambda: chat_stream(oa, prompt)) if i % 2 == 0 else (lambda: chat_plain(oa, prompt))
        return call(calls, f"concurrent.{i}", fn)

    with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
        futures = [pool.submit(one, i) for i in range(threads)]
        for f in futures:
            f.result()
    print(f"concurrent start order: {','.join(map(str, order))}", file=sys.stderr)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["all", "sequential", "concurrent"], default="all")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--variant", default=os.environ.get("APP_VARIANT", ""))
    p.add_argument("--dump", default=os.environ.get("APP_DUMP"))
    args = p.parse_args(argv)

    global anthropic
    calls = Calls()
    # With --dump, the clients get an httpx client whose transport keeps what came back.
    http = (lambda: httpx2.Client(transport=Tee(calls))) if args.dump else (lambda: None)
    oa = openai.OpenAI(http_client=http())
    an = None
    if args.only != "concurrent":
        import anthropic

        an = anthropic.Anthropic(http_client=http())

    status = 0
    try:
        if args.only in ("all", "sequential"):
            prompt = "Is the release plan sound?" + (f" (variant {args.variant})" if args.variant else "")
            call(calls, "chat.plain", lambda: chat_plain(oa, prompt))
            call(calls, "chat.stream", lambda: chat_stream(oa, "Explain the backfill step."))
            call(calls, "responses.stream", lambda: responses_stream(oa))
            call(calls, "embeddings", lambda: embeddings(oa))
            call(calls, "anthropic.plain", lambda: anthropic_plain(an))
            call(calls, "anthropic.stream", lambda: anthropic_stream(an))
        if args.only in ("all", "concurrent"):
            concurrent_batch(calls, oa, args.threads, os.environ.get("APP_JITTER_SEED"))
    except api_errors() as e:
        print(f"API error: {type(e).__name__} {e.status_code}: {e.message}", file=sys.stderr)
        status = 3

    for name in sorted(calls.results):
        print(f"{name}: {json.dumps(calls.results[name])}")
    if args.dump:
        with open(args.dump, "w", encoding="utf-8") as f:
            for line in dump_lines(calls):
                f.write(line + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
