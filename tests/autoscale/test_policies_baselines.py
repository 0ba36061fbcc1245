"""The baseline policies as pure functions on scripted signal sequences (no processes, no sleep)."""

from __future__ import annotations

import pytest

from autoscale.helpers import even, fleet
from gpufleet.autoscale.decision import ReplicaBounds
from gpufleet.autoscale.policies import (
    HpaPolicy,
    KpaPolicy,
    QueueDepthPolicy,
    RayServePolicy,
    make_policy,
)
from gpufleet.errors import UserError

B = ReplicaBounds(1, 8)


# queue_depth ---------------------------------------------------------------------------


def test_queue_depth_is_ceil_of_pending_over_capacity() -> None:
    p = QueueDepthPolicy(B, capacity_per_replica=8)
    d = p.decide(0.0, fleet(even(2, 16, waiting=1), queue=3))  # 16 + 1 + 3 = 20 pending
    assert d.desired_replicas == 3
    assert "pending 20" in d.reason and "capacity 8" in d.reason


def test_queue_depth_clamps_to_bounds() -> None:
    p = QueueDepthPolicy(ReplicaBounds(2, 4), capacity_per_replica=8)
    assert p.decide(0.0, fleet(even(2, 0))).desired_replicas == 2
    assert p.decide(1.0, fleet(even(2, 200))).desired_replicas == 4


# hpa -----------------------------------------------------------------------------------


def test_hpa_inside_tolerance_changes_nothing() -> None:
    p = HpaPolicy(B, target_per_replica=10)
    d = p.decide(0.0, fleet(even(2, 21)))  # 10.5 per replica: ratio 1.05
    assert d.desired_replicas == 2
    assert "within tolerance" in d.reason


def test_hpa_scales_to_ceil_ratio_times_ready() -> None:
    p = HpaPolicy(B, target_per_replica=10)
    assert p.decide(0.0, fleet(even(2, 50))).desired_replicas == 5  # ratio 2.5 × 2


def test_hpa_default_scale_up_policy_is_max_of_double_or_four_per_15s() -> None:
    p = HpaPolicy(ReplicaBounds(1, 20), target_per_replica=10)
    d = p.decide(0.0, fleet(even(1, 500)))  # wants 50
    assert d.desired_replicas == 5  # max(1 × 2, 1 + 4)
    assert "scale-up policy" in d.reason
    # 5 s later, still inside the period that started at 1 replica: no more.
    d = p.decide(5.0, fleet(even(5, 500)))
    assert d.desired_replicas == 5
    # A new period: from 5, max(10, 9) = 10.
    d = p.decide(20.0, fleet(even(5, 500)))
    assert d.desired_replicas == 10


def test_hpa_counts_starting_replicas_as_zero_on_scale_up() -> None:
    p = HpaPolicy(B, target_per_replica=10)
    # 2 ready at 15 each (ratio 1.5) but 2 more starting: 30 / 4 / 10 = 0.75 — flips: no change.
    d = p.decide(0.0, fleet(even(2, 30), starting=2))
    assert d.desired_replicas == 4
    assert "no change" in d.reason


def test_hpa_scale_down_waits_for_the_300s_stabilization_window() -> None:
    p = HpaPolicy(B, target_per_replica=10)
    assert p.decide(0.0, fleet(even(4, 40))).desired_replicas == 4
    for t in range(15, 300, 15):
        d = p.decide(float(t), fleet(even(4, 4)))  # wants 1
        assert d.desired_replicas == 4, d.reason
    d = p.decide(301.0, fleet(even(4, 4)))
    assert d.desired_replicas == 1


# kpa -----------------------------------------------------------------------------------


def test_kpa_stable_mode_targets_concurrency_times_utilization() -> None:
    p = KpaPolicy(B, target_per_replica=10, target_utilization=0.7)
    d = None
    for t in range(0, 61, 2):
        d = p.decide(float(t), fleet(even(2, 20)))  # 20 / 7 → 3; 20/7/2 = 1.4 < 2: no panic
    assert d is not None
    assert d.desired_replicas == 3
    assert not p.panicking
    assert "stable" in d.reason


