"""The routing benchmarks' synthetic sources: NAME@SEED draws another workload instance."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_a_workload_seed_draws_another_instance_and_seed_0_is_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from routing_workloads import load_requests, source_label

    def texts(source: str) -> list[str]:
        return [r.text for r in load_requests(source, 0, 5, 1.0, 64)]

    assert texts("synthetic:multi_turn@0") == texts("synthetic:multi_turn")
    assert texts("synthetic:multi_turn@1") != texts("synthetic:multi_turn")
    assert source_label("synthetic:multi_turn@1") == "multi_turn@1"
