import itertools
import math
import random

import pytest

from gpufleet.errors import UserError
from gpufleet.stats import mean
from gpufleet.workload import (
    RatePhase,
    arrival_offsets,
    iter_arrival_offsets,
    parse_rate_steps,
    schedule_offsets,
)


def gaps(xs: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *xs], xs, strict=False)]


def test_fixed_rate_is_rescaled_to_n_over_rate() -> None:
    offs = arrival_offsets(200, rate=8.0, burstiness=1.0, rng=random.Random(1))
    assert offs[-1] == pytest.approx(200 / 8.0)
    assert offs == sorted(offs)


def test_constant_rate_with_infinite_burstiness() -> None:
    offs = arrival_offsets(5, rate=4.0, burstiness=math.inf)
    assert offs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.25])


def test_infinite_rate_sends_all_at_once() -> None:
    assert arrival_offsets(4, rate=math.inf) == [0.0] * 4


def test_burstiness_changes_the_spread_not_the_mean() -> None:
    smooth = gaps(arrival_offsets(2000, 10.0, burstiness=4.0, rng=random.Random(2)))
    bursty = gaps(arrival_offsets(2000, 10.0, burstiness=0.25, rng=random.Random(2)))
    assert mean(smooth) == pytest.approx(0.1, rel=1e-6) and mean(bursty) == pytest.approx(
        0.1, rel=1e-6
    )
    cv = lambda g: (sum((x - mean(g)) ** 2 for x in g) / len(g)) ** 0.5 / mean(g)  # noqa: E731
    assert cv(smooth) < 0.7 < 1.3 < cv(bursty)  # gamma CV = 1/sqrt(shape): 0.5 vs 2


def test_linear_ramp_speeds_up() -> None:
    offs = arrival_offsets(400, rate=1.0, burstiness=math.inf, ramp=(2.0, 20.0))
    g = gaps(offs)
    assert g[0] == pytest.approx(1 / 2.0) and g[-1] == pytest.approx(1 / 20.0)
    assert all(a >= b for a, b in itertools.pairwise(g))


def test_unbounded_iterator_has_the_right_mean() -> None:
    it = iter_arrival_offsets(5.0, 1.0, random.Random(3))
    offs = [next(it) for _ in range(2000)]
    assert offs[-1] / 2000 == pytest.approx(0.2, rel=0.05)


def test_bad_rates_are_refused() -> None:
    with pytest.raises(ValueError):
        arrival_offsets(3, rate=0.0)
    with pytest.raises(ValueError):
        arrival_offsets(3, rate=1.0, burstiness=0.0)


def test_a_constant_schedule_at_infinite_burstiness_is_evenly_spaced() -> None:
    offs = schedule_offsets([RatePhase("a", 2.0, 4.0, 4.0)], burstiness=math.inf)
    assert offs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75])


def test_a_ramp_follows_the_integral_of_its_rate() -> None:
    # 0 -> 20 req/s over 100 s at constant spacing in operational time: arrival k is where
    # the integral 0.1 t^2 reaches k, i.e. t = sqrt(10 k).
    offs = schedule_offsets([RatePhase("ramp", 100.0, 0.0, 20.0)], burstiness=math.inf)
    assert len(offs) == 999  # the 1000th lands exactly on the end, outside [0, 100)
    assert offs[:3] == pytest.approx([math.sqrt(10), math.sqrt(20), math.sqrt(30)])
    # Poisson: counts per 25 s quarter follow the area under the rate, 0.1 t^2 between ends
    poisson = schedule_offsets([RatePhase("ramp", 100.0, 0.0, 20.0)], rng=random.Random(5))
    counts = [sum(1 for t in poisson if q * 25 <= t < (q + 1) * 25) for q in range(4)]
    for got, want in zip(counts, (62.5, 187.5, 312.5, 437.5), strict=True):
        assert abs(got - want) < 4 * math.sqrt(want), counts


def test_rate_steps_follow_the_schedule() -> None:
    steps = parse_rate_steps("1:100, 20:100, 0:50, 1:100")
    assert [s.start_rps for s in steps] == [1, 20, 0, 1]
    offs = schedule_offsets(steps, rng=random.Random(1))
    bounds = ((0, 100), (100, 200), (200, 250), (250, 350))
    counts = [sum(1 for t in offs if lo <= t < hi) for lo, hi in bounds]
    assert counts[2] == 0 and max(offs) < 350
    assert counts[1] > 5 * max(counts[0], counts[3])
    assert offs == schedule_offsets(steps, rng=random.Random(1))
    for bad in ("5", "x:10", "1:0", "-1:10"):
        with pytest.raises(UserError, match="--rate-steps"):
            parse_rate_steps(bad)
