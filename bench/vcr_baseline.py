#!/usr/bin/env python3
"""Per-request replay cost, VCR.py against Retrace's proxy, with the same client on both sides.

Run by `retrace-bench proxy` (crates/retrace-bench/src/proxy_vcr.rs) from a virtualenv that has
vcrpy and httpx; it installs nothing itself:

    python3 -m venv target/bench-venv
    target/bench-venv/bin/pip install vcrpy httpx
    target/bench-venv/bin/python bench/vcr_baseline.py vcr --upstream http://127.0.0.1:8100/v1

`--client` picks the HTTP client, the same for every subcommand of one comparison:
`httpx` (what the official openai and anthropic clients use) or `http.client` (the standard
library's keep-alive connection, which VCR.py also patches). VCR.py answers inside the client,
so whatever the client costs by itself is added to both sides alike; with httpx that is
~0.4-1 ms of Python per request, more than Retrace's whole replay, so the leaner client shows
each recorder's own cost.

`vcr`:     records a cassette of N chat completions against the upstream, then replays it REPEATS
           times, matching requests with VCR.py's default matchers (method and URL; the recorded
           interactions play in order), or with --match body also on the body, as Retrace
           matches on the request's key.
`direct`:  sends the N calls to the upstream itself: the client's own cost plus the simulator's,
           the floor under both replays.
`retrace`: opens a replay of the recorded run SOURCE on the daemon (POST /api/runs/SOURCE/replay)
           and sends its N recorded calls in order through the proxy, REPEATS times.

Each prints one JSON line: per_request_us (the whole replay, cassette load or replay open
included, divided by N; median over repeats), open_us (the load / open alone), call_p50_us and
call_p99_us (single requests), non200.
"""
import argparse
import json
import os
import statistics
import sys
import time

TAG, NUM = "TAGTAGTAG", "987654321"
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-bench-not-a-key"}


