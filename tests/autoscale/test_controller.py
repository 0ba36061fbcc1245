"""The controller loop with a scripted gateway and a recording actuator (pure: no processes).

The actuator here is a fake on purpose: this tests the controller's wiring only; the real
LocalProcessActuator has its own tests with real processes, and the fleet integration
test runs both together.
"""

from __future__ import annotations

from typing import Any

from gpufleet.autoscale.actuator import ManagedReplica
from gpufleet.autoscale.controller import Controller, scale_in_order
from gpufleet.autoscale.decision import ReplicaBounds
from gpufleet.autoscale.gateway_link import fleet_signals
from gpufleet.autoscale.policies import QueueDepthPolicy
from gpufleet.autoscale.signals import FleetSignals, ReplicaSignals
from gpufleet.fleet_state import GatewaySignals
from gpufleet.routing.types import ReplicaState


class RecordingActuator:
    def __init__(self, replicas: list[ManagedReplica]) -> None:
        self.replicas = replicas
        self.started: list[int] = []
        self.drained: list[str] = []

    async def start(self, n: int) -> list[ManagedReplica]:
        self.started.append(n)
        new = [
            ManagedReplica(f"new{i}", "http://x", ReplicaState.STARTING, 0.0, 10.0)
            for i in range(n)
        ]
        self.replicas += new
        return new

    async def undrain(self, replica_id: str) -> bool:
        return False  # (as Kubernetes: a scale-out starts new replicas)

    async def drain(self, replica_id: str) -> None:
        self.drained.append(replica_id)
        for r in self.replicas:
            if r.replica_id == replica_id:
                r.state = ReplicaState.DRAINING

    async def stop(self, replica_id: str) -> None:
        raise AssertionError("the controller drains; it never stops directly")

    def list(self) -> list[ManagedReplica]:
        return list(self.replicas)

    def observed_cold_start_s(self) -> float | None:
        return 7.5


def managed(rid: str, state: ReplicaState = ReplicaState.READY) -> ManagedReplica:
    return ManagedReplica(rid, f"http://{rid}", state, 0.0, 5.0)


def gw_replica(rid: str, running: int, waiting: int = 0, in_flight: int | None = None) -> dict:
    return {
        "id": rid,
        "url": f"http://{rid}",
        "state": "ready",
        "in_flight": running + waiting if in_flight is None else in_flight,
        "num_running": running,
        "num_waiting": waiting,
        "kv_cache_usage": 0.5,
    }


def scripted(*frames: dict[str, Any]):  # type: ignore[no-untyped-def]
    """A signal source answering these frames (the admin API's JSON) in turn."""
    frames_left = [GatewaySignals.from_json(f) for f in frames]

    async def read() -> GatewaySignals:
        return frames_left.pop(0) if len(frames_left) > 1 else frames_left[0]

    return read


async def test_scale_out_starts_the_difference_and_records_the_reason() -> None:
    act = RecordingActuator([managed("a")])
    frame = {"queue_depth": 4, "in_flight_total": 16, "replicas": [gw_replica("a", 8, 8)]}
    ctl = Controller(QueueDepthPolicy(ReplicaBounds(1, 8), 8), act, scripted(frame))
    d = await ctl.tick()
    assert d.desired_replicas == 3 and d.current_replicas == 1  # (16 + 4) / 8
    assert act.started == [2]
    assert "pending 20" in ctl.to_json()["decisions"][-1]["reason"]
    # Next tick: the two new replicas are starting and count; nothing more is started.
    await ctl.tick()
    assert act.started == [2]


async def test_scale_in_drains_starting_first_then_least_loaded() -> None:
    act = RecordingActuator(
        [managed("a"), managed("b"), managed("c"), managed("s", ReplicaState.STARTING)]
    )
    frame = {
        "queue_depth": 0,
        "in_flight_total": 5,
        "replicas": [gw_replica("a", 3), gw_replica("b", 0), gw_replica("c", 2)],
    }
    ctl = Controller(QueueDepthPolicy(ReplicaBounds(1, 8), 8), act, scripted(frame))
    d = await ctl.tick()
    assert d.desired_replicas == 1 and d.current_replicas == 4
    assert act.drained == ["s", "b", "c"]


