from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .cluster import Cluster
from .fake_api import FakeApiServer


async def _cluster(ordered: bool, models: tuple[str, ...] = ("tiny",)) -> AsyncIterator[Cluster]:
    with FakeApiServer() as server:
        c = Cluster(server, ordered=ordered, models=models)
        await c.start_gateways()
        try:
            yield c
        finally:
            await c.close()


@pytest.fixture
async def env() -> AsyncIterator[Cluster]:
    """The fake API with a Deployment-backed group and two real gateways."""
    async for c in _cluster(False):
        yield c


@pytest.fixture
async def lws_env() -> AsyncIterator[Cluster]:
    """The same with a LeaderWorkerSet (StatefulSet-ordered) group."""
    async for c in _cluster(True):
        yield c


@pytest.fixture
async def groups_env() -> AsyncIterator[Cluster]:
    """Gateways that serve two models, `tiny` (GROUP's) and `other` (add_group's)."""
    async for c in _cluster(False, ("tiny", "other")):
        yield c
