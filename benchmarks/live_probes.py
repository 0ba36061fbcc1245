"""What sim_vs_live reads off the live fleet from outside: each layer's TTFT and each
process's CPU while the traffic runs, and what the HTTP path adds to one request.

Every figure comes from what the processes already publish: the gateway's and the
replicas' Prometheus metrics (the gateway's TTFT from its parse of a request to the first
chunk it relayed; a replica's from the request's arrival to the step that emitted its
first token; the engine's own queue + prefill time, on its clock scaled to wall time) and
/proc/PID/stat (CPU seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import aiohttp

from gpufleet.fleet.traffic import demo_workload, one_request
from gpufleet.routing.types import ReplicaState
from gpufleet.workload import RatePhase, synthetic_shapes, text_conversations

_TOTALS = {
    "vllm:time_to_first_token_seconds_sum": "replica_ttft_s",
    "vllm:time_to_first_token_seconds_count": "replica_ttft_n",
    "vllm:request_queue_time_seconds_sum": "engine_ttft_s",
    "vllm:request_prefill_time_seconds_sum": "engine_ttft_s",
    "vllm:request_prefill_time_seconds_count": "engine_ttft_n",
    "gpufleet_gateway_time_to_first_token_seconds_sum": "gateway_ttft_s",
    "gpufleet_gateway_time_to_first_token_seconds_count": "gateway_ttft_n",
    # What the engines were given: prompt tokens, and how many of them the prefix cache held.
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:prefix_cache_queries_total": "prefix_queries_tokens",
    "vllm:prefix_cache_hits_total": "prefix_hits_tokens",
}
_TIMEOUT = aiohttp.ClientTimeout(total=5)


async def scrape_totals(session: aiohttp.ClientSession, url: str) -> dict[str, float] | None:
    """The sums and counts of `_TOTALS` that `url`/metrics reports (None: no answer)."""
    with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
        async with session.get(f"{url}/metrics", timeout=_TIMEOUT) as resp:
            totals = dict.fromkeys(_TOTALS.values(), 0.0)
            for line in (await resp.text()).splitlines():
                name, _, value = line.partition(" ")
                key = _TOTALS.get(name.split("{")[0])
                if key is not None:
                    totals[key] += float(value)
            return totals
    return None


def proc_cpu_s(pid: int) -> float | None:
    """A process's CPU seconds (user + system) so far, from /proc (None: gone, or no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class FleetProbe:
    """Reads the gateway's metrics when started and when stopped, and every `period_s`
    the replicas' metrics and CPU, so a replica drained before the end still counts
    (up to its last `period_s`). A replica ready at the start counts from its first
    reading, one that came later from zero. A scrape costs the scraped process a few ms
    in its event loop (~3 ms for a replica's ~400 lines, ~10 ms for the gateway's): the
    gateway scrapes each replica every second anyway, the probe adds one every 2 s."""

    def __init__(self, run: Any, period_s: float = 2.0) -> None:
        self.run = run
        self.period_s = period_s
        self.stop = asyncio.Event()
        ready = [m for m in run.actuator.list() if m.state is ReplicaState.READY]
        self._initial = {m.replica_id for m in ready}
        self._first: dict[str, dict[str, float]] = {}
        self._last: dict[str, dict[str, float]] = {}

    def _read(self, key: str, now: dict[str, float], initial: bool) -> None:
        self._first.setdefault(key, now if initial else dict.fromkeys(now, 0.0))
        self._last[key] = now

    async def _sample(self, session: aiohttp.ClientSession, every: bool) -> None:
        """Every replica's CPU and metrics; the gateway's too when `every`."""
        scraped = (ReplicaState.READY, ReplicaState.DRAINING)
        for m in self.run.actuator.list():
            initial = m.replica_id in self._initial  # (a later replica may reuse a port)
            if m.pid is not None and (cpu := proc_cpu_s(m.pid)) is not None:
                self._read(f"pid:{m.pid}", {"cpu_s": cpu}, initial)
            if m.state in scraped and (totals := await scrape_totals(session, m.url)) is not None:
                self._read(m.replica_id, totals, initial)
        if every and (totals := await scrape_totals(session, self.run.url)) is not None:
            self._read(self.run.url, totals, True)

    async def sample(self) -> None:
        """Until `stop` is set."""
        async with aiohttp.ClientSession() as session:
            await self._sample(session, every=True)
            while not self.stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), self.period_s)
                await self._sample(session, every=self.stop.is_set())

    def added(self) -> dict[str, float]:
        """What every source added while sampled, summed."""
        out: dict[str, float] = {}
        for key, last in self._last.items():
            for name, value in last.items():
                out[name] = out.get(name, 0.0) + value - self._first[key][name]
        return out

    def ttft_ms(self) -> dict[str, float]:
        """Mean TTFT (ms) and the number of requests in it, as the gateway, the replicas
        and the engines measured it."""
        added, out = self.added(), {}
        for name in ("gateway", "replica", "engine"):
            n = added.get(f"{name}_ttft_n", 0.0)
            out[f"{name}_ms"] = 1000 * added.get(f"{name}_ttft_s", 0.0) / max(1.0, n)
            out[f"{name}_n"] = n
        return out

    def tokens(self) -> dict[str, float]:
        """Prompt tokens the engines prefilled or found cached, and the prefix cache's
        hit rate (hit tokens / queried tokens): routing and caching, live."""
        added = self.added()
        queries = added.get("prefix_queries_tokens", 0.0)
        return {"prompt_tokens": added.get("prompt_tokens", 0.0), "prefix_queries_tokens": queries,
                "prefix_hit_rate": added.get("prefix_hits_tokens", 0.0) / max(1.0, queries)}  # fmt: skip


async def measure_overhead(run: Any, model: str, seed: int, n: int = 20) -> float:
    """The live HTTP path's share of TTFT on this machine, now: `n` requests one at a
    time (prompts of another seed, so the run's prefix caches stay cold), their mean client
    TTFT minus the engines' own (queue + prefill, from the replicas' metrics)."""
    phases = (RatePhase("calibration", float(n), 1.0, 1.0),)
    convs = list(text_conversations(synthetic_shapes(demo_workload(phases, seed + 1000))))[:n]
    urls = [m.url for m in run.actuator.list() if m.state is ReplicaState.READY]
    async with aiohttp.ClientSession() as session:
        before = [await scrape_totals(session, url) for url in urls]
        ttfts = []
        for conv in convs:
            messages = [{"role": "user", "content": conv.turns[0].text}]
            r = await one_request(session, run.url, model, messages, 64, 0.0)
            if r.ttft_s is not None:
                ttfts.append(r.ttft_s)
            await asyncio.sleep(0.3)
        after = [await scrape_totals(session, url) for url in urls]
    engine_s = engine_n = 0.0
    for then, now in zip(before, after, strict=True):
        if then is not None and now is not None:
            engine_s += now["engine_ttft_s"] - then["engine_ttft_s"]
            engine_n += now["engine_ttft_n"] - then["engine_ttft_n"]
    return max(0.0, sum(ttfts) / len(ttfts) - engine_s / max(1.0, engine_n))
