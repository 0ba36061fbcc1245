"""A live fleet of both personalities: the gateway reads a vLLM replica's and an SGLang
replica's own metric names and balances by them; a replica without load metrics is routed
by in-flight counts, and the gateway says so once (log and /admin/replicas)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import aiohttp
import pytest

from gpufleet.gateway.server import Gateway
from gpufleet.replica.testing import DEFAULT_MODEL as MODEL
from gpufleet.replica.testing import ReplicaProcess

from .conftest import ADMIN_KEY, GatewayFactory, wait_until

pytestmark = pytest.mark.process  # every test here starts processes or servers

STEP = ("--step-time", "base_s=0.01")  # 10 ms a step: a 150-token request holds ~1.5 s


@pytest.fixture(scope="module")
def vllm() -> Iterator[ReplicaProcess]:
    with ReplicaProcess(*STEP) as r:
        yield r


@pytest.fixture(scope="module")
def sglang() -> Iterator[ReplicaProcess]:
    with ReplicaProcess("--engine", "sglang", "--enable-metrics", *STEP) as r:
        yield r


async def _hold(s: aiohttp.ClientSession, url: str, n: int) -> list[aiohttp.ClientResponse]:
    """`n` long streaming requests sent straight to a replica (not via the gateway), each
    read until its first chunk: they run in its engine until released."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 150, "ignore_eos": True, "stream": True}
    held = [await s.post(url + "/v1/completions", json=body) for _ in range(n)]
    for resp in held:
        await resp.content.readline()
    return held


async def _via_gateway(s: aiohttp.ClientSession, gw: Gateway, n: int) -> None:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    for _ in range(n):
        async with s.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200


def _sent(gw: Gateway, replica_id: str) -> float:
    value: float = gw.replicas.by_id[replica_id].m_requests.value
    return value


async def test_balances_by_each_engines_own_metrics(
    vllm: ReplicaProcess, sglang: ReplicaProcess, make_gateway: GatewayFactory
) -> None:
    gw = await make_gateway(
        [], replicas=[{"url": vllm.url, "id": "v"}, {"url": sglang.url, "id": "s"}],
        policy="queue_depth",
    )  # fmt: skip
    await wait_until(lambda: all(r.load_signals == "engine" for r in gw.replicas))
    assert {r.replica_id: r.engine for r in gw.replicas} == {"v": "vllm", "s": "sglang"}
    async with aiohttp.ClientSession() as s:
        for busy, idle, url in (("s", "v", sglang.url), ("v", "s", vllm.url)):
            held = await _hold(s, url, 6)
            # the gateway learns the load from the busy replica's own metric names
            await wait_until(lambda b=busy: (gw.replicas.by_id[b].stats or _NONE).num_running >= 6)  # type: ignore[misc]
            before = {rid: _sent(gw, rid) for rid in ("s", "v")}
            await _via_gateway(s, gw, 8)
            assert _sent(gw, idle) - before[idle] == 8, f"requests went to the busy {busy}"
            assert _sent(gw, busy) == before[busy]
            for resp in held:
                resp.close()
            await wait_until(lambda b=busy: (gw.replicas.by_id[b].stats or _NONE).num_running == 0)  # type: ignore[misc]


class _NoStats:
    num_running = -1


_NONE = _NoStats()


async def test_no_load_metrics_is_said_once(
    vllm: ReplicaProcess, make_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpufleet.gateway")
    with ReplicaProcess("--engine", "sglang", *STEP) as bare:  # no --enable-metrics
        gw = await make_gateway(
            [], replicas=[{"url": vllm.url, "id": "v"}, {"url": bare.url, "id": "bare"}],
            policy="queue_depth",
        )  # fmt: skip
        await wait_until(lambda: gw.replicas.by_id["bare"].load_signals == "in_flight")
        await asyncio.sleep(0.5)  # five more scrapes: nothing new to say
        async with aiohttp.ClientSession() as s:
            headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
            async with s.get(gw.url + "/admin/replicas", headers=headers) as resp:
                rows = {r["id"]: r for r in (await resp.json())["replicas"]}
            await _via_gateway(s, gw, 4)  # it still gets traffic, by in-flight counts
        assert rows["bare"]["load_signals"] == "in_flight"
        assert rows["bare"]["engine"] == "sglang"
        assert "--enable-metrics" in rows["bare"]["load_note"]
        assert rows["v"]["load_signals"] == "engine" and rows["v"]["load_note"] is None
        said = [r.getMessage() for r in caplog.records if "replica bare " in r.getMessage()]
        assert len([m for m in said if "in-flight counts" in m]) == 1, said
        assert _sent(gw, "bare") + _sent(gw, "v") == 4
