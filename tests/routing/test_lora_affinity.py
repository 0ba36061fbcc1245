"""LoRA affinity: adapters stay where they are loaded, spill past the load bound, respect
max_lora slots; base-model requests go to the inner policy (pure, no network)."""

from __future__ import annotations

from collections import Counter

import pytest

from gpufleet.errors import UserError
from gpufleet.routing import make_policy, policy_options
from gpufleet.routing.lora_affinity import (
    TIER_ABSENT,
    TIER_IN_USE,
    TIER_REGISTERED,
    TIER_SLOTS_FULL,
    TIER_WARM,
    LoraAffinity,
)
from gpufleet.routing.types import EngineStats, ReplicaView

from .helpers import request, views


def policy(**kw: object) -> LoraAffinity:
    p = make_policy("lora_affinity", seed=0, **kw)
    assert isinstance(p, LoraAffinity)
    return p


def send(p: LoraAffinity, replicas: list[ReplicaView], i: int, adapter: str | None) -> ReplicaView:
    """Route one request and start it (as the fleet core does)."""
    info = request(i, adapter=adapter)
    chosen = p.choose(info, replicas)
    assert chosen is not None
    chosen.in_flight += 1
    p.on_started(info, chosen)
    return chosen


def test_requests_for_an_adapter_stay_on_the_replica_that_runs_it() -> None:
    p = policy(max_loras=4)
    rs = views(4)
    first = send(p, rs, 0, "sql")
    # Load on the others too, so least-outstanding alone would move away.
    for i, r in enumerate(rs):
        if r is not first:
            send(p, [r], 100 + i, None)
    picks = {send(p, rs, i, "sql").replica_id for i in range(1, 3)}
    assert picks == {first.replica_id}


def test_a_hot_adapter_spills_past_the_load_bound_then_sticks_to_both() -> None:
    p = policy(max_loras=4, load_factor=1.0, load_slack=1.0)
    rs = views(3)
    holders = Counter(send(p, rs, i, "hot").replica_id for i in range(9))
    # Bound: load + 1 <= mean + 1 -> the load spreads evenly, over every replica.
    assert sorted(holders.values()) == [3, 3, 3]


def test_bounded_load_keeps_an_adapter_on_few_replicas_while_they_have_room() -> None:
    p = policy(max_loras=4, load_factor=2.0, load_slack=4.0)
    rs = views(4)
    for i, r in enumerate(rs):  # some base traffic everywhere
        send(p, [r], 100 + i, None)
    holders = {send(p, rs, i, "hot").replica_id for i in range(6)}
    assert len(holders) < 4


def test_a_replica_whose_slots_are_taken_by_other_adapters_is_avoided() -> None:
    p = policy(max_loras=1)
    rs = views(2)
    busy = send(p, rs, 0, "a")  # r takes adapter a: its one slot is in use
    other = send(p, rs, 1, "b")
    assert other is not busy
    assert p.tier("c", busy) == TIER_SLOTS_FULL
    assert p.tier("a", busy) == TIER_IN_USE


def test_tiers_follow_use_recency_and_registration() -> None:
    p = policy(max_loras=2)
    (r,) = views(1)
    assert p.tier("x", r) == TIER_ABSENT
    r.models = frozenset({"m", "x"})
    assert p.tier("x", r) == TIER_REGISTERED
    info = request(0, adapter="x")
    send(p, [r], 0, "x")
    assert p.tier("x", r) == TIER_IN_USE
    p.on_finished(info, r, True)
    assert p.tier("x", r) == TIER_WARM  # its last use: likely still in a GPU slot
    for i, name in enumerate(("y", "z")):  # two newer adapters push it out of 2 slots
        send(p, [r], 10 + i, name)
        p.on_finished(request(10 + i, adapter=name), r, True)
    assert p.tier("x", r) == TIER_REGISTERED


def test_scraped_adapters_and_max_lora_count_as_in_use() -> None:
    p = policy(max_loras=8)
    rs = views(2)
    rs[0].stats = EngineStats(running_adapters=("a",), waiting_adapters=("b",), max_lora=2)
    assert p.tier("a", rs[0]) == TIER_IN_USE
    assert p.tier("b", rs[0]) == TIER_IN_USE
    assert p.tier("c", rs[0]) == TIER_SLOTS_FULL  # the replica's own max_lora wins
    assert send(p, rs, 0, "c") is rs[1]


def test_base_requests_go_to_the_inner_policy() -> None:
    p = policy(inner="round_robin")
    rs = views(3)
    picks = [send(p, rs, i, None).replica_id for i in range(6)]
    assert picks == ["r0", "r1", "r2"] * 2


def test_the_inner_policy_is_told_everything_and_sized_by_capacity() -> None:
    p = policy(inner="prefix_aware", inner_options={"capacity_tokens": 1024})
    assert p.uses_prefix_hashes
    rs = views(2)
    info = request(0, adapter="a", prefix_hashes=(1, 2, 3))
    chosen = p.choose(info, rs)
    assert chosen is not None
    p.on_started(info, chosen)
    p.on_first_token(info, chosen)
    p.set_capacity_tokens(chosen.replica_id, 4096)
    p.on_finished(info, chosen, True)
    p.on_replica_removed(chosen.replica_id)
    assert p.tier("a", chosen) == TIER_ABSENT  # forgotten with the replica


def test_options_are_checked() -> None:
    assert "inner" in policy_options("lora_affinity")
    with pytest.raises(UserError):
        make_policy("lora_affinity", load_slack=0.5)
    with pytest.raises(UserError):
        make_policy("lora_affinity", inner="lora_affinity")
    with pytest.raises(UserError):
        make_policy("lora_affinity", inner="nope")
