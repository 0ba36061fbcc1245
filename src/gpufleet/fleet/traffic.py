"""Built-in demo traffic: phases of Poisson arrivals (quiet, ramp, burst, quiet) at a gateway.

The schedule and the request shapes are `gpufleet.workload`'s (a rate schedule; six shared
system prompts as prefix groups, each followed by a short question of its own), so
prefix-aware routing and the replicas' prefix caches have work, and `gpufleet sim` can
replay the very same requests. `drive` plays them in real time as streaming chat requests
and records what each client saw (TTFT, TPOT, errors). Each request is sent and measured
by gpufleet.bench's streaming client (vLLM's metric definitions), so the demo and
`gpufleet bench` read streams the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from gpufleet.bench.client import stream_request
from gpufleet.bench.metrics import request_metrics
from gpufleet.bench.records import RequestRecord
from gpufleet.bench.requests import chat_body
from gpufleet.workload import RatePhase, WorkloadSpec, synthetic_shapes, text_conversations

_JSON = {"Content-Type": "application/json"}

DEMO_PHASES: tuple[RatePhase, ...] = (
    RatePhase("quiet", 15.0, 1.0, 1.0),
    RatePhase("ramp", 30.0, 1.0, 12.0),
    RatePhase("burst", 25.0, 15.0, 15.0),
    RatePhase("quiet", 50.0, 1.0, 1.0),
)


def demo_workload(
    phases: Sequence[RatePhase] = DEMO_PHASES, seed: int = 0, max_tokens: int = 64
) -> WorkloadSpec:
    """The demo's requests: six ~500-token system prompts (round robin) + a 12-word question."""
    return WorkloadSpec(
        schedule=tuple(phases),
        prefix_groups=6,
        prefix_tokens=500,
        input_tokens=12,
        output_tokens=max_tokens,
        seed=seed,
    )


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


async def one_request(
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
    phases: Sequence[RatePhase] = DEMO_PHASES,
    *,
    log: TrafficLog,
    seed: int = 0,
    max_tokens: int = 64,
    max_in_flight: int = 512,
    stop: asyncio.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> TrafficLog:
    """Play the phases against `url`; returns once every request sent has finished."""
    convs = text_conversations(synthetic_shapes(demo_workload(phases, seed, max_tokens)))
    t0 = clock()
    tasks: set[asyncio.Task[None]] = set()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300)
    connector = aiohttp.TCPConnector(limit=max_in_flight)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def run_one(sent_s: float, messages: list[dict[str, str]]) -> None:
            log.in_flight += 1
            try:
                result = await one_request(session, url, model, messages, max_tokens, sent_s)
            finally:
                log.in_flight -= 1
            log.results.append(result)

        for conv in convs:
            at_s = conv.arrival_s or 0.0
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
            messages = [{"role": "user", "content": conv.turns[0].text}]
            task = asyncio.get_running_loop().create_task(run_one(at_s, messages))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    return log
