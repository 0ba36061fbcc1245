"""Small aiohttp helpers every replica endpoint shares: JSON in and out, OpenAI errors.

Every refusal — a bad body, an unknown model, an unknown route, a wrong method — is the
same OpenAI error shape vLLM uses, `{"error": {"message", "type", "param", "code"}}`, with
`code` the HTTP status as an integer.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web

from gpufleet.openai_errors import error_json_bytes
from gpufleet.replica.errors import RequestError


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(data).encode(), status=status, content_type="application/json"
    )


def error_response(
    message: str, status: int, param: str | None = None, error_type: str | None = None
) -> web.Response:
    return web.Response(
        body=error_json_bytes(message, status, param=param, error_type=error_type),
        status=status,
        content_type="application/json",
    )


async def read_json(request: web.Request) -> Any:
    try:
        return await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"Invalid JSON body: {e}", param="body") from e


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (404 route, 405 method, 413 body) in the OpenAI error shape."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        phrase = HTTPStatus(e.status).phrase
        message = f"{phrase}: {request.method} {request.path}"
        if isinstance(e, web.HTTPMethodNotAllowed):
            message += f" (allowed: {', '.join(sorted(e.allowed_methods))})"
        resp = error_response(message, e.status, error_type=phrase)
        for name in ("Allow",):
            if name in e.headers:
                resp.headers[name] = e.headers[name]
        return resp
