"""Requests the gateway admitted: a running total and a count over the signal window.

The autoscaler trends the arrival rate (Little's law turns it into requests in flight one
cold start ahead); counts, not rates, so that the workers of one gateway add up. Times
are passed in; nothing here reads a clock.
"""

from __future__ import annotations

from array import array


class Arrivals:
    """Admissions (requests that were routed or queued, not refused), the fleet's and
    each model's: a monotonic total and the count over the last `window_s`."""

    MAX_MODELS = 64  # a bound on per-model counts (model names come from clients)

    def __init__(self, window_s: float, max_samples: int = 200_000) -> None:
        self.window_s = window_s
        self.total = 0
        self.total_by_model: dict[str, int] = {}
        self.max_samples = max_samples
        # the recent admissions' times and models (the same index), from `_head` on: an
        # array of doubles, not a tuple and a float per admission kept
        self._times = array("d")
        self._models: list[str] = []
        self._head = 0

    def add(self, now_s: float, model: str) -> None:
        self.total += 1
        if model in self.total_by_model or len(self.total_by_model) < self.MAX_MODELS:
            self.total_by_model[model] = self.total_by_model.get(model, 0) + 1
        self._times.append(now_s)
        self._models.append(model)
        if len(self._times) - self._head > self.max_samples:
            self._head += 1
            self._compact()

    def in_window(self, now_s: float) -> tuple[int, dict[str, int]]:
        """Admissions over the last `window_s`: the fleet's and each model's."""
        cutoff = now_s - self.window_s
        times = self._times
        head, n = self._head, len(times)
        while head < n and times[head] < cutoff:
            head += 1
        self._head = head
        self._compact()
        by_model: dict[str, int] = {}
        for model in self._models[self._head :]:
            if model in self.total_by_model:
                by_model[model] = by_model.get(model, 0) + 1
        return len(self._times) - self._head, by_model

    def _compact(self) -> None:
        """Drop the gone samples' room once they are half of it (and 4,096 or more)."""
        head = self._head
        if head >= 4096 and 2 * head >= len(self._times):
            del self._times[:head]
            del self._models[:head]
            self._head = 0
