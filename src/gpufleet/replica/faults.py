"""Fault injection over HTTP, for testing gateways and autoscalers (also settable by flags).

GET  /admin/faults                            the current faults as JSON
POST /admin/faults  {"fail_next": N, "fail_status": 503}
                    the next N generation requests fail with that status (OpenAI error body)
                    {"slow_factor": 3.0}      every engine iteration takes 3x longer
                    {"unhealthy": true}       /health answers 503 (the server keeps serving)
                    {"exit": true, "exit_code": 1, "exit_after_s": 0.0}
                    the process exits abruptly (os._exit, no cleanup, streams cut)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gpufleet.replica.config import Faults
from gpufleet.replica.errors import RequestError
from gpufleet.replica.http import error_response, json_response, read_json


def _int(body: dict[str, Any], name: str, ok: Callable[[int], bool], rule: str) -> int:
    v = body[name]
    if not isinstance(v, int) or isinstance(v, bool) or not ok(v):
        raise RequestError(f"{name} must be {rule}", param=name)
    return v


def apply_faults(faults: Faults, body: Any, set_slow: Callable[[float], None]) -> None:
    """Change `faults` from an admin request body (RequestError names a bad field)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if "fail_next" in body:
        faults.fail_next = _int(body, "fail_next", lambda v: v >= 0, "an integer >= 0")
    if "fail_status" in body:
        faults.fail_status = _int(
            body, "fail_status", lambda v: 400 <= v <= 599, "an HTTP error status"
        )
    if "slow_factor" in body:
        v = body["slow_factor"]
        if not isinstance(v, int | float) or isinstance(v, bool) or v <= 0:
            raise RequestError("slow_factor must be a number > 0", param="slow_factor")
        faults.slow_factor = float(v)
        set_slow(faults.slow_factor)
    if "unhealthy" in body:
        if not isinstance(body["unhealthy"], bool):
            raise RequestError("unhealthy must be a boolean", param="unhealthy")
        faults.unhealthy = body["unhealthy"]
    if body.get("exit"):
        code = body.get("exit_code", 1)
        after = body.get("exit_after_s", 0.0)
        if not isinstance(code, int) or not isinstance(after, int | float) or after < 0:
            raise RequestError("exit_code must be an int and exit_after_s >= 0", param="exit")
        # Answer first, then die without any cleanup, like a crashed process.
        asyncio.get_running_loop().call_later(max(after, 0.05), os._exit, code)


class FaultsApi:
    def __init__(self, faults: Faults, set_slow: Callable[[float], None]):
        self.faults = faults
        self.set_slow = set_slow

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/admin/faults", self.get)
        app.router.add_post("/admin/faults", self.post)

    async def get(self, request: web.Request) -> web.Response:
        return json_response(self.faults.as_json())

    async def post(self, request: web.Request) -> web.Response:
        try:
            apply_faults(self.faults, await read_json(request), self.set_slow)
        except RequestError as e:
            return error_response(e.message, e.status, e.param)
        return json_response(self.faults.as_json())
