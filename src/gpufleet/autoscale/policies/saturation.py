"""The default policy's saturation signals: requests waiting for a batch slot, KV-cache
pressure, latency over its SLO. Pure: values in, the reasons (empty: not saturated) out."""

from __future__ import annotations

from gpufleet.autoscale.signals import FleetSignals


def saturation_reasons(
    signals: FleetSignals,
    waiting: int,
    kv_threshold: float,
    ttft_p90_slo_s: float | None,
    tpot_p90_slo_s: float | None,
) -> str:
    """Why the fleet is saturated now, in words: `waiting` requests that persisted (the
    caller's streaks decide which), the ready replicas' mean KV usage over its threshold,
    or the window's TTFT or TPOT p90 over its SLO."""
    reasons = []
    if waiting > 0:
        reasons.append(f"{waiting} waiting")
    ready = signals.ready
    if ready:
        kv_mean = sum(r.kv_usage for r in ready) / len(ready)
        if kv_mean >= kv_threshold:
            reasons.append(f"KV {kv_mean:.0%} ≥ {kv_threshold:.0%}")
    ttft, tpot = signals.ttft_s, signals.tpot_s
    if ttft_p90_slo_s is not None and ttft is not None and ttft.p90_s > ttft_p90_slo_s:
        reasons.append(f"TTFT p90 {ttft.p90_s:.2f} s > SLO {ttft_p90_slo_s:g} s")
    if tpot_p90_slo_s is not None and tpot is not None and tpot.p90_s > tpot_p90_slo_s:
        reasons.append(f"TPOT p90 {tpot.p90_s * 1000:.0f} ms > SLO {tpot_p90_slo_s * 1000:g} ms")
    return ", ".join(reasons)
