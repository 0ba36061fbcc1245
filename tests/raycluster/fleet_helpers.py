"""A gateway, a RayActuator of real `gpufleet replica` processes, and bounded client traffic."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gpufleet.autoscale.gateway_link import InProcessGateway
from gpufleet.autoscale.local import DEFAULT_COMMAND
from gpufleet.autoscale.raycluster.actuator import RayActuator
from gpufleet.autoscale.raycluster.shape import ReplicaShape
from gpufleet.gateway.config import validate_config
from gpufleet.gateway.server import Gateway

from .conftest import NAMESPACE

MODEL = "meta-llama/Llama-3.1-8B"


async def start_gateway() -> Gateway:
    gw = Gateway(
        validate_config(
            {
                "models": [MODEL],
                "policy": "least_outstanding",
                "health": {"probe_interval_s": 0.3, "eject_after_failures": 2},
                "scrape_interval_s": 0.5,
            }
        )
    )
    await gw.start("127.0.0.1", 0)
    return gw


def make_actuator(
    fleet: str, registry: Any = None, *, tp: int = 2, pp: int = 1, **kw: Any
) -> RayActuator:
    return RayActuator(
        DEFAULT_COMMAND,
        shape=ReplicaShape(tp=tp, pp=pp, cpus_per_bundle=0.5),
        fleet=fleet,
        namespace=NAMESPACE,
        values={"model": MODEL, "gpu": "h100-sxm", "startup_s": 0.2, "time_scale": 1.0},
        registry=InProcessGateway(registry) if registry is not None else None,
        expected_startup_s=10.0,
        drain_deadline_s=30.0,
        stop_grace_s=5.0,
        probe_interval_s=0.5,
        probe_failures=3,
        **kw,
    )


def abandon(actuator: RayActuator) -> None:
    """What a crashed controller leaves: its replicas running in Ray, nothing watching them."""
    for slot in actuator._entries.values():
        for task in slot.tasks:
            task.cancel()
    actuator._entries.clear()


@dataclass
class Traffic:
    """Plain and streamed completions through the gateway until stopped (bounded)."""

    url: str
    ok: int = 0
    streamed: int = 0
    failures: list[str] = field(default_factory=list)
    max_requests: int = 3000

    async def _one(self, session: aiohttp.ClientSession, stream: bool) -> None:
        body = {"model": MODEL, "prompt": "hello there", "max_tokens": 12, "stream": stream}
        try:
            async with session.post(f"{self.url}/v1/completions", json=body) as resp:
                text = (await resp.read()).decode()
                if resp.status != 200 or (stream and "data: [DONE]" not in text):
                    self.failures.append(f"{resp.status}: {text[:200]}")
                    return
        except (aiohttp.ClientError, TimeoutError) as e:
            self.failures.append(repr(e))
            return
        self.ok += 1
        self.streamed += stream

    async def run(self, stop: asyncio.Event, clients: int = 3) -> None:
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def client(i: int) -> None:
                n = 0
                while not stop.is_set() and self.ok + len(self.failures) < self.max_requests:
                    await self._one(session, stream=(n + i) % 2 == 0)
                    n += 1
                    await asyncio.sleep(0.02)

            await asyncio.gather(*(client(i) for i in range(clients)))


@contextlib.asynccontextmanager
async def traffic_through(gw: Gateway) -> Any:
    stop = asyncio.Event()
    traffic = Traffic(gw.url)
    task = asyncio.get_running_loop().create_task(traffic.run(stop))
    try:
        yield traffic
    finally:
        stop.set()
        await task
