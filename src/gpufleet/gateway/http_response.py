"""Writing one HTTP/1.1 response on a front connection: whole (`send`) or streamed as
chunked frames (`start_stream`, `write`/`push`, `end`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufleet.gateway.fast_http import FastConnection

REASONS = {
    200: b"OK", 201: b"Created", 400: b"Bad Request", 401: b"Unauthorized",
    403: b"Forbidden", 404: b"Not Found", 405: b"Method Not Allowed",
    408: b"Request Timeout", 409: b"Conflict", 413: b"Payload Too Large",
    414: b"URI Too Long", 422: b"Unprocessable Entity", 429: b"Too Many Requests",
    431: b"Request Header Fields Too Large", 500: b"Internal Server Error",
    502: b"Bad Gateway", 503: b"Service Unavailable", 504: b"Gateway Timeout",
}  # fmt: skip


class FastResponder:
    """Writes one response. `send` for a whole one; `start_stream`, `write`/`push`, `end`
    for SSE."""

    __slots__ = ("_chunked", "_conn", "_head", "_head_only", "_keep_alive", "status")

    def __init__(
        self, conn: FastConnection, keep_alive: bool, http11: bool = True, head_only: bool = False
    ) -> None:
        self._conn = conn
        self._keep_alive = keep_alive
        # HTTP/1.0 has no chunked framing: a stream is delimited by closing the connection.
        self._chunked = http11
        self._head_only = head_only
        self._head: bytes | None = None
        self.status = 0

    def _status_line(self, status: int) -> bytes:
        return b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b"Status"))

    def close_after(self) -> None:
        """Answer with `Connection: close` and close once this response is written."""
        self._keep_alive = False

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
        self._conn.write(head + b"\r\n" + (b"" if self._head_only else body))
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

    def _frame(self, chunk: bytes) -> bytes:
        data = b"%x\r\n%s\r\n" % (len(chunk), chunk) if self._chunked else chunk
        if self._head is not None:
            data = self._head + data
            self._head = None
        return data

    async def write(self, chunk: bytes) -> None:
        await self._conn.write_and_drain(self._frame(chunk))

    def push(self, chunk: bytes) -> bool:
        """Write now, without waiting; False when the client is not keeping up (wait for
        `drained()` before pushing more). Raises ConnectionResetError if it is gone."""
        conn = self._conn
        conn.write(self._frame(chunk))
        return not conn.write_paused

    def drained(self) -> asyncio.Future[None]:
        """Resolves when the client has read enough of what was pushed."""
        return self._conn.drain_waiter()

    async def end(self) -> None:
        data = b"0\r\n\r\n" if self._chunked else b""
        if self._head is not None:
            data = self._head + data
            self._head = None
        if data:
            self._conn.write(data)
        self._conn.response_done = True
        if not self._keep_alive:
            self._conn.linger()  # also how an HTTP/1.0 stream ends
