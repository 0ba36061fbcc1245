"""The routing policies' written-out random draws draw exactly what `random.Random`'s
`choice` and `sample` draw (a seeded run routes the same with either)."""

from __future__ import annotations

import random

from gpufleet.routing.base import randbelow, sample_two


def test_sample_two_is_random_sample_of_a_range() -> None:
    for n in (2, 3, 5, 20, 21, 22, 23, 64, 255, 256, 257, 1000):
        for seed in range(40):
            mine, theirs = random.Random(seed), random.Random(seed)
            for _ in range(25):
                assert list(sample_two(mine, n)) == theirs.sample(range(n), 2), (n, seed)
            assert mine.getstate() == theirs.getstate()  # (the same number of draws)


def test_randbelow_is_random_choice() -> None:
    for n in (1, 2, 3, 7, 8, 9, 100, 256, 1023, 1024):
        items = list(range(n))
        mine, theirs = random.Random(n), random.Random(n)
        for _ in range(200):
            assert items[randbelow(mine, n)] == theirs.choice(items)
        assert mine.getstate() == theirs.getstate()
