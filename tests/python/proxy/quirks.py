#!/usr/bin/env python3
"""Client programs for the proxy's edge cases, run under `retrace record` / `retrace replay`.

Like the example, no Retrace import: plain official clients (and httpx for a compressed
request body), pointed at the proxy by OPENAI_BASE_URL / ANTHROPIC_BASE_URL. They reuse the
example's tee transport so their dumps have the same shape.

  quirks.py gzip  --dump FILE   models named *-gzip (the simulator gzips its answer) on Chat
                                Completions, Embeddings and Anthropic Messages, then a Chat
                                Completions request whose body is gzip-compressed
  quirks.py 429   --dump FILE   a model named *-429 (429, retry-after: 3) with max_retries=1:
                                the client retries once, then gets RateLimitError (exit 0)
  quirks.py truncate --dump FILE  a stream the upstream breaks off (model *-truncate)
  quirks.py bestof --dump FILE  best-of-3: three identical Chat Completions calls in flight at
                                once from three threads, sent 50 ms apart, the first answered
                                last (the simulator's x-sim-delay-ms): each thread keeps its own
  quirks.py bestof-agents --dump FILE  the same, each thread naming its own agent
                                (X-Retrace-Agent), which replay keeps apart
  quirks.py timeout --dump FILE  a client whose 0.3 s timeout runs out before the upstream
                                answers (1 s): both attempts (max_retries=1) give up with
                                APITimeoutError; then a patient client asks the same
  quirks.py routes --dump FILE  routes besides the model calls: models.list() and Anthropic's
                                messages.count_tokens, then a chat completion
  quirks.py hang --dump FILE    a model that never answers (*-hang), with a 0.5 s client timeout
                                and no retry: APITimeoutError
  quirks.py stall --dump FILE   a stream whose upstream stalls after its first chunk
                                (*-stall): the program reads one chunk and exits
  quirks.py dropfirst --dump FILE  a Chat Completions and an Anthropic Messages call with the
                                clients' default retries, against an upstream that drops the
                                first connection of each (dropping.py): the retry answers
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "examples", "python", "unmodified"))

_t0 = time.monotonic()
import httpx2  # noqa: E402
import openai  # noqa: E402

import app  # noqa: E402  (the example: its tee transport and dump format)

IMPORT_SECONDS = time.monotonic() - _t0  # the clients' import cost, reported on stderr

GZIP_REQUEST_MARKER = "compressed request body 7f3a"


def gzip_scenario(calls: app.Calls) -> None:
    import anthropic

    oa = openai.OpenAI(http_client=httpx2.Client(transport=app.Tee(calls)))
    an = anthropic.Anthropic(http_client=httpx2.Client(transport=app.Tee(calls)))
    app.call(
        calls,
        "gzip.chat",
        lambda: oa.chat.completions.create(
            model="sim-gzip", messages=[{"role": "user", "content": "gzip me"}]
        ).choices[0].message.content,
    )
    app.call(
        calls,
        "gzip.embeddings",
        lambda: [round(x, 6) for x in oa.embeddings.create(model="emb-gzip", input="gzip me").data[0].embedding],
    )
    app.call(
        calls,
        "gzip.anthropic",
        lambda: an.messages.create(
            model="claude-gzip", max_tokens=16, messages=[{"role": "user", "content": "gzip me"}]
        ).content[0].text,
    )

    # A request whose body is compressed, sent with httpx through the same tee.
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": GZIP_REQUEST_MARKER}]})
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    with httpx2.Client(transport=app.Tee(calls)) as http:

        def send():
            r = http.post(
                f"{base}/chat/completions",
                content=gzip.compress(body.encode()),
                headers={
                    "content-type": "application/json",
                    "content-encoding": "gzip",
                    "authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'sk-none')}",
                },
            )
            r.raise_for_status()
            return r.json()["choices"][0]["message"]["content"]

        app.call(calls, "gzip.request", send)


def rate_limit_scenario(calls: app.Calls) -> None:
    oa = openai.OpenAI(max_retries=1, http_client=httpx2.Client(transport=app.Tee(calls)))
    started = time.monotonic()
    try:
        app.call(
            calls,
            "ratelimited",
            lambda: oa.chat.completions.create(model="sim-429", messages=[{"role": "user", "content": "hi"}]),
        )
    except openai.RateLimitError as e:
        print(f"RateLimitError {e.status_code} after {len(calls.attempts['ratelimited'])} attempts")
    # Not in the dump: it differs between record (~3 s) and replay.
    print(f"elapsed {time.monotonic() - started:.3f}", file=sys.stderr)
    print(f"imports {IMPORT_SECONDS:.3f}", file=sys.stderr)


def truncate_scenario(calls: app.Calls) -> None:
    """A stream the upstream breaks off (model *-truncate): the client sees a connection error."""
    oa = openai.OpenAI(max_retries=0, http_client=httpx2.Client(transport=app.Tee(calls)))

    def read():
        text = []
        try:
            stream = oa.chat.completions.create(
                model="sim-truncate", messages=[{"role": "user", "content": "break off"}], stream=True
            )
            for chunk in stream:
                text.extend(c.delta.content or "" for c in chunk.choices)
        except openai.APIConnectionError as e:
            text.append(f"<{type(e).__name__}>")
        return "".join(text)

    app.call(calls, "truncated", read)


def bestof_scenario(calls: app.Calls, own_agents: bool = False) -> None:
    """Three identical calls at once, answered in the reverse of the order they were sent."""
    import threading

    oa = openai.OpenAI(max_retries=0, http_client=httpx2.Client(transport=app.Tee(calls)))

    def sample(i: int) -> None:
        app.call(
            calls,
            f"bestof.{i}",
            lambda: oa.chat.completions.create(
                model="gpt-4o-mini",
                temperature=1,
                messages=[{"role": "user", "content": "name a colour"}],
                extra_headers={"x-sim-delay-ms": str(600 - 300 * i)}
                | ({"x-retrace-agent": f"sampler-{i}"} if own_agents else {}),
            ).choices[0].message.content,
        )

    threads = []
    for i in range(3):
        threads.append(threading.Thread(target=sample, args=(i,)))
        threads[-1].start()
        time.sleep(0.05)
    for t in threads:
        t.join()


def timeout_scenario(calls: app.Calls) -> None:
    """A call the client gives up on, twice, then the same call with time to wait."""
    messages = [{"role": "user", "content": "take your time"}]
    slow = {"x-sim-delay-ms": "1000"}
    impatient = openai.OpenAI(timeout=0.3, max_retries=1, http_client=httpx2.Client(transport=app.Tee(calls)))
    patient = openai.OpenAI(timeout=10, max_retries=0, http_client=httpx2.Client(transport=app.Tee(calls)))

    def give_up():
        try:
            return impatient.chat.completions.create(
                model="gpt-4o-mini", messages=messages, extra_headers=slow
            ).choices[0].message.content
        except openai.APITimeoutError as e:
            return f"<{type(e).__name__}>"

    app.call(calls, "timeout.impatient", give_up)
    app.call(
        calls,
        "timeout.patient",
        lambda: patient.chat.completions.create(model="gpt-4o-mini", messages=messages, extra_headers=slow)
        .choices[0]
        .message.content,
    )


def routes_scenario(calls: app.Calls) -> None:
    """Calls besides model calls, which the proxy records and replays like them."""
    import anthropic

    oa = openai.OpenAI(http_client=httpx2.Client(transport=app.Tee(calls)))
    an = anthropic.Anthropic(http_client=httpx2.Client(transport=app.Tee(calls)))
    app.call(calls, "routes.models", lambda: sorted(m.id for m in oa.models.list()))
    app.call(
        calls,
        "routes.count_tokens",
        lambda: an.messages.count_tokens(
            model="claude-sonnet-4-5", messages=[{"role": "user", "content": "how many tokens is this"}]
        ).input_tokens,
    )
    app.call(
        calls,
        "routes.chat",
        lambda: oa.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "and now an answer"}]
        ).choices[0].message.content,
    )


def hang_scenario(calls: app.Calls) -> None:
    """A call to an upstream that never answers, which the client gives up on."""
    oa = openai.OpenAI(timeout=0.5, max_retries=0, http_client=httpx2.Client(transport=app.Tee(calls)))

    def give_up():
        try:
            return oa.chat.completions.create(
                model="gpt-4o-mini-hang", messages=[{"role": "user", "content": "anyone there?"}]
            ).choices[0].message.content
        except (openai.APITimeoutError, openai.InternalServerError) as e:
            return f"<{type(e).__name__}>"

    app.call(calls, "hang", give_up)


def stall_scenario(calls: app.Calls) -> None:
    """Reads the first chunk of a stream whose upstream then stalls, and leaves."""
    oa = openai.OpenAI(max_retries=0, http_client=httpx2.Client(transport=app.Tee(calls)))

    def first():
        stream = oa.chat.completions.create(
            model="gpt-4o-mini-stall", messages=[{"role": "user", "content": "and then?"}], stream=True
        )
        for chunk in stream:
            return chunk.choices[0].delta.role if chunk.choices else "?"

    app.call(calls, "stall", first)


def dropfirst_scenario(calls: app.Calls) -> None:
    """The upstream drops the first attempt's connection: the clients' default retries (2) get
    the answer, with or without Retrace in between."""
    import anthropic

    oa = openai.OpenAI(http_client=httpx2.Client(transport=app.Tee(calls)))
    an = anthropic.Anthropic(http_client=httpx2.Client(transport=app.Tee(calls)))
    app.call(
        calls,
        "dropfirst.chat",
        lambda: oa.chat.completions.create(
            model="sim-dropfirst", messages=[{"role": "user", "content": "retry me"}]
        ).choices[0].message.content,
    )
    app.call(
        calls,
        "dropfirst.anthropic",
        lambda: an.messages.create(
            model="claude-dropfirst", max_tokens=16, messages=[{"role": "user", "content": "retry me"}]
        ).content[0].text,
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["gzip", "429", "truncate", "bestof", "bestof-agents", "timeout", "routes", "hang", "stall", "dropfirst"])
    p.add_argument("--dump", default=os.environ.get("APP_DUMP"), required=False)
    args = p.parse_args(argv)
    calls = app.Calls()
    status = 0
    try:
        scenarios = {
            "gzip": gzip_scenario,
            "429": rate_limit_scenario,
            "truncate": truncate_scenario,
            "bestof": bestof_scenario,
            "bestof-agents": lambda calls: bestof_scenario(calls, own_agents=True),
            "timeout": timeout_scenario,
            "routes": routes_scenario,
            "hang": hang_scenario,
            "stall": stall_scenario,
            "dropfirst": dropfirst_scenario,
        }
        scenarios[args.scenario](calls)
    except Exception as e:  # noqa: BLE001  (an API error: reported, kept in the dump)
        print(f"error: {e}", file=sys.stderr)
        status = 3
    for name in sorted(calls.results):
        print(f"{name}: {json.dumps(calls.results[name])}")
    if args.dump:
        with open(args.dump, "w", encoding="utf-8") as f:
            for line in app.dump_lines(calls):
                f.write(line + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
