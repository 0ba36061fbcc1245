"""Adapter popularity: Zipf shares, seeded draws, sessions keep their adapter."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from gpufleet.workload import (
    AdapterPopularity,
    WorkloadSpec,
    adapter_name,
    sim_requests,
    synthetic_shapes,
    text_conversations,
    with_adapters,
)


def test_zipf_probabilities_follow_rank_power() -> None:
    p = AdapterPopularity(4, zipf_s=1.0).probabilities()
    assert sum(p) == pytest.approx(1.0)
    # P(k) proportional to 1/k: 12/25, 6/25, 4/25, 3/25
    assert p == pytest.approx([12 / 25, 6 / 25, 4 / 25, 3 / 25])
    assert AdapterPopularity(5, zipf_s=0.0).probabilities() == pytest.approx([0.2] * 5)


def test_draws_match_the_distribution_and_the_seed() -> None:
    pop = AdapterPopularity(8, zipf_s=1.2, seed=3)
    draws = list(itertools.islice(pop.draws(), 40_000))
    counts = Counter(draws)
    for name, p in zip(pop.names(), pop.probabilities(), strict=True):
        assert counts[name] / len(draws) == pytest.approx(p, abs=0.01)
    assert list(itertools.islice(pop.draws(), 50)) == draws[:50]
    other = list(itertools.islice(AdapterPopularity(8, zipf_s=1.2, seed=4).draws(), 50))
    assert other != draws[:50]


def test_base_fraction_sends_some_requests_to_the_base_model() -> None:
    pop = AdapterPopularity(3, base_fraction=0.25, seed=1)
    draws = list(itertools.islice(pop.draws(), 20_000))
    assert draws.count(None) / len(draws) == pytest.approx(0.25, abs=0.015)


def test_adapters_do_not_change_arrivals_or_lengths_and_sessions_keep_theirs() -> None:
    spec = WorkloadSpec(30, rate=5.0, sessions=True, turns=3, input_tokens=20, seed=2)
    plain = list(synthetic_shapes(spec))
    tagged = list(with_adapters(synthetic_shapes(spec), AdapterPopularity(5, seed=2)))
    assert [(s.arrival_s, s.turns) for s in plain] == [(s.arrival_s, s.turns) for s in tagged]
    assert {s.adapter for s in tagged} <= {adapter_name(k) for k in range(1, 6)}
    reqs = sim_requests(tagged)
    by_session: dict[str | None, set[str | None]] = {}
    for r in reqs:
        by_session.setdefault(r.session_key, set()).add(r.adapter)
    assert all(len(adapters) == 1 for adapters in by_session.values())
    texts = list(text_conversations(tagged))
    assert [c.adapter for c in texts] == [s.adapter for s in tagged]


@pytest.mark.parametrize(
    "kwargs",
    [{"adapters": 0}, {"adapters": 2, "zipf_s": -1.0}, {"adapters": 2, "base_fraction": 1.0}],
)
def test_bad_popularity_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AdapterPopularity(**kwargs)  # type: ignore[arg-type]
