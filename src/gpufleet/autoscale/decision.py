"""The policy interface (DESIGN.md: `ScalingPolicy.decide(now, FleetSignals)`).

A policy keeps its own history as plain state, changed only inside `decide`; it never reads
a clock, sleeps, opens a socket or logs. The caller passes `now_s` (wall clock live, virtual
time in the simulator) and calls `decide` once per control tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpufleet.autoscale.signals import FleetSignals
from gpufleet.errors import UserError


@dataclass(frozen=True, slots=True)
class ScalingDecision:
    """How many replicas (ready + starting) the fleet should have, and why, in numbers."""

    desired_replicas: int
    reason: str
    policy: str = ""
    now_s: float = 0.0
    current_replicas: int = 0

    @property
    def delta(self) -> int:
        return self.desired_replicas - self.current_replicas


@dataclass(frozen=True, slots=True)
class ReplicaBounds:
    min_replicas: int = 1
    max_replicas: int = 8

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise UserError("must be ≥ 0", field="min_replicas", fix="set min_replicas: 0 or more")
        if self.max_replicas < max(1, self.min_replicas):
            raise UserError(
                f"must be ≥ max(1, min_replicas={self.min_replicas})",
                field="max_replicas",
                fix="raise max_replicas or lower min_replicas",
            )

    def clamp(self, n: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, n))


class ScalingPolicy(Protocol):
    name: str

    def decide(self, now_s: float, signals: FleetSignals) -> ScalingDecision: ...


def check_capacity_per_replica(capacity_per_replica: int) -> None:
    """The per-replica batch capacity a capacity-based policy divides demand by."""
    if capacity_per_replica < 1:
        raise UserError(
            "must be ≥ 1", field="capacity_per_replica", fix="use the plan's concurrent sequences"
        )


def capacity_note(capacity_source: str) -> str:
    """Where the capacity came from, as a suffix for a decision's reason."""
    return f" [{capacity_source}]" if capacity_source else ""
