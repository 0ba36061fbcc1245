"""A trend model for demand: least-squares line over a sliding window of samples.

Pure: samples come in with their timestamps; nothing reads a clock. A line is enough to
see a ramp one cold start ahead; it is cheap, has one parameter (the window), and when the
window holds fewer than three samples it makes no forecast rather than a wild one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Window:
    """Samples (time, value) of the last `window_s`; older ones drop out as new ones come."""

    window_s: float = 60.0
    _samples: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, now_s: float, value: float) -> None:
        self._samples.append((now_s, value))
        while self._samples and self._samples[0][0] < now_s - self.window_s:
            self._samples.popleft()


@dataclass(slots=True)
class LinearTrend(_Window):
    window_s: float = 30.0

    def forecast(self, at_s: float) -> float | None:
        """The fitted line's value at `at_s`, or None with too few samples to fit."""
        fit = self._fit()
        if fit is None:
            return None
        slope, mean_t, mean_v = fit
        return mean_v + slope * (at_s - mean_t)

    def _fit(self) -> tuple[float, float, float] | None:
        n = len(self._samples)
        if n < 3:
            return None
        mean_t = sum(t for t, _ in self._samples) / n
        mean_v = sum(v for _, v in self._samples) / n
        var_t = sum((t - mean_t) ** 2 for t, _ in self._samples)
        if var_t <= 0.0:
            return None
        cov = sum((t - mean_t) * (v - mean_v) for t, v in self._samples)
        return cov / var_t, mean_t, mean_v


@dataclass(slots=True)
class WindowMax(_Window):
    """The largest value seen over the last `window_s` (the recent peak)."""

    def peak(self) -> float:
        return max((v for _, v in self._samples), default=0.0)


@dataclass(slots=True)
class WindowMean(_Window):
    """The mean of samples over the last `window_s` (Knative's and Ray Serve's averaging)."""

    def mean(self, since_s: float | None = None) -> float | None:
        vals = [v for t, v in self._samples if since_s is None or t >= since_s]
        return sum(vals) / len(vals) if vals else None


@dataclass(slots=True)
class RobustTrend(_Window):
    """A line whose slope is the repeated median of the pairwise slopes (Siegel) and whose
    level is the mean of the last `level_s`: the arrival rate one cold start ahead.

    A step (rate r, then 2r and staying) is no trend: more than half the points lie on one
    side of it, so the median slope stays 0 and the forecast is the new level, where a least-squares
    line tilts towards the step and, extrapolated a cold start ahead, overshoots it several
    times. A ramp tilts every pair alike. Samples are averaged into at most `max_points`
    buckets first: the pairs grow as the square, and a per-tick rate is noisy.
    """

    window_s: float = 120.0
    level_s: float = 10.0
    max_points: int = 128

    def forecast(self, at_s: float) -> float | None:
        samples = list(self._samples)
        if len(samples) < 3:
            return None
        per = -(-len(samples) // self.max_points)
        points = [
            (sum(t for t, _ in b) / len(b), sum(v for _, v in b) / len(b))
            for b in (samples[i : i + per] for i in range(0, len(samples), per))
        ]
        # Siegel's repeated median: each point's median slope to the points, then their
        # median. A step leaves more than half the points on one side of it, whose own
        # median slopes are 0; a point counts itself as flat, so that a step at exactly
        # half the window (two equal halves) is a step too.
        each = []
        for t1, v1 in points:
            slopes = sorted([0.0, *((v2 - v1) / (t2 - t1) for t2, v2 in points if t2 != t1)])
            each.append(_median(slopes))
        slope = _median(sorted(each)) if each else 0.0
        recent = [(t, v) for t, v in samples if t >= samples[-1][0] - self.level_s]
        level_t = sum(t for t, _ in recent) / len(recent)
        level_v = sum(v for _, v in recent) / len(recent)
        return level_v + slope * (at_s - level_t)


def _median(ordered: list[float]) -> float:
    """The median of sorted values, the lower one of the middle two: of two equal
    halves, a step's flat side (slope 0) and its straddling side, the flat one."""
    return ordered[(len(ordered) - 1) // 2]
