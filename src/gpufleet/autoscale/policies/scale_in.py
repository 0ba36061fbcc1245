"""The default policy's scale-in check: would N−k ready replicas have held the recent peak?
Pure: values in, a verdict and its reason out."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.autoscale.capacity import quantile_of
from gpufleet.autoscale.signals import FleetSignals


def latency_over_slo(
    signals: FleetSignals,
    load_factor: float,
    quantile: float,
    ttft_slo_s: float | None,
    tpot_slo_s: float | None,
) -> str:
    """Which SLO the window's latency at the SLO's quantile (p99 where 99 % of requests
    must meet it: its p90 may be within while 5 % miss) would miss with each replica
    holding `load_factor` times its load (1: now), in words ('' if none), taking latency
    as proportional to a replica's load (a bound for TPOT: a decode step's time is a
    fixed weight read plus a part that grows with the batch). The replicas' measured
    capacity, where the planner's is off; the warm headroom applies to it as to demand."""
    out = []
    for name, slo, window in (
        ("TTFT", ttft_slo_s, signals.ttft_s),
        ("TPOT", tpot_slo_s, signals.tpot_s),
    ):
        q = None if window is None else quantile_of(window, quantile) * load_factor
        if slo is not None and q is not None and q > slo:
            out.append(f"{name} p{quantile * 100:g} {q:.3g} s > SLO {slo:g} s")
    return " and ".join(out)


@dataclass(frozen=True, slots=True)
class PeakLoad:
    """What N−k replicas must hold: the demand to size for (in flight), the peak of the
    ready replicas' summed KV fractions, over `span_s`."""

    demand: float
    kv_total: float
    span_s: float
    what: str = "peak"  # what the demand is, in words


def n_minus_k_fits(
    signals: FleetSignals,
    k: int,
    peak: PeakLoad,
    cap: int,
    headroom: float,
    kv_threshold: float,
    slos_s: tuple[float | None, float | None],
    quantile: float = 0.9,
) -> tuple[bool, str]:
    """Would N−k ready replicas have stayed below the saturation thresholds at the peak
    (and within the latency SLOs, latency scaled by N/(N−k))?"""
    n_ready = len(signals.ready)
    n1 = n_ready - k
    worst = peak.demand
    if n1 <= 0:
        ok = worst == 0
        return ok, f"N−{k} = 0 {'fits' if ok else 'cannot hold'} peak demand {worst:.0f}"
    need = worst * (1.0 + headroom)
    kv_each = peak.kv_total / n1
    if need > n1 * cap:
        return False, f"N−{k} = {n1} × {cap} < {peak.what} {worst:.0f} + {headroom:.0%}"
    if kv_each >= kv_threshold:
        return False, f"N−{k} = {n1} would hold KV {kv_each:.0%} ≥ {kv_threshold:.0%}"
    over = latency_over_slo(signals, n_ready / n1 * (1.0 + headroom), quantile, *slos_s)
    if over:
        return False, f"N−{k} = {n1} would miss {over}"
    return True, (
        f"N−{k} = {n1} holds {peak.what} {worst:.0f} + {headroom:.0%} ≤ {n1 * cap} "
        f"and KV {kv_each:.0%} < {kv_threshold:.0%} over {peak.span_s:g} s"
    )
