#!/usr/bin/env python3
"""The privacy canary program: feeds a known secret of every rule kind through every surface
Retrace records (tool outputs, tool arguments, messages, env values, model requests and
responses, streamed and not, gzip-compressed, JSON-escaped, split across stream chunks, response
headers), and prints what it got back as one JSON line, with every canary replaced by its name
(so the program's own output never holds a secret).

    retrace record --upstream-openai URL/v1 --upstream-anthropic URL -- python canary_app.py
    retrace replay RUN

In record the program gets its own values back; in replay it gets tokens where secrets were.
"""
from __future__ import annotations

import json
import os
import sys
import urllib.request

import retrace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import canaries as C  # noqa: E402

NAMES = {v: k for k, v in vars(C).items() if k.isupper() and isinstance(v, str)}


def scrub(value):
    """The value as printable: every canary replaced by its name, tokens by their kind."""
    text = json.dumps(value, sort_keys=True)
    for secret, name in NAMES.items():
        text = text.replace(json.dumps(secret)[1:-1], f"<{name}>")
    return text


def main() -> None:
    run = retrace.connect()
    alpha, beta = run.agent("alpha", role="intake"), run.agent("beta", role="billing")
    out: dict = {"mode": run.mode}

    # A tool whose output holds an email, a card, an IBAN, a private key and an app field.
    customer = alpha.tool("crm.lookup", {"customer": "c-1", "auth": C.BEARER}, lambda: {
        "email": C.EMAIL, "card": C.CARD, "iban": C.IBAN, "ssn": C.SSN, "deploy_key": C.PRIVATE_KEY})
    out["got_email_back"] = customer["email"] == C.EMAIL
    out["customer"] = scrub(customer)

    # An env value and a message carrying secrets.
    out["env"] = scrub(alpha.env("CANARY_ENV_SECRET"))
    alpha.send("beta", {"jwt": C.JWT, "aws": C.AWS_KEY, "github": C.GITHUB_TOKEN}, kind="handoff")
    msg = beta.recv(timeout=10)
    out["message"] = scrub(msg.body if msg else None)

    # Model calls with secrets in the prompt; the -echo models answer with the prompt, streamed
    # in three-character pieces (so each secret is split across several chunks).
    prompt = f"mail {C.EMAIL} key {C.OPENAI_KEY} card {C.CARD}"
    llm = alpha.openai()
    chunks = llm.chat.completions.create(model="sim-echo", messages=[{"role": "user", "content": prompt}],
                                         stream=True)
    out["chat_stream"] = scrub("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    reply = llm.chat.completions.create(model="sim-echo-gzip", messages=[{"role": "user", "content": prompt}])
    out["chat_gzip"] = scrub(reply.choices[0].message.content)
    events = llm.responses.create(model="sim-echo", input=f"iban {C.IBAN} jwt {C.JWT}", stream=True)
    out["responses_stream"] = scrub("".join(e.delta for e in events if e.type == "response.output_text.delta"))
    claude = beta.anthropic()
    with claude.messages.stream(model="claude-echo", max_tokens=64,
                                messages=[{"role": "user", "content": f"key {C.ANTHROPIC_KEY} aws {C.AWS_KEY}"}]) as s:
        out["anthropic_stream"] = scrub("".join(s.text_stream))

    # A hand-written request whose secrets are JSON-escaped (\u0040, \u002d, \/), as some
    # clients send them.
    body = ('{"model":"sim-echo","messages":[{"role":"user","content":"mail canary.bob\\u0040corp.example '
            'key sk\\u002dproj\\u002dCanaryQ7v2XbLk9TnWp4ZrYd8HsMf3GjUe6Ac deploy key '
            '-----BEGIN PRIVATE KEY-----\\nMIIBVQ\\/canaryEscapedKey\\/0123+xyz=\\n-----END PRIVATE KEY-----"}]}')
    req = urllib.request.Request(alpha._proxy("openai") + "/v1/chat/completions", data=body.encode(),
                                 headers={"content-type": "application/json",
                                          "authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'x')}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        out["escaped"] = scrub(json.loads(r.read())["choices"][0]["message"]["content"])
        out["echo_header"] = scrub(r.headers.get("x-echo"))

    beta.decide("charge", target="customer:c-1")
    print(json.dumps(out, sort_keys=True))
    run.finish(0)


if __name__ == "__main__":
    main()
