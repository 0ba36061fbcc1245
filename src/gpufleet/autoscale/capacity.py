"""What one replica holds within the latency SLO, measured on the fleet itself.

A planner's capacity (requests in flight whose *mean* TTFT and TPOT meet the SLO, for a
closed batch) is optimistic for an open arrival stream: prompts' prefill chunks share
steps with decodes, and a request that must meet the SLO is judged at the tail (p90 of a
window, or 99 % of requests), not the mean. So the policy measures it where it runs:

    in flight per replica at the SLO  ≈  ℓ̄ × SLO / latency_q

with ℓ̄ the mean in-flight requests per ready replica over the gateway's latency window
and latency_q that window's quantile (p90, or p99 when 99 % of requests must meet it).
Latency taken as proportional to a replica's load is a bound (a decode step is a fixed
weight read plus a part that grows with the batch), so at low load the estimate errs low
(more replicas); sized with headroom h on it, the fleet settles where latency_q is
SLO × (1 − h)-ish whatever the model's error, since an estimate that is off moves the
load, and the load moves the latency the next estimate reads. Pure: samples come in with
their timestamps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gpufleet.autoscale.forecast import WindowMean, WindowMedian
from gpufleet.autoscale.signals import FleetSignals, Percentiles


def quantile_of(p: Percentiles, quantile: float) -> float:
    """The window's latency at the SLO's quantile (p90, or p99 for ≥ 99 % of requests)."""
    return p.p99_s if quantile >= 0.99 else p.p90_s


@dataclass(slots=True)
class SloCapacity:
    """Requests in flight per replica at the latency SLO, from the fleet's own latency."""

    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    quantile: float = 0.9  # of requests that must meet the SLO
    window_s: float = 60.0  # the gateway's latency window: ℓ̄ is averaged over the same
    smooth_s: float = 120.0  # median of the per-tick estimates over this long
    min_requests: int = 50  # a window with fewer requests says little about its tail
    # A window whose latency is at least this fraction of the SLO measures the capacity
    # (a short extrapolation); one below it only bounds it from below: part of a tail
    # latency does not grow with load (a short answer's TPOT is one long prompt's
    # prefill chunk), so latency ∝ load errs low the further it extrapolates.
    at_load_fraction: float = 0.7
    _load: WindowMean = field(default_factory=WindowMean)
    _since_s: float | None = None
    _bounds: WindowMedian = field(default_factory=WindowMedian)
    _at_load: deque[float] = field(default_factory=deque)

    def add(self, now_s: float, signals: FleetSignals, requests_in_window: int | None) -> None:
        ready = len(signals.ready)
        if ready == 0:
            return
        window_s = signals.window_s or self.window_s
        self._load.window_s = window_s
        self._bounds.window_s = self.smooth_s
        self._load.add(now_s, signals.demand / ready)
        if self._since_s is None:
            self._since_s = now_s
        load = self._load.mean() or 0.0
        if load <= 0 or requests_in_window is None or requests_in_window < self.min_requests:
            return  # a tail over few (or an unknown number of) requests says little
        if now_s - self._since_s < window_s:
            return  # the load has not been seen over the whole latency window yet
        ratios = [
            slo / quantile_of(p, self.quantile)
            for slo, p in ((self.ttft_slo_s, signals.ttft_s), (self.tpot_slo_s, signals.tpot_s))
            if slo is not None and p is not None and quantile_of(p, self.quantile) > 0
        ]
        if not ratios:
            return
        estimate = load * min(ratios)
        self._bounds.add(now_s, estimate)
        if 1.0 / min(ratios) >= self.at_load_fraction:
            self._at_load.append(estimate)
            while len(self._at_load) > max(1, int(self.smooth_s)):
                self._at_load.popleft()

    def estimate(self) -> float | None:
        """In flight per replica at the SLO (None: no latency measured under load yet):
        the median of the recent windows measured near the SLO, or of the lower bounds
        where these are higher (the replicas hold more now than when last loaded)."""
        bound = self._bounds.median()
        if not self._at_load:
            return bound
        at_load = sorted(self._at_load)[len(self._at_load) // 2]
        return at_load if bound is None else max(at_load, bound)
