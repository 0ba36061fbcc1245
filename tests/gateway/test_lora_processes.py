"""The gateway in front of two real `gpufleet replica` processes with different LoRA adapters:
requests for an adapter go where it is loaded, a declared adapter loaded nowhere is loaded
once (vLLM's /v1/load_lora_adapter) and then stuck to, a burst spills to the other replica
(bounded load) which then loads it too, and /v1/models lists every adapter with its parent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from gpufleet.gateway.config import validate_config
from gpufleet.gateway.server import Gateway
from gpufleet.replica.testing import DEFAULT_MODEL as MODEL
from gpufleet.replica.testing import ReplicaProcess
from gpufleet.routing.types import ReplicaState

from .conftest import wait_until

pytestmark = pytest.mark.process  # every test here starts processes or servers

RUNTIME = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[ReplicaProcess]]:
    common = ("--step-time", "base_s=0.01", "--enable-lora", "--max-loras", "2")
    with (
        ReplicaProcess(*common, "--lora-modules", "sql=org/sql-lora", env=RUNTIME) as r0,
        ReplicaProcess(*common, "--lora-modules", "chat=org/chat-lora", env=RUNTIME) as r1,
    ):
        yield [r0, r1]


async def started_gateway(
    urls: list[str], *, max_loras: int | None = None, replica_id: str = "r{}"
) -> Gateway:
    """A started gateway routing by adapter over `urls`, with the adapter `new` declared
    (loaded nowhere until a request needs it)."""
    options = {"policy_options": {"max_loras": max_loras}} if max_loras else {}
    cfg = validate_config(
        {
            "replicas": [{"url": u, "id": replica_id.format(i)} for i, u in enumerate(urls)],
            "models": [MODEL],
            "adapters": [{"name": "new", "path": "org/new-lora"}],
            "policy": "lora_affinity",
            "health": {"probe_interval_s": 0.2},
            "scrape_interval_s": 0.2,
            **options,
        }
    )
    gw = Gateway(cfg)
    await gw.start("127.0.0.1", 0)
    return gw


@pytest.fixture
async def gateway(replicas: list[ReplicaProcess]) -> AsyncIterator[Gateway]:
    gw = await started_gateway([p.url for p in replicas], max_loras=2)
    try:
        await wait_until(lambda: all(r.state is ReplicaState.READY for r in gw.replicas))
        await wait_until(lambda: {"sql", "chat"} <= {m for r in gw.replicas for m in r.models})
        yield gw
    finally:
        await gw.stop()


def served(gw: Gateway) -> dict[str, int]:
    return {r.replica_id: int(r.m_requests.value) for r in gw.replicas}


async def send(s: aiohttp.ClientSession, gw: Gateway, model: str, max_tokens: int = 4) -> None:
    body = {"model": model, "prompt": "select one two three", "max_tokens": max_tokens}
    async with s.post(gw.url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        assert (await r.json())["model"] == model


async def test_adapters_routed_to_their_replica_loaded_once_and_spilled(gateway: Gateway) -> None:
    gw = gateway
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/v1/models") as r:
            cards = {c["id"]: c for c in (await r.json())["data"]}
        assert {cards[a]["parent"] for a in ("sql", "chat", "new")} == {MODEL}

        home = {"sql": "r0", "chat": "r1"}
        for model in ("sql", "sql", "chat", "sql", "chat", "chat", "sql", "chat"):  # one by one
            before = served(gw)
            await send(s, gw, model)
            after = served(gw)
            assert [rid for rid in after if after[rid] > before[rid]] == [home[model]]
        assert [r.adapter_loads for r in gw.replicas] == [0, 0]

        for _ in range(4):  # declared, loaded nowhere: one load, then affinity
            await send(s, gw, "new")
        assert sum(r.adapter_loads for r in gw.replicas) == 1
        holder = next(r for r in gw.replicas if "new" in r.models)
        async with s.get(holder.url + "/v1/models") as r:
            assert "new" in {c["id"] for c in (await r.json())["data"]}

        # A burst for one adapter is not herded onto its replica: the bound spills it.
        await asyncio.gather(*(send(s, gw, "sql", max_tokens=30) for _ in range(12)))
        r1 = next(r for r in gw.replicas if r.replica_id == "r1")
        assert "sql" in r1.models and r1.adapter_loads >= 1


async def test_an_adapter_is_loaded_on_an_sglang_replica_through_sglangs_api() -> None:
    """The gateway finds SGLang's /load_lora_adapter (vLLM's route is a 404 there), loads a
    declared adapter once and names it `<base>:<adapter>` in what it forwards."""
    args = ("--step-time", "base_s=0.01", "--engine", "sglang", "--enable-metrics",
            "--enable-lora", "--max-loras", "2")  # fmt: skip
    with ReplicaProcess(*args) as rep:
        gw = await started_gateway([rep.url], replica_id="s{}")
        try:
            await wait_until(lambda: all(r.state is ReplicaState.READY for r in gw.replicas))
            async with aiohttp.ClientSession() as s:
                for _ in range(3):
                    body = {"model": "new", "prompt": "select one two", "max_tokens": 3}
                    async with s.post(gw.url + "/v1/completions", json=body) as r:
                        assert r.status == 200, await r.text()
                (replica,) = gw.replicas
                assert replica.adapter_loads == 1 and replica.lora_api == "sglang"
                async with s.get(rep.url + "/v1/models") as r:
                    assert "new" in {c["id"] for c in (await r.json())["data"]}
        finally:
            await gw.stop()
