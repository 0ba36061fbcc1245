"""`SloCapacity.join_quiet_s`: a window over the SLO just after a replica joined (the
router's herd onto it, docs/up.md Wave 16) is not a bound from above when asked; it is
by default for `SloCapacity` alone. The default policy asks for 60 s (since wave 17)."""

from __future__ import annotations

from dataclasses import replace

from autoscale.helpers import even, fleet
from gpufleet.autoscale.capacity import SloCapacity
from gpufleet.autoscale.policies.default import DefaultPolicy
from gpufleet.autoscale.signals import FleetSignals, Percentiles


def signals(n_ready: int, admitted: int, tpot_p99_s: float) -> FleetSignals:
    tpot = Percentiles(tpot_p99_s / 3, tpot_p99_s / 2, tpot_p99_s)
    return replace(fleet(even(n_ready, 40)), admitted_total=admitted, tpot_s=tpot,
                   window_s=60.0, latency_requests=500)  # fmt: skip


def run(cap: SloCapacity) -> float:
    """4 replicas at 5 req/s each within the SLO for 200 s; then a fifth joins and the
    next 30 s are over the SLO: the estimate after them."""
    admitted = 0
    for t in range(0, 200):
        admitted += 20
        cap.add(float(t), signals(4, admitted, 0.05))
    before = cap.estimate_rps()
    for t in range(200, 230):
        admitted += 20
        cap.add(float(t), signals(5, admitted, 0.3))
    after = cap.estimate_rps()
    assert before is not None and after is not None
    return after / before


def test_windows_over_the_slo_just_after_a_join_cut_the_estimate_unless_quiet() -> None:
    kw = {"tpot_slo_s": 0.1, "quantile": 0.99, "smooth_s": 60.0, "tpot_unloaded_s": 0.02}
    assert run(SloCapacity(**kw)) < 0.9  # the herd's windows bound it from above
    assert run(SloCapacity(join_quiet_s=60.0, **kw)) == 1.0


def test_a_replica_replaced_in_the_same_tick_is_a_join() -> None:
    """One replica leaves (a drain, a crash) as another becomes ready in the same tick:
    the ready count is unchanged, yet the new one is a join and its herd's windows are
    quiet. Counting ready replicas (before wave 18) missed it and cut the estimate."""
    kw = {"tpot_slo_s": 0.1, "quantile": 0.99, "smooth_s": 60.0, "tpot_unloaded_s": 0.02}
    cap, admitted = SloCapacity(join_quiet_s=60.0, **kw), 0
    for t in range(0, 200):
        admitted += 20
        cap.add(float(t), signals(4, admitted, 0.05))
    before = cap.estimate_rps()
    swapped = signals(4, 0, 0.3)
    new = replace(swapped.replicas[3], replica_id="r9")  # r3 left, r9 joined
    for t in range(200, 230):
        admitted += 20
        s = replace(swapped, admitted_total=admitted, replicas=(*swapped.replicas[:3], new))
        cap.add(float(t), s)
    assert before is not None and cap.estimate_rps() == before


def test_the_default_policy_is_quiet_60_s_after_a_join_and_forecasts_at_3_errors() -> None:
    """Wave 17's defaults (docs/up.md): with routing's prefill weight 4 they make the study
    99.46-99.58 % at 0.69 x the fleet sized for the peak; 0 and None still turn them off."""
    p = DefaultPolicy(capacity_per_replica=100, tpot_p90_slo_s=0.1)
    assert p.capacity_join_quiet_s == 60.0 and p.forecast_rise_z == 3.0
    assert p._slo_capacity.join_quiet_s == 60.0
    off = DefaultPolicy(capacity_per_replica=100, tpot_p90_slo_s=0.1, capacity_join_quiet_s=0.0)
    assert off._slo_capacity.join_quiet_s == 0.0
