"""A lean HTTP/1.1 front for the two hot endpoints; every other request goes to aiohttp.

The gateway's own cost per request is mostly HTTP machinery. This front parses requests
with httptools (llhttp), hands POST /v1/chat/completions and /v1/completions to the proxy
with the body already read, and writes responses as single buffers (streams as chunked
frames, each chunk written as it arrives). A connection whose request is anything else is
handed, with the bytes read so far, to aiohttp's own protocol for the rest of its life, so
/v1/models, /health, /metrics, the admin API and routes other code adds to `Gateway.app`
keep working unchanged.

Limits answered here, in OpenAI format: 431 (headers), 413 (body), 408 (slow body), 400
(malformed HTTP). A client that disconnects cancels its request's task, which resets the
upstream connection at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import httptools

from gpufleet.openai_errors import error_json_bytes

HOT_PATHS: dict[bytes, tuple[str, str]] = {
    b"/v1/chat/completions": ("chat", "/v1/chat/completions"),
    b"/v1/completions": ("completions", "/v1/completions"),
}
_REASONS = {
    200: b"OK", 201: b"Created", 400: b"Bad Request", 401: b"Unauthorized",
    403: b"Forbidden", 404: b"Not Found", 405: b"Method Not Allowed",
    408: b"Request Timeout", 409: b"Conflict", 413: b"Payload Too Large",
    422: b"Unprocessable Entity", 429: b"Too Many Requests",
    431: b"Request Header Fields Too Large", 500: b"Internal Server Error",
    502: b"Bad Gateway", 503: b"Service Unavailable", 504: b"Gateway Timeout",
}  # fmt: skip
KEEPALIVE_S = 75.0  # close idle client connections, as aiohttp and nginx do
_MAX_DISCARD_BYTES = 64 << 20  # read and drop at most this much of a refused body


class FastRequest:
    __slots__ = ("body", "path", "raw_headers")

    def __init__(self, path: bytes, raw_headers: list[tuple[bytes, bytes]], body: bytes):
        self.path = path
        self.raw_headers = raw_headers
        self.body = body

    def header(self, lname: bytes) -> bytes | None:
        for k, v in self.raw_headers:
            if k.lower() == lname:
                return v
        return None


class _Pending:
    """A fully read request waiting for its turn (HTTP/1.1 answers in order)."""

    __slots__ = ("http11", "keep_alive", "reject", "request", "target")

    def __init__(
        self,
        request: FastRequest,
        keep_alive: bool,
        http11: bool,
        target: tuple[str, str] | None,
        reject: tuple[int, str] | None,
    ) -> None:
        self.request = request
        self.keep_alive = keep_alive
        self.http11 = http11
        self.target = target
        self.reject = reject


class FastResponder:
    """Writes one response. `send` for a whole one; `start_stream`/`write`/`end` for SSE."""

    __slots__ = ("_chunked", "_conn", "_head", "_keep_alive", "status")

    def __init__(self, conn: FastConnection, keep_alive: bool, http11: bool = True) -> None:
        self._conn = conn
        self._keep_alive = keep_alive
        # HTTP/1.0 has no chunked framing: a stream is delimited by closing the connection.
        self._chunked = http11
        self._head: bytes | None = None
        self.status = 0

    def _status_line(self, status: int) -> bytes:
        return b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Status"))

    def send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.status = status
        head = self._status_line(status) + b"Content-Type: %s\r\nContent-Length: %d\r\n" % (
            content_type.encode("latin-1"),
            len(body),
        )
        if headers:
            for k, v in headers.items():
                head += b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1"))
        if not self._keep_alive:
            head += b"Connection: close\r\n"
        self._conn.write(head + b"\r\n" + body)
        self._conn.response_done = True

    async def start_stream(self, status: int, content_type: str) -> None:
        self.status = status
        head = self._status_line(status) + (
            b"Content-Type: %s\r\nCache-Control: no-cache\r\n" % content_type.encode("latin-1")
        )
        if self._chunked:
            head += b"Transfer-Encoding: chunked\r\n"
        else:
            self._keep_alive = False
        if not self._keep_alive:
            head += b"Connection: close\r\n"
        self._head = head + b"\r\n"  # goes out with the first chunk: one write, not two

    async def write(self, chunk: bytes) -> None:
        data = b"%x\r\n%s\r\n" % (len(chunk), chunk) if self._chunked else chunk
        if self._head is not None:
            data = self._head + data
            self._head = None
        await self._conn.write_and_drain(data)

    async def end(self) -> None:
        data = b"0\r\n\r\n" if self._chunked else b""
        if self._head is not None:
            data = self._head + data
            self._head = None
        if data:
            self._conn.write(data)
        self._conn.response_done = True
        if not self._keep_alive:
            self._conn.close()  # also how an HTTP/1.0 stream ends


Handler = Callable[[FastRequest, FastResponder, str, str], Awaitable[None]]


class _HandOver(Exception):
    """Raised inside the parser: this connection belongs to aiohttp from now on."""


class FastConnection(asyncio.Protocol):
    def __init__(self, front: FastFront) -> None:
        self.front = front
        self.loop = front.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._reject: tuple[int, str] | None = None
        self._target: tuple[str, str] | None = None
        self._in_message = False
        self._chunk_starts_idle = False
        self._can_hand_over = False
        self._since_idle: list[bytes] = []  # reads of the current request up to its headers
        self._queue: deque[_Pending] = deque()
        self.response_done = True  # the current task's response is fully written
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self.last_active_s = self.loop.time()

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.front.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.front.connections.discard(self)
        self._disarm()
        self._queue.clear()
        if self._task is not None and not self.response_done:
            self._task.cancel()  # the client is gone: stop its request (and the upstream)
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("the client disconnected"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def data_received(self, data: bytes) -> None:
        if not self._in_message:
            self._chunk_starts_idle = self.response_done and not self._queue
            if self._chunk_starts_idle:
                self._since_idle = [data]
        elif self._can_hand_over and self._target is None:
            self._since_idle.append(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HandOver):
                self._hand_over()
                return
            self._fail(400, "malformed HTTP request")
            return
        except httptools.HttpParserError:
            self._fail(400, "malformed HTTP request")
            return
        self.last_active_s = self.loop.time()
        if self._in_message and self._timer is None:
            # Only a request split over several reads needs a timer (slow-body guard).
            self._timer = self.loop.call_later(self.front.body_timeout_s, self._on_timer)

    # -- httptools callbacks ------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._in_message = True
        self._can_hand_over = self._chunk_starts_idle
        self._chunk_starts_idle = False
        self._url = b""
        self._headers = []
        self._header_bytes = 0
        self._body = []
        self._body_bytes = 0
        self._reject = None
        self._target = None

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes <= self.front.max_header_bytes:
            self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        path = self._url.split(b"?", 1)[0]
        target = HOT_PATHS.get(path)
        if target is None or self.parser.get_method() != b"POST":
            if self._can_hand_over:
                raise _HandOver
            self._reject = (400, "pipeline completions and other requests on separate connections")
            return
        self._target = target
        self._since_idle = []
        front = self.front
        if self._header_bytes > front.max_header_bytes:
            self._reject = (431, f"request headers exceed {front.max_header_bytes} bytes")
            return
        for k, v in self._headers:
            lk = k.lower()
            if lk == b"content-length":
                try:
                    too_big = int(v) > front.max_body_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    self._reject = (413, f"the request body exceeds {front.max_body_bytes} bytes")
                    return
            elif lk == b"expect" and v.lower() == b"100-continue" and self.transport is not None:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._reject is not None:
            if self._body_bytes > _MAX_DISCARD_BYTES:
                self._fail(*self._reject)
            return
        if self._body_bytes > self.front.max_body_bytes:
            self._reject = (413, f"the request body exceeds {self.front.max_body_bytes} bytes")
            self._body = []
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        self._disarm()
        keep_alive = self.parser.should_keep_alive()
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = FastRequest(self._url, self._headers, body)
        http11 = self.parser.get_http_version() != "1.0"
        self._queue.append(_Pending(request, keep_alive, http11, self._target, self._reject))
        self._body = []
        if self._task is None:
            self._next()

    # -- running requests ----------------------------------------------------------------
    def _next(self) -> None:
        if not self._queue or self.closed:
            return
        pending = self._queue.popleft()
        self.response_done = False
        self._task = self.loop.create_task(self._run(pending))

    async def _run(self, pending: _Pending) -> None:
        keep_alive = pending.keep_alive and pending.reject is None
        out = FastResponder(self, keep_alive, pending.http11)
        try:
            if pending.reject is not None:
                status, message = pending.reject
                out.send(status, error_json_bytes(message, status), "application/json")
            else:
                assert pending.target is not None
                endpoint, path = pending.target
                await self.front.handler(pending.request, out, endpoint, path)
        except asyncio.CancelledError:
            raise
        except (ConnectionError, OSError):
            keep_alive = False
        except Exception:
            keep_alive = False
            if out.status == 0:
                out.send(500, error_json_bytes("internal gateway error", 500), "application/json")
            self.front.log_exception()
        finally:
            self._task = None
            self.response_done = True
        if not keep_alive or self.closed:
            self.close()
            return
        if self._queue:
            self._next()

    # -- writing --------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.closed or self.transport is None:
            raise ConnectionResetError("the client disconnected")
        self.transport.write(data)

    async def write_and_drain(self, data: bytes) -> None:
        self.write(data)
        if self._write_paused:
            self._drain = self.loop.create_future()
            try:
                await self._drain
            finally:
                self._drain = None

    # -- lifecycle --------------------------------------------------------------------------
    def _fail(self, status: int, message: str) -> None:
        """Answer a request that cannot go on, then close the connection."""
        if self.transport is not None and not self.closed and self._task is None:
            body = error_json_bytes(message, status)
            self.transport.write(
                b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n%s"
                % (status, _REASONS.get(status, b"Status"), len(body), body)
            )
        self.close()

    def _on_timer(self) -> None:
        self._timer = None
        if self._in_message:
            self._fail(408, "timed out reading the request")

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def idle_for_s(self, now_s: float) -> float:
        """Seconds since the last byte came in, while no request is open; else 0."""
        if self._in_message or self._task is not None or self._queue:
            return 0.0
        return now_s - self.last_active_s

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    def _hand_over(self) -> None:
        """From now on aiohttp serves this connection, starting with the bytes read so far."""
        self._disarm()
        self.front.connections.discard(self)
        transport = self.transport
        assert transport is not None
        protocol = self.front.aiohttp_protocol()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        protocol.data_received(b"".join(self._since_idle))
        self.transport = None
        self.closed = True


class FastFront:
    """Per-server settings and the set of open fast connections."""

    def __init__(
        self,
        handler: Handler,
        aiohttp_protocol: Callable[[], Any],
        max_header_bytes: int,
        max_body_bytes: int,
        body_timeout_s: float,
        log_exception: Callable[[], None],
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.handler = handler
        self.aiohttp_protocol = aiohttp_protocol
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.log_exception = log_exception
        self.connections: set[FastConnection] = set()

    def protocol(self) -> FastConnection:
        return FastConnection(self)

    async def sweep_idle(self, keepalive_s: float = KEEPALIVE_S) -> None:
        """Close keep-alive connections idle for longer than keepalive_s (one timer for all,
        instead of one per request)."""
        while True:
            await asyncio.sleep(min(10.0, keepalive_s))
            now_s = self.loop.time()
            for conn in list(self.connections):
                if conn.idle_for_s(now_s) > keepalive_s:
                    conn.close()

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.close()
