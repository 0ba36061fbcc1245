"""Consistent hashing with bounded loads: stickiness, minimal movement, the load bound."""

from __future__ import annotations

import math
from collections import Counter

from gpufleet.routing import make_policy
from gpufleet.routing.session import SessionAffinity

from .helpers import request, views


def _placement(p: object, keys: list[str], rs: list) -> dict[str, str]:
    out = {}
    for i, k in enumerate(keys):
        r = p.choose(request(i, session_key=k), rs)  # type: ignore[attr-defined]
        out[k] = r.replica_id
    return out


KEYS = [f"user-{i}" for i in range(600)]


def test_a_session_sticks_and_sessions_spread() -> None:
    p = make_policy("session", seed=0)
    rs = views(4)
    first = _placement(p, KEYS, rs)
    assert _placement(p, KEYS, rs) == first
    counts = Counter(first.values())
    assert set(counts) == {"r0", "r1", "r2", "r3"}
    assert max(counts.values()) < 2 * min(counts.values())


def test_placement_does_not_depend_on_list_order_or_gateway_instance() -> None:
    rs = views(5)
    a = _placement(make_policy("session", seed=1), KEYS, rs)
    b = _placement(make_policy("session", seed=2), KEYS, list(reversed(rs)))
    assert a == b


def test_a_leaving_replica_moves_only_its_own_sessions() -> None:
    p = make_policy("session", seed=0)
    rs = views(5)
    before = _placement(p, KEYS, rs)
    p.on_replica_removed("r2")
    after = _placement(p, KEYS, [r for r in rs if r.replica_id != "r2"])
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved == {k for k in KEYS if before[k] == "r2"}
    assert moved  # r2 held some sessions
    # ...and they spread over the survivors instead of piling onto one.
    assert len({after[k] for k in moved}) >= 3


def test_a_joining_replica_takes_sessions_only_from_others_not_between_them() -> None:
    p = make_policy("session", seed=0)
    before = _placement(p, KEYS, views(4))
    after = _placement(p, KEYS, views(5))
    assert all(after[k] == "r4" for k in KEYS if before[k] != after[k])


def test_a_hot_session_is_bounded_and_spills_to_other_replicas() -> None:
    p = SessionAffinity(seed=0, balance_factor=1.25)
    rs = views(4)
    cold = [f"cold-{i}" for i in range(8)]
    for step in range(200):
        key = "hot" if step % 2 == 0 else cold[step % 8]
        r = p.choose(request(step, session_key=key), rs)
        assert r is not None
        total = sum(x.in_flight for x in rs) + 1
        bound = math.ceil(1.25 * total / len(rs))
        r.in_flight += 1
        assert r.in_flight <= bound
        if step % 3 == 2:  # some requests finish, the hot session keeps arriving
            busiest = max(rs, key=lambda x: x.in_flight)
            busiest.in_flight -= 1
    # The hot session could not fit on one replica: it used several.
    loads = [x.in_flight for x in rs]
    assert max(loads) <= math.ceil(1.25 * sum(loads) / 4) + 1


def test_hot_session_returns_home_once_load_falls() -> None:
    p = make_policy("session", seed=0)
    rs = views(4)
    home = p.choose(request(0, session_key="hot"), rs)
    assert home is not None
    home.in_flight = 10  # overloaded: next request spills
    spill = p.choose(request(1, session_key="hot"), rs)
    assert spill is not None and spill.replica_id != home.replica_id
    home.in_flight = 0
    again = p.choose(request(2, session_key="hot"), rs)
    assert again is not None and again.replica_id == home.replica_id


def test_requests_without_a_session_key_go_to_the_least_loaded() -> None:
    p = make_policy("session", seed=0)
    rs = views(3, [4, 0, 2])
    assert all(p.choose(request(i), rs).replica_id == "r1" for i in range(10))  # type: ignore[union-attr]
