"""The actuator interface (DESIGN.md: `Actuator`): what the controller tells to change the fleet.

Local processes (`local.py`), Ray placement groups and actors (`raycluster/`), or
Kubernetes workloads implement the same calls. An actuator owns replica lifecycles
(start → ready → draining → gone, restarts), and tells the gateway about them through a
`FleetRegistry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpufleet.routing.types import ReplicaState


@dataclass(slots=True)
class ManagedReplica:
    replica_id: str
    url: str
    state: ReplicaState
    started_at_s: float
    expected_ready_s: float  # when /health should pass (start + expected cold start)
    ready_at_s: float | None = None
    pid: int | None = None
    restarts: int = 0
    cut_requests: int = 0  # requests still in flight when a drain deadline forced a stop

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.replica_id,
            "url": self.url,
            "state": str(self.state),
            "started_at_s": self.started_at_s,
            "expected_ready_s": self.expected_ready_s,
            "ready_at_s": self.ready_at_s,
            "pid": self.pid,
            "restarts": self.restarts,
            "cut_requests": self.cut_requests,
        }


def restart_backoff_s(restarts: int) -> float:
    """How long an actuator waits before restarting a replica that crashed `restarts`
    times already: 0.5 s, doubling, at most 30 s."""
    return float(min(30.0, 0.5 * 2.0**restarts))


class Actuator(Protocol):
    async def start(self, n: int) -> list[ManagedReplica]:
        """Start `n` replicas; returns at once with them `starting`."""
        ...

    async def drain(self, replica_id: str) -> None:
        """Stop sending it requests, let in-flight ones finish (up to a deadline), then stop it.

        Returns once the drain has begun; the stop follows in the background.
        """
        ...

    async def stop(self, replica_id: str) -> None:
        """Stop it now (after removing it from the gateway)."""
        ...

    def list(self) -> list[ManagedReplica]: ...

    async def undrain(self, replica_id: str) -> bool:
        """Take a draining replica back into service, warm, in place of a cold start.

        False when it cannot: the stop has begun, or the backend cannot take one back
        (Kubernetes); the controller then starts a new one.
        """
        ...

    def observed_cold_start_s(self) -> float | None:
        """Mean seconds from start to ready over recent starts (None before the first)."""
        ...


class FleetActuator(Actuator, Protocol):
    """What `gpufleet up` holds of any backend: the interface, a close, and a tally."""

    cut_requests_total: int  # in flight when a drain deadline forced a stop
    undrained_total: int  # draining replicas a scale-out took back (no cold start)

    async def close(self) -> None:
        """Stop every replica (on shutdown); leaves nothing behind."""
        ...


class FleetRegistry(Protocol):
    """The gateway, as an actuator needs it (in-process `Gateway` or its admin API)."""

    async def add(self, replica_id: str, url: str) -> None: ...

    async def drain(self, replica_id: str) -> None: ...

    async def undrain(self, replica_id: str) -> None:
        """Route to a draining replica again (KeyError if the gateway does not know it)."""
        ...

    async def remove(self, replica_id: str) -> None: ...

    async def in_flight(self, replica_id: str) -> int | None:
        """Requests the gateway has sent to it and not seen finish (None if unknown to it)."""
        ...


class NoRegistry:
    """No gateway in front (replicas used directly)."""

    async def add(self, replica_id: str, url: str) -> None:
        return None

    async def drain(self, replica_id: str) -> None:
        return None

    async def undrain(self, replica_id: str) -> None:
        return None

    async def remove(self, replica_id: str) -> None:
        return None

    async def in_flight(self, replica_id: str) -> int | None:
        return None
