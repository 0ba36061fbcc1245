"""One request and response shape for the proxy, whichever HTTP front read the request.

The lean front (`fast_http`) serves the two completion endpoints; a connection whose
request is anything else is handed to aiohttp for the rest of its life, so a completion
may also arrive through aiohttp. Both give the proxy an `In` and an `Out`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from gpufleet.gateway.config import LimitsConfig
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
    """Where the response goes: `send` a whole one, or `start_stream`, `write`..., `end`."""

    status: int

    def send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None: ...

    async def start_stream(self, status: int, content_type: str) -> None: ...

    async def write(self, chunk: bytes) -> None: ...

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


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | int | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.Response(
        body=error_json_bytes(message, status, param=param, code=code),
        status=status,
        content_type=JSON,
        headers=headers,
    )


class AiohttpIn:
    __slots__ = ("body", "raw_headers")

    def __init__(self, request: web.Request, body: bytes) -> None:
        self.raw_headers = request.raw_headers
        self.body = body

    def header(self, lname: bytes) -> bytes | None:
        for k, v in self.raw_headers:
            if k.lower() == lname:
                return bytes(v)
        return None


class AiohttpOut:
    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None
        self.status = 0

    def send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.status = status
        self.response = web.Response(
            body=body, status=status, headers={"Content-Type": content_type, **(headers or {})}
        )

    async def start_stream(self, status: int, content_type: str) -> None:
        self.status = status
        self.response = web.StreamResponse(
            status=status, headers={"Content-Type": content_type, "Cache-Control": "no-cache"}
        )
        await self.response.prepare(self.request)

    async def write(self, chunk: bytes) -> None:
        assert self.response is not None
        await self.response.write(chunk)

    async def end(self) -> None:
        assert self.response is not None
        await self.response.write_eof()


Handler = Callable[[In, Out, str, str, float], Awaitable[None]]


def aiohttp_completions(
    handle: Handler,
    limits: LimitsConfig,
    count_refused: Callable[[int], None],
    clock: Callable[[], float],
) -> tuple[Any, Any]:
    """The aiohttp handlers of the two completion endpoints (for handed-over connections):
    read the body within the limits, then `handle(in, out, endpoint, path, t0_s)`."""

    async def proxy(request: web.Request, endpoint: str, path: str) -> web.StreamResponse:
        t0_s = clock()
        out = AiohttpOut(request)
        length = request.content_length
        try:
            if length is not None and length > limits.max_body_bytes:
                raise web.HTTPRequestEntityTooLarge(max_size=limits.max_body_bytes,
                                                    actual_size=length)  # fmt: skip
            if request.content.is_eof():  # the whole body came with the headers: no timer
                raw = await request.read()
            else:
                async with asyncio.timeout(limits.client_body_timeout_s):
                    raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            count_refused(413)
            return error_response(413, f"the request body exceeds {limits.max_body_bytes} bytes")
        except TimeoutError:
            count_refused(408)
            return error_response(408, "timed out reading the request body")
        await handle(AiohttpIn(request, raw), out, endpoint, path, t0_s)
        assert out.response is not None
        return out.response

    async def chat(request: web.Request) -> web.StreamResponse:
        return await proxy(request, "chat", "/v1/chat/completions")

    async def completions(request: web.Request) -> web.StreamResponse:
        return await proxy(request, "completions", "/v1/completions")

    return chat, completions
