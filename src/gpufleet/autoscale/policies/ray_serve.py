"""`ray_serve`: Ray Serve's default policy (python/ray/serve/autoscaling_policy.py).

desired = total ongoing requests (averaged over a look-back window) / target_ongoing_requests;
the step from the running replicas is multiplied by the up- or down-scaling smoothing
factor (a down-step that rounds to nothing still removes one); bounded by min/max; and a
change is made only once the same direction has been wanted for upscale_delay_s (30 s) or
downscale_delay_s (600 s) in a row — Ray counts control-loop ticks, here it is measured
in seconds so any tick rate gives the same delays. With no running replica and requests
waiting it scales up at once (Ray's cold-start fast path).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpufleet.autoscale.decision import ReplicaBounds, ScalingDecision
from gpufleet.autoscale.forecast import WindowMean
from gpufleet.autoscale.signals import FleetSignals
from gpufleet.errors import UserError


@dataclass(slots=True)
class RayServePolicy:
    bounds: ReplicaBounds = field(default_factory=ReplicaBounds)
    target_ongoing_requests: float = 2.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    upscaling_factor: float = 1.0
    downscaling_factor: float = 1.0
    look_back_period_s: float = 30.0
    name: str = "ray_serve"
    _ongoing: WindowMean = field(default_factory=WindowMean)
    _target: int | None = None  # Ray's target_num_replicas: the last decision
    _direction: int = 0  # +1 up, -1 down, 0 none: what the last ticks wanted
    _direction_since_s: float = 0.0

    def __post_init__(self) -> None:
        if self.target_ongoing_requests <= 0:
            raise UserError(
                "must be > 0", field="target_ongoing_requests", fix="Ray's default is 2"
            )
        self._ongoing.window_s = self.look_back_period_s

    def decide(self, now_s: float, signals: FleetSignals) -> ScalingDecision:
        current = signals.current_replicas
        running = len(signals.ready)
        target_now = current if self._target is None else self._target
        self._ongoing.add(now_s, float(signals.demand))
        total = self._ongoing.mean() or 0.0

        if running == 0:
            if total > 0:
                desired = self.bounds.clamp(max(math.ceil(self.upscaling_factor), target_now))
                self._set(desired, 0, now_s)
                return ScalingDecision(
                    desired,
                    f"no running replica and {total:.1f} requests: cold start → {desired}",
                    self.name,
                    now_s,
                    current,
                )
            self._set(target_now, 0, now_s)
            return ScalingDecision(
                self.bounds.clamp(target_now),
                "no running replica, no requests",
                self.name,
                now_s,
                current,
            )

        wanted = total / self.target_ongoing_requests
        delta = wanted - running
        factor = self.upscaling_factor if delta > 0 else self.downscaling_factor
        scaled = math.ceil(running + factor * delta)
        if math.ceil(wanted) < running and scaled == running:
            scaled -= 1
        bounded = self.bounds.clamp(scaled)
        head = (
            f"ongoing {total:.1f} (mean {self.look_back_period_s:g} s) / target "
            f"{self.target_ongoing_requests:g} = {wanted:.2f}; smoothed {scaled}, bounded {bounded}"
        )

        direction = (bounded > target_now) - (bounded < target_now)
        if direction != self._direction:
            self._direction, self._direction_since_s = direction, now_s
        held_s = now_s - self._direction_since_s
        if direction > 0 and held_s >= self.upscale_delay_s:
            self._set(bounded, 0, now_s)
            why = f"{head}; up wanted {held_s:.0f} s ≥ {self.upscale_delay_s:g} s"
        elif direction < 0 and held_s >= self.downscale_delay_s:
            self._set(bounded, 0, now_s)
            why = f"{head}; down wanted {held_s:.0f} s ≥ {self.downscale_delay_s:g} s"
        elif direction != 0:
            delay = self.upscale_delay_s if direction > 0 else self.downscale_delay_s
            self._target = target_now
            why = f"{head}; {'up' if direction > 0 else 'down'} wanted {held_s:.0f} s < {delay:g} s, hold"
        else:
            self._target = target_now
            why = f"{head}; at target"
        desired = self._target if self._target is not None else target_now
        return ScalingDecision(desired, f"{why} → {desired}", self.name, now_s, current)

    def _set(self, target: int, direction: int, now_s: float) -> None:
        self._target, self._direction, self._direction_since_s = target, direction, now_s
