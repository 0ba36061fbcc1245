"""The offline packing bound of routing_packing_bound.py: exact splits, groups, copies."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bound(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import routing_packing_bound

    return routing_packing_bound


def brute_force(sizes: list[int], bins: int) -> int:
    best = sum(sizes)
    for assignment in itertools.product(range(bins), repeat=len(sizes)):
        loads = [0] * bins
        for s, b in zip(sizes, assignment, strict=True):
            loads[b] += s
        best = min(best, max(loads))
    return best


def test_the_split_is_exact_where_the_greedy_one_is_not(bound: ModuleType) -> None:
    # LPT puts 3+2+2 on one bin (7); the best split is 3+3 | 2+2+2 (6).
    assert bound.min_max_split([3, 3, 2, 2, 2], 2) == 6
    for sizes in ([7, 5, 4, 4, 3, 3, 2], [9, 8, 3, 3, 3, 2, 1, 1], [5, 5, 5, 1]):
        assert bound.min_max_split(sizes, 3) == brute_force(sizes, 3)


def test_one_hot_group_needs_a_copy_and_the_cheapest_is_chosen(bound: ModuleType) -> None:
    hot = bound.Group(shared_blocks=500, conversations=(5, 5, 5, 5, 5, 5))  # 30 of 60
    cheap = bound.Group(shared_blocks=10, conversations=(10,))  # one conversation
    others = [bound.Group(100, (10,)), bound.Group(100, (10,)), bound.Group(100, (8,))]
    groups = [hot, cheap, *others]  # 30 + 10 + 10 + 10 + 8 = 68 requests, 2 bins: mean 34
    assert bound.min_max_split([g.requests for g in groups], 2) == 38  # 30 + 8 at least
    # Only a copy of the hot group's prefix reaches 36 (1.06 x the mean): 25 + 10 | 5 + 28;
    # a conversation never splits, so the cheap prefix cannot be copied to any use.
    assert bound.one_copy_plan(groups, 2, cap=36) == (0, 500, 35)
    assert bound.one_copy_plan(groups, 2, cap=30) is None


def test_groups_are_conversations_behind_one_shared_prefix(bound: ModuleType) -> None:
    def req(session: str, hashes: tuple[int, ...]) -> object:
        return bound.HashedRequest(0.0, hashes, hashes, 16 * len(hashes), 64, 8, session)

    hashed = [
        req("a", (1, 2, 3, 10)),
        req("a", (1, 2, 3, 10, 11)),
        req("b", (1, 2, 3, 20)),
        req("c", (7, 8)),
    ]
    groups = bound.groups_of(hashed)
    assert groups == [bound.Group(3, (2, 1)), bound.Group(2, (1,))]


def test_the_size_oracle_keeps_each_group_home_and_fills_by_promised_size(
    bound: ModuleType,
) -> None:
    from gpufleet.routing.types import ReplicaView, RequestInfo

    group_of = {(1,): 10, (2,): 20, (3,): 30, (1, 5): 10}
    oracle = bound.SizeOracle(group_of, {10: 5, 20: 2, 30: 2})
    views = [ReplicaView(replica_id=f"r{i}", url=f"sim://r{i}") for i in range(2)]

    def route(hashes: tuple[int, ...]) -> str:
        chosen = oracle.choose(RequestInfo(request_id="q", model="m", prefix_hashes=hashes), views)
        return chosen.replica_id

    # group 10 (5 requests to come) on r0; 20 and 30 both on r1, promised 2 then 4 < 5
    assert [route(h) for h in [(1,), (2,), (3,), (1, 5)]] == ["r0", "r1", "r1", "r0"]
