"""A trend model for demand: least-squares line over a sliding window of samples.

Pure: samples come in with their timestamps; nothing reads a clock. A line is enough to
see a ramp one cold start ahead; it is cheap, has one parameter (the window), and when the
window holds fewer than three samples it makes no forecast rather than a wild one.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Window:
    """Samples (time, value) of the last `window_s`; older ones drop out as new ones come."""

    window_s: float = 60.0
    _samples: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, now_s: float, value: float) -> None:
        self._samples.append((now_s, value))
        self.expire(now_s)

    def expire(self, now_s: float) -> None:
        """Drop samples older than the window (`add` does; a reader between adds may)."""
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

    def forecast_low(self, at_s: float, z: float, span_s: float) -> float | None:
        """The line's value at `at_s` less `z` standard errors of it, from the scatter
        about the line. Samples that each count over `span_s` overlap: those of the window
        count (last − first + span_s) / span_s independent ones, not one a sample. None
        until the samples span the window (carried as far ahead as the window is long, a
        shorter line's error grows as (ahead / its span)²; at the study's start one over
        45 s asked for 24 replicas where 8 held), or with fewer than 3 independent ones."""
        fit = self._fit()
        n = len(self._samples)
        if fit is None or n < 4:
            return None
        seen_s = self._samples[-1][0] - self._samples[0][0]
        n_eff = min(float(n), (seen_s + span_s) / span_s) if span_s > 0 else float(n)
        if seen_s < 0.9 * self.window_s or n_eff < 3.0:
            return None
        slope, mean_t, mean_v = fit
        resid_sq = sum((v - mean_v - slope * (t - mean_t)) ** 2 for t, v in self._samples)
        sxx = sum((t - mean_t) ** 2 for t, _ in self._samples)
        var = resid_sq / (n - 2) * (1.0 / n_eff + (at_s - mean_t) ** 2 / (sxx * n_eff / n))
        return mean_v + slope * (at_s - mean_t) - z * math.sqrt(var)

    def rising(self) -> bool:
        """The fitted line slopes up (False with too few samples to fit)."""
        fit = self._fit()
        return fit is not None and fit[0] > 0

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
class WindowMin(_Window):
    """The smallest value seen over the last `window_s`."""

    def low(self) -> float:
        return min((v for _, v in self._samples), default=0.0)


@dataclass(slots=True)
class WindowMean(_Window):
    """The mean of samples over the last `window_s` (Knative's and Ray Serve's averaging)."""

    def mean(self, since_s: float | None = None) -> float | None:
        vals = [v for t, v in self._samples if since_s is None or t >= since_s]
        return sum(vals) / len(vals) if vals else None


@dataclass(slots=True)
class WindowMedian(_Window):
    """The median of samples over the last `window_s` (one outlier moves it little)."""

    def median(self) -> float | None:
        vals = sorted(v for _, v in self._samples)
        if not vals:
            return None
        mid = len(vals) // 2
        return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2.0


@dataclass(slots=True)
class ArrivalRate:
    """Requests per second from a counter of admissions (the gateway's `admitted_total`).

    `rate_s` is the span one rate is counted over: long enough that a rate of a few
    requests per second is not all noise, short enough to see a burst. `peak` holds the
    highest such rate of the last `window_s`: an arrival rate's next minutes are not its
    trend (at a cold start's horizon a fitted line mostly extrapolates noise); they are,
    with few exceptions, below its recent peak.
    """

    rate_s: float = 30.0
    window_s: float = 120.0
    _totals: deque[tuple[float, float]] = field(default_factory=deque)
    _rates: WindowMax = field(default_factory=WindowMax)

    def add(self, now_s: float, total: float) -> None:
        if self._totals and total < self._totals[-1][1]:
            self._totals.clear()  # the counter restarted (a new gateway): start over
        self._totals.append((now_s, total))
        while len(self._totals) > 1 and self._totals[1][0] <= now_s - self.rate_s:
            self._totals.popleft()
        self._rates.window_s = self.window_s
        rate = self.rate()
        if rate is not None:
            self._rates.add(now_s, rate)

    def rate(self) -> float | None:
        """Over the last `rate_s` (None until a rate's span has been seen)."""
        if len(self._totals) < 2:
            return None
        (t0, n0), (t1, n1) = self._totals[0], self._totals[-1]
        if t1 - t0 < self.rate_s * 0.5:
            return None
        return (n1 - n0) / (t1 - t0)

    def peak(self) -> float | None:
        """The highest rate over the last `window_s`."""
        return self._rates.peak() if self.rate() is not None else None
