"""The autoscaler on /metrics: replicas by state, the desired count, decisions over time.

`gpufleet up` registers this collector in its gateway's registry, so one scrape of the
gateway gives Grafana the fleet's size and every scaling decision next to the traffic.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.routing.types import ReplicaState

if TYPE_CHECKING:
    from gpufleet.autoscale.controller import Controller


class AutoscaleCollector(Collector):
    def __init__(self, controller: Controller):
        self.controller = controller

    def collect(self) -> Iterator[Metric]:
        c = self.controller
        policy = c.policy.name
        counts = {str(s): 0 for s in ReplicaState}
        for m in c.actuator.list():
            counts[str(m.state)] += 1
        replicas = GaugeMetricFamily(
            "gpufleet_autoscale_replicas",
            "Replicas the autoscaler manages, by state.",
            labels=["state"],
        )
        for state, n in counts.items():
            replicas.add_metric([state], n)
        yield replicas
        last = c.decisions[-1] if c.decisions else None
        desired = GaugeMetricFamily(
            "gpufleet_autoscale_desired_replicas",
            "Replicas (ready + starting) the policy wants, at its last decision.",
            labels=["policy"],
        )
        desired.add_metric([policy], last.desired_replicas if last else 0)
        yield desired
        decisions = CounterMetricFamily(
            "gpufleet_autoscale_decisions",
            "Scaling decisions by direction (out, in, hold).",
            labels=["policy", "direction"],
        )
        for direction, n in c.decision_counts.items():
            decisions.add_metric([policy, direction], n)
        yield decisions
