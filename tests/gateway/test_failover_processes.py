"""Real `gpufleet replica` processes behind the gateway: SIGKILL one under load, faults."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gpufleet.gateway.config import validate_config
from gpufleet.gateway.server import Gateway
from gpufleet.routing.types import ReplicaState

from .conftest import wait_until
from .processes import REPLICA_MODEL, BackendProcess, free_port, replica_process

pytestmark = pytest.mark.process  # every test here starts processes or servers


@pytest.fixture
async def replicas() -> AsyncIterator[list[BackendProcess]]:
    procs = [replica_process(free_port()) for _ in range(2)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            await p.wait_healthy()
        yield procs
    finally:
        for p in procs:
            p.kill()


@pytest.fixture
async def gateway(replicas: list[BackendProcess]) -> AsyncIterator[Gateway]:
    cfg = validate_config(
        {
            "replicas": [{"url": p.url, "id": f"p{i}"} for i, p in enumerate(replicas)],
            "health": {"probe_interval_s": 0.2, "eject_after_failures": 2},
            "scrape_interval_s": 0.2,
            "limits": {"max_attempts": 3},
        }
    )
    gw = Gateway(cfg)
    await gw.start("127.0.0.1", 0)
    try:
        await wait_until(lambda: all(r.state is ReplicaState.READY for r in gw.replicas))
        yield gw
    finally:
        await gw.stop()


async def _one(session: aiohttp.ClientSession, url: str, stream: bool) -> tuple[int, str]:
    body = {"model": REPLICA_MODEL, "messages": [{"role": "user", "content": "tell me"}],
            "max_tokens": 24, "stream": stream}  # fmt: skip
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        return resp.status, (await resp.read()).decode()


def _sent(gw: Gateway, replica_id: str) -> float:
    """Attempts the gateway sent to a replica (its Prometheus counter)."""
    value: float = gw.replicas.by_id[replica_id].m_requests.value
    return value


async def test_sigkill_under_load(replicas: list[BackendProcess], gateway: Gateway) -> None:
    gw = gateway
    victim = replicas[0]
    victim_replica = gw.replicas.by_id["p0"]
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(_one(session, gw.url, stream=i % 2 == 0)) for i in range(24)]
        # Kill while requests of both kinds are in flight on the victim, some streaming.
        await wait_until(lambda: victim_replica.in_flight >= 4 and victim_replica.streaming >= 2)
        streaming_at_kill = victim_replica.streaming
        in_flight_at_kill = victim_replica.in_flight
        victim.kill()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        broken = []
        for status, text in results:
            assert status == 200, text
            if not text.startswith("data:"):
                assert json.loads(text)["choices"][0]["message"]["content"]
                continue
            events = [e for e in text.split("\n\n") if e.strip()]
            assert events[-1] == "data: [DONE]", "never a silent truncation"
            if '"error"' in text:
                broken.append(events)
        # Only streams that had started on the victim may break, each with an error event.
        # (A stream whose last bytes were already on the wire when the kill landed may
        # still finish cleanly, so not every one of `streaming_at_kill` must break.)
        assert streaming_at_kill >= 2
        assert 1 <= len(broken) <= in_flight_at_kill
        for events in broken:
            assert "choices" in json.loads(events[0].removeprefix("data: "))
            assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == 502
        await wait_until(lambda: victim_replica.state is ReplicaState.DEAD)
        sent_to_victim = _sent(gw, "p0")
        more = await asyncio.gather(*(_one(session, gw.url, stream=False) for _ in range(8)))
        assert all(status == 200 for status, _ in more)
        assert _sent(gw, "p0") == sent_to_victim  # ejected: no traffic
        victim.start()  # the same port: the replica restarts
        await wait_until(lambda: victim_replica.state is ReplicaState.READY, timeout_s=60)
        more = await asyncio.gather(*(_one(session, gw.url, stream=False) for _ in range(8)))
        assert all(status == 200 for status, _ in more)
        assert _sent(gw, "p0") > sent_to_victim  # re-admitted


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
