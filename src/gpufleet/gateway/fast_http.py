"""The gateway's one HTTP/1.1 front: every request on every connection is parsed here.

Requests are parsed with httptools (llhttp). POST /v1/chat/completions and
/v1/completions go to the proxy with the body already read; every other request goes to
the `Router` (/v1/models, /health, /metrics, the admin API, routes other code adds), and
its `Reply` is written here. So every answer, whatever the endpoint and whatever came
before it on the connection, is framed the same way and every error is the same JSON
(`{"error": {"message", "type", "param", "code"}}`).

Limits answered here: 431 (headers), 414 (request line), 413 (body), 408 (slow request:
headers and body must arrive within `body_timeout_s` once begun, which also ends
slowloris clients), 400 (malformed HTTP). Requests pipelined on a connection are answered
in order. A client that disconnects cancels its request's task, which resets the
upstream connection at once; a client that only half-closes (shuts down its sending
side) still gets its answers, then the connection closes.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Awaitable, Callable

import httptools

from gpufleet.gateway.http_response import FastResponder
from gpufleet.gateway.routes import Reply, RouteHandler, Router, error_reply
from gpufleet.openai_errors import error_json_bytes

HOT_PATHS: dict[bytes, tuple[str, str]] = {
    b"/v1/chat/completions": ("chat", "/v1/chat/completions"),
    b"/v1/completions": ("completions", "/v1/completions"),
}
KEEPALIVE_S = 75.0  # close idle client connections, as aiohttp and nginx do
_MAX_DISCARD_BYTES = 64 << 20  # read and drop at most this much of a refused body
_HEADER_SLACK = 4  # stop reading headers at this multiple of the limit (431 and close)
_PEER_CHECKS_S = (0.02, 0.1, 0.5, 2.0, 5.0)  # after a client's EOF: did it reset?
_LINGER_S = 2.0  # after our last answer on a connection: read and drop this long at most


class FastRequest:
    __slots__ = ("body", "method", "params", "path", "raw_headers")

    def __init__(
        self, method: bytes, path: bytes, raw_headers: list[tuple[bytes, bytes]], body: bytes
    ):
        self.method = method
        self.path = path
        self.raw_headers = raw_headers
        self.body = body
        self.params: dict[str, str] = {}

    def header(self, lname: bytes) -> bytes | None:
        for k, v in self.raw_headers:
            if k.lower() == lname:
                return v
        return None


class _Pending:
    """A fully read request waiting for its turn (HTTP/1.1 answers in order)."""

    __slots__ = ("http11", "keep_alive", "reply", "request", "route", "target")

    def __init__(
        self,
        request: FastRequest,
        keep_alive: bool,
        http11: bool,
        target: tuple[str, str] | None,
        route: RouteHandler | None,
        reply: Reply | None,
    ) -> None:
        self.request = request
        self.keep_alive = keep_alive
        self.http11 = http11
        self.target = target  # a completion endpoint: (endpoint, path) for the proxy
        self.route = route  # any other endpoint's handler
        self.reply = reply  # refused before running anything (4xx)


Handler = Callable[[FastRequest, FastResponder, str, str], Awaitable[None]]


class FastConnection(asyncio.Protocol):
    def __init__(self, front: FastFront) -> None:
        self.front = front
        self.loop = front.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self._eof = False  # the client shut down its sending side
        self._refusing = False  # a request was refused for good: read no more
        self._lingering = False  # our side is shut down; what comes in is dropped
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._reject: Reply | None = None
        self._target: tuple[str, str] | None = None
        self._route: RouteHandler | None = None
        self._params: dict[str, str] = {}
        self._in_message = False
        self._queue: deque[_Pending] = deque()
        self.response_done = True  # the current task's response is fully written
        self.response_started = False  # some byte of the current response went out
        self._http11 = True  # the current request's version
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.write_paused = False
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

    def eof_received(self) -> bool:
        """The client shut down its sending side: answer what it sent, then close (True
        keeps the transport open for writing).

        A half-close and a full close look the same here, so while a response has not
        started, an interim `100 Continue` (which HTTP/1.1 clients must accept and skip)
        goes out: a client that really closed answers it with a reset, which the checks
        below see and treat as a disconnect (cancelling the request and its upstream)."""
        self._eof = True
        if self._lingering:
            self.close()
        elif self._refusing:
            pass
        elif self._in_message:
            # The rest of this request can never come.
            self._fail(400, "the client closed its side before the request was complete")
        elif self._task is None and not self._queue:
            self.close()
        elif not self.response_started and self._http11 and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._check_peer(0)
        return True

    def _check_peer(self, attempt: int) -> None:
        """After EOF: has the client reset the connection (it closed, not half-closed)?"""
        if self.closed or self.transport is None or self.response_done:
            return
        sock = self.transport.get_extra_info("socket")
        try:
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if sock else 0
        except OSError:
            error = 1
        if error:
            self.transport.abort()  # connection_lost cancels the request
        elif attempt < len(_PEER_CHECKS_S):
            self.loop.call_later(_PEER_CHECKS_S[attempt], self._check_peer, attempt + 1)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._refusing or self._lingering:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail(400, "malformed HTTP request")
            return
        self.last_active_s = self.loop.time()
        if self._in_message and self._timer is None:
            # Only a request split over several reads needs a timer (slow-request guard).
            self._timer = self.loop.call_later(self.front.body_timeout_s, self._on_timer)

    # -- httptools callbacks ------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._in_message = True
        self._url = b""
        self._headers = []
        self._header_bytes = 0
        self._body = []
        self._body_bytes = 0
        self._reject = None
        self._target = None
        self._route = None
        self._params = {}

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self.front.max_header_bytes:
            self._fail(414, f"the request line exceeds {self.front.max_header_bytes} bytes")
            raise httptools.HttpParserCallbackError("request line too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        limit = self.front.max_header_bytes
        if self._header_bytes <= limit:
            self._headers.append((name, value))
        elif self._header_bytes > _HEADER_SLACK * limit:
            self._fail(431, f"request headers exceed {limit} bytes")
            raise httptools.HttpParserCallbackError("headers too large")

    def on_headers_complete(self) -> None:
        front = self.front
        method = self.parser.get_method()
        path = self._url.split(b"?", 1)[0]
        if self._header_bytes > front.max_header_bytes:
            self._reject = error_reply(
                431, f"request headers exceed {front.max_header_bytes} bytes"
            )
            return
        target = HOT_PATHS.get(path) if method == b"POST" else None
        if target is not None:
            self._target = target
        else:
            self._route, self._params, self._reject = front.router.match(method, path)
            if self._reject is not None:
                return
        for k, v in self._headers:
            lk = k.lower()
            if lk == b"content-length":
                try:
                    too_big = int(v) > front.max_body_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    self._reject = error_reply(
                        413, f"the request body exceeds {front.max_body_bytes} bytes"
                    )
                    return
            elif lk == b"expect" and v.lower() == b"100-continue" and self.transport is not None:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._reject is not None:
            if self._body_bytes > _MAX_DISCARD_BYTES:
                self._fail(self._reject.status, "the request body is too large")
            return
        if self._body_bytes > self.front.max_body_bytes:
            self._reject = error_reply(
                413, f"the request body exceeds {self.front.max_body_bytes} bytes"
            )
            self._body = []
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        self._disarm()
        parser = self.parser
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = FastRequest(parser.get_method(), self._url, self._headers, body)
        request.params = self._params
        http11 = parser.get_http_version() != "1.0"
        pending = _Pending(request, parser.should_keep_alive(), http11, self._target,
                           self._route, self._reject)  # fmt: skip
        self._queue.append(pending)
        self._body = []
        if self._task is None:
            self._next()

    # -- running requests ----------------------------------------------------------------
    def _next(self) -> None:
        if not self._queue or self.closed:
            return
        pending = self._queue.popleft()
        self.response_done = False
        self.response_started = False
        self._http11 = pending.http11
        self._task = self.loop.create_task(self._run(pending))

    async def _run(self, pending: _Pending) -> None:
        request = pending.request
        # A refused request keeps its connection unless it was refused for its size.
        refused = pending.reply is not None and pending.reply.status not in (404, 405)
        keep_alive = pending.keep_alive and not refused and not self._eof
        out = FastResponder(self, keep_alive, pending.http11, request.method == b"HEAD")
        try:
            if pending.reply is not None:
                r = pending.reply
                out.send(r.status, r.body, r.content_type, r.headers)
            elif pending.target is not None:
                endpoint, path = pending.target
                await self.front.handler(request, out, endpoint, path)
            else:
                assert pending.route is not None
                r = await pending.route(request)
                out.send(r.status, r.body, r.content_type, r.headers)
        except asyncio.CancelledError:
            raise
        except (ConnectionError, OSError):
            keep_alive = False
        except Exception:
            keep_alive = False
            if out.status == 0 and not self.closed:
                out.close_after()  # say so: the client must not reuse this connection
                out.send(500, error_json_bytes("internal gateway error", 500), "application/json")
            self.front.log_exception()
        finally:
            self._task = None
            self.response_done = True
        if not keep_alive or self.closed or (self._eof and not self._queue):
            self.linger()
            return
        if self._queue:
            self._next()

    # -- writing --------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.closed or self.transport is None:
            raise ConnectionResetError("the client disconnected")
        self.response_started = True
        self.transport.write(data)

    def drain_waiter(self) -> asyncio.Future[None]:
        if self._drain is None or self._drain.done():
            self._drain = self.loop.create_future()
            if not self.write_paused:
                self._drain.set_result(None)
            elif self.closed:
                self._drain.set_exception(ConnectionResetError("the client disconnected"))
        return self._drain

    async def write_and_drain(self, data: bytes) -> None:
        self.write(data)
        if self.write_paused:
            await self.drain_waiter()

    # -- lifecycle --------------------------------------------------------------------------
    def _fail(self, status: int, message: str) -> None:
        """Refuse what is being read, for good: the answer goes out after any answers
        still owed on this connection (in order), then the connection closes (lingering,
        so that the client reads it)."""
        self._in_message = False
        self._disarm()
        if self.closed or self._refusing:
            return
        self._refusing = True
        request = FastRequest(b"", b"", [], b"")
        self._queue.append(_Pending(request, False, True, None, None, error_reply(status, message)))
        if self._task is None:
            self._next()

    def _on_timer(self) -> None:
        self._timer = None
        if self._in_message and not self._lingering:
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
            self._disarm()
            self.transport.close()

    def linger(self) -> None:
        """Close after our last answer without losing it: shut down our side once it is
        written and drop what the client still sends until it closes (at most `_LINGER_S`).
        Closing outright with unread input resets the connection, and a reset makes the
        client's kernel drop our answer before the client reads it."""
        if self.closed or self._lingering or self.transport is None:
            return
        self._lingering = True
        self._disarm()
        if self._eof or not self.transport.can_write_eof():
            self.close()
            return
        self.transport.write_eof()
        self._timer = self.loop.call_later(_LINGER_S, self.close)


class FastFront:
    """Per-server settings, the routes, and the set of open connections."""

    def __init__(
        self,
        handler: Handler,
        router: Router,
        max_header_bytes: int,
        max_body_bytes: int,
        body_timeout_s: float,
        log_exception: Callable[[], None],
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.handler = handler
        self.router = router
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
