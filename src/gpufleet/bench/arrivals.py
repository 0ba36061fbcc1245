"""When each request (or session) starts, in seconds from the start of the run. Pure.

Open-loop arrivals follow vLLM's serving benchmark: inter-arrival gaps are drawn from a
gamma distribution with shape = burstiness and mean 1/rate (burstiness 1 is a Poisson
process, < 1 burstier, inf a constant rate). For a fixed rate the cumulative times are
rescaled so n requests span exactly n/rate seconds, which steadies throughput across
seeds. A linear ramp moves the rate from its start to its end value across the requests.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator


def _gap_s(rate: float, burstiness: float, rng: random.Random) -> float:
    if math.isinf(rate):
        return 0.0
    if math.isinf(burstiness):
        return 1.0 / rate
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def _check(rate: float, burstiness: float) -> None:
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")


def arrival_offsets(
    n: int,
    rate: float,
    burstiness: float = 1.0,
    rng: random.Random | None = None,
    ramp: tuple[float, float] | None = None,
) -> list[float]:
    """Start offsets of n requests. `ramp` = (start rate, end rate) overrides `rate`."""
    rng = rng or random.Random(0)
    _check(rate if ramp is None else min(ramp), burstiness)
    offsets: list[float] = []
    t = 0.0
    for i in range(n):
        if ramp is not None:
            progress = i / max(n - 1, 1)
            current = ramp[0] + (ramp[1] - ramp[0]) * progress
        else:
            current = rate
        t += _gap_s(current, burstiness, rng)
        offsets.append(t)
    if ramp is None and offsets and offsets[-1] > 0 and not math.isinf(rate):
        scale = (n / rate) / offsets[-1]
        offsets = [x * scale for x in offsets]
    return offsets


def iter_arrival_offsets(
    rate: float, burstiness: float = 1.0, rng: random.Random | None = None
) -> Iterator[float]:
    """Unbounded start offsets at a fixed rate (for timed runs; no rescaling)."""
    rng = rng or random.Random(0)
    _check(rate, burstiness)
    t = 0.0
    while True:
        t += _gap_s(rate, burstiness, rng)
        yield t
