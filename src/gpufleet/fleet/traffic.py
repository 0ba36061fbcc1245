"""Built-in demo traffic: phases of Poisson arrivals (quiet, ramp, burst, quiet) at a gateway.

The schedule is pure (seeded, no clock); `drive` plays it in real time with streaming chat
requests and records what each client saw (TTFT, TPOT, errors). Chats share a few long
system prompts so that prefix-aware routing and the replicas' prefix caches have work.
It stands in for gpufleet.bench behind one function until both can share a load loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    duration_s: float
    start_rps: float
    end_rps: float  # linear from start to end over the phase


DEMO_PHASES: tuple[Phase, ...] = (
    Phase("quiet", 15.0, 1.0, 1.0),
    Phase("ramp", 30.0, 1.0, 12.0),
    Phase("burst", 25.0, 15.0, 15.0),
    Phase("quiet", 50.0, 1.0, 1.0),
)


def total_duration_s(phases: Sequence[Phase]) -> float:
    return sum(p.duration_s for p in phases)


def phase_at(phases: Sequence[Phase], t_s: float) -> tuple[Phase | None, float]:
    """The phase at `t_s` seconds from the start and its request rate then."""
    start = 0.0
    for p in phases:
        if t_s < start + p.duration_s:
            frac = (t_s - start) / p.duration_s if p.duration_s > 0 else 0.0
            return p, p.start_rps + (p.end_rps - p.start_rps) * frac
        start += p.duration_s
    return None, 0.0


def arrival_times(phases: Sequence[Phase], seed: int = 0) -> list[float]:
    """Poisson arrivals whose rate follows the phases (thinning), in seconds from the start."""
    rng = random.Random(seed)
    peak = max((max(p.start_rps, p.end_rps) for p in phases), default=0.0)
    if peak <= 0:
        return []
    end = total_duration_s(phases)
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= end:
            return out
        _, rate = phase_at(phases, t)
        if rng.random() < rate / peak:
            out.append(t)


_SYSTEM_PROMPTS = tuple(
    " ".join(
        f"{topic} guideline {i}: answer clearly, cite the manual section, keep it short."
        for i in range(40)
    )
    for topic in ("billing", "shipping", "returns", "accounts", "devices", "security")
)


def demo_messages(rng: random.Random) -> list[dict[str, str]]:
    system = rng.choice(_SYSTEM_PROMPTS)
    question = " ".join(
        rng.choice(
            ("how", "when", "why", "can", "my", "order", "refund", "login", "screen", "fast")
        )
        for _ in range(12)
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


@dataclass(slots=True)
class RequestResult:
    sent_s: float  # seconds from the start of the run
    ok: bool
    status: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    error: str = ""


@dataclass(slots=True)
class TrafficLog:
    results: list[RequestResult] = field(default_factory=list)
    in_flight: int = 0
    sent: int = 0

    def recent(self, now_s: float, window_s: float) -> list[RequestResult]:
        return [r for r in self.results if r.sent_s >= now_s - window_s]


async def _one_request(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    sent_s: float,
    clock: Callable[[], float],
) -> RequestResult:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = clock()
    first: float | None = None
    tokens = 0
    done = False
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                text = (await resp.text())[:200]
                return RequestResult(sent_s, False, resp.status, error=text)
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True  # read on to the end so the connection closes cleanly
                    continue
                event = json.loads(data)
                if "error" in event:
                    return RequestResult(
                        sent_s, False, resp.status, error=str(event["error"])[:200]
                    )
                for choice in event.get("choices") or []:
                    if first is None and (choice.get("delta") or {}).get("content"):
                        first = clock()
                usage = event.get("usage")
                if usage:
                    tokens = int(usage.get("completion_tokens") or 0)
    except (aiohttp.ClientError, TimeoutError, OSError, json.JSONDecodeError) as e:
        return RequestResult(sent_s, False, 0, error=f"{type(e).__name__}: {e}"[:200])
    end = clock()
    if not done:
        return RequestResult(sent_s, False, 200, error="stream ended without [DONE]")
    ttft = None if first is None else first - start
    tpot = None
    if first is not None and tokens > 1:
        tpot = (end - first) / (tokens - 1)
    return RequestResult(sent_s, True, 200, ttft, tpot, end - start, tokens)


async def drive(
    url: str,
    model: str,
    phases: Sequence[Phase] = DEMO_PHASES,
    *,
    log: TrafficLog,
    seed: int = 0,
    max_tokens: int = 64,
    max_in_flight: int = 512,
    stop: asyncio.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> TrafficLog:
    """Play the phases against `url`; returns once every request sent has finished."""
    rng = random.Random(seed)
    times = arrival_times(phases, seed)
    t0 = clock()
    tasks: set[asyncio.Task[None]] = set()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300)
    connector = aiohttp.TCPConnector(limit=max_in_flight)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def run_one(sent_s: float, messages: list[dict[str, str]]) -> None:
            log.in_flight += 1
            try:
                result = await _one_request(
                    session, url, model, messages, max_tokens, sent_s, clock
                )
            finally:
                log.in_flight -= 1
            log.results.append(result)

        for at_s in times:
            delay = at_s - (clock() - t0)
            if delay > 0:
                if stop is not None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                else:
                    await asyncio.sleep(delay)
            if stop is not None and stop.is_set():
                break
            if log.in_flight >= max_in_flight:
                continue  # bound the load generator itself; counted as not sent
            log.sent += 1
            task = asyncio.get_running_loop().create_task(run_one(at_s, demo_messages(rng)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    return log


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[k]
