"""The `default` policy's scale-in rule (`DefaultPolicy` delegates to it): remove replicas
only when N−1 would have held the recent peak and the arrival rate's line a cold start
ahead (with `batch_trend`, also the trend's highest forecast while its line rises), within
the SLOs, nothing saturated over the peak window, after a stabilization window and a
cooldown, no replica starting; then as many at once as N−k would have.
Pure: the policy's state in, a desired count and its reason out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.autoscale.policies.scale_in import PeakLoad, latency_over_slo
from gpufleet.autoscale.policies.scale_in import n_minus_k_fits as fits_at_peak
from gpufleet.autoscale.signals import FleetSignals

if TYPE_CHECKING:
    from gpufleet.autoscale.policies.default import DefaultPolicy


def maybe_scale_in(
    p: DefaultPolicy, now_s: float, signals: FleetSignals, cap: int, cold_start_s: float, head: str
) -> tuple[int, str]:
    """The desired count when nothing calls for more replicas, and why."""
    current = signals.current_replicas
    n_minus_1 = len(signals.ready) - 1
    if current <= p.bounds.min_replicas or n_minus_1 < 0:
        p._n1_ok_since_s = None
        return current, f"{head}; at minimum"
    if signals.starting:
        # While replicas start, the ready ones alone rarely hold the peak (the start was
        # for it): no scale-in of ready ones (through starts, as HPA does, measured no
        # gain on the Azure study: wave 13, docs/up.md). But a start the demand no longer
        # asks for is cancelled before it loads (`cancel_starts`).
        p._n1_ok_since_s = None
        return cancel_starts(p, now_s, signals, cap, cold_start_s, head)
    if p._measuring and p.measured_capacity() is None:
        # The configured capacity is a planner's: the fleet keeps its size until
        # its own latency under load says what a replica holds within the SLO.
        p._n1_ok_since_s = None
        return current, f"{head}; capacity within the SLO not measured yet, no scale-in"
    peak_s = p.peak_s(cold_start_s)
    if p._last_saturated_s is not None and now_s - p._last_saturated_s < peak_s:
        # N replicas were saturated in the window: N−1 would have been worse, whatever
        # the averages say (routing is never perfectly even).
        p._n1_ok_since_s = None
        ago = now_s - p._last_saturated_s
        return current, f"{head}; keep: saturated {ago:.0f} s ago (< {peak_s:g} s)"
    slos_s = (p.ttft_p90_slo_s, p.tpot_p90_slo_s)
    failing = latency_over_slo(signals, 1.0, p.slo_attainment, *slos_s)
    if failing:
        # The latency window already misses the SLO at its quantile (p99 for 99 % of
        # requests) while its p90 may be within: N−k would only miss it more.
        p._n1_ok_since_s = None
        return current, f"{head}; keep: {failing}"
    fits, check = n_minus_k_fits(p, now_s, signals, cap, cold_start_s, 1)
    if not fits:
        p._n1_ok_since_s = None
        return current, f"{head}; keep: {check}"
    if p._n1_ok_since_s is None:
        p._n1_ok_since_s = now_s
    held_s = now_s - p._n1_ok_since_s
    if held_s < p.scale_in_stabilization_s:
        return (
            current,
            f"{head}; {check}, held {held_s:.0f}/{p.scale_in_stabilization_s:g} s",
        )
    if demand_rising(p):
        # Replicas removed while the demand rises come back a cold start late; the
        # check above stays held (a line through noise tilts up half the time).
        # With `scale_in_ahead` (the gateway counting admissions) the N−k check holds
        # the rate's line a cold start ahead instead, and this guard is off.
        return current, f"{head}; {check}, held {held_s:.0f} s; keep: demand rising"
    since_change = None if p._last_change_s is None else now_s - p._last_change_s
    if since_change is not None and since_change < p.scale_in_cooldown_s:
        return (
            current,
            f"{head}; {check}, cooldown {since_change:.0f}/{p.scale_in_cooldown_s:g} s",
        )
    p._n1_ok_since_s = None
    k = 1  # and as many more as the same check lets go (`scale_in_many`)
    while p.scale_in_many and k + 1 < len(signals.ready):
        more, why = n_minus_k_fits(p, now_s, signals, cap, cold_start_s, k + 1)
        if not more:
            break
        k, check = k + 1, why
    return current - k, f"{head}; scale in {k}: {check}, held {held_s:.0f} s"


def cancel_starts(
    p: DefaultPolicy, now_s: float, signals: FleetSignals, cap: int, cold_start_s: float, head: str
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
    peak_s = p.peak_s(cold_start_s)
    saturated = p._last_saturated_s is not None and now_s - p._last_saturated_s < peak_s
    unmeasured = p._measuring and p.measured_capacity() is None
    fits, check = False, ""
    if p.cancel_idle_starts and not saturated and not unmeasured and len(signals.ready) > 1:
        fits, check = n_minus_k_fits(p, now_s, signals, cap, cold_start_s, 1, hold=False)
    if not fits:
        p._cancel_since_s = None
        return current, keep_why
    if p._cancel_since_s is None:
        p._cancel_since_s = now_s
    held_s, wait_s = now_s - p._cancel_since_s, cold_start_s / 2.0
    if held_s < wait_s:
        return current, f"{keep_why}; {check}, held {held_s:.0f}/{wait_s:g} s to cancel"
    p._cancel_since_s = None
    starting = len(signals.starting)
    return current - starting, f"{head}; cancel {starting} starting: {check}, held {held_s:.0f} s"


def demand_rising(p: DefaultPolicy) -> bool:
    """The arrival rate's line over a cold start slopes up (else the in-flight one's)."""
    if p._little.known:
        return not p.scale_in_ahead and p._little.rate_rising()
    return p._trend.rising()


def trend_hold(p: DefaultPolicy) -> float | None:
    """With `batch_trend`, the highest in-flight forecast of the peak window while the
    in-flight line over the trend window still slopes up (None otherwise): HPA's scale-down
    stabilization (the highest recommendation of the window) applied to the trend. Its
    forecast, a short line carried a cold start ahead, dips mid-ramp whenever a backlog
    drains; N−k held only against the forecast now removed the replicas it had just
    started, to start them again a cold start later (sim_vs_live: 5 → 3 → 6 around the
    burst). Once the line turns down (the ramp's top passed), the hold lets go, so a burst's
    last forecasts do not keep its fleet through the quiet that follows."""
    if not p._batch_trend_on() or not p._trend.rising():
        return None
    return p._trend_peak.peak()


def worst_demand(
    p: DefaultPolicy, now_s: float, signals: FleetSignals, cold_start_s: float, hold: bool = True
) -> tuple[float, str]:
    """The demand fewer replicas must hold, and what it is in words (`hold`: with the
    trend's held peak while the in-flight line rises)."""
    what = "peak"
    if p._little.known:
        worst = p.expected_demand(now_s, signals.demand, cold_start_s)
        # The demand when a replica removed now could be back: the rate's line there.
        ahead = p._little.in_flight_ahead(now_s + cold_start_s)
        if p.scale_in_ahead and ahead is not None and ahead > worst:
            worst, what = ahead, f"rising rate in {cold_start_s:.0f} s"
        held = trend_hold(p) if hold else None
        if held is not None and held > worst:
            worst, what = held, "the trend's peak while demand rises"
    else:
        forecast = p.forecast(now_s + cold_start_s) or 0.0
        worst = max(p._peak_demand.peak(), forecast)
    return worst, what


def n_minus_k_fits(
    p: DefaultPolicy,
    now_s: float,
    signals: FleetSignals,
    cap: int,
    cold_start_s: float,
    k: int,
    hold: bool = True,
) -> tuple[bool, str]:
    """Would N−k ready replicas have held the recent peak (`scale_in.n_minus_k_fits`)?"""
    worst, what = worst_demand(p, now_s, signals, cold_start_s, hold)
    peak = PeakLoad(worst, p._peak_kv_total.peak(), p.peak_s(cold_start_s), what)
    slos_s = (p.ttft_p90_slo_s, p.tpot_p90_slo_s)
    return fits_at_peak(signals, k, peak, cap, p.headroom_fraction,
                          p.kv_usage_threshold, slos_s, p.slo_attainment)  # fmt: skip
