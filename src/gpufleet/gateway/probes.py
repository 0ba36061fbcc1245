"""Active health probes, model discovery and /metrics scrapes of one replica."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.routing.types import EngineStats

# vLLM gauge names (sums over their label sets). Older vLLM calls KV usage gpu_cache_usage_perc.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CACHE_INFO = "vllm:cache_config_info"  # labels num_gpu_blocks and block_size: KV capacity
_WANTED = (RUNNING, WAITING, *KV_USAGE, CACHE_INFO)

PROBE_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError)


async def probe_health(session: aiohttp.ClientSession, url: str, timeout_s: float) -> bool:
    try:
        async with session.get(
            url + "/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            await resp.read()
            return resp.status == 200
    except PROBE_ERRORS:
        return False


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


def parse_engine_stats(
    text: str, scraped_at_s: float, in_flight: int
) -> tuple[EngineStats, int | None]:
    """EngineStats from a vLLM-style exposition, and the KV capacity in tokens if reported.

    Only the lines needed are handed to the Prometheus parser (replicas expose hundreds).
    """
    lines = [ln for ln in text.splitlines() if ln.startswith(_WANTED)]
    totals: dict[str, float] = {}
    capacity_tokens: int | None = None
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name == CACHE_INFO:
                try:
                    blocks = int(sample.labels["num_gpu_blocks"])
                    capacity_tokens = blocks * int(sample.labels["block_size"])
                except (KeyError, ValueError):
                    pass
                continue
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    kv = next((totals[n] for n in KV_USAGE if n in totals), 0.0)
    stats = EngineStats(
        num_running=int(totals.get(RUNNING, 0.0)),
        num_waiting=int(totals.get(WAITING, 0.0)),
        kv_cache_usage=float(kv),
        scraped_at_s=scraped_at_s,
        in_flight_at_scrape=in_flight,
    )
    return stats, capacity_tokens


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
