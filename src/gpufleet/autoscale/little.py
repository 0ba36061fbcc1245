"""Requests in flight to size for, from the arrival rate (Little's law: L = λ W).

The gateway counts the requests it admits (`FleetSignals.admitted_total`); their rate is
the fleet's input, which no scaling decision changes, while the in-flight count is its
output and grows with every queue. The demand a cold start ahead is the time in the
system (in flight / rate over the rate's span, its median over the peak window: a
backlog that replicas already starting will clear inflates it for a while, and sizing
for it would start more) times the rate's peak over that window (`ArrivalRate`: at a
cold start's horizon a fitted trend mostly extrapolates noise, and a least-squares
in-flight trend carried 120 s ahead overshot every arrival step ~2×). A line through the
rate over the peak window only bounds a scale-in (`in_flight_ahead`: replicas removed on
the way up come back a cold start late, so the fewer must hold the demand by then;
`rate_rising`, its slope's sign, where that guard is off). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.autoscale.forecast import ArrivalRate, LinearTrend, WindowMean, WindowMedian
from gpufleet.autoscale.signals import FleetSignals


@dataclass(slots=True)
class LittleDemand:
    known: bool = False  # the gateway counts admissions
    _rate: ArrivalRate = field(default_factory=ArrivalRate)
    _in_flight: WindowMean = field(default_factory=WindowMean)  # over the rate's span
    _time_in_system: WindowMedian = field(default_factory=WindowMedian)
    _rate_trend: LinearTrend = field(default_factory=LinearTrend)  # the rate over the peak window

    def windows(self, peak_s: float) -> None:
        """The peak window (at least a cold start): the rate's peak and the median time."""
        self._rate.window_s = self._time_in_system.window_s = self._rate_trend.window_s = peak_s
        self._in_flight.window_s = self._rate.rate_s

    def add(self, now_s: float, signals: FleetSignals) -> None:
        self.known = signals.admitted_total is not None
        if signals.admitted_total is None:
            return
        self._rate.add(now_s, float(signals.admitted_total))
        self._in_flight.add(now_s, float(signals.demand))
        rate, in_flight = self._rate.rate(), self._in_flight.mean()
        if rate is not None:
            self._rate_trend.add(now_s, rate)
        if rate and in_flight is not None:
            self._time_in_system.add(now_s, in_flight / rate)

    def rate_rising(self) -> bool:
        """The arrival rate's line over the peak window slopes up."""
        return self._rate_trend.rising()

    def in_flight_ahead(self, at_s: float) -> float | None:
        """The time in the system × the rate's line carried to `at_s` (None: no line yet)."""
        time_s, rate = self._time_in_system.median(), self._rate_trend.forecast(at_s)
        return None if time_s is None or rate is None else time_s * max(rate, 0.0)

    def rise_in_flight(self, at_s: float, z: float) -> float | None:
        """The time in the system × the rate's line carried to `at_s`, less `z` of its
        own standard errors (`LinearTrend.forecast_low`): the part of a rise the line is
        sure of. A rate counted over `rate_s` is the rate of its span's middle, so the
        line is read half a span later. None: no line yet."""
        time_s = self._time_in_system.median()
        span_s = self._rate.rate_s
        rate = self._rate_trend.forecast_low(at_s + span_s / 2.0, z, span_s)
        return None if time_s is None or rate is None else time_s * max(rate, 0.0)

    def time_in_system_s(self) -> float | None:
        return self._time_in_system.median()

    def peak_in_flight(self) -> float | None:
        """Time in the system × the rate's recent peak (None: not seen a rate's span yet)."""
        time_s, peak = self._time_in_system.median(), self._rate.peak()
        return None if time_s is None or peak is None else time_s * peak
