"""The default policy's saturation signals: requests waiting for a batch slot, KV-cache
pressure, latency over its SLO. Pure: values in, the reasons (empty: not saturated) out."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.autoscale.signals import FleetSignals, ReplicaSignals


@dataclass(slots=True)
class Streak:
    """One replica's run of ticks with requests waiting."""

    since_s: float
    ticks: int = 0
    # (time, running) on the run's ticks, learned from only once the run counts as
    # saturation (the policy's `_track_waiting`); a run that never does teaches nothing.
    pending: list[tuple[float, int]] = field(default_factory=list)


def waiting_streaks(
    now_s: float,
    signals: FleetSignals,
    previous: dict[str, Streak],
    min_ticks: int,
    min_s: float,
    keep_last: int,
) -> tuple[dict[str, Streak], list[ReplicaSignals]]:
    """The ready replicas' runs of waiting (`previous` carried on, a run broken dropped)
    and those whose run has lasted `min_ticks` ticks and `min_s` seconds."""
    streaks: dict[str, Streak] = {}
    persistent = []
    for r in signals.ready:
        if r.waiting <= 0:
            continue
        st = streaks[r.replica_id] = previous.get(r.replica_id, Streak(now_s))
        st.ticks += 1
        if r.running > 0:
            st.pending = [*st.pending, (now_s, r.running)][-keep_last:]
        if st.ticks >= min_ticks and now_s - st.since_s >= min_s:
            persistent.append(r)
    return streaks, persistent


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
