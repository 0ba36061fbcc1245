"""One health probe of a replica, with the reason a person can act on.

A replica that answers `GET /health` 200 is healthy. One without `/health` (a plain
OpenAI-compatible server: 404 or 405 there) is probed through `GET /v1/models` from then
on. Anything else is a failure whose reason says what happened: nothing listens at the
address, no answer within the timeout, or the status the replica answered.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp

# /health answered with one of these: the server has no such route (plain OpenAI server)
_NO_HEALTH_ROUTE = (404, 405)


@dataclass(frozen=True, slots=True)
class Probe:
    ok: bool
    reason: str
    uses_models_probe: bool = False  # the replica has no /health: probe /v1/models instead
    model_cards: list[dict[str, Any]] | None = None  # when /v1/models was read


def _failure_reason(e: BaseException, url: str, timeout_s: float) -> str:
    if isinstance(e, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return f"no answer from {url} within {timeout_s:g} s"
    if isinstance(e, aiohttp.ClientConnectorError):
        return f"unreachable: nothing accepts connections at {url} ({e.os_error.strerror or e})"
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return f"{url} closed the connection without answering"
    return f"probe of {url} failed: {type(e).__name__}: {e}"


async def _models(
    session: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout
) -> tuple[int, list[dict[str, Any]] | None]:
    async with session.get(url + "/v1/models", timeout=timeout) as resp:
        if resp.status != 200:
            await resp.read()
            return resp.status, None
        body = await resp.json(content_type=None)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return 200, None
    return 200, [c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)]


async def probe(
    session: aiohttp.ClientSession, url: str, timeout_s: float, *, models_probe: bool = False
) -> Probe:
    """Probe `url` once (`models_probe`: it has no /health, read /v1/models instead)."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        if not models_probe:
            async with session.get(url + "/health", timeout=timeout) as resp:
                await resp.read()
                if resp.status == 200:
                    return Probe(True, "healthy (GET /health 200)")
                if resp.status not in _NO_HEALTH_ROUTE:
                    return Probe(False, f"GET /health answered {resp.status}")
        status, cards = await _models(session, url, timeout)
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as e:
        return Probe(False, _failure_reason(e, url, timeout_s), models_probe)
    if status != 200:
        return Probe(False, f"no /health, and GET /v1/models answered {status}", True)
    if not cards:
        return Probe(False, "no /health, and GET /v1/models lists no model", True)
    return Probe(True, "healthy (no /health; GET /v1/models 200)", True, cards)
