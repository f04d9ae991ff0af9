"""An upstream that drops the first connection of every call and answers the next attempt, for
the retry test: each odd-numbered request for a model is read and its connection closed with no
answer; each even-numbered one gets a fixed Chat Completions or Anthropic Messages answer.
"""
from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Dropping:
    """The upstream on a free loopback port, served from a thread until `stop()`."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        lock = threading.Lock()
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                model = body.get("model", "")
                with lock:
                    seen[model] += 1
                    n = seen[model]
                if n % 2 == 1:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if self.path.endswith("/messages"):
                    answer = {
                        "id": f"msg_{n}",
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [{"type": "text", "text": "answered once the connection was retried"}],
                        "stop_reason": "end_turn",
                        "stop_sequence": None,
                        "usage": {"input_tokens": 3, "output_tokens": 4},
                    }
                else:
                    answer = {
                        "id": f"chatcmpl-{n}",
                        "object": "chat.completion",
                        "created": 1,
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": "answered once the connection was retried"},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
                    }
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
