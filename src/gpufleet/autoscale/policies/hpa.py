"""`hpa`: Kubernetes HorizontalPodAutoscaler v2, on a per-replica concurrency metric.

Follows the published controller (pkg/controller/podautoscaler) step by step:
1. replica calculation: ratio = average metric over ready replicas / target; inside the
   tolerance (0.1) nothing changes; replicas without metrics yet (starting) count as 0 on
   a scale-up and as exactly the target on a scale-down, and if that flips the direction
   or lands inside the tolerance nothing changes; else desired = ceil(ratio × replicas).
2. stabilization: the recommendation is the highest of the last 300 s when going down and
   the lowest of the last 0 s when going up (default behavior).
3. rate policies: up by at most max(100 %, 4 replicas) per 15 s counted from the replicas
   of the period's start; down by at most 100 % per 15 s.
The metric is requests in the system per replica (what a Pods metric for "in-flight
requests" would show), never CPU.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from gpufleet.autoscale.decision import ReplicaBounds, ScalingDecision
from gpufleet.autoscale.signals import FleetSignals
from gpufleet.errors import UserError


@dataclass(slots=True)
class HpaPolicy:
    bounds: ReplicaBounds = field(default_factory=ReplicaBounds)
    target_per_replica: float = 16.0  # target average requests per replica
    tolerance: float = 0.1
    scale_up_stabilization_s: float = 0.0
    scale_down_stabilization_s: float = 300.0
    scale_up_percent: float = 100.0
    scale_up_pods: int = 4
    scale_up_period_s: float = 15.0
    scale_down_percent: float = 100.0
    scale_down_period_s: float = 15.0
    name: str = "hpa"
    _recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    _events: deque[tuple[float, int]] = field(default_factory=deque)  # (time, replica change)

    def __post_init__(self) -> None:
        if self.target_per_replica <= 0:
            raise UserError("must be > 0", field="target_per_replica", fix="e.g. 16")
        if not 0 <= self.tolerance < 1:
            raise UserError("must be in [0, 1)", field="tolerance", fix="Kubernetes uses 0.1")

    def decide(self, now_s: float, signals: FleetSignals) -> ScalingDecision:
        current = signals.current_replicas
        raw, why = self._replica_calculation(signals)
        stabilized = self._stabilize(now_s, current, raw)
        limited, limit_why = self._rate_limit(now_s, current, stabilized)
        desired = self.bounds.clamp(limited)
        if desired != current:
            self._events.append((now_s, desired - current))
        reason = f"{why}; stabilized {stabilized}"
        if limit_why:
            reason += f"; {limit_why}"
        reason += f" → {desired}"
        return ScalingDecision(desired, reason, self.name, now_s, current)

    def _replica_calculation(self, signals: FleetSignals) -> tuple[int, str]:
        current = signals.current_replicas
        ready = len(signals.ready)
        missing = len(signals.starting)
        if ready == 0:
            return current, "no metrics from ready replicas, keep current"
        total = float(signals.demand)
        ratio = total / ready / self.target_per_replica
        head = f"{total:.0f} requests / {ready} ready = {total / ready:.1f} vs target {self.target_per_replica:g} (ratio {ratio:.2f})"
        if missing == 0:
            if abs(ratio - 1.0) <= self.tolerance:
                return current, f"{head} within tolerance {self.tolerance:g}"
            return math.ceil(ratio * ready), head
        if abs(ratio - 1.0) <= self.tolerance:
            return current, f"{head} within tolerance {self.tolerance:g}"
        scale_up = ratio > 1.0
        if not scale_up:
            total += self.target_per_replica * missing  # missing pods assumed at target
        new_ratio = total / (ready + missing) / self.target_per_replica
        head += (
            f"; with {missing} starting counted as {'0' if scale_up else 'target'}: {new_ratio:.2f}"
        )
        if abs(new_ratio - 1.0) <= self.tolerance or (new_ratio > 1.0) != scale_up:
            return current, f"{head}, no change"
        return math.ceil(new_ratio * (ready + missing)), head

    def _stabilize(self, now_s: float, current: int, raw: int) -> int:
        self._recommendations.append((now_s, raw))
        horizon = max(self.scale_up_stabilization_s, self.scale_down_stabilization_s)
        while self._recommendations and self._recommendations[0][0] < now_s - horizon:
            self._recommendations.popleft()
        up = min(
            (r for t, r in self._recommendations if t >= now_s - self.scale_up_stabilization_s),
            default=raw,
        )
        down = max(
            (r for t, r in self._recommendations if t >= now_s - self.scale_down_stabilization_s),
            default=raw,
        )
        recommendation = current
        if recommendation < up:
            recommendation = up
        if recommendation > down:
            recommendation = down
        return recommendation

    def _rate_limit(self, now_s: float, current: int, desired: int) -> tuple[int, str]:
        horizon = max(self.scale_up_period_s, self.scale_down_period_s)
        while self._events and self._events[0][0] <= now_s - horizon:
            self._events.popleft()
        if desired > current:
            added = sum(d for t, d in self._events if d > 0 and t > now_s - self.scale_up_period_s)
            start = current - added
            limit = max(
                math.ceil(start * (1 + self.scale_up_percent / 100.0)), start + self.scale_up_pods
            )
            if desired > limit:
                return limit, f"scale-up policy limits to {limit} per {self.scale_up_period_s:g} s"
        elif desired < current:
            removed = -sum(
                d for t, d in self._events if d < 0 and t > now_s - self.scale_down_period_s
            )
            start = current + removed
            limit = math.ceil(start * (1 - self.scale_down_percent / 100.0))
            if desired < limit:
                return (
                    limit,
                    f"scale-down policy limits to {limit} per {self.scale_down_period_s:g} s",
                )
        return desired, ""
