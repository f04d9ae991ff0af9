"""The SDK against a daemon older than itself, played by a tiny HTTP server in the test: a route
the daemon doesn't serve (an agent's role, POST .../agents/{agent}/role) is answered as an
older `retrace serve` answers any unknown route, a 404 "retrace: no route for ...". Declaring a
role then goes on without it, said once on standard error; any other error is still raised."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import retrace

RUN = "01oldoldoldoldoldoldoldold1"


class OldDaemon:
    """Serves GET /api/runs/RUN; answers every role declaration with `role_answer`."""

    def __init__(self, role_answer):
        self.role_answer, self.roles_asked = role_answer, []
        daemon = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status, body):
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                if self.path == f"/api/runs/{RUN}":
                    self._reply(200, {"run_id": RUN, "mode": "record"})
                else:
                    self._reply(*daemon.no_route(self.path))

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path.endswith("/role"):
                    daemon.roles_asked.append(self.path)
                    self._reply(*daemon.role_answer(self.path))
                else:
                    self._reply(*daemon.no_route(self.path))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def no_route(path):
        # What retrace-server's `fallback` answers (an OpenAI-shaped error).
        message = (f"retrace: no route for {path}; the proxy lives under /proxy/openai/v1/ and "
                   "/proxy/anthropic/, the API under /api/")
        return 404, {"error": {"message": message, "type": "invalid_request_error", "param": None,
                               "code": "retrace_proxy"}}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("RETRACE_URL", "RETRACE_RUN", "RETRACE_MODE", "RETRACE_TOKEN"):
        monkeypatch.delenv(var, raising=False)


def test_a_role_an_older_daemon_has_no_route_for_is_left_out_with_one_warning(clean_env, capsys):
    old = OldDaemon(OldDaemon.no_route)
    try:
        run = retrace.connect(url=old.url, run=RUN)
        planner = run.agent("planner", role="planner")
        reviewer = run.agent("reviewer", role="reviewer")
        assert (planner.role, reviewer.role) == ("planner", "reviewer")
        err = capsys.readouterr().err
        assert err.count("older than this SDK") == 1, err
        assert old.url in err and "records no roles" in err, err
        assert len(old.roles_asked) == 1, "once the daemon said it has no route, the SDK asks no more"
    finally:
        old.close()


def test_other_errors_declaring_a_role_are_raised(clean_env, capsys):
    unknown_run = (404, {"error": {"code": "unknown_run", "message": f"no run {RUN}"}})
    for answer, status, code in [(unknown_run, 404, "unknown_run"),
                                 ((500, {"error": {"code": "store", "message": "disk full"}}), 500, "store")]:
        old = OldDaemon(lambda path, answer=answer: answer)
        try:
            run = retrace.connect(url=old.url, run=RUN)
            with pytest.raises(retrace.RetraceError) as raised:
                run.agent("planner", role="planner")
            assert (raised.value.status, raised.value.code) == (status, code)
        finally:
            old.close()
    assert "older than this SDK" not in capsys.readouterr().err