def test_kpa_panics_at_200_percent_and_never_shrinks_while_panicking() -> None:
    p = KpaPolicy(B, target_per_replica=10, target_utilization=1.0)
    for t in range(0, 60, 2):
        p.decide(float(t), fleet(even(1, 5)))
    # A burst: 6 s panic window mean goes far above 2 × target per ready replica.
    d = None
    for t in range(60, 68, 2):
        d = p.decide(float(t), fleet(even(1, 60)))
    assert d is not None
    assert p.panicking
    assert "PANIC" in d.reason
    burst_desired = d.desired_replicas
    assert burst_desired >= 4  # panic window mean ≥ 45 / 10
    # Load vanishes: while the panic lasts (60 s after the last over-threshold tick) no shrink.
    for t in range(68, 126, 2):
        d = p.decide(float(t), fleet(even(burst_desired, 0)))
        assert d.desired_replicas >= burst_desired, (t, d.reason)
    # One stable window after the last panic tick: back to stable mode and it shrinks.
    for t in range(126, 200, 2):
        d = p.decide(float(t), fleet(even(burst_desired, 0)))
    assert not p.panicking
    assert d.desired_replicas < burst_desired


# ray_serve -----------------------------------------------------------------------------


def test_ray_serve_waits_upscale_delay_then_jumps() -> None:
    p = RayServePolicy(B, target_ongoing_requests=2, look_back_period_s=1)
    for t in range(0, 30):
        d = p.decide(float(t), fleet(even(1, 8)))  # wants 4
        assert d.desired_replicas == 1, (t, d.reason)
    d = p.decide(30.0, fleet(even(1, 8)))
    assert d.desired_replicas == 4
    assert "up wanted 30 s" in d.reason


def test_ray_serve_upscaling_factor_smooths_the_step() -> None:
    p = RayServePolicy(
        B, target_ongoing_requests=2, upscale_delay_s=0, upscaling_factor=0.5, look_back_period_s=1
    )
    d = p.decide(0.0, fleet(even(2, 20)))  # wants 10: 2 + 0.5 × 8 = 6
    assert d.desired_replicas == 6


def test_ray_serve_small_downscale_still_removes_one_after_delay() -> None:
    p = RayServePolicy(
        B,
        target_ongoing_requests=2,
        downscaling_factor=0.1,
        downscale_delay_s=600,
        look_back_period_s=1,
    )
    for t in range(0, 600, 10):
        d = p.decide(float(t), fleet(even(5, 7)))  # wants 3.5 → smoothing rounds to 5 → 4
        assert d.desired_replicas == 5
    d = p.decide(600.0, fleet(even(5, 7)))
    assert d.desired_replicas == 4


def test_ray_serve_direction_change_resets_the_delay() -> None:
    p = RayServePolicy(B, target_ongoing_requests=2, look_back_period_s=0.5)
    for t in range(0, 20):
        p.decide(float(t), fleet(even(2, 12)))  # up wanted
    p.decide(20.0, fleet(even(2, 4)))  # at target: resets
    for t in range(21, 50):
        d = p.decide(float(t), fleet(even(2, 12)))
        assert d.desired_replicas == 2, t
    assert p.decide(51.0, fleet(even(2, 12))).desired_replicas == 6


def test_ray_serve_cold_start_from_zero_is_immediate() -> None:
    p = RayServePolicy(ReplicaBounds(0, 8), target_ongoing_requests=2)
    d = p.decide(0.0, fleet([], queue=5))
    assert d.desired_replicas == 1
    assert "cold start" in d.reason


# registry ------------------------------------------------------------------------------


def test_make_policy_names_the_bad_field() -> None:
    with pytest.raises(UserError, match=r"autoscale.policy"):
        make_policy("nope", B)
    with pytest.raises(UserError, match=r"autoscale.params.tolerence"):
        make_policy("hpa", B, {"tolerence": 0.1})
    with pytest.raises(UserError, match="max_replicas"):
        ReplicaBounds(3, 2)
    p = make_policy("kpa", B, {"stable_window_s": 30})
    assert p.name == "kpa"
