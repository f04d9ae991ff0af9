"""The two transports to the daemon, both HTTP/1.1 keep-alive over loopback TCP, standard
library only: :class:`Http` for the blocking API (one connection per thread, ``http.client``)
and :class:`AsyncHttp` for the async twins (a pool of ``asyncio`` stream connections per event
loop, so an agent awaiting a long ``recv`` holds a socket, not a thread). Both send the same
headers and read the daemon's answers through :func:`answer`."""
from __future__ import annotations

import asyncio
import http.client
import json
import os
import threading
import urllib.parse
import weakref
from typing import Any, Optional

from ._errors import Divergence, RetraceError

_IDLE_MAX = 64  # idle connections an event loop keeps; more are closed once answered


def _headers(token: Optional[str]) -> dict:
    # The daemon ties each agent to one process, and declares a replay stalled at once
    # when the process that owes the awaited step has exited.
    headers = {"content-type": "application/json", "x-retrace-process": str(os.getpid())}
    if token:
        headers["authorization"] = f"Bearer {token}"
    return headers


def answer(status: int, raw: bytes) -> Any:
    """The payload of a daemon's answer, or the error it names raised."""
    try:
        payload = json.loads(raw) if raw else None
    except ValueError:
        # Something answers at RETRACE_URL, but not a Retrace daemon (a web server, the model's
        # upstream): said as such, not as the JSON parser's error.
        raise not_a_daemon(f"HTTP {status} with a body that is not JSON: {raw[:80]!r}") from None
    if status >= 400:
        error = payload.get("error") if isinstance(payload, dict) else None
        if not isinstance(error, dict):
            # The daemon's errors are `{"error": {...}}`: an empty 404 is another server (the
            # simulator, a proxy) on the port RETRACE_URL names (QA12 D16).
            shown = "an empty body" if not raw else f"a body that is not a Retrace error: {raw[:80]!r}"
            raise not_a_daemon(f"HTTP {status} with {shown}")
        if status == 409 and error.get("divergence") is not None:
            raise Divergence(status, error.get("message", ""), error["divergence"])
        raise RetraceError(status, error.get("code", "error"), error.get("message", raw.decode(errors="replace")))
    return payload


# Every transport made, so that a forked child (os.fork, multiprocessing's default start method
# on Linux) drops the connections it inherited: parent and child writing requests on one socket
# would each read the other's answers.
_TRANSPORTS: "weakref.WeakSet" = weakref.WeakSet()


def _forget_inherited() -> None:
    for transport in list(_TRANSPORTS):
        transport.forget_connections()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited)


class Http:
    """One keep-alive connection per thread to the daemon, and per process: a forked child
    opens its own."""

    def __init__(self, url: str):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise RetraceError(0, "usage", f"RETRACE_URL must be http://HOST:PORT, not {url!r}")
        self.url = url.rstrip("/")
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.token = os.environ.get("RETRACE_TOKEN")
        self.local = threading.local()
        self._async: Optional[AsyncHttp] = None
        _TRANSPORTS.add(self)

    def forget_connections(self) -> None:
        """In a forked child: the parent's connections are the parent's (they are dropped, not
        closed with a shutdown, which would end them for the parent too)."""
        self.local = threading.local()
        if self._async is not None:
            self._async.forget_connections()

    @property
    def aio(self) -> "AsyncHttp":
        """The asyncio transport to the same daemon."""
        if self._async is None:
            self._async = AsyncHttp(self.host, self.port, self.token)
        return self._async

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=None)
            self.local.conn = conn
        return conn

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body, allow_nan=False).encode()
        headers = _headers(self.token)
        for attempt in (0, 1):
            # Sent again only on a kept-alive connection the daemon had closed meanwhile: on a new
            # one, a failure may come after the daemon applied the request (QA34 S7).
            reused = getattr(self.local, "conn", None) is not None
            conn = self._conn()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                break
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                self.local.conn = None
                if data is not None and len(data) >= _LARGE and isinstance(e, (BrokenPipeError, ConnectionResetError)):
                    raise too_large(len(data)) from e
                if attempt or not reused:
                    raise unreachable(self.url, e) from e
        return answer(response.status, raw)


def not_a_daemon(what: str) -> RetraceError:
    """The error for an address that answers, but not as a Retrace daemon does (``not_a_daemon``)."""
    return RetraceError(0, "not_a_daemon", f"RETRACE_URL answered, but not as a Retrace daemon ({what}): it names "
                        "another server; `retrace serve` prints the daemon's address")


