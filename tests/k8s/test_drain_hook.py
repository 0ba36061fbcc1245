"""The replica pods' preStop hook against a real gateway and an engine on loopback: it drains
the pod at the gateway, waits for the engine's requests, and gives up at the deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gpufleet.gateway.config import validate_config
from gpufleet.gateway.server import Gateway
from gpufleet.k8s import drain_hook

from .cluster import Engine, free_port, wait_until

pytestmark = pytest.mark.process  # real HTTP on loopback (the fake API server, gateways)


@pytest.fixture
async def setup() -> AsyncIterator[tuple[Gateway, int, Engine, str]]:
    gw = Gateway(validate_config({"admin_key": "k", "health": {"probe_interval_s": 0.1}}))
    port = await gw.start("127.0.0.1", 0)
    engine = Engine()
    engine_port = free_port("127.0.0.1")
    await engine.start("127.0.0.1", engine_port)
    url = f"http://127.0.0.1:{engine_port}"
    gw.add_replica(url, replica_id="pod-a")
    await wait_until(lambda: gw.list_replicas()[0]["state"] == "ready")
    try:
        yield gw, port, engine, url
    finally:
        await engine.stop()
        await gw.stop()


def env(port: int, url: str) -> dict[str, str]:
    return {"POD_NAME": "pod-a", "GPUFLEET_ADMIN_KEY": "k", "GPUFLEET_DRAIN_DEADLINE_S": "30",
            "GPUFLEET_GATEWAY_PEERS": f"localhost:{port}", "GPUFLEET_ENGINE_URL": url}  # fmt: skip


async def test_hook_drains_at_the_gateway_and_waits_for_the_engine(setup) -> None:  # type: ignore[no-untyped-def]
    gw, port, engine, url = setup
    engine.running = 2
    pauses: list[float] = []

    def pause(_: float) -> None:  # the engine finishes its requests after two polls
        pauses.append(1.0)
        if len(pauses) == 2:
            engine.running = 0

    clock = iter(range(1000))
    left = await asyncio.to_thread(
        drain_hook.drain, env(port, url), lambda: float(next(clock)), pause
    )
    assert left == 0 and len(pauses) == 2
    assert gw.list_replicas()[0]["state"] == "draining"


async def test_hook_stops_waiting_at_the_deadline(setup) -> None:  # type: ignore[no-untyped-def]
    _gw, port, engine, url = setup
    engine.running = 1
    t = [0.0]

    def pause(s: float) -> None:
        t[0] += 10.0

    left = await asyncio.to_thread(drain_hook.drain, env(port, url), lambda: t[0], pause)
    assert left == 1 and t[0] >= 30.0


def test_engine_load_reads_vllm_and_sglang_names() -> None:
    text = (
        '# HELP vllm:num_requests_running x\nvllm:num_requests_running{model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{model_name="m"} 2.0\nvllm:num_preemptions_total 7\n'
        'sglang:num_queue_reqs{model_name="m"} 1\n'
    )
    assert drain_hook.engine_load(text) == 6
