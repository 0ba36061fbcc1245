"""Per-replica TTFT p90 over a recent window, from each replica's own /metrics histogram.

vLLM's vllm:time_to_first_token_seconds is cumulative; the window is the difference
between the newest scrape and the oldest one still inside it.
"""

from __future__ import annotations

import asyncio
from collections import deque

import aiohttp

from gpufleet.autoscale.scrape import parse_histogram
from gpufleet.stats import bucket_delta, histogram_quantile

TTFT = "vllm:time_to_first_token_seconds"


class ReplicaTtft:
    def __init__(self, window_s: float = 20.0) -> None:
        self.window_s = window_s
        self._scrapes: dict[str, deque[tuple[float, list[tuple[float, float]]]]] = {}

    def add(self, replica_id: str, now_s: float, buckets: list[tuple[float, float]]) -> None:
        q = self._scrapes.setdefault(replica_id, deque())
        q.append((now_s, buckets))
        while len(q) > 1 and q[0][0] < now_s - self.window_s:
            q.popleft()

    def forget_except(self, replica_ids: set[str]) -> None:
        for rid in list(self._scrapes):
            if rid not in replica_ids:
                del self._scrapes[rid]

    def p90_s(self) -> dict[str, float]:
        out = {}
        for rid, q in self._scrapes.items():
            if len(q) < 2:
                continue
            value = histogram_quantile(0.9, bucket_delta(q[-1][1], q[0][1]))
            if value is not None:
                out[rid] = value
        return out


async def scrape_ttft(
    session: aiohttp.ClientSession, urls: dict[str, str], into: ReplicaTtft, now_s: float
) -> None:
    async def one(rid: str, url: str) -> None:
        try:
            async with session.get(f"{url}/metrics") as resp:
                if resp.status == 200:
                    into.add(rid, now_s, parse_histogram(await resp.text(), TTFT))
        except (aiohttp.ClientError, TimeoutError, OSError):
            pass

    await asyncio.gather(*(one(rid, url) for rid, url in urls.items()))
    into.forget_except(set(urls))
