"""The gateway's routes other than the two completion endpoints, for the one HTTP front.

A route is `(method, path pattern) -> async handler(request) -> Reply`; a pattern segment
`{name}` matches one path segment and lands in `request.params[name]`. An unknown path is
a 404 and a known path with another method a 405 with `Allow`, both in OpenAI format, as
every other answer of the gateway.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from gpufleet.openai_errors import error_json_bytes

JSON = "application/json"


class Reply:
    """A whole response: status, body bytes, content type and extra headers."""

    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self,
        status: int,
        body: bytes,
        content_type: str = JSON,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


def json_reply(data: Any, status: int = 200) -> Reply:
    return Reply(status, json.dumps(data, default=str).encode())


def error_reply(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | int | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    return Reply(status, error_json_bytes(message, status, param=param, code=code),
                 headers=headers)  # fmt: skip


class RouteRequest(Protocol):
    """What a route handler reads (the front's request with its path parameters)."""

    method: bytes
    body: bytes
    params: dict[str, str]

    def header(self, lname: bytes) -> bytes | None: ...


RouteHandler = Callable[[Any], Awaitable[Reply]]


class Router:
    def __init__(self) -> None:
        # pattern segments -> {method: handler}
        self._routes: dict[tuple[str, ...], dict[bytes, RouteHandler]] = {}
        # Takes every request no route matches (a gateway worker forwards those to its
        # supervisor); None: they get a 404.
        self.fallback: RouteHandler | None = None

    def add(self, method: str, path: str, handler: RouteHandler) -> None:
        """Serve `method path` (a GET route answers HEAD too). Raises ValueError if taken."""
        segments = tuple(path.strip("/").split("/"))
        methods = self._routes.setdefault(segments, {})
        key = method.upper().encode()
        if key in methods:
            raise ValueError(f"route {method} {path} already exists")
        methods[key] = handler

    def remove(self, path: str) -> None:
        """Forget every method of `path` (KeyError if unknown)."""
        del self._routes[tuple(path.strip("/").split("/"))]

    def match(
        self, method: bytes, path: bytes
    ) -> tuple[RouteHandler | None, dict[str, str], Reply | None]:
        """(handler, params, None), or (None, {}, the 404/405 to answer)."""
        try:
            text = path.decode("ascii")
        except UnicodeDecodeError:
            if self.fallback is not None:
                return self.fallback, {}, None
            return None, {}, error_reply(404, "no such route")
        segments = tuple(text.strip("/").split("/"))
        for pattern, methods in self._routes.items():
            params = _bind(pattern, segments)
            if params is None:
                continue
            handler = methods.get(method) or (methods.get(b"GET") if method == b"HEAD" else None)
            if handler is not None:
                return handler, params, None
            allow = ", ".join(sorted(m.decode() for m in methods))
            return None, {}, error_reply(
                405, f"method {method.decode('latin-1')} not allowed on {text}",
                headers={"Allow": allow},
            )  # fmt: skip
        if self.fallback is not None:
            return self.fallback, {}, None
        return None, {}, error_reply(404, f"no route {method.decode('latin-1')} {text[:200]}")


def _bind(pattern: tuple[str, ...], segments: tuple[str, ...]) -> dict[str, str] | None:
    if len(pattern) != len(segments):
        return None
    params: dict[str, str] = {}
    for want, got in zip(pattern, segments, strict=True):
        if want.startswith("{") and want.endswith("}"):
            if not got:
                return None
            params[want[1:-1]] = got
        elif want != got:
            return None
    return params
