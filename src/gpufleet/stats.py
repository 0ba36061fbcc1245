"""The one definition of every summary figure gpufleet prints, and its one histogram.

Percentiles are vLLM's serving benchmark's: `numpy.percentile` with its default 'linear'
method (interpolate between the two closest ranks). `gpufleet bench`, `gpufleet up`'s
summary, `gpufleet sim`'s report, the gateway's recent-latency window (what autoscaling
reads) and the routing replay all call `percentile`/`percentiles` here, so one set of
latencies gives one p99 whichever command prints it. `std` is the population standard
deviation (ddof=0), as numpy's default.

`Histogram` is the Prometheus histogram that the replica's and the gateway's /metrics
expose (bucket counts and a sum; `observe` is one bisect and two additions, no lock),
and `histogram_quantile` is Prometheus' estimate of a quantile from cumulative buckets.
Pure: no clock, no I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import numpy as np

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
INF = float("inf")


def percentiles(values: Sequence[float], ps: Sequence[float]) -> list[float] | None:
    """The `ps`-th percentiles (each in 0..100) of `values`; None when there are none."""
    if len(values) == 0:
        return None
    if any(not 0.0 <= p <= 100.0 for p in ps):
        raise ValueError(f"percentiles must be in [0, 100], got {list(ps)}")
    out = np.percentile(np.asarray(values, dtype=np.float64), np.asarray(ps, dtype=np.float64))
    return [float(x) for x in np.atleast_1d(out)]


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0..100) of `values`, numpy's linear method; None when empty."""
    got = percentiles(values, (p,))
    return None if got is None else got[0]


def mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else 0.0


def std(values: Sequence[float]) -> float:
    return float(np.std(values)) if len(values) else 0.0


def summarize_ms(values_s: Sequence[float], ps: Sequence[float]) -> dict[str, float]:
    """mean, median, std and the `ps` percentiles of a series in seconds, in ms (0 if empty)."""
    got = percentiles(values_s, (50.0, *ps)) or [0.0] * (len(ps) + 1)
    out = {"mean": mean(values_s) * 1000.0, "median": got[0] * 1000.0}
    out["std"] = std(values_s) * 1000.0
    for p, value in zip(ps, got[1:], strict=True):
        out[f"p{format_percentile(p)}"] = value * 1000.0
    return out


def format_percentile(p: float) -> str:
    """99.0 -> '99', 99.9 -> '99.9' (the key vLLM writes)."""
    return str(int(p)) if float(p).is_integer() else str(p)


class Histogram:
    """Bucket counts and a sum over fixed upper bounds (`le`), plus +Inf."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("histogram bounds must be strictly increasing")
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs as Prometheus exposes them, '+Inf' last."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip((*self.bounds, INF), self.counts, strict=True):
            total += n
            out.append(("+Inf" if bound == INF else repr(float(bound)), float(total)))
        return out

    def quantile(self, q: float) -> float | None:
        """Prometheus' estimate of quantile `q` (0..1) from these buckets."""
        return histogram_quantile(q, [(float(le), n) for le, n in self.cumulative()])


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (le, count) buckets: linear inside the
    bucket that holds rank q × count; None when the histogram is empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == INF:
                return lower_bound  # the highest finite bound, as Prometheus does
            if count == lower_count:
                return le
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    return lower_bound


def bucket_delta(
    new: Sequence[tuple[float, float]], old: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Cumulative buckets of the observations between two scrapes of one histogram
    (a restarted process's counters went back: then all of `new`)."""
    before = dict(old)
    delta = [(le, c - before.get(le, 0.0)) for le, c in new]
    if any(c < 0 for _, c in delta):
        return list(new)
    return delta
