"""Built-in demo traffic: phases of Poisson arrivals (quiet, ramp, burst, quiet) at a gateway.

The schedule is pure (seeded, no clock); `drive` plays it in real time with streaming chat
requests and records what each client saw (TTFT, TPOT, errors). Chats share a few long
system prompts so that prefix-aware routing and the replicas' prefix caches have work.
Each request is sent and measured by gpufleet.bench's streaming client (vLLM's metric
definitions), so the demo and `gpufleet bench` read streams the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from gpufleet.bench.client import stream_request
from gpufleet.bench.metrics import request_metrics
from gpufleet.bench.records import RequestRecord
from gpufleet.bench.requests import chat_body

_JSON = {"Content-Type": "application/json"}


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
) -> RequestResult:
    """One streamed chat request, read and measured by gpufleet.bench's client."""
    body = json.dumps(chat_body(model, messages, max_tokens)).encode()
    rec = await stream_request(
        session, f"{url}/v1/chat/completions", body, _JSON, RequestRecord(max_tokens=max_tokens)
    )
    return result_from_record(rec, sent_s)


def result_from_record(rec: RequestRecord, sent_s: float) -> RequestResult:
    """What the summary keeps of one request, measured with `gpufleet bench`'s definitions."""
    m = request_metrics(rec)
    if m is None:
        error = f"{rec.error_type}: {rec.error}"[:200]
        return RequestResult(sent_s, False, rec.status or 0, error=error)
    return RequestResult(
        sent_s, True, rec.status or 200, m.ttft_s, m.tpot_s, m.e2e_s, m.output_tokens
    )


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
                result = await _one_request(session, url, model, messages, max_tokens, sent_s)
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
