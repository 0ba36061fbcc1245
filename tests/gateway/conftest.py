from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
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


class Front:
    """How a test's client reaches the completion endpoints: on a fresh connection, or on
    one kept alive after a request for another endpoint (a client mixing /v1/models and
    completions does that; the one HTTP front must answer both alike)."""

    def __init__(self, mixed: bool) -> None:
        self.mixed = mixed

    @contextlib.asynccontextmanager
    async def session(self, gw: Gateway) -> AsyncIterator[aiohttp.ClientSession]:
        connector = aiohttp.TCPConnector(limit=1)  # one keep-alive connection for all
        async with aiohttp.ClientSession(connector=connector) as session:
            if self.mixed:
                async with session.get(gw.url + "/health") as resp:
                    await resp.read()
                self._check_one_connection(gw)
            yield session

    @contextlib.asynccontextmanager
    async def openai_async(self, gw: Gateway) -> AsyncIterator[openai.AsyncOpenAI]:
        # Sequential requests reuse the client's one kept-alive connection.
        async with openai.DefaultAsyncHttpxClient() as http:
            if self.mixed:
                (await http.get(gw.url + "/health")).raise_for_status()
                self._check_one_connection(gw)
            yield openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused",
                                     max_retries=0, http_client=http)  # fmt: skip

    def openai_sync(self, gw: Gateway) -> openai.OpenAI:
        http = openai.DefaultHttpxClient()
        if self.mixed:
            http.get(gw.url + "/health").raise_for_status()
        return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0,
                             http_client=http)  # fmt: skip

    @staticmethod
    def _check_one_connection(gw: Gateway) -> None:
        front = gw._front
        assert front is not None and len(front.connections) == 1, "not kept alive"


@pytest.fixture(params=[False, True], ids=["fresh", "after-other-request"])
def front(request: pytest.FixtureRequest) -> Front:
    """Run a test on a fresh connection and on one that first served another endpoint."""
    return Front(bool(request.param))


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