def test_scale_in_gives_up_the_starting_replica_due_last_first() -> None:
    # The one due soonest is closest to serving; one in a crash's backoff is furthest.
    s = FleetSignals(
        replicas=(
            ReplicaSignals("a", ReplicaState.READY, 1, 0, 0.1, 1),
            ReplicaSignals("s1", ReplicaState.STARTING, expected_ready_s=30.0),
            ReplicaSignals("s2", ReplicaState.STARTING, expected_ready_s=90.0),
            ReplicaSignals("s3", ReplicaState.STARTING, expected_ready_s=60.0),
        )
    )
    assert scale_in_order(s, {"a", "s1", "s2", "s3"}) == ["s2", "s3", "s1", "a"]


def test_fleet_signals_merge_gateway_and_actuator_views() -> None:
    raw = {
        "queue_depth": 2,
        "in_flight_total": 9,
        "window_s": 30,
        "ttft_s": {"p50": 0.1, "p90": 0.4, "p99": None},
        "tpot_s": {"p50": None, "p90": None, "p99": None},
        "replicas": [
            gw_replica("a", 4, 1),
            gw_replica("b", 4) | {"state": "dead"},  # ejected by health checks
            gw_replica("d", 0),  # draining per the actuator
            gw_replica("x", 0) | {"state": "starting"},  # registered, probe not passed yet
        ],
    }
    mine = [
        managed("a"),
        managed("d", ReplicaState.DRAINING),
        managed("n", ReplicaState.STARTING),  # not registered until /health passes
    ]
    s = fleet_signals(GatewaySignals.from_json(raw), mine, cold_start_s=12.0)
    states = {r.replica_id: r.state for r in s.replicas}
    assert states == {
        "a": ReplicaState.READY,
        "b": ReplicaState.DEAD,
        "d": ReplicaState.DRAINING,
        "x": ReplicaState.STARTING,
        "n": ReplicaState.STARTING,
    }
    assert s.current_replicas == 3  # a + x + n
    assert s.waiting == 1 + 2
    assert s.ttft_s is not None and s.ttft_s.p90_s == 0.4 and s.ttft_s.p99_s == 0.4
    assert s.tpot_s is None
    assert s.cold_start_s == 12.0
    assert [r.expected_ready_s for r in s.replicas if r.replica_id == "n"] == [5.0]


class UndrainingActuator(RecordingActuator):
    """One that can take a draining replica back (as `ActuatorBase` does)."""

    def __init__(self, replicas: list[ManagedReplica]) -> None:
        super().__init__(replicas)
        self.undrained: list[str] = []

    async def undrain(self, replica_id: str) -> bool:
        for r in self.replicas:
            if r.replica_id == replica_id and r.state == ReplicaState.DRAINING:
                r.state = ReplicaState.READY
                self.undrained.append(replica_id)
                return True
        return False


async def test_scale_out_takes_draining_replicas_back_before_starting_any() -> None:
    act = UndrainingActuator(
        [managed("a"), managed("d1", ReplicaState.DRAINING), managed("d2", ReplicaState.DRAINING)]
    )
    frame = {
        "queue_depth": 12,
        "in_flight_total": 28,
        "replicas": [gw_replica("a", 8, 8), gw_replica("d1", 1), gw_replica("d2", 3)],
    }
    ctl = Controller(QueueDepthPolicy(ReplicaBounds(1, 8), 8), act, scripted(frame))
    d = await ctl.tick()
    assert d.current_replicas == 1 and d.desired_replicas == 5  # (28 + 12) / 8
    # Both drains are cancelled (the busiest first), and only the rest start cold.
    assert act.undrained == ["d2", "d1"]
    assert act.started == [2]
    assert ctl.undrained == 2 and ctl.to_json()["undrained"] == 2


async def test_a_backend_that_cannot_take_a_drain_back_starts_as_before() -> None:
    act = RecordingActuator([managed("a"), managed("d1", ReplicaState.DRAINING)])
    frame = {"queue_depth": 4, "in_flight_total": 16,
             "replicas": [gw_replica("a", 8, 8), gw_replica("d1", 2)]}  # fmt: skip
    ctl = Controller(QueueDepthPolicy(ReplicaBounds(1, 8), 8), act, scripted(frame))
    await ctl.tick()
    assert act.started == [2] and ctl.undrained == 0
