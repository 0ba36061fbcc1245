"""Active health probes, model discovery and /metrics scrapes of one replica (the I/O;
what a scrape says is read by `gpufleet.fleet_state.parse_engine_metrics`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

PROBE_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError)


async def fetch_models(
    session: aiohttp.ClientSession, url: str, timeout_s: float
) -> list[dict[str, Any]] | None:
    """The replica's /v1/models cards, or None when it cannot tell."""
    try:
        async with session.get(
            url + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status != 200:
                return None
            body = await resp.json(content_type=None)
    except PROBE_ERRORS:
        return None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return [card for card in data if isinstance(card, dict) and isinstance(card.get("id"), str)]


async def fetch_text(
    session: aiohttp.ClientSession, url: str, path: str, timeout_s: float
) -> tuple[int | None, str | None]:
    """(status, body) of GET url+path; (None, None) when the replica did not answer."""
    try:
        async with session.get(url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            text = await resp.text(errors="replace")
            return resp.status, text if resp.status == 200 else None
    except PROBE_ERRORS:
        return None, None


async def fetch_json(session: aiohttp.ClientSession, url: str, path: str, timeout_s: float) -> Any:
    """The JSON body of GET url+path (None when it fails, answers non-200 or non-JSON)."""
    status, text = await fetch_text(session, url, path, timeout_s)
    if status != 200 or text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
