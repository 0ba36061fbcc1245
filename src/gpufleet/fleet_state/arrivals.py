"""Requests the gateway admitted: a running total and a count over the signal window.

The autoscaler trends the arrival rate (Little's law turns it into requests in flight one
cold start ahead); counts, not rates, so that the workers of one gateway add up. Times
are passed in; nothing here reads a clock.
"""

from __future__ import annotations

from gpufleet.fleet_state.recent_times import RecentTimes


class Arrivals(RecentTimes):
    """Admissions (requests that were routed or queued, not refused), the fleet's and
    each model's: a monotonic total and the count over the last `window_s`."""

    MAX_MODELS = 64  # a bound on per-model counts (model names come from clients)

    def __init__(self, window_s: float, max_samples: int = 200_000) -> None:
        super().__init__(max_samples)
        self.window_s = window_s
        self.total = 0
        self.total_by_model: dict[str, int] = {}
        self._models: list[str] = []  # each recent admission's model, by the times' index

    def add(self, now_s: float, model: str) -> None:
        self.total += 1
        if model in self.total_by_model or len(self.total_by_model) < self.MAX_MODELS:
            self.total_by_model[model] = self.total_by_model.get(model, 0) + 1
        self._models.append(model)
        self._add_time(now_s)

    def in_window(self, now_s: float) -> tuple[int, dict[str, int]]:
        """Admissions over the last `window_s`: the fleet's and each model's."""
        self._trim_before(now_s - self.window_s)
        by_model: dict[str, int] = {}
        for model in self._models[self._head :]:
            if model in self.total_by_model:
                by_model[model] = by_model.get(model, 0) + 1
        return self.count(), by_model

    def _drop_first(self, n: int) -> None:
        del self._models[:n]
