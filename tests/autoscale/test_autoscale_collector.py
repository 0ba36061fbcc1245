"""The autoscaler's /metrics series show every model group, parsed by Prometheus's own parser."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.autoscale.controller import Controller
from gpufleet.autoscale.decision import ReplicaBounds
from gpufleet.autoscale.metrics import AutoscaleCollector
from gpufleet.autoscale.policies import QueueDepthPolicy
from gpufleet.routing.types import ReplicaState

from .test_controller import RecordingActuator, gw_replica, managed, scripted


async def test_every_group_has_its_own_series() -> None:
    busy = {"queue_depth": 4, "in_flight_total": 16, "replicas": [gw_replica("a", 8, 8)]}
    idle = {"queue_depth": 0, "in_flight_total": 0, "replicas": [gw_replica("b", 0)]}
    chat = Controller(
        QueueDepthPolicy(ReplicaBounds(1, 8), 8), RecordingActuator([managed("a")]),
        scripted(busy),
    )  # fmt: skip
    small = Controller(
        QueueDepthPolicy(ReplicaBounds(1, 8), 8),
        RecordingActuator([managed("b"), managed("c", ReplicaState.STARTING)]),
        scripted(idle),
    )
    await chat.tick()
    registry = CollectorRegistry()
    registry.register(
        AutoscaleCollector([("chat", "big-model", chat), ("small", "small-model", small)])
    )
    families = {
        f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())
    }
    replicas = {
        (s.labels["group"], s.labels["model"], s.labels["state"]): s.value
        for s in families["gpufleet_autoscale_replicas"].samples
    }
    assert replicas[("chat", "big-model", "ready")] == 1
    assert replicas[("chat", "big-model", "starting")] == 2  # the scale-out just started
    assert replicas[("small", "small-model", "ready")] == 1
    assert replicas[("small", "small-model", "starting")] == 1
    desired = {
        s.labels["group"]: s.value for s in families["gpufleet_autoscale_desired_replicas"].samples
    }
    assert desired == {"chat": 3, "small": 0}  # small has not decided yet
    outs = {
        s.labels["group"]: s.value
        for s in families["gpufleet_autoscale_decisions"].samples
        if s.name.endswith("_total") and s.labels["direction"] == "out"
    }
    assert outs["chat"] == 1 and outs.get("small", 0) == 0
