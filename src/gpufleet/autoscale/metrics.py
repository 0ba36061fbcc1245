"""The autoscaler on /metrics: replicas by state, the desired count, decisions over time.

`gpufleet up` registers this collector in its gateway's registry, so one scrape of the
gateway gives Grafana the fleet's size and every scaling decision next to the traffic.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.routing.types import ReplicaState

if TYPE_CHECKING:
    from gpufleet.autoscale.controller import Controller


class AutoscaleCollector(Collector):
    """Every model group's autoscaler: each series carries the group and its model.

    One fleet may run several groups (`groups:` in the fleet YAML), each with its own
    controller; a scrape must show all of them, not the first only.
    """

    def __init__(self, groups: Sequence[tuple[str, str, Controller]]):
        self.groups = list(groups)

    def collect(self) -> Iterator[Metric]:
        labels = ["group", "model"]
        replicas = GaugeMetricFamily(
            "gpufleet_autoscale_replicas",
            "Replicas the autoscaler manages, by state.",
            labels=[*labels, "state"],
        )
        desired = GaugeMetricFamily(
            "gpufleet_autoscale_desired_replicas",
            "Replicas (ready + starting) the policy wants, at its last decision.",
            labels=[*labels, "policy"],
        )
        decisions = CounterMetricFamily(
            "gpufleet_autoscale_decisions",
            "Scaling decisions by direction (out, in, hold).",
            labels=[*labels, "policy", "direction"],
        )
        undrained = CounterMetricFamily(
            "gpufleet_autoscale_undrained_replicas",
            "Draining replicas a scale-out took back into service (warm, no cold start).",
            labels=[*labels, "policy"],
        )
        for group, model, c in self.groups:
            policy = c.policy.name
            undrained.add_metric([group, model, policy], c.undrained)
            counts = {str(s): 0 for s in ReplicaState}
            for m in c.actuator.list():
                counts[str(m.state)] += 1
            for state, n in counts.items():
                replicas.add_metric([group, model, state], n)
            last = c.decisions[-1] if c.decisions else None
            desired.add_metric([group, model, policy], last.desired_replicas if last else 0)
            for direction, n in c.decision_counts.items():
                decisions.add_metric([group, model, policy, direction], n)
        yield replicas
        yield desired
        yield decisions
        yield undrained
