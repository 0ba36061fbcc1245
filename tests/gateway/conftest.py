from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gpufleet.gateway.config import validate_config
from gpufleet.gateway.server import Gateway
from gpufleet.routing.types import ReplicaState

from .stub_backend import StubBackend

ADMIN_KEY = "admin-secret"


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll a condition; the timeout is only a hang guard."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not met before the hang-guard timeout")
        await asyncio.sleep(0.02)


@pytest.fixture
async def stubs() -> AsyncIterator[list[StubBackend]]:
    backends = [await StubBackend(f"s{i}").start() for i in range(2)]
    yield backends
    for b in backends:
        await b.stop()


GatewayFactory = Callable[..., Awaitable[Gateway]]


@pytest.fixture(params=[True, False], ids=["fast-front", "aiohttp-front"])
def fast_front(request: pytest.FixtureRequest) -> bool:
    """Run a test against both HTTP fronts: the lean one and aiohttp's (handed-over conns)."""
    value: bool = request.param
    return value


@pytest.fixture
async def make_gateway() -> AsyncIterator[GatewayFactory]:
    started: list[Gateway] = []

    async def make(urls: list[str], wait_ready: bool = True, **config: Any) -> Gateway:
        data: dict[str, Any] = {
            "admin_key": ADMIN_KEY,
            "replicas": [{"url": u} for u in urls],
            "health": {"probe_interval_s": 0.1, "probe_timeout_s": 2.0},
            "scrape_interval_s": 0.1,
        }
        for key, value in config.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        gw = Gateway(validate_config(data))
        await gw.start("127.0.0.1", 0)
        started.append(gw)
        if wait_ready:
            await wait_until(lambda: all(r.state is ReplicaState.READY for r in gw.replicas))
        return gw

    yield make
    for gw in started:
        await gw.stop()
