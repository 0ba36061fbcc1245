"""The `default` policy's scale-in rule (`DefaultPolicy` holds one `ScaleIn`): remove replicas
only when N−1 would have held the recent peak and the arrival rate's line a cold start
ahead (with `batch_trend`, also the trend's highest forecast while its line rises), within
the SLOs, nothing saturated over the peak window, after a stabilization window and a
cooldown, no replica starting; then as many at once as N−k would have. Starting replicas
the demand no longer asks for are cancelled (`ScaleIn.cancel_starts`).

`ScaleIn` owns its clocks (since when the N−1 check has held, since when a start has not
been asked for); it reads the policy's demand estimates, bounds and settings through
`Readings` and changes nothing of it. Pure: readings in, a desired count and its reason
out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpufleet.autoscale.decision import ReplicaBounds
from gpufleet.autoscale.policies.scale_in import PeakLoad, latency_over_slo
from gpufleet.autoscale.policies.scale_in import n_minus_k_fits as fits_at_peak
from gpufleet.autoscale.signals import FleetSignals


class Readings(Protocol):
    """What scale-in reads of its policy (`DefaultPolicy`), read-only."""

    bounds: ReplicaBounds
    headroom_fraction: float
    kv_usage_threshold: float
    ttft_p90_slo_s: float | None
    tpot_p90_slo_s: float | None
    slo_attainment: float
    scale_in_stabilization_s: float
    scale_in_cooldown_s: float
    scale_in_many: bool
    cancel_idle_starts: bool

    def peak_s(self, cold_start_s: float) -> float: ...
    def saturated_ago_s(self, now_s: float) -> float | None: ...
    def changed_ago_s(self, now_s: float) -> float | None: ...
    def awaiting_measurement(self) -> bool: ...
    def demand_rising(self) -> bool: ...
    def peak_kv_total(self) -> float: ...
    def demand_to_hold(
        self, now_s: float, signals: FleetSignals, cold_start_s: float, hold: bool = True
    ) -> tuple[float, str]: ...


@dataclass(slots=True)
class ScaleIn:
    """The scale-in rule and its clocks."""

    ok_since_s: float | None = None  # the N−1 check has held since (stabilization)
    idle_start_since_s: float | None = None  # the starts have not been asked for since

    def reset(self) -> None:
        """A scale-out, or a forecast asking for more: the stabilization starts over."""
        self.ok_since_s = None

    def decide(
        self,
        p: Readings,
        now_s: float,
        signals: FleetSignals,
        cap: int,
        cold_start_s: float,
        head: str,
    ) -> tuple[int, str]:
        """The desired count when nothing calls for more replicas, and why."""
        current = signals.current_replicas
        if current <= p.bounds.min_replicas or len(signals.ready) - 1 < 0:
            self.ok_since_s = None
            return current, f"{head}; at minimum"
        if signals.starting:
            # While replicas start, the ready ones alone rarely hold the peak (the start was
            # for it): no scale-in of ready ones (through starts, as HPA does, measured no
            # gain on the Azure study: wave 13, docs/up.md). But a start the demand no
            # longer asks for is cancelled before it loads (`cancel_starts`).
            self.ok_since_s = None
            return self.cancel_starts(p, now_s, signals, cap, cold_start_s, head)
        if p.awaiting_measurement():
            # The configured capacity is a planner's: the fleet keeps its size until
            # its own latency under load says what a replica holds within the SLO.
            self.ok_since_s = None
            return current, f"{head}; capacity within the SLO not measured yet, no scale-in"
        peak_s = p.peak_s(cold_start_s)
        ago = p.saturated_ago_s(now_s)
        if ago is not None and ago < peak_s:
            # N replicas were saturated in the window: N−1 would have been worse, whatever
            # the averages say (routing is never perfectly even).
            self.ok_since_s = None
            return current, f"{head}; keep: saturated {ago:.0f} s ago (< {peak_s:g} s)"
        slos_s = (p.ttft_p90_slo_s, p.tpot_p90_slo_s)
        failing = latency_over_slo(signals, 1.0, p.slo_attainment, *slos_s)
        if failing:
            # The latency window already misses the SLO at its quantile (p99 for 99 % of
            # requests) while its p90 may be within: N−k would only miss it more.
            self.ok_since_s = None
            return current, f"{head}; keep: {failing}"
        fits, check = self.n_minus_k_fits(p, now_s, signals, cap, cold_start_s, 1)
        if not fits:
            self.ok_since_s = None
            return current, f"{head}; keep: {check}"
        if self.ok_since_s is None:
            self.ok_since_s = now_s
        held_s = now_s - self.ok_since_s
        stabilization_s = p.scale_in_stabilization_s
        if held_s < stabilization_s:
            return current, f"{head}; {check}, held {held_s:.0f}/{stabilization_s:g} s"
        if p.demand_rising():
            # Replicas removed while the demand rises come back a cold start late; the
            # check above stays held (a line through noise tilts up half the time).
            # With `scale_in_ahead` (the gateway counting admissions) the N−k check holds
            # the rate's line a cold start ahead instead, and this guard is off.
            return current, f"{head}; {check}, held {held_s:.0f} s; keep: demand rising"
        since_change = p.changed_ago_s(now_s)
        if since_change is not None and since_change < p.scale_in_cooldown_s:
            return (
                current,
                f"{head}; {check}, cooldown {since_change:.0f}/{p.scale_in_cooldown_s:g} s",
            )
        self.ok_since_s = None
        k = 1  # and as many more as the same check lets go (`scale_in_many`)
        while p.scale_in_many and k + 1 < len(signals.ready):
            more, why = self.n_minus_k_fits(p, now_s, signals, cap, cold_start_s, k + 1)
            if not more:
                break
            k, check = k + 1, why
        return current - k, f"{head}; scale in {k}: {check}, held {held_s:.0f} s"

    def cancel_starts(
        self,
        p: Readings,
        now_s: float,
        signals: FleetSignals,
        cap: int,
        cold_start_s: float,
        head: str,
    ) -> tuple[int, str]:
        """Starting replicas the demand no longer asks for, cancelled before they load (the
        controller drains starting ones first): Ray Serve's autoscaler stops pending replicas
        first when it scales down. A forecast spike in the quiet after a burst (in flight
        2 → 8 read as a ramp's start) started a replica that, once ready, was held a
        stabilization window: ~18 s of a replica for nothing (sim_vs_live, waves 18–19).

        Cancelled once one ready replica fewer than now would have held the demand a cold
        start ahead (scale-in's N−1 check: the forecast and the rate's line with headroom, KV,
        SLOs; not the trend's held peak, `trend_hold`, which holds the spike itself until the
        replica is ready) for half a cold start, nothing saturated over the peak window. One
        replica below the ready fleet, not at it: mid-ramp the forecast dips to what the ready
        ones just hold while a backlog drains, and climbs back. Half a cold start: a ramp's
        first seconds look like the quiet's bump, and a start cancelled there came back a cold
        start late (2 ticks: TTFT p99 +13 % over 30 replays; later, the cancel saves less
        than half the start; docs/up.md, wave 19)."""
        current = signals.current_replicas
        keep_why = f"{head}; replicas starting, no scale-in"
        ago = p.saturated_ago_s(now_s)
        saturated = ago is not None and ago < p.peak_s(cold_start_s)
        fits, check = False, ""
        ready_many = len(signals.ready) > 1
        if p.cancel_idle_starts and not saturated and not p.awaiting_measurement() and ready_many:
            fits, check = self.n_minus_k_fits(p, now_s, signals, cap, cold_start_s, 1, hold=False)
        if not fits:
            self.idle_start_since_s = None
            return current, keep_why
        if self.idle_start_since_s is None:
            self.idle_start_since_s = now_s
        held_s, wait_s = now_s - self.idle_start_since_s, cold_start_s / 2.0
        if held_s < wait_s:
            return current, f"{keep_why}; {check}, held {held_s:.0f}/{wait_s:g} s to cancel"
        self.idle_start_since_s = None
        n = len(signals.starting)
        return current - n, f"{head}; cancel {n} starting: {check}, held {held_s:.0f} s"

    @staticmethod
    def n_minus_k_fits(
        p: Readings,
        now_s: float,
        signals: FleetSignals,
        cap: int,
        cold_start_s: float,
        k: int,
        hold: bool = True,
    ) -> tuple[bool, str]:
        """Would N−k ready replicas have held the recent peak (`scale_in.n_minus_k_fits`)?"""
        worst, what = p.demand_to_hold(now_s, signals, cold_start_s, hold)
        peak = PeakLoad(worst, p.peak_kv_total(), p.peak_s(cold_start_s), what)
        slos_s = (p.ttft_p90_slo_s, p.tpot_p90_slo_s)
        return fits_at_peak(signals, k, peak, cap, p.headroom_fraction,
                            p.kv_usage_threshold, slos_s, p.slo_attainment)  # fmt: skip