def bodies(template, tag, n):
    return [template.replace(TAG, tag).replace(NUM, str(i)).encode() for i in range(n)]


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    rank = max(1, min(len(xs), int(-(-p * len(xs) // 100))))
    return xs[rank - 1]


def summary(totals, opens, calls, n, non200, **extra):
    out = {
        "per_request_us": statistics.median(totals) * 1e6 / n,
        "open_us": statistics.median(opens) * 1e6,
        "call_p50_us": pct(calls, 50) * 1e6,
        "call_p99_us": pct(calls, 99) * 1e6,
        "non200": non200,
    }
    out.update(extra)
    print(json.dumps(out))


class Client:
    """One keep-alive HTTP client of the kind `--client` names, for one origin: `post` returns
    (status, body bytes). Made inside a cassette's context, so that VCR.py's patches apply."""

    def __init__(self, kind, origin, timeout=60):
        self.kind = kind
        if kind == "httpx":
            import httpx

            self.client = httpx.Client(base_url=origin, timeout=timeout)
        else:
            import http.client
            from urllib.parse import urlsplit

            u = urlsplit(origin)
            self.client = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)

    def post(self, path, body=None, headers=None):
        if self.kind == "httpx":
            r = self.client.post(path, content=body, headers=headers)
            return r.status_code, r.content
        # A body of None still says `content-length: 0`: the daemon reads the head and body
        # as one request.
        self.client.request("POST", path, body=body if body is not None else b"", headers=headers or {})
        r = self.client.getresponse()
        return r.status, r.read()

    def close(self):
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def split(url):
    """("http://host:port", "/path") of a URL."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    return "%s://%s" % (u.scheme, u.netloc), u.path


def cmd_vcr(a):
    import vcr
    import yaml

    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, "cassette-%d-%s-%s.yaml" % (a.n, a.match, a.client))
    if os.path.exists(path):
        os.remove(path)
    if a.match == "body":
        my_vcr = vcr.VCR(match_on=["method", "scheme", "host", "port", "path", "query", "body"])
    else:
        my_vcr = vcr.VCR()
    origin, prefix = split(a.upstream.rstrip("/") + "/chat/completions")
    bs = bodies(a.template, "vcr", a.n)
    with my_vcr.use_cassette(path, record_mode="all"):
        with Client(a.client, origin) as client:
            for b in bs:
                status, body = client.post(prefix, b, HEADERS)
                assert status == 200, body
    totals, opens, calls, non200 = [], [], [], 0
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        with my_vcr.use_cassette(path, record_mode="none", allow_playback_repeats=False) as cassette:
            t1 = time.perf_counter()
            with Client(a.client, origin) as client:
                for b in bs:
                    s = time.perf_counter()
                    status, _ = client.post(prefix, b, HEADERS)
                    calls.append(time.perf_counter() - s)
                    non200 += status != 200
            assert cassette.all_played, "not every interaction was played"
        totals.append(time.perf_counter() - t0)
        opens.append(t1 - t0)
    summary(totals, opens, calls, a.n, non200, client=a.client,
            vcrpy=vcr.__version__, libyaml=bool(getattr(yaml, "__with_libyaml__", False)),
            cassette_bytes=os.path.getsize(path))


def cmd_retrace(a):
    bs = bodies(a.template, a.tag, a.n)
    totals, opens, calls, non200, failed = [], [], [], 0, []
    with Client(a.client, a.base) as client:
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            # No body: the daemon doesn't read this route's body.
            status, body = client.post("/api/runs/%s/replay" % a.source)
            assert status == 200, body
            run = json.loads(body)["run_id"]
            t1 = time.perf_counter()
            path = "/proxy/run/%s/agent/bench/openai/v1/chat/completions" % run
            for i, b in enumerate(bs):
                s = time.perf_counter()
                try:
                    status, _ = client.post(path, b, HEADERS)
                except Exception as e:
                    print("call %d of replay %s failed after %.3f s: %r" % (i, run, time.perf_counter() - s, e),
                          file=sys.stderr)
                    raise
                calls.append(time.perf_counter() - s)
                non200 += status != 200
            totals.append(time.perf_counter() - t0)
            opens.append(t1 - t0)
            _, body = client.post("/api/runs/%s/finish" % run, json.dumps({"exit_status": 0}).encode(),
                                  {"content-type": "application/json"})
            fin = json.loads(body)
            if fin.get("status") != "ok" or fin.get("divergence"):
                failed.append(fin)
    if failed:
        print("retrace replay did not complete: %s" % json.dumps(failed[0])[:800], file=sys.stderr)
    summary(totals, opens, calls, a.n, non200, client=a.client, replays_not_completed=len(failed))


def cmd_direct(a):
    origin, prefix = split(a.upstream.rstrip("/") + "/chat/completions")
    bs = bodies(a.template, "direct", a.n)
    totals, calls, non200 = [], [], 0
    with Client(a.client, origin) as client:
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            for b in bs:
                s = time.perf_counter()
                status, _ = client.post(prefix, b, HEADERS)
                calls.append(time.perf_counter() - s)
                non200 += status != 200
            totals.append(time.perf_counter() - t0)
    summary(totals, [0.0], calls, a.n, non200, client=a.client)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    default_template = json.dumps({
        "model": "sim",
        "messages": [{"role": "user", "content": "[%s] question %s" % (TAG, NUM)}],
    })
    v = sub.add_parser("vcr")
    v.add_argument("--upstream", required=True, help="OpenAI base URL, with /v1")
    v.add_argument("--dir", default=".", help="where the cassette goes")
    v.add_argument("--match", choices=["default", "body"], default="default")
    d = sub.add_parser("direct")
    d.add_argument("--upstream", required=True, help="OpenAI base URL, with /v1")
    r = sub.add_parser("retrace")
    r.add_argument("--base", required=True, help="the daemon, http://host:port")
    r.add_argument("--source", required=True, help="the recorded run")
    r.add_argument("--tag", required=True, help="the tag the run's bodies were recorded with")
    for s in (v, d, r):
        s.add_argument("--client", choices=["httpx", "http.client"], default="httpx",
                       help="the HTTP client, the same on both sides of a comparison")
        s.add_argument("--n", type=int, default=200)
        s.add_argument("--repeats", type=int, default=5)
        s.add_argument("--template", default=default_template,
                       help="request body with %s and %s standing for the tag and the call's index" % (TAG, NUM))
    a = p.parse_args()
    {"vcr": cmd_vcr, "direct": cmd_direct, "retrace": cmd_retrace}[a.cmd](a)


if __name__ == "__main__":
    main()
