"""`kpa`: Knative's Pod Autoscaler on request concurrency.

As the published autoscaler does it: the observed concurrency is averaged over a 60 s
stable window and a 6 s panic window (10 % of it); desired = ceil(observed / target),
target = container concurrency target × target utilization (100 × 0.7 by default).
Both counts are bounded by the scale rates (up to 1000× the ready replicas, down to half
of them). Panic starts when the panic-window count reaches 200 % of the ready replicas;
while panicking the fleet never shrinks, and panic ends one stable window after the last
time it was over the threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpufleet.autoscale.decision import ReplicaBounds, ScalingDecision
from gpufleet.autoscale.forecast import WindowMean
from gpufleet.autoscale.signals import FleetSignals
from gpufleet.errors import UserError


@dataclass(slots=True)
class KpaPolicy:
    bounds: ReplicaBounds = field(default_factory=ReplicaBounds)
    target_per_replica: float = 100.0  # container-concurrency-target-default
    target_utilization: float = 0.7  # container-concurrency-target-percentage 70
    stable_window_s: float = 60.0
    panic_window_percent: float = 10.0
    panic_threshold_percent: float = 200.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    name: str = "kpa"
    _concurrency: WindowMean = field(default_factory=WindowMean)
    _panic_since_s: float | None = None  # last time the panic threshold was crossed
    _max_panic_replicas: int = 0

    def __post_init__(self) -> None:
        if self.target_per_replica <= 0 or not 0 < self.target_utilization <= 1:
            raise UserError(
                "target must be > 0 and utilization in (0, 1]",
                field="target_per_replica",
                fix="e.g. target_per_replica: 16, target_utilization: 0.7",
            )
        self._concurrency.window_s = self.stable_window_s

    @property
    def panic_window_s(self) -> float:
        return self.stable_window_s * self.panic_window_percent / 100.0

    @property
    def panicking(self) -> bool:
        return self._panic_since_s is not None

    def decide(self, now_s: float, signals: FleetSignals) -> ScalingDecision:
        current = signals.current_replicas
        self._concurrency.add(now_s, float(signals.demand))
        stable = self._concurrency.mean()
        panic = self._concurrency.mean(since_s=now_s - self.panic_window_s)
        if stable is None or panic is None:
            return ScalingDecision(current, "no data yet", self.name, now_s, current)
        target = self.target_per_replica * self.target_utilization
        ready = max(1, len(signals.ready))
        max_up = math.ceil(self.max_scale_up_rate * ready)
        max_down = math.floor(ready / self.max_scale_down_rate) if self.max_scale_down_rate else 0
        want_stable = min(max(math.ceil(stable / target), max_down), max_up)
        want_panic = min(max(math.ceil(panic / target), max_down), max_up)
        over = (panic / target) / ready >= self.panic_threshold_percent / 100.0

        if over:
            self._panic_since_s = now_s  # enter panic, or extend it
        elif (
            self._panic_since_s is not None and now_s >= self._panic_since_s + self.stable_window_s
        ):
            self._panic_since_s = None
            self._max_panic_replicas = 0

        head = (
            f"concurrency {stable:.1f} over {self.stable_window_s:g} s, {panic:.1f} over "
            f"{self.panic_window_s:g} s; target {target:g}/replica; {len(signals.ready)} ready"
        )
        if self._panic_since_s is not None:
            desired = max(want_panic, self._max_panic_replicas)  # never shrink while panicking
            self._max_panic_replicas = desired
            why = f"{head}; PANIC (≥{self.panic_threshold_percent:g}%): {want_panic} (held ≥ {desired})"
        else:
            desired = want_stable
            why = f"{head}; stable: {want_stable}"
        desired = self.bounds.clamp(desired)
        return ScalingDecision(desired, f"{why} → {desired}", self.name, now_s, current)
