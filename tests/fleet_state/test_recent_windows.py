"""The recent windows keep their samples in arrays: they answer as a bounded deque of
(time, value) pairs trimmed to the window would, through many compactions."""

from __future__ import annotations

import random
from collections import deque

import pytest

from gpufleet.fleet_state.arrivals import Arrivals
from gpufleet.fleet_state.latency import RecentWindow
from gpufleet.stats import percentiles


@pytest.mark.parametrize("max_samples", [0, 1, 7, 5000])
def test_a_window_answers_as_a_bounded_deque_trimmed_to_it(max_samples: int) -> None:
    rng = random.Random(max_samples)
    window = RecentWindow(window_s=3.0, max_samples=max_samples)
    ref: deque[tuple[float, float]] = deque(maxlen=max_samples)
    now = 0.0
    for i in range(30_000):
        now += rng.expovariate(2000.0) if i % 5000 else 4.0  # (now and then a gap)
        value = rng.random()
        window.add(now, value)
        ref.append((now, value))
        if i % 997 == 0:
            while ref and ref[0][0] < now - 3.0:
                ref.popleft()
            values = [v for _, v in ref]
            assert window.mean(now) == (sum(values) / len(values) if values else None)
            assert window.samples == list(ref) and window.count() == len(ref)  # (trimmed)
            got = window.percentiles(now, (0.5, 0.99))
            want = percentiles(values, [50.0, 99.0])
            assert list(got.values()) == (list(want) if want is not None else [None, None])


def test_arrivals_count_the_window_as_a_bounded_deque_would() -> None:
    rng = random.Random(3)
    arrivals = Arrivals(window_s=2.0, max_samples=6000)
    ref: deque[tuple[float, str]] = deque(maxlen=6000)
    now = 0.0
    for i in range(40_000):
        now += rng.expovariate(3000.0)
        model = rng.choice(["a", "b"])
        arrivals.add(now, model)
        ref.append((now, model))
        if i % 1999 == 0:
            while ref and ref[0][0] < now - 2.0:
                ref.popleft()
            by_model = {m: sum(1 for _, x in ref if x == m) for m in ("a", "b")}
            count, got = arrivals.in_window(now)
            assert count == len(ref)
            assert got == {m: n for m, n in by_model.items() if n}
