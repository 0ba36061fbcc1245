"""Prefill weight: a request awaiting its first token counts more than a decoding one, so a
just-ready replica takes a few prompts at a time, not every arrival (pure)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gpufleet.errors import UserError
from gpufleet.fleet_state import FleetReplica, FleetState
from gpufleet.routing import make_policy
from gpufleet.routing.base import PolicyBase, random_min_of
from gpufleet.routing.load import awaiting_first_token
from gpufleet.routing.types import ReplicaView, RequestInfo

from .helpers import arrivals_taken_by, request, views


class _PlainLeastOutstanding(PolicyBase):
    """Fewest in flight, random among ties: the count before the prefill weight."""

    def choose(self, request: RequestInfo, replicas: Sequence[ReplicaView]) -> ReplicaView | None:
        return random_min_of(self.rng, replicas, [r.in_flight + r.peer_in_flight for r in replicas])


def _fleet_with_a_new_replica() -> list:
    """Three replicas hold 20 requests each, 18 of them decoding; a fourth just became
    ready with nothing."""
    rs = views(4, [20, 20, 20, 0])
    for r in rs[:3]:
        r.streaming = 18
    return rs


def _picks_of_the_new_one(policy: str, arrivals: int = 20, **options: float) -> int:
    """How many of the next `arrivals` (none gets its first token meanwhile) go to the
    new replica."""
    rs = _fleet_with_a_new_replica()
    return arrivals_taken_by(make_policy(policy, seed=0, **options), rs, 3, arrivals)


def test_awaiting_first_token_is_in_flight_less_streaming() -> None:
    rs = views(1, [7])
    rs[0].streaming = 5
    assert awaiting_first_token(rs[0]) == 2


def test_least_outstanding_herds_unweighted_and_takes_a_few_prompts_when_weighted() -> None:
    # weight 1 (off): every arrival goes to the new replica, the herd
    assert _picks_of_the_new_one("least_outstanding", prefill_weight=1.0) == 20
    # weight 4: the others count 18 + 2 x 4 = 26, the new one 4 a prompt: it takes 7,
    # then every new prompt counts 4 wherever it goes and they share the rest
    assert _picks_of_the_new_one("least_outstanding", prefill_weight=4.0) == 10


@pytest.mark.parametrize("policy", ["least_outstanding", "power_of_two"])
def test_the_default_weight_is_4(policy: str) -> None:
    """On by default since wave 17 (docs/up.md): the gateway, `gpufleet sim` and `up` get
    it through the constructor unless their options set another."""
    assert make_policy(policy, seed=0).prefill_weight == 4.0
    assert _picks_of_the_new_one(policy, arrivals=60) == _picks_of_the_new_one(
        policy, arrivals=60, prefill_weight=4.0
    )


def test_the_new_replica_takes_more_as_its_prompts_get_their_first_tokens() -> None:
    rs = _fleet_with_a_new_replica()
    p = make_policy("least_outstanding", seed=0, prefill_weight=4.0)
    for i in range(7):
        chosen = p.choose(request(i), rs)
        assert chosen is rs[3]
        chosen.in_flight += 1
    assert p.choose(request(7), rs) is not rs[3]  # full of prompts: the others' turn
    rs[3].streaming = 7  # its 7 prompts prefilled: now decoding, counted once each
    assert p.choose(request(8), rs) is rs[3]


def test_power_of_two_weighs_prefill_the_same_way() -> None:
    off = _picks_of_the_new_one("power_of_two", arrivals=60, prefill_weight=1.0)
    on = _picks_of_the_new_one("power_of_two", arrivals=60, prefill_weight=4.0)
    assert on < off  # (60 arrivals over 4 replicas: 15 is a fair share)


def test_weight_one_is_the_plain_count_and_below_one_is_refused() -> None:
    """Weight 1 routes exactly as the plain in-flight count (a reference written here)."""
    rs = _fleet_with_a_new_replica()
    plain = _PlainLeastOutstanding(seed=3)
    weighted = make_policy("least_outstanding", seed=3, prefill_weight=1.0)
    for i in range(30):
        a, b = plain.choose(request(i), rs), weighted.choose(request(i), rs)
        assert a is b and a is not None
        a.in_flight += 1
    with pytest.raises(UserError):
        make_policy("least_outstanding", prefill_weight=0.5)


def test_the_fleet_core_counts_a_request_streaming_from_its_first_token() -> None:
    fleet = FleetState[FleetReplica](make_policy("least_outstanding", prefill_weight=4.0))
    r = fleet.table.add(FleetReplica("r0", "http://x", models=frozenset({"m"})))
    info = request(0)
    fleet.started(info, r, fleet.policy)
    assert awaiting_first_token(r) == 1
    fleet.first_token(info, r, fleet.policy)
    assert awaiting_first_token(r) == 0 and r.streaming == 1
    fleet.finished(info, r, fleet.policy, ok=True, streamed=True)
    assert r.in_flight == 0 and r.streaming == 0
