"""A lean keep-alive HTTP/1.1 client for the proxy's hot path (httptools' llhttp parser).

The general-purpose aiohttp client costs more CPU per request than the rest of the gateway
together; a proxy needs far less: write one request, read status, content type and body
chunks as they arrive, reuse the connection. Probes and scrapes still use aiohttp.
"""

from __future__ import annotations

import asyncio
import errno
from collections import deque
from typing import Protocol

import httptools

_MAX_BUFFERED_BYTES = 1 << 20  # pause reading the replica when the client lags this much
_MAX_IDLE_PER_HOST = 512
# errno values that mean the gateway, not the replica, ran out of something
_OWN_LIMITS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM,
                         errno.EADDRNOTAVAIL})  # fmt: skip


class UpstreamError(Exception):
    """The replica failed: refused, reset, closed early, or sent garbage."""


class UpstreamTimeout(UpstreamError):
    """The replica was silent for longer than the read timeout."""


class UpstreamConnectError(UpstreamError):
    """No connection to the replica (refused, unreachable, connect timeout): the request
    never reached it."""


class GatewayOverloaded(UpstreamConnectError):
    """The gateway itself is out of file descriptors or buffers: not the replica's fault."""


class Sink(Protocol):
    """Takes a response body as it arrives, from the connection's own callbacks (no task
    switch per chunk). Must not raise."""

    def on_data(self, data: bytes) -> None: ...

    def on_end(self) -> None: ...

    def on_error(self, exc: BaseException) -> None: ...


class UpstreamResponse:
    __slots__ = (
        "_chunks",
        "_conn",
        "_eof",
        "_error",
        "_headers_done",
        "_sink",
        "_waiter",
        "buffered",
        "content_type",
        "got_bytes",
        "reused",
        "status",
    )

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = 0
        self.content_type = b""
        self._chunks: deque[bytes] = deque()
        self.buffered = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._headers_done = False
        self._sink: Sink | None = None
        self.got_bytes = False  # any byte of the response arrived
        self.reused = conn.reused  # sent on a kept-alive connection

    # -- fed by the protocol --------------------------------------------------------------
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _feed(self, data: bytes) -> None:
        sink = self._sink
        if sink is not None:
            sink.on_data(data)
            return
        self._chunks.append(data)
        self.buffered += len(data)
        if self.buffered > _MAX_BUFFERED_BYTES:
            self._conn.pause()
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if not self._eof and self._error is None:
            self._error = exc
            if self._sink is not None:
                self._sink.on_error(exc)
        self._wake()

    def _finish(self) -> None:
        self._eof = True
        if self._sink is not None:
            self._sink.on_end()
        self._wake()

    # -- or handed to a sink ----------------------------------------------------------------
    def attach(self, sink: Sink) -> None:
        """From now on the body goes to `sink` as it arrives (what was read already first)."""
        self._sink = sink
        if self._chunks:
            data = b"".join(self._chunks)
            self._chunks.clear()
            self.buffered = 0
            self._conn.resume()
            sink.on_data(data)
        if self._error is not None:
            sink.on_error(self._error)
        elif self._eof:
            sink.on_end()

    def pause_reading(self) -> None:
        """Stop reading the replica (the client lags): TCP pushes back on the replica."""
        self._conn.pause()

    def resume_reading(self) -> None:
        self._conn.resume()

    # -- read by the proxy ----------------------------------------------------------------
    async def _wait(self, timeout_s: float) -> None:
        loop = self._conn.loop
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _time_out, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    async def headers(self, timeout_s: float) -> None:
        while not self._headers_done:
            if self._error is not None:
                raise self._error
            await self._wait(timeout_s)

    async def read_chunk(self, timeout_s: float) -> bytes:
        """The next body bytes as they arrived; b"" at the end. Raises UpstreamError."""
        while True:
            if self._chunks:
                data = self._chunks.popleft()
                if len(self._chunks) > 1:
                    # Coalesce what piled up, so a slow client gets fewer, larger writes.
                    data = data + b"".join(self._chunks)
                    self._chunks.clear()
                self.buffered = 0
                self._conn.resume()
                return data
            if self._eof:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait(timeout_s)

    async def read_all(self, timeout_s: float) -> bytes:
        parts: list[bytes] = []
        while True:
            chunk = await self.read_chunk(timeout_s)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)

    def release(self) -> None:
        """Done with the response: reuse the connection if it is clean, else close it."""
        self._sink = None
        self._conn.done(self._eof and self._error is None)


def _time_out(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamTimeout("the replica sent nothing within the read timeout"))


class _Connection(asyncio.Protocol):
    def __init__(self, pool: UpstreamPool, key: tuple[str, int]) -> None:
        self.pool = pool
        self.key = key
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.keep_alive = True
        self.closed = False
        self.reused = False
        self._paused = False
        self._framed = False  # content-length or chunked: the end is known without a close

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        resp = self.response
        if resp is None:
            self.close()  # bytes nobody asked for: the connection is out of sync
            return
        resp.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            resp._fail(UpstreamError(f"bad HTTP from the replica: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        resp = self.response
        if resp is not None and not resp._eof:
            if resp._headers_done and not self._framed:
                resp._finish()  # a close-delimited body ends here
            else:
                resp._fail(UpstreamError("the replica closed the connection"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        lname = name.lower()
        if lname == b"content-type":
            assert self.response is not None
            self.response.content_type = value
        elif lname == b"content-length" or (lname == b"transfer-encoding" and b"chunked" in value):
            self._framed = True

    def on_headers_complete(self) -> None:
        resp = self.response
        assert resp is not None
        resp.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        resp._headers_done = True
        resp._wake()

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._feed(body)

    def on_message_complete(self) -> None:
        assert self.response is not None
        self.response._finish()

    # pool side
    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def start(self, request: bytes) -> UpstreamResponse:
        assert self.transport is not None
        self.response = UpstreamResponse(self)
        self._framed = False
        self.transport.write(request)
        return self.response

    def done(self, clean: bool) -> None:
        self.response = None
        if clean and self.keep_alive and not self.closed and not self._paused:
            self.reused = True
            self.pool._put(self)
        else:
            self.close()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.abort()  # reset at once: the replica sees the disconnect


class UpstreamPool:
    """Idle keep-alive connections per replica address; requests never share one."""

    def __init__(self, connect_timeout_s: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    def _put(self, conn: _Connection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) < _MAX_IDLE_PER_HOST:
            idle.append(conn)
        else:
            conn.close()

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await self.loop.create_connection(
                    lambda: _Connection(self, key), key[0], key[1]
                )
        except TimeoutError:
            raise UpstreamConnectError(f"connect to {key[0]}:{key[1]} timed out") from None
        except OSError as exc:
            if exc.errno in _OWN_LIMITS:
                raise GatewayOverloaded(f"the gateway cannot open a connection: {exc}") from None
            raise UpstreamConnectError(f"connect to {key[0]}:{key[1]} failed: {exc}") from None
        return proto

    async def send(self, key: tuple[str, int], request: bytes) -> UpstreamResponse:
        """Write a full request on an idle or new connection; returns before any reply."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn.start(request)
        conn = await self._connect(key)
        return conn.start(request)

    async def fresh(self, key: tuple[str, int], request: bytes) -> UpstreamResponse:
        """Like send, on a new connection (after a reused one turned out stale)."""
        conn = await self._connect(key)
        return conn.start(request)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def request_head(method: bytes, host: bytes, path: bytes, length: int) -> bytes:
    return b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n" % (method, path, host, length)
