"""Samples kept in time order, bounded in count, whose oldest leave as time passes.

The recent latency windows (`latency.RecentWindow`) and the admissions' window
(`arrivals.Arrivals`) keep the same thing: a time per sample, in an array of doubles read
from `_head` on, beside a store of their own for what each sample holds. A dropped sample
only moves `_head`; the room is given back once the gone samples are half of it (and
4,096 or more), so neither adding nor trimming moves memory per sample. Not a deque of
tuples: a simulated fleet keeps ~20,000 samples per window, objects nothing reads until
they are freed, by then cold. Times are passed in; nothing here reads a clock.
"""

from __future__ import annotations

from array import array

_COMPACT_AFTER = 4096  # gone samples kept before their room is given back, at least


class RecentTimes:
    """The times of samples `_head` on; subclasses keep each sample's payload at the same
    index and drop it in `_drop_first`."""

    def __init__(self, max_samples: int) -> None:
        self.max_samples = max_samples
        self._times = array("d")
        self._head = 0  # the samples before it are gone

    def count(self) -> int:
        return len(self._times) - self._head

    def _add_time(self, now_s: float) -> None:
        """A sample at `now_s`, its payload already added: the oldest goes past the bound."""
        self._times.append(now_s)
        if len(self._times) - self._head > self.max_samples:
            self._head += 1
            self._compact()

    def _trim_before(self, cutoff_s: float) -> None:
        """Drop the samples older than `cutoff_s`."""
        times = self._times
        head, n = self._head, len(times)
        while head < n and times[head] < cutoff_s:
            head += 1
        self._head = head
        self._compact()

    def _compact(self) -> None:
        head = self._head
        if head >= _COMPACT_AFTER and 2 * head >= len(self._times):
            del self._times[:head]
            self._drop_first(head)
            self._head = 0

    def _drop_first(self, n: int) -> None:
        """Drop the payloads of the first `n` samples (those gone)."""
