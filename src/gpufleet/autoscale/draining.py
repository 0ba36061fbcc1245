"""What every actuator does alike at scale-in: wait for a draining replica's requests to
finish, up to a deadline, counting what the deadline cut."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from gpufleet.autoscale.actuator import FleetRegistry, ManagedReplica
from gpufleet.fleet_state import parse_engine_metrics

log = logging.getLogger("gpufleet.autoscale")


async def engine_load(session: aiohttp.ClientSession, url: str) -> int | None:
    """Requests running or waiting in the replica's engine (its /metrics), None if unknown."""
    try:
        async with session.get(f"{url}/metrics") as resp:
            if resp.status != 200:
                return None
            return parse_engine_metrics(await resp.text()).load
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        return None


async def requests_left(
    registry: FleetRegistry, session: aiohttp.ClientSession, replica: ManagedReplica
) -> int:
    """In flight at the gateway, or running/waiting in the engine, whichever is larger."""
    gateway = await registry.in_flight(replica.replica_id)
    engine = await engine_load(session, replica.url)
    return max(gateway or 0, engine or 0)


async def wait_drained(
    replica: ManagedReplica,
    registry: FleetRegistry,
    session: Callable[[], aiohttp.ClientSession],
    deadline_s: float,
    clock: Callable[[], float],
) -> int:
    """Poll until nothing is left or the deadline passes; the requests the deadline cut."""
    deadline = clock() + deadline_s
    left = 0
    while clock() < deadline:
        left = await requests_left(registry, session(), replica)
        if left == 0:
            log.info("%s drained", replica.replica_id)
            return 0
        await asyncio.sleep(0.2)
    replica.cut_requests += left
    log.warning(
        "%s: drain deadline %.0f s passed with %d requests in flight",
        replica.replica_id,
        deadline_s,
        left,
    )
    return left
