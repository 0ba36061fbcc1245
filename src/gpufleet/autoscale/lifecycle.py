"""The replica lifecycle every actuator shares (local processes, Ray): the table of replicas,
drain → wait for in-flight requests (up to a deadline) → stop, cold-start bookkeeping, and
the restart backoff. A backend adds how to start a replica and `_halt` (how to stop one).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import aiohttp

from gpufleet.autoscale.actuator import (
    FleetRegistry,
    ManagedReplica,
    NoRegistry,
    restart_backoff_s,
)
from gpufleet.autoscale.draining import wait_drained
from gpufleet.routing.types import ReplicaState


@dataclass(slots=True)
class Entry:
    """One replica as its actuator holds it (a backend adds its handles)."""

    replica: ManagedReplica
    stopping: bool = False
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    draining: asyncio.Task[None] | None = None  # waits for its requests, then stops it


E = TypeVar("E", bound=Entry)


class ActuatorBase(Generic[E]):
    def __init__(
        self,
        *,
        registry: FleetRegistry | None,
        expected_startup_s: float,
        health_timeout_s: float,
        drain_deadline_s: float,
        stop_grace_s: float,
        restart_crashed: bool,
        clock: Callable[[], float],
        id_prefix: str,
    ) -> None:
        self.registry: FleetRegistry = registry or NoRegistry()
        self.expected_startup_s = expected_startup_s
        self.health_timeout_s = health_timeout_s
        self.drain_deadline_s = drain_deadline_s
        self.stop_grace_s = stop_grace_s
        self.restart_crashed = restart_crashed
        self.clock = clock
        self._ids = (f"{id_prefix}-{i}" for i in itertools.count(1))
        self._entries: dict[str, E] = {}
        self._cold_starts_s: deque[float] = deque(maxlen=8)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self.cut_requests_total = 0  # in flight when a drain deadline forced a stop
        self.undrained_total = 0  # draining replicas a scale-out took back (no cold start)

    async def _halt(self, entry: E) -> None:
        """Stop the replica's processes and free what it holds (the backend's part)."""
        raise NotImplementedError

    # -- Actuator ---------------------------------------------------------------------
    async def drain(self, replica_id: str) -> None:
        entry = self._entries.get(replica_id)
        if entry is None or entry.stopping:
            return
        if entry.replica.state == ReplicaState.STARTING:
            await self.stop(replica_id)  # never served: nothing to drain
            return
        entry.replica.state = ReplicaState.DRAINING
        with contextlib.suppress(KeyError):
            await self.registry.drain(replica_id)
        entry.draining = self._background(entry, self._finish_drain(entry))

    async def undrain(self, replica_id: str) -> bool:
        """Take a draining replica back into service: it is warm (and its prefix cache
        too), so a scale-out has it at once instead of after a cold start. False when it
        is not draining, or already stopping (its requests finished, or the deadline)."""
        entry = self._entries.get(replica_id)
        if entry is None or entry.stopping or entry.replica.state != ReplicaState.DRAINING:
            return False
        try:
            await self.registry.undrain(replica_id)
        except KeyError:
            return False  # the gateway forgot it: let the drain finish
        if entry.stopping or entry.replica.state != ReplicaState.DRAINING:
            return False  # the drain ended while the gateway was asked
        if entry.draining is not None:
            entry.draining.cancel()  # it is waiting (the stop sets `stopping` first)
            entry.draining = None
        entry.replica.state = ReplicaState.READY
        self.undrained_total += 1
        return True

    async def stop(self, replica_id: str) -> None:
        entry = self._entries.get(replica_id)
        if entry is None:
            return
        entry.stopping = True
        with contextlib.suppress(KeyError):
            await self.registry.remove(replica_id)
        await self._halt(entry)
        entry.replica.state = ReplicaState.DEAD
        for task in builtins.list(entry.tasks):
            if task is not asyncio.current_task():
                task.cancel()
        self._entries.pop(replica_id, None)

    def list(self) -> builtins.list[ManagedReplica]:
        return [e.replica for e in self._entries.values()]

    def observed_cold_start_s(self) -> float | None:
        if not self._cold_starts_s:
            return None
        return sum(self._cold_starts_s) / len(self._cold_starts_s)

    async def close(self) -> None:
        """Stop every replica (used on shutdown); leaves nothing behind."""
        self._closed = True
        await asyncio.gather(
            *(self.stop(r) for r in builtins.list(self._entries)), return_exceptions=True
        )
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- shared steps -----------------------------------------------------------------
    def _new_replica(self, url: str = "") -> ManagedReplica:
        now = self.clock()
        return ManagedReplica(
            next(self._ids), url, ReplicaState.STARTING, now, now + self._expected_startup()
        )

    def _expected_startup(self) -> float:
        return self.observed_cold_start_s() or self.expected_startup_s

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0))
        return self._session

    def _background(self, entry: E, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        entry.tasks.add(task)
        task.add_done_callback(entry.tasks.discard)
        return task

    def _mark_ready(self, replica: ManagedReplica, *, cold_start: bool = True) -> float:
        """It passed /health: ready from now; returns the seconds since it was started."""
        now = self.clock()
        if cold_start:
            self._cold_starts_s.append(now - replica.started_at_s)
        replica.ready_at_s = now
        replica.state = ReplicaState.READY
        return now - replica.started_at_s

    def _restarting(self, replica: ManagedReplica) -> float:
        """It died: starting again from now (capacity on its way, so the controller starts no
        second one in its place), after the returned backoff (`restart_backoff_s`)."""
        backoff_s = restart_backoff_s(replica.restarts)
        now = self.clock()
        replica.state = ReplicaState.STARTING
        replica.started_at_s = now
        replica.expected_ready_s = now + backoff_s + self._expected_startup()
        replica.ready_at_s = None
        return backoff_s

    async def _finish_drain(self, entry: E) -> None:
        replica = entry.replica
        self.cut_requests_total += await wait_drained(
            replica, self.registry, self._http, self.drain_deadline_s, self.clock
        )
        await self.stop(replica.replica_id)
