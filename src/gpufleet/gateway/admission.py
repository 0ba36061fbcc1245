"""Admission: which replica a request goes to, waiting in the fleet core's queue while
there is none. The asyncio half of the admission queue (the data and its rules are in
`gpufleet.fleet_state`): a request waits for the table to change or its deadline to pass,
then asks the core again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from gpufleet.fleet_state import FleetReplica, FleetState, QueueTicket, Refusal
from gpufleet.routing.types import RequestInfo, RoutingPolicy

R = TypeVar("R", bound=FleetReplica)


class TableChanges:
    """An asyncio event that fires on every change of the fleet core's replica table."""

    def __init__(self, fleet: FleetState[Any]) -> None:
        self._event = asyncio.Event()
        fleet.table.listeners.append(self._fire)

    def _fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def next(self) -> asyncio.Event:
        """The event the next change sets."""
        return self._event


async def wait_for_replicas(
    fleet: FleetState[R],
    model: str,
    pool: str | None,
    deadline_s: float,
    changes: TableChanges,
    clock: Callable[[], float] = time.monotonic,
    adapter: str | None = None,
    first_try: bool = True,
) -> Sequence[R] | Refusal:
    """Eligible replicas, waiting in the bounded queue while there are none (scale from 0)."""
    admitted = fleet.admit(model, pool, clock(), deadline_s, adapter=adapter, first_try=first_try)
    if not isinstance(admitted, QueueTicket):
        return admitted
    ticket = admitted
    try:
        while True:
            changed = changes.next()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), ticket.deadline_s - clock())
            admitted = fleet.admit(model, pool, clock(), deadline_s, ticket)
            if not isinstance(admitted, QueueTicket):
                return admitted
    finally:
        fleet.leave_queue(ticket)  # a client that left while waiting leaves the queue


def choose_ready(
    fleet: FleetState[R],
    info: RequestInfo,
    policy: RoutingPolicy,
    pool: str | None,
    tried: Sequence[R] = (),
) -> R | None:
    """The policy's pick among the eligible replicas not tried yet; None when there is
    none. The hot path: no waiting, no allocation beyond what the policy does."""
    candidates = fleet.candidates(info, pool, tried)
    if not candidates:
        return None
    chosen = policy.choose(info, candidates)
    # A policy returns one of the candidates it was given (None only when given none).
    return candidates[0] if chosen is None else cast(R, chosen)


async def choose_replica(
    fleet: FleetState[R],
    info: RequestInfo,
    policy: RoutingPolicy,
    pool: str | None,
    deadline_s: float,
    changes: TableChanges,
    tried: Sequence[R] = (),
    clock: Callable[[], float] = time.monotonic,
    first_try: bool = True,
) -> R | Refusal | None:
    """The replica for this try of a request (None: every ready replica already failed it).

    Replicas `tried` are avoided while others are eligible; with none eligible the request
    waits in the queue, and may then go back to one it tried.
    """
    chosen = choose_ready(fleet, info, policy, pool, tried)
    if chosen is not None:
        return chosen
    if tried and fleet.candidates(info, pool):
        return None
    waited = await wait_for_replicas(fleet, info.model, pool, deadline_s, changes, clock,
                                     info.adapter, first_try)  # fmt: skip
    if isinstance(waited, Refusal):
        return waited
    candidates = [r for r in waited if r not in tried] or list(waited)
    picked = policy.choose(info, candidates)
    return candidates[0] if picked is None else cast(R, picked)
