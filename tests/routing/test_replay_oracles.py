"""routing_replay.py's oracle routers: prefix_aware's rules on the replicas' true caches.

They swap PrefixAware's index for one that reads the caches. A compiled PrefixAware (`make
sim-compiled`) checks its `index` attribute's type and refused the swap with a TypeError, so
the oracles crashed on the compiled build; under it this test failed before the fix."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

# importing the benchmark imports its result recorder, which asks git for the commit
pytestmark = pytest.mark.process

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def replay_bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import routing_replay

    return routing_replay


def test_oracles_route_and_see_the_true_caches(replay_bench: ModuleType) -> None:
    args = replay_bench.parse_args(
        ["synthetic:multi_turn", "--requests", "120", "--policies", "prefix_aware"]
    )
    result = replay_bench.run_source("synthetic:multi_turn", args)
    rows = {row["router"]: row["runs"][0] for row in result["rows"]}
    assert set(rows) == {"prefix_aware", "oracle_prefix_aware", "oracle_longest"}
    # the longest-match oracle reads the true caches: no hit is lost to placement
    assert rows["oracle_longest"]["held_elsewhere_vs_pooled_engine"] == 0.0
    assert rows["oracle_longest"]["hit_rate"] > 0.5


def test_the_oracles_policy_takes_any_index(replay_bench: ModuleType) -> None:
    policy = replay_bench.interpreted_prefix_aware()(seed=0)
    policy.index = replay_bench._TrueIndex({}, {})
    assert isinstance(policy.index, replay_bench._TrueIndex)
