"""Real `gpufleet replica` processes behind the gateway: SIGKILLs and stalls under load (no
request lost: mid-stream failover), faults, the openai client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gpufleet.bench.chaos import mixed_requests, run_chaos
from gpufleet.gateway.config import validate_config
from gpufleet.gateway.server import Gateway
from gpufleet.replica.generation import expected_answer
from gpufleet.routing.types import ReplicaState

from .conftest import wait_until
from .processes import REPLICA_MODEL, BackendProcess, free_port, replica_process

pytestmark = pytest.mark.process  # every test here starts processes or servers


@pytest.fixture
async def replicas() -> AsyncIterator[list[BackendProcess]]:
    procs = [replica_process(free_port()) for _ in range(3)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            await p.wait_healthy()
        yield procs
    finally:
        for p in procs:
            p.kill()


async def _gateway(replicas: list[BackendProcess], **extra: Any) -> Gateway:
    cfg = validate_config(
        {
            "replicas": [{"url": p.url, "id": f"p{i}"} for i, p in enumerate(replicas)],
            "health": {"probe_interval_s": 0.2, "eject_after_failures": 2},
            "outlier": {"base_ejection_time_s": 2.0},
            "scrape_interval_s": 0.2,
            "limits": {"max_attempts": 3},
            **extra,
        }
    )
    gw = Gateway(cfg)
    await gw.start("127.0.0.1", 0)
    await wait_until(lambda: all(r.state is ReplicaState.READY for r in gw.replicas))
    return gw


@pytest.fixture
async def gateway(replicas: list[BackendProcess]) -> AsyncIterator[Gateway]:
    gw = await _gateway(replicas)
    try:
        yield gw
    finally:
        await gw.stop()


async def _one(session: aiohttp.ClientSession, url: str, stream: bool) -> tuple[int, str]:
    body = {"model": REPLICA_MODEL, "messages": [{"role": "user", "content": "tell me"}],
            "max_tokens": 24, "stream": stream}  # fmt: skip
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        return resp.status, (await resp.read()).decode()


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name))  # fmt: skip


async def test_sigkill_loop_loses_no_request(
    replicas: list[BackendProcess], gateway: Gateway
) -> None:
    """The kill test, sized for CI: 12 closed-loop clients (half streaming) while one of 3
    replicas is SIGKILLed (and restarted) every 3 s: every request completes, every stream
    is well formed and has exactly the text of an uninterrupted answer."""

    async def kill(n: int) -> None:
        victim = replicas[n % len(replicas)]
        victim.kill()
        victim.start()  # replaced: the same port comes back a second or two later

    report = await run_chaos(gateway.url, mixed_requests(REPLICA_MODEL, expected_answer),
                             clients=12, duration_s=10.0, disrupt=kill, every_s=3.0)  # fmt: skip
    assert report.disruptions >= 2
    assert report.counts["ok"] == report.total > 50, report.to_json()
    async with aiohttp.ClientSession() as s, s.get(gateway.url + "/metrics") as resp:
        text = await resp.text()
    assert _metric(text, "gpufleet_gateway_resumes_total") >= 1
    assert _metric(text, "gpufleet_gateway_resumed_tokens_total") >= 1
    assert _metric(text, "gpufleet_gateway_resume_failures_total") == 0
    # A killed replica that came back is routed to again.
    await wait_until(lambda: all(r.state is ReplicaState.READY for r in gateway.replicas), 30)


async def test_stalled_replicas_are_resumed_elsewhere(replicas: list[BackendProcess]) -> None:
    """The same with stalls: one replica at a time runs 300x slower (2 s a token), so its
    streams go silent past the inter-token timeout and are resumed elsewhere."""
    gw = await _gateway(replicas, failover={"inter_token_timeout_s": 0.5})

    async def faults(url: str, slow: float) -> None:
        async with aiohttp.ClientSession() as s, s.post(url + "/admin/faults",
                                                        json={"slow_factor": slow}) as r:  # fmt: skip
            assert r.status == 200

    async def stall(n: int) -> None:
        await faults(replicas[(n - 1) % 3].url, 1.0)
        await faults(replicas[n % 3].url, 300.0)

    async def settle() -> None:
        for p in replicas:
            await faults(p.url, 1.0)

    try:
        report = await run_chaos(gw.url, mixed_requests(REPLICA_MODEL, expected_answer, 30),
                                 clients=12, duration_s=8.0, disrupt=stall, every_s=2.5,
                                 settle=settle)  # fmt: skip
        async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as resp:
            text = await resp.text()
    finally:
        await gw.stop()
    assert report.disruptions >= 2
    assert report.counts["ok"] == report.total > 20, report.to_json()
    assert _metric(text, 'gpufleet_gateway_resumes_total{model="' + REPLICA_MODEL
                   + '",reason="stall"}') >= 1  # fmt: skip


async def test_replica_faults_are_retried_and_probed(
    replicas: list[BackendProcess], gateway: Gateway
) -> None:
    gw = gateway
    async with aiohttp.ClientSession() as session:
        # The replica's own fault injection: its next 2 generations fail with 503.
        async with session.post(
            replicas[0].url + "/admin/faults", json={"fail_next": 2, "fail_status": 503}
        ) as resp:
            assert resp.status == 200
        results = await asyncio.gather(*(_one(session, gw.url, stream=i % 2 == 0)
                                         for i in range(6)))  # fmt: skip
        assert all(status == 200 and '"error"' not in text for status, text in results)
        async with session.get(gw.url + "/metrics") as resp:
            text = await resp.text()
        assert 'gpufleet_gateway_replica_retries_total{replica="p0"}' in text
        # An unhealthy /health takes it out by the active probes alone, and back.
        async with session.post(replicas[1].url + "/admin/faults", json={"unhealthy": True}):
            pass
        await wait_until(lambda: gw.replicas.by_id["p1"].state is ReplicaState.DEAD)
        async with session.post(replicas[1].url + "/admin/faults", json={"unhealthy": False}):
            pass
        await wait_until(lambda: gw.replicas.by_id["p1"].state is ReplicaState.READY)
        # Scraped engine stats reach the signals the autoscaler reads.
        await wait_until(lambda: all(r.num_running is not None for r in gw.signals().replicas))


async def test_openai_client_through_gateway_to_real_replicas(gateway: Gateway) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    try:
        msgs = [{"role": "user", "content": "hello"}]
        full = await client.chat.completions.create(
            model=REPLICA_MODEL,
            messages=msgs,  # type: ignore[arg-type]
            max_tokens=5,
        )
        assert full.usage is not None and full.usage.completion_tokens == 5
        # Fields the gateway does not know (stream_options) reach the engine untouched.
        stream = await client.chat.completions.create(
            model=REPLICA_MODEL,
            messages=msgs,  # type: ignore[arg-type]
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert len(text.split()) == 5
    finally:
        await client.close()
