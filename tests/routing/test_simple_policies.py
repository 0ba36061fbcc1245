"""Defining properties of the load-only policies and the registry (pure, no network)."""

from __future__ import annotations

from collections import Counter

import pytest

from gpufleet.errors import UserError
from gpufleet.routing import POLICY_NAMES, make_policy, policy_options

from .helpers import request, stats, views


def test_every_name_builds_an_independent_policy_that_handles_no_replicas() -> None:
    for name in POLICY_NAMES:
        a, b = make_policy(name, seed=1), make_policy(name, seed=1)
        assert a is not b
        assert a.name == name
        assert a.choose(request(), []) is None
        assert a.choose(request(), views(1)) is not None


def test_registry_names_are_the_documented_ones() -> None:
    assert set(POLICY_NAMES) >= {
        "round_robin",
        "random",
        "least_outstanding",
        "power_of_two",
        "queue_depth",
    }


def test_unknown_policy_and_option_are_user_errors_naming_the_field() -> None:
    with pytest.raises(UserError) as e:
        make_policy("fastest")
    assert e.value.field == "policy" and "round_robin" in str(e.value)
    with pytest.raises(UserError) as e:
        make_policy("round_robin", bogus=1)
    assert e.value.field == "policy_options.bogus"
    assert "waiting_weight" in policy_options("queue_depth")


def test_round_robin_cycles_through_every_replica() -> None:
    p = make_policy("round_robin")
    rs = views(3)
    picks = [p.choose(request(i), rs) for i in range(9)]
    assert [r.replica_id for r in picks if r] == ["r0", "r1", "r2"] * 3


def test_random_is_seeded_and_covers_all_replicas() -> None:
    rs = views(4)
    a = [make_policy("random", seed=7).choose(request(), rs) for _ in range(1)]
    b = [make_policy("random", seed=7).choose(request(), rs) for _ in range(1)]
    assert a == b
    p = make_policy("random", seed=3)
    seen = Counter(p.choose(request(i), rs).replica_id for i in range(400))  # type: ignore[union-attr]
    assert set(seen) == {"r0", "r1", "r2", "r3"}


def test_least_outstanding_picks_the_minimum() -> None:
    p = make_policy("least_outstanding", seed=0)
    rs = views(4, [3, 1, 2, 5])
    assert all(p.choose(request(i), rs).replica_id == "r1" for i in range(20))  # type: ignore[union-attr]


def test_least_outstanding_breaks_ties_randomly_not_by_position() -> None:
    p = make_policy("least_outstanding", seed=0)
    rs = views(4, [2, 1, 1, 1])
    seen = Counter(p.choose(request(i), rs).replica_id for i in range(300))  # type: ignore[union-attr]
    assert set(seen) == {"r1", "r2", "r3"}
    assert min(seen.values()) > 60  # each tied replica gets roughly a third


def test_power_of_two_never_picks_the_most_loaded_and_samples_two_distinct() -> None:
    p = make_policy("power_of_two", seed=5)
    rs = views(3, [9, 0, 4])
    seen = Counter(p.choose(request(i), rs).replica_id for i in range(300))  # type: ignore[union-attr]
    assert "r0" not in seen  # the busiest loses every comparison it is in
    # r2 wins only when the pair is {r0, r2}: about a third of the time.
    assert 50 < seen["r2"] < 150
    two = views(2, [1, 0])
    assert all(p.choose(request(i), two).replica_id == "r1" for i in range(20))  # type: ignore[union-attr]


def test_queue_depth_uses_scraped_engine_numbers() -> None:
    p = make_policy("queue_depth", seed=0)
    rs = views(3, [1, 1, 1])
    rs[0].stats = stats(running=4, waiting=3, at_scrape=1)
    rs[1].stats = stats(running=4, waiting=0, kv=0.2, at_scrape=1)
    rs[2].stats = stats(running=4, waiting=0, kv=0.9, at_scrape=1)
    assert p.choose(request(), rs).replica_id == "r1"  # type: ignore[union-attr]


def test_queue_depth_corrects_stale_scrapes_by_in_flight_since() -> None:
    p = make_policy("queue_depth", seed=0)
    rs = views(2)
    # Both scraped equal; since then the gateway sent 5 more to r0 and r1 saw 2 finish.
    rs[0].stats = stats(running=3, at_scrape=3)
    rs[0].in_flight = 8
    rs[1].stats = stats(running=6, at_scrape=6)
    rs[1].in_flight = 4
    assert p.choose(request(), rs).replica_id == "r1"  # type: ignore[union-attr]


def test_queue_depth_without_a_scrape_falls_back_to_in_flight() -> None:
    p = make_policy("queue_depth", seed=0)
    rs = views(2, [3, 1])
    assert p.choose(request(), rs).replica_id == "r1"  # type: ignore[union-attr]