def unreachable(url: str, cause: BaseException) -> RetraceError:
    """The error for a daemon that can't be reached (not running, or gone mid-run): a
    :class:`RetraceError` (``no_daemon``), which a program that fails closed on Retrace's errors
    catches, not the socket's own."""
    return RetraceError(0, "no_daemon", f"the Retrace daemon at {url} can't be reached ({type(cause).__name__}: "
                        f"{cause}): it has stopped, or RETRACE_URL names the wrong address")


_LARGE = 1 << 20  # a request this large that the daemon cut off while it was sent was too large


def too_large(size: int) -> RetraceError:
    """The error for a request the daemon stopped reading while it was sent: larger than its body
    limit (QA34 D4: said as "the daemon has stopped")."""
    return RetraceError(413, "too_large", f"the daemon closed the connection while this {size}-byte step was "
                        "sent: it is larger than the daemon accepts (its --max-body, 32 MiB by default); "
                        "keep large payloads out of steps (store them, and pass a reference)")


class _Stale(Exception):
    """A reused connection the daemon had closed: nothing of the answer arrived."""


class AsyncHttp:
    """HTTP/1.1 keep-alive over ``asyncio.open_connection``: each request takes an idle
    connection of the running loop's pool, or opens one, and gives it back once its answer is
    read whole. Concurrent requests use one connection each (HTTP/1.1 has no multiplexing);
    none holds a thread. A request cancelled mid-way closes its connection."""

    def __init__(self, host: str, port: int, token: Optional[str]):
        self.host, self.port, self.token = host, port, token
        self._idle: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list]" = weakref.WeakKeyDictionary()

    def forget_connections(self) -> None:
        """In a forked child: drops the parent's idle connections (see :meth:`Http.forget_connections`)."""
        self._idle = weakref.WeakKeyDictionary()

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        data = b"" if body is None else json.dumps(body, allow_nan=False).encode()
        lines = [f"{method} {path} HTTP/1.1", f"host: {self.host}:{self.port}", f"content-length: {len(data)}"]
        lines += [f"{k}: {v}" for k, v in _headers(self.token).items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data
        url = f"http://{self.host}:{self.port}"
        for attempt in (0, 1):
            try:
                reader, writer, reused = await self._acquire()
            except OSError as e:
                raise unreachable(url, e) from e
            try:
                status, raw, keep = await self._exchange(reader, writer, request, reused)
            except _Stale:
                writer.close()
                if attempt:
                    raise unreachable(url, ConnectionError("the daemon closed the connection"))
                continue
            except (OSError, asyncio.IncompleteReadError) as e:  # the daemon went away mid-answer
                writer.close()
                if len(data) >= _LARGE and isinstance(e, (BrokenPipeError, ConnectionResetError)):
                    raise too_large(len(data)) from e
                raise unreachable(url, e) from e
            except BaseException:  # an error or a cancellation mid-answer: the stream is unusable
                writer.close()
                raise
            if keep:
                self._release(reader, writer)
            else:
                writer.close()
            return answer(status, raw)

    async def aclose(self) -> None:
        """Closes the running loop's idle connections."""
        for _, writer in self._idle.pop(asyncio.get_running_loop(), []):
            writer.close()

    async def _acquire(self) -> tuple:
        idle = self._idle.setdefault(asyncio.get_running_loop(), [])
        while idle:
            reader, writer = idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer, True
            writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return reader, writer, False

    def _release(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        idle = self._idle.setdefault(asyncio.get_running_loop(), [])
        if len(idle) < _IDLE_MAX:
            idle.append((reader, writer))
        else:
            writer.close()

    @staticmethod
    async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes,
                        reused: bool) -> tuple:
        """Sends `request`, reads the answer: (status, body, whether the connection stays open)."""
        try:
            writer.write(request)
            await writer.drain()
            status_line = await reader.readline()
        except ConnectionError:
            if reused:
                raise _Stale()
            raise
        if not status_line:
            if reused:
                raise _Stale()
            raise ConnectionError("the daemon closed the connection before answering")
        version, _, rest = status_line.decode("latin-1").partition(" ")
        status = int(rest.split(" ", 1)[0])
        headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise ConnectionError("the daemon closed the connection mid-answer")
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts = []
            while True:
                size = int((await reader.readline()).split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            raw = b"".join(parts)
        elif "content-length" in headers:
            raw = await reader.readexactly(int(headers["content-length"]))
        else:  # no length: the body runs to the end of the connection
            raw = await reader.read()
            return status, raw, False
        keep = headers.get("connection", "").lower() != "close" and version.upper() == "HTTP/1.1"
        return status, raw, keep
