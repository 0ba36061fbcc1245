"""The request and response shapes the proxy works with (the HTTP front's, as protocols),
so the proxy can be driven by anything that reads a request and writes a response."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from gpufleet.openai_errors import error_json_bytes

JSON = "application/json"


class In(Protocol):
    """A completion request with its body read."""

    @property
    def body(self) -> bytes: ...

    @property
    def raw_headers(self) -> Any: ...

    def header(self, lname: bytes) -> bytes | None: ...


class Out(Protocol):
    """Where the response goes: `send` a whole one, or `start_stream`, then `write` (waits
    for a slow client) or `push` (does not; False asks the caller to wait for `drained`),
    then `end`."""

    status: int

    def send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None: ...

    async def start_stream(self, status: int, content_type: str) -> None: ...

    async def write(self, chunk: bytes) -> None: ...

    def push(self, chunk: bytes) -> bool: ...

    def drained(self) -> asyncio.Future[None]: ...

    async def end(self) -> None: ...


def send_error(
    out: Out,
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | int | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    out.send(status, error_json_bytes(message, status, param=param, code=code), JSON, headers)
