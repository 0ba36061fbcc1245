"""SIGKILL a backend process under load: nothing that had not started streaming fails."""

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
from .processes import BackendProcess, free_port, stub_process

MODEL = "stub-model"


@pytest.fixture
async def backends() -> AsyncIterator[list[BackendProcess]]:
    procs = [stub_process(free_port()) for _ in range(2)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            await p.wait_healthy()
        yield procs
    finally:
        for p in procs:
            p.kill()


async def _one(session: aiohttp.ClientSession, url: str, stream: bool) -> tuple[int, str]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        return resp.status, (await resp.read()).decode()


async def test_sigkill_under_load(backends: list[BackendProcess]) -> None:
    cfg = validate_config(
        {
            "replicas": [{"url": p.url, "id": f"p{i}"} for i, p in enumerate(backends)],
            "health": {"probe_interval_s": 0.2, "eject_after_failures": 2},
            "limits": {"max_attempts": 3},
        }
    )
    gw = Gateway(cfg)
    await gw.start("127.0.0.1", 0)
    victim, survivor = backends
    victim_replica = gw.replicas.by_id["p0"]
    try:
        await wait_until(lambda: all(r.state is ReplicaState.READY for r in gw.replicas))
        async with aiohttp.ClientSession() as session:
            tasks = [
                asyncio.create_task(_one(session, gw.url, stream=i % 2 == 0)) for i in range(24)
            ]
            # Kill while requests of both kinds are in flight on the victim.
            await wait_until(lambda: victim_replica.in_flight >= 4)
            in_flight_at_kill = victim_replica.in_flight
            victim.kill()
            results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            for status, text in results:
                assert status == 200
                if not text.startswith("data:"):
                    assert json.loads(text)["choices"][0]["message"]["content"]
                    continue
                events = [e for e in text.split("\n\n") if e.strip()]
                assert events[-1] == "data: [DONE]", "never a silent truncation"
            broken = [t for _, t in results if '"error"' in t]
            assert len(broken) <= in_flight_at_kill
            for text in broken:  # only streams that had started may break
                first = json.loads(text.split("\n\n")[0].removeprefix("data: "))
                assert "choices" in first
            await wait_until(lambda: victim_replica.state is ReplicaState.DEAD)
            sent_to_victim = victim_replica.m_requests._value.get()
            more = await asyncio.gather(*(_one(session, gw.url, stream=False) for _ in range(8)))
            assert all(status == 200 for status, _ in more)
            assert victim_replica.m_requests._value.get() == sent_to_victim  # ejected: no traffic
            victim.start()  # same port: the replica restarts
            await wait_until(lambda: victim_replica.state is ReplicaState.READY, timeout_s=60)
            more = await asyncio.gather(*(_one(session, gw.url, stream=False) for _ in range(8)))
            assert all(status == 200 for status, _ in more)
            assert victim_replica.m_requests._value.get() > sent_to_victim  # re-admitted
    finally:
        await gw.stop()
        assert survivor.proc is not None
