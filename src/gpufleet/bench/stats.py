"""Summary statistics as vLLM's serving benchmark reports them (numpy's definitions).

Pure Python so the core needs no numpy: `percentile` is numpy's default 'linear' method,
`std` is the population standard deviation (ddof=0), and an empty series reads as 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)


def mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else 0.0


def std(xs: Sequence[float]) -> float:
    if not xs:
        return 0.0
    m = mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / len(xs))


def percentile_sorted(sorted_xs: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) by linear interpolation between closest ranks."""
    if not sorted_xs:
        return 0.0
    if not 0.0 <= p <= 100.0:
        raise ValueError("percentile must be in [0, 100]")
    pos = (len(sorted_xs) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    frac = pos - lo
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * frac


def percentile(xs: Sequence[float], p: float) -> float:
    return percentile_sorted(sorted(xs), p)


def median(xs: Sequence[float]) -> float:
    return percentile(xs, 50.0)


def summarize_ms(xs_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    """mean, median, std and the asked percentiles of a series in seconds, reported in ms."""
    ordered = sorted(xs_s)
    out = {
        "mean": mean(ordered) * 1000.0,
        "median": percentile_sorted(ordered, 50.0) * 1000.0,
        "std": std(ordered) * 1000.0,
    }
    for p in percentiles:
        out[f"p{format_percentile(p)}"] = percentile_sorted(ordered, p) * 1000.0
    return out


def format_percentile(p: float) -> str:
    """99.0 -> '99', 99.9 -> '99.9' (the key vLLM writes)."""
    return str(int(p)) if float(p).is_integer() else str(p)
