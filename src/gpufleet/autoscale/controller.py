"""The controller: a thin loop — read signals, ask the policy, tell the actuator, log why.

One tick: the gateway's signals merged with the actuator's list become `FleetSignals`;
the policy returns a `ScalingDecision`; the difference from the current count becomes
`start(n)` or drains. Scale-in picks starting replicas first (they serve nothing yet), then
the ready replica with the fewest requests in flight. Every decision is kept (bounded) for
the admin API and the live view, and logged when it changes something or its verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, replace
from typing import Any

from gpufleet.autoscale.actuator import Actuator, ManagedReplica
from gpufleet.autoscale.decision import ScalingDecision, ScalingPolicy
from gpufleet.autoscale.gateway_link import fleet_signals
from gpufleet.autoscale.signals import FleetSignals
from gpufleet.fleet_state import GatewaySignals
from gpufleet.routing.types import ReplicaState

log = logging.getLogger("gpufleet.autoscale")

SignalReader = Callable[[], Awaitable[GatewaySignals]]


def scale_in_order(signals: FleetSignals, mine: set[str]) -> list[str]:
    """Which replicas to drain first (pure; the simulator uses it too): starting ones (they
    serve nothing yet; the one due last first: the others are closer to serving), then
    ready ones with the fewest requests."""
    due_last_first = sorted(
        (r for r in signals.starting if r.replica_id in mine),
        key=lambda r: (-(r.expected_ready_s if r.expected_ready_s is not None else math.inf),
                       r.replica_id),
    )  # fmt: skip
    starting = [r.replica_id for r in due_last_first]
    ready = sorted(
        (r for r in signals.ready if r.replica_id in mine),
        key=lambda r: (r.load, r.replica_id),
    )
    return starting + [r.replica_id for r in ready]


def undrain_order(signals: FleetSignals, mine: set[str]) -> list[str]:
    """Which draining replicas a scale-out returns to service first (pure; the simulator
    uses it too), before it starts any: they are warm, serving at once where a new one
    pays a cold start. The one with the most requests in flight first: it would stay up
    longest anyway (it stops only once they finish), so returning it saves the most GPU
    time of the drains, and its prefix cache is the fullest."""
    draining = [r for r in signals.in_state(ReplicaState.DRAINING) if r.replica_id in mine]
    return [r.replica_id for r in sorted(draining, key=lambda r: (-r.load, r.replica_id))]


class Controller:
    def __init__(
        self,
        policy: ScalingPolicy,
        actuator: Actuator,
        read_signals: SignalReader,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        history: int = 500,
    ) -> None:
        self.policy = policy
        self.actuator = actuator
        self.read_signals = read_signals
        self.interval_s = interval_s
        self.clock = clock
        self.decisions: deque[ScalingDecision] = deque(maxlen=history)
        self.changes: deque[ScalingDecision] = deque(maxlen=history)  # those with delta ≠ 0
        self.last_signals: FleetSignals | None = None
        # Monotonic counts of decisions (the deques above forget old ones): for /metrics.
        self.decision_counts: dict[str, int] = {"out": 0, "in": 0, "hold": 0}
        # Replicas scale-outs took back from draining instead of starting (no cold start).
        self.undrained = 0
        self._task: asyncio.Task[None] | None = None

    async def tick(self) -> ScalingDecision:
        gateway = await self.read_signals()
        managed = self.actuator.list()
        signals = fleet_signals(gateway, managed, self.actuator.observed_cold_start_s())
        self.last_signals = signals
        decision = self.policy.decide(self.clock(), signals)
        # A backend that cannot place a replica yet (Ray: a pending placement group) says
        # what is short and for how long, so the decision does not read as a silent hang.
        pending = getattr(self.actuator, "pending_reason", None)
        note = pending() if callable(pending) else None
        if note:
            decision = replace(decision, reason=f"{decision.reason}; {note}")
        self.decisions.append(decision)
        direction = "out" if decision.delta > 0 else "in" if decision.delta < 0 else "hold"
        self.decision_counts[direction] += 1
        if decision.delta != 0:
            self.changes.append(decision)
        self._log(decision)
        await self._apply(decision, signals, managed)
        return decision

    async def _apply(
        self, decision: ScalingDecision, signals: FleetSignals, managed: list[ManagedReplica]
    ) -> None:
        delta = decision.desired_replicas - signals.current_replicas
        if delta > 0:
            # Draining replicas first (warm, at once), where the backend can take one back.
            mine = {m.replica_id for m in managed}
            for replica_id in undrain_order(signals, mine)[:delta]:
                if await self.actuator.undrain(replica_id):
                    delta -= 1
                    self.undrained += 1
        if delta > 0:
            await self.actuator.start(delta)
        elif delta < 0:
            for replica_id in self._scale_in_order(signals, managed)[:-delta]:
                await self.actuator.drain(replica_id)

    @staticmethod
    def _scale_in_order(signals: FleetSignals, managed: list[ManagedReplica]) -> list[str]:
        return scale_in_order(signals, {m.replica_id for m in managed})

    def _log(self, decision: ScalingDecision) -> None:
        if decision.delta != 0:
            log.info(
                "scale %d → %d (%s): %s",
                decision.current_replicas,
                decision.desired_replicas,
                decision.policy,
                decision.reason,
            )
        else:
            log.debug(
                "hold %d (%s): %s", decision.current_replicas, decision.policy, decision.reason
            )

    async def run(self) -> None:
        while True:
            started = self.clock()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # keep controlling: a failed read is retried next tick
                log.exception("autoscale tick failed")
            await asyncio.sleep(max(0.0, self.interval_s - (self.clock() - started)))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="autoscaler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def to_json(self, last: int = 50) -> dict[str, Any]:
        """What the admin API serves: the policy, recent decisions, and the managed replicas."""
        return {
            "policy": self.policy.name,
            "interval_s": self.interval_s,
            "decisions": [asdict(d) for d in list(self.decisions)[-last:]],
            "changes": [asdict(d) for d in list(self.changes)[-last:]],
            "replicas": [m.to_json() for m in self.actuator.list()],
            "counts": {
                str(s): sum(1 for m in self.actuator.list() if m.state == s) for s in ReplicaState
            },
            "undrained": self.undrained,
        }
