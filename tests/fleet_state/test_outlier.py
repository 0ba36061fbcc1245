"""Outlier detection in the fleet core, as Envoy's: consecutive failures and success rate,
growing ejection times, and a floor so that overload never empties the pool."""

from __future__ import annotations

from gpufleet.fleet_state import FleetReplica, FleetState, OutlierConfig
from gpufleet.routing.types import ReplicaState

from .helpers import fleet, ready


def _fleet(**outlier: float) -> FleetState[FleetReplica]:
    return fleet(outlier=OutlierConfig(**outlier))  # type: ignore[arg-type]


def fail(f: FleetState[FleetReplica], r: FleetReplica, n: int, now_s: float) -> None:
    for _ in range(n):
        f.table.record_failure(r, now_s)


def test_consecutive_failures_eject_for_growing_times() -> None:
    f = _fleet(consecutive_failures=3, base_ejection_time_s=10.0, max_ejection_time_s=25.0,
               interval_s=1000.0)  # fmt: skip
    a, b = ready(f, "a"), ready(f, "b")
    fail(f, a, 2, 0.0)
    f.table.record_success(a)  # a success breaks the streak
    fail(f, a, 2, 0.0)
    assert a.state is ReplicaState.READY
    fail(f, a, 1, 0.0)
    assert a.state is ReplicaState.DEAD and a.ejected_until_s == 10.0
    assert f.table.eligible("m", None) == [b]
    assert not f.table.probe_passed(a, 5.0)  # healthy, but the ejection is not over
    f.table.tick(9.9)
    assert a.state is ReplicaState.DEAD
    f.table.tick(10.0)
    assert a.state is ReplicaState.READY and a.ejected_until_s is None
    fail(f, a, 3, 11.0)
    assert a.ejected_until_s == 11.0 + 20.0  # the second ejection lasts twice as long
    f.table.tick(31.0)
    fail(f, a, 3, 40.0)
    assert a.ejected_until_s == 40.0 + 25.0  # capped by max_ejection_time_s


def test_overload_never_ejects_the_last_replicas() -> None:
    """Issue 13, defect 4: under overload both replicas failed at once and both were
    ejected, leaving nothing to serve. With at most 50 % ejected, one always stays."""
    f = _fleet(consecutive_failures=2)
    a, b = ready(f, "a"), ready(f, "b")
    for now_s in (0.0, 0.1, 0.2):
        fail(f, a, 1, now_s)
        fail(f, b, 1, now_s)
    assert [r.state for r in (a, b)] == [ReplicaState.DEAD, ReplicaState.READY]
    assert f.table.eligible("m", None) == [b]
    # Four replicas, all failing: two may go, never three.
    g = _fleet(consecutive_failures=1)
    rs = [ready(g, f"r{i}") for i in range(4)]
    for r in rs:
        fail(g, r, 1, 0.0)
    assert sum(r.state is ReplicaState.DEAD for r in rs) == 2
    # One replica alone is never ejected, whatever max_ejection_percent says.
    h = _fleet(consecutive_failures=1, max_ejection_percent=100.0)
    solo = ready(h, "solo")
    fail(h, solo, 10, 0.0)
    assert solo.state is ReplicaState.READY


def test_the_floor_is_per_model_and_pool() -> None:
    f = _fleet(consecutive_failures=1, max_ejection_percent=100.0)
    shared = ready(f, "s", models=("m", "n"))
    other = ready(f, "o", models=("n",))
    fail(f, shared, 1, 0.0)  # the only replica of "m": it stays
    assert shared.state is ReplicaState.READY
    fail(f, other, 1, 0.0)
    assert other.state is ReplicaState.DEAD


def test_success_rate_ejects_the_outlier_each_interval() -> None:
    f = _fleet(consecutive_failures=1000, interval_s=10.0, success_rate_minimum_hosts=5,
               success_rate_request_volume=20, success_rate_stdev_factor=1.9)  # fmt: skip
    rs = [ready(f, f"r{i}") for i in range(6)]
    f.table.tick(0.0)  # starts the first interval
    for i, r in enumerate(rs):
        for n in range(40):
            bad = (i == 5 and n % 2 == 0) or (i < 5 and n == 0 and i % 2)
            if bad:
                f.table.record_failure(r, 1.0)
            else:
                f.table.record_success(r, 1.0)
    f.table.tick(5.0)
    assert all(r.state is ReplicaState.READY for r in rs)  # not at the interval yet
    f.table.tick(10.0)
    assert [r.replica_id for r in rs if r.state is ReplicaState.DEAD] == ["r5"]
    assert all(r.window_requests == 0 for r in rs)  # a new interval counts afresh


def test_ejection_multiplier_decays_while_in_the_pool() -> None:
    f = _fleet(consecutive_failures=1, base_ejection_time_s=5.0, interval_s=10.0)
    a, _ = ready(f, "a"), ready(f, "b")
    f.table.tick(0.0)
    fail(f, a, 1, 1.0)
    assert a.ejections == 1
    f.table.tick(6.0)  # back in the pool
    f.table.tick(10.0)  # an interval in the pool without ejection
    assert a.ejections == 0
