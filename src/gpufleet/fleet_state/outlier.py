"""Outlier detection in the manner of Envoy's: which failing replica to take out, for how
long, and when not to.

Two detectors, as Envoy's `outlier_detection`:
- consecutive failures: a replica whose last `consecutive_failures` requests all failed
  (5xx, reset, a stream cut or stalled: gateway failures) is ejected;
- success rate: every `interval_s`, among replicas that served at least
  `success_rate_request_volume` requests in the interval (and only when at least
  `success_rate_minimum_hosts` did), one whose success rate is below
  mean - `success_rate_stdev_factor` x stdev is ejected.

An ejection lasts `base_ejection_time_s` x the replica's number of ejections (capped at
`max_ejection_time_s`); the count drops by one for every interval the replica spends in
the pool without being ejected again. The floor: at most `max_ejection_percent` of the
replicas are ejected at once (Envoy's rule: the first ejection is always allowed), and
never a replica whose ejection would leave some model it serves in its pool without a
ready replica, so that overload, which makes every replica look bad at once, can never
empty the pool. What counts as a failure is the driver's call: failures of the gateway's
own making (its overload, a client that left) are not reported.

Pure: times come in as arguments.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from gpufleet.fleet_state.replica import FleetReplica
from gpufleet.routing.types import ReplicaState

R = TypeVar("R", bound=FleetReplica)


@dataclass(frozen=True, slots=True)
class OutlierConfig:
    consecutive_failures: int = 5
    base_ejection_time_s: float = 30.0
    max_ejection_time_s: float = 300.0
    max_ejection_percent: float = 50.0
    interval_s: float = 10.0
    success_rate_minimum_hosts: int = 5
    success_rate_request_volume: int = 100
    success_rate_stdev_factor: float = 1.9

    def ejection_time_s(self, ejections: int) -> float:
        """How long the `ejections`-th ejection of one replica lasts."""
        cap = max(self.base_ejection_time_s, self.max_ejection_time_s)
        return min(self.base_ejection_time_s * max(1, ejections), cap)


def may_eject(
    config: OutlierConfig, replica: FleetReplica, replicas: Iterable[FleetReplica]
) -> bool:
    """Whether ejecting `replica` now stays within the floor (see the module docstring)."""
    pool = [r for r in replicas if r.state in (ReplicaState.READY, ReplicaState.DEAD)]
    ejected = sum(1 for r in pool if r.ejected_until_s is not None)
    if ejected and 100.0 * (ejected + 1) / max(1, len(pool)) > config.max_ejection_percent:
        return False
    for model in replica.models:
        if not any(
            r is not replica
            and r.state is ReplicaState.READY
            and r.pool == replica.pool
            and model in r.models
            for r in pool
        ):
            return False  # the last ready replica of this model in its pool stays
    return True


def success_rate_outliers(config: OutlierConfig, replicas: Iterable[R]) -> list[R]:
    """The ready replicas whose success rate over the interval is an outlier."""
    volume = config.success_rate_request_volume
    sampled = [r for r in replicas
               if r.state is ReplicaState.READY and r.window_requests >= volume]  # fmt: skip
    if len(sampled) < max(1, config.success_rate_minimum_hosts):
        return []
    rates = [1.0 - r.window_failures / r.window_requests for r in sampled]
    mean = sum(rates) / len(rates)
    stdev = math.sqrt(sum((x - mean) ** 2 for x in rates) / len(rates))
    threshold = mean - config.success_rate_stdev_factor * stdev
    return [r for r, rate in zip(sampled, rates, strict=True) if rate < threshold]
