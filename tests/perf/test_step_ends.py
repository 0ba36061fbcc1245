"""`StepEnds` reads as the list `tolist` would give, and finds steps as `bisect` does."""

from __future__ import annotations

import bisect
import random

import numpy as np
import pytest

from gpufleet.perf.step_ends import StepEnds, steps_ended_by


@pytest.mark.parametrize("seed", range(5))
def test_step_ends_read_as_their_list(seed: int) -> None:
    rng = random.Random(seed)
    steps = [rng.choice([0.01, 0.02, 0.0125]) for _ in range(rng.randrange(1, 300))]
    x = np.add.accumulate(np.array(steps))
    ends, listed = StepEnds(x.data), x.tolist()
    assert len(ends) == len(listed) and list(ends) == listed and ends == listed
    for _ in range(50):
        i = rng.randrange(-len(listed), len(listed))
        assert ends[i] == listed[i] and type(ends[i]) is float
        k = rng.randrange(0, len(listed) + 1)
        assert ends[:k] == listed[:k]
        t = rng.choice([*listed, rng.uniform(-1.0, listed[-1] + 1.0)])  # ties included
        hi = rng.randrange(0, len(listed) + 1)
        assert steps_ended_by(ends, t, hi) == bisect.bisect_right(listed, t, 0, hi)
        assert steps_ended_by(listed, t, hi) == bisect.bisect_right(listed, t, 0, hi)
