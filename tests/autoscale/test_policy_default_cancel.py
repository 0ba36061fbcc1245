"""`default` cancels a start the demand no longer asks for (`ScaleIn.cancel_starts`):
pure, on scripted signals."""

from __future__ import annotations

from autoscale.helpers import even, fleet
from gpufleet.autoscale.decision import ReplicaBounds
from gpufleet.autoscale.policies import DefaultPolicy


def policy(**kw: object) -> DefaultPolicy:
    params: dict[str, object] = {
        "capacity_per_replica": 8,
        "cold_start_s": 10.0,
        "headroom_fraction": 0.2,
        "trend_window_s": 10.0,
        "peak_window_s": 20.0,
        "scale_in_stabilization_s": 8.0,
        "scale_in_cooldown_s": 6.0,
    }
    params.update(kw)
    return DefaultPolicy(ReplicaBounds(3, 6), **params)  # type: ignore[arg-type]


def test_a_start_the_demand_no_longer_asks_for_is_cancelled_after_half_a_cold_start() -> None:
    """3 ready holding 3 in flight, one replica starting (asked for by a spike now gone):
    N−1 = 2 × 8 holds 3 + 20 %. Kept for half the 10 s cold start, then cancelled."""
    p = policy()
    ds = [
        p.decide(float(t), fleet(even(3, 3), starting=1, cold_start_s=10.0, now_s=float(t)))
        for t in range(0, 6)
    ]
    assert [d.desired_replicas for d in ds] == [4, 4, 4, 4, 4, 3]  # held 0–4 s < 5 s
    assert "cancel 1 starting: N−1 = 2 holds" in ds[5].reason, ds[5].reason


def test_a_start_still_needed_is_kept() -> None:
    """20 in flight on 3 ready: N−1 = 16 cannot hold it; the start stays."""
    p = policy()
    for t in range(0, 12):
        d = p.decide(float(t), fleet(even(3, 20), starting=1, cold_start_s=10.0, now_s=float(t)))
        assert d.desired_replicas == 4, (t, d.reason)


def test_a_dip_shorter_than_half_a_cold_start_keeps_the_start() -> None:
    """The demand falls for 3 s and comes back: the count of held seconds starts over."""
    p = policy()
    loads = [3, 3, 3, 20, 3, 3, 3, 20, 3, 3, 3, 20]
    for t, load in enumerate(loads):
        d = p.decide(float(t), fleet(even(3, load), starting=1, cold_start_s=10.0, now_s=float(t)))
        assert d.desired_replicas >= 4, (t, d.reason)


def test_off_no_start_is_cancelled() -> None:
    p = policy(cancel_idle_starts=False)
    for t in range(0, 12):
        d = p.decide(float(t), fleet(even(3, 3), starting=1, cold_start_s=10.0, now_s=float(t)))
        assert d.desired_replicas == 4, (t, d.reason)
