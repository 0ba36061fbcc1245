"""The default policy sized by arrival rate × time in system (Little's law) and by the
capacity a replica shows within the SLO, on scripted signals."""

from __future__ import annotations

from dataclasses import replace

from autoscale.helpers import even, fleet
from gpufleet.autoscale.capacity import SloCapacity
from gpufleet.autoscale.decision import ReplicaBounds
from gpufleet.autoscale.forecast import ArrivalRate
from gpufleet.autoscale.policies import DefaultPolicy
from gpufleet.autoscale.signals import FleetSignals, Percentiles

B = ReplicaBounds(1, 40)


def policy(**kw: object) -> DefaultPolicy:
    params: dict[str, object] = {"capacity_per_replica": 50, "cold_start_s": 120.0}
    params.update(kw)
    return DefaultPolicy(B, **params)  # type: ignore[arg-type]


def signals(
    n_ready: int,
    in_flight: int,
    admitted: int,
    *,
    tpot_p99_s: float | None = None,
    requests: int | None = None,
) -> FleetSignals:
    s = fleet(even(n_ready, in_flight))
    tpot = None if tpot_p99_s is None else Percentiles(tpot_p99_s / 3, tpot_p99_s / 2, tpot_p99_s)
    return replace(s, admitted_total=admitted, tpot_s=tpot, window_s=60.0,
                   latency_requests=requests)  # fmt: skip


def test_a_rate_step_is_sized_by_littles_law_not_extrapolated_a_cold_start_ahead() -> None:
    # 10 req/s for 10 s each (100 in flight on 4 replicas of 50), then 20 req/s from
    # t = 300: in flight climbs to 200 over 10 s. Needed: 200 × 1.1 / 50 → 5 replicas.
    # A least-squares trend of in flight carried 120 s ahead read the climb as a ramp
    # and asked for ~2× that.
    p = policy()
    admitted, desired = 0, []
    for t in range(0, 500):
        rate = 10 if t < 300 else 20
        admitted += rate
        in_flight = 100 + min(max(t - 300, 0), 10) * 10
        d = p.decide(float(t), signals(4, in_flight, admitted))
        desired.append(d.desired_replicas)
    assert max(desired[:300]) == 4
    assert desired[-1] == 5 and max(desired) == 5, max(desired)


def test_the_capacity_within_the_slo_is_measured_and_overrides_the_planners() -> None:
    # The planner says 50 per replica; 4 replicas at 20 each already run at the TPOT SLO
    # (p99 100 ms, with 99 % of requests to meet it): measured 20, so 80 in flight with
    # 10 % headroom needs 5. Without SLO measurements the planner's 50 keeps 4.
    p = policy(tpot_p90_slo_s=0.1, slo_attainment=0.99)
    blind = policy(tpot_p90_slo_s=0.1, slo_attainment=0.99, measure_capacity=False)
    admitted = 0
    for t in range(0, 200):
        admitted += 10
        s = signals(4, 80, admitted, tpot_p99_s=0.1, requests=600)
        d, b = p.decide(float(t), s), blind.decide(float(t), s)
    assert p.measured_capacity() == 20.0 and p.capacity == 20
    assert d.desired_replicas == 5 and "measured within the SLO at p99" in d.reason
    assert b.desired_replicas == 4


def test_no_scale_in_on_the_planners_capacity_before_the_fleet_is_measured() -> None:
    # 8 replicas at 10 in flight each: the planner's 50 says 2 would do. Until a window
    # with enough requests has shown the latency under this load, the fleet keeps 8.
    p = policy(tpot_p90_slo_s=0.1, slo_attainment=0.99, scale_in_stabilization_s=0.0,
               scale_in_cooldown_s=0.0)  # fmt: skip
    admitted = 0
    for t in range(0, 300):
        admitted += 8
        d = p.decide(float(t), signals(8, 80, admitted, tpot_p99_s=0.02, requests=10))
        assert d.desired_replicas == 8, d.reason
    assert "not measured yet" in d.reason
    # Enough requests: 10 in flight at 20 ms of a 100 ms SLO bounds the capacity at ≥ 50.
    for t in range(300, 600):
        admitted += 8
        d = p.decide(float(t), signals(d.desired_replicas, 80, admitted, tpot_p99_s=0.02,
                                       requests=500))  # fmt: skip
    assert d.desired_replicas < 8, d.reason


def test_slo_capacity_measures_near_the_slo_and_only_bounds_below_it() -> None:
    cap = SloCapacity(tpot_slo_s=0.1, quantile=0.99, smooth_s=60.0)
    low = replace(signals(4, 40, 0, tpot_p99_s=0.025), latency_requests=500)
    cap.add(0.0, low, 500)
    assert cap.estimate() is None  # the load not seen over a whole latency window yet
    for t in range(1, 61):
        cap.add(float(t), low, 500)
    assert cap.estimate() == 40.0  # 10 per replica at a quarter of the SLO: ≥ 40
    loaded = replace(signals(4, 120, 0, tpot_p99_s=0.09), latency_requests=500)
    for t in range(61, 200):
        cap.add(float(t), loaded, 500)
    near = cap.estimate()
    assert near is not None and 30 <= near <= 34  # 30 per replica at 90 ms: ~33
    for t in range(200, 400):  # load falls: the lower bounds (≥ 12.5) do not undo it
        cap.add(float(t), replace(signals(4, 20, 0, tpot_p99_s=0.04), latency_requests=500),
                500)  # fmt: skip
    assert cap.estimate() == near
    few = SloCapacity(tpot_slo_s=0.1)
    for t in range(0, 200):
        few.add(float(t), low, 20)
    assert few.estimate() is None


def test_arrival_rate_from_a_counter_and_its_recent_peak() -> None:
    r = ArrivalRate(rate_s=30.0, window_s=120.0)
    for t in range(0, 10):
        r.add(float(t), 5.0 * t)
    assert r.rate() is None  # less than half the rate's span seen
    for t in range(10, 100):
        r.add(float(t), 5.0 * t)
    assert r.rate() == 5.0 and r.peak() == 5.0
    total = 5.0 * 99
    for t in range(100, 130):  # a 30 s burst at 15 req/s
        total += 15.0
        r.add(float(t), total)
    for t in range(130, 200):
        total += 5.0
        r.add(float(t), total)
    assert r.rate() == 5.0 and r.peak() == 15.0  # held over the window
    for t in range(200, 300):
        total += 5.0
        r.add(float(t), total)
    assert r.peak() == 5.0
    r.add(300.0, 3.0)  # the counter restarted (a new gateway)
    assert r.rate() is None
