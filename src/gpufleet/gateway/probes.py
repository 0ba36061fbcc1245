"""Active health probes, model discovery and /metrics scrapes of one replica (the I/O;
what a scrape says is read by `gpufleet.fleet_state.parse_engine_metrics`)."""

from __future__ import annotations

import asyncio
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


async def scrape_metrics(session: aiohttp.ClientSession, url: str, timeout_s: float) -> str | None:
    try:
        async with session.get(
            url + "/metrics", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status != 200:
                return None
            return await resp.text()
    except PROBE_ERRORS:
        return None
