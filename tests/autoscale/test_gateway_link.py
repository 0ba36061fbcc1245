"""The actuator's registry and the controller's signal source against the real gateway,
both ways: the in-process `Gateway` object and its admin API over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpufleet.autoscale.gateway_link import AdminApiGateway, InProcessGateway, fleet_signals
from gpufleet.autoscale.local import LocalProcessActuator
from gpufleet.gateway.config import validate_config
from gpufleet.gateway.server import Gateway
from gpufleet.routing.types import ReplicaState

pytestmark = pytest.mark.process  # every test here starts processes or servers

TINY = Path(__file__).with_name("tiny_server.py")


async def _until(cond, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s  # hang guard only
    while not cond():
        assert loop.time() < end, "condition not met before the hang guard"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _fleet(
    via: str,
) -> AsyncIterator[tuple[Gateway, InProcessGateway | AdminApiGateway, LocalProcessActuator]]:
    """A real gateway, the actuator's link to it (`via`) and a local-process actuator."""
    gw = Gateway(validate_config({"port": 0, "admin_key": "adm", "models": ["tiny"]}))
    port = await gw.start("127.0.0.1", 0)
    link: InProcessGateway | AdminApiGateway = (
        InProcessGateway(gw)
        if via == "in_process"
        else AdminApiGateway(f"http://127.0.0.1:{port}", "adm")
    )
    act = LocalProcessActuator(
        f"{sys.executable} {TINY} --port {{port}}", registry=link, drain_deadline_s=10.0
    )
    try:
        yield gw, link, act
    finally:
        await act.close()
        if isinstance(link, AdminApiGateway):
            await link.close()
        await gw.stop()


@pytest.mark.parametrize("via", ["in_process", "admin_api"])
async def test_actuator_registers_drains_and_removes_through_the_gateway(via: str) -> None:
    async with _fleet(via) as (gw, link, act):
        [r] = await act.start(1)
        await _until(lambda: r.state == ReplicaState.READY)
        await _until(lambda: any(x["state"] == "ready" for x in gw.list_replicas()))
        signals = fleet_signals(await link.read_signals(), act.list())
        assert [x.replica_id for x in signals.ready] == [r.replica_id]
        assert await link.in_flight(r.replica_id) == 0

        await act.drain(r.replica_id)
        # Nothing in flight: the drain completes, the gateway forgets it, the process ends.
        await _until(lambda: not act.list())
        await _until(lambda: not gw.list_replicas())
        assert await link.in_flight(r.replica_id) is None


@pytest.mark.parametrize("via", ["in_process", "admin_api"])
async def test_a_draining_replica_taken_back_routes_again(via: str) -> None:
    async with _fleet(via) as (gw, link, act):
        [r] = await act.start(1)
        await _until(lambda: any(x["state"] == "ready" for x in gw.list_replicas()))
        gw.replicas.by_id[r.replica_id].in_flight = 1  # a request it still holds
        await act.drain(r.replica_id)
        assert [x["state"] for x in gw.list_replicas()] == ["draining"]
        assert await act.undrain(r.replica_id)
        assert [x["state"] for x in gw.list_replicas()] == ["ready"]
        gw.replicas.by_id[r.replica_id].in_flight = 0  # it finished: the drain would stop it
        await asyncio.sleep(0.6)
        assert act.list() == [r] and r.state == ReplicaState.READY
        signals = fleet_signals(await link.read_signals(), act.list())
        assert [x.replica_id for x in signals.ready] == [r.replica_id]


async def test_admin_api_errors_surface() -> None:
    gw = Gateway(validate_config({"port": 0, "admin_key": "adm"}))
    port = await gw.start("127.0.0.1", 0)
    wrong = AdminApiGateway(f"http://127.0.0.1:{port}", "not-the-key")
    right = AdminApiGateway(f"http://127.0.0.1:{port}", "adm")
    try:
        with pytest.raises(Exception, match="401"):
            await wrong.read_signals()
        with pytest.raises(KeyError):
            await right.drain("no-such-replica")
        with pytest.raises(KeyError):
            await right.undrain("no-such-replica")
    finally:
        await wrong.close()
        await right.close()
        await gw.stop()
