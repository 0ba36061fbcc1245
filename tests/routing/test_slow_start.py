"""Slow start: a just-ready replica takes a ramped share, not every request (pure)."""

from __future__ import annotations

import pytest

from gpufleet.fleet_state import FleetReplica, FleetState
from gpufleet.routing import make_policy
from gpufleet.routing.slow_start import slow_start_weight

from .helpers import arrivals_taken_by, views


def test_the_weight_ramps_as_envoys_slow_start_from_its_floor_to_one() -> None:
    assert slow_start_weight(0.0, 10.0) == 0.1  # min_weight_percent's default
    assert slow_start_weight(5.0, 10.0) == 0.5  # aggression 1: linear
    assert slow_start_weight(2.5, 10.0, aggression=2.0) == pytest.approx(0.5)
    assert slow_start_weight(0.0, 4.0) == 0.25  # Envoy counts at least a second
    assert slow_start_weight(10.0, 10.0) == 1.0
    assert slow_start_weight(3.0, 0.0) == 1.0  # window 0: off


def _picks_of_the_new_one(policy: str, weight: float, arrivals: int = 20) -> int:
    """Three replicas hold 20 requests each (none finishes); a fourth just became ready.
    How many of the next `arrivals` go to the new one."""
    rs = views(4, [20, 20, 20, 0])
    rs[3].slow_start_weight = weight
    return arrivals_taken_by(make_policy(policy, seed=0), rs, 3, arrivals)


def test_least_outstanding_herds_onto_a_new_replica_without_slow_start_not_with_it() -> None:
    assert _picks_of_the_new_one("least_outstanding", 1.0) == 20  # every arrival (the herd)
    # weight 0.25: it counts 4 per request, so it takes ~5 and then shares
    assert 4 <= _picks_of_the_new_one("least_outstanding", 0.25) <= 7


def test_power_of_two_also_divides_by_the_weight() -> None:
    off = _picks_of_the_new_one("power_of_two", 1.0, arrivals=60)
    on = _picks_of_the_new_one("power_of_two", 0.1, arrivals=60)
    assert on < off and on <= 4


def test_the_fleet_core_ramps_a_replica_that_became_ready_and_not_when_off() -> None:
    fleet = FleetState[FleetReplica](make_policy("least_outstanding"), slow_start_s=10.0)
    r = fleet.table.add(FleetReplica("r0", "http://x", models=frozenset({"m"})))
    fleet.became_ready(r, 100.0)
    assert r.slow_start_weight == 0.1
    fleet.admit("m", None, 104.0, 200.0)  # admission brings the weights up to date
    assert r.slow_start_weight == pytest.approx(0.4)
    fleet.ramp(111.0)
    assert r.slow_start_weight == 1.0 and not fleet.ramping
    off = FleetState[FleetReplica](make_policy("least_outstanding"))
    r = off.table.add(FleetReplica("r0", "http://x", models=frozenset({"m"})))
    off.became_ready(r, 100.0)
    assert r.slow_start_weight == 1.0 and not off.ramping
