"""The client's own timing error: event-loop lag and CPU use during a run.

A chunk is timestamped when the event loop gets to it, so the loop's lag (how late a
short sleep wakes up) bounds how late a timestamp can be. CPU use near one full core
means the client itself may be the bottleneck.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from gpufleet.stats import mean, percentile

BUSY_CPU_UTIL = 0.9  # of one core
LATE_LOOP_P99_MS = 10.0


@dataclass(frozen=True, slots=True)
class ClientOverhead:
    loop_lag_mean_ms: float
    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    cpu_util: float  # process CPU seconds / wall seconds (1.0 = one full core)
    schedule_lag_mean_ms: float | None  # open loop without cap: sent minus scheduled
    schedule_lag_p99_ms: float | None

    @property
    def saturated(self) -> bool:
        """The client kept its core busy: it may have been the bottleneck."""
        return self.cpu_util > BUSY_CPU_UTIL

    @property
    def starved(self) -> bool:
        """The loop woke late although the client was not busy: other processes had the
        CPU, so timestamps may be late by about the loop lag."""
        return not self.saturated and self.loop_lag_p99_ms > LATE_LOOP_P99_MS

    def to_dict(self) -> dict[str, Any]:
        return {
            "loop_lag_mean_ms": self.loop_lag_mean_ms,
            "loop_lag_p99_ms": self.loop_lag_p99_ms,
            "loop_lag_max_ms": self.loop_lag_max_ms,
            "cpu_util": self.cpu_util,
            "schedule_lag_mean_ms": self.schedule_lag_mean_ms,
            "schedule_lag_p99_ms": self.schedule_lag_p99_ms,
            "saturated": self.saturated,
            "starved": self.starved,
        }


class LoopLagMonitor:
    """Sleeps `interval_s` in a loop and records how late each wake-up is."""

    def __init__(self, interval_s: float = 0.01):
        self.interval_s = interval_s
        self.lags_s: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._cpu0 = 0.0
        self._wall0 = 0.0
        self.cpu_s = 0.0
        self.wall_s = 0.0

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            self.lags_s.append(max(0.0, time.perf_counter() - t - self.interval_s))

    def start(self) -> None:
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self.cpu_s = time.process_time() - self._cpu0
        self.wall_s = time.perf_counter() - self._wall0
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def report(self, schedule_lags_s: list[float] | None) -> ClientOverhead:
        lags = self.lags_s
        return ClientOverhead(
            loop_lag_mean_ms=mean(lags) * 1000,
            loop_lag_p99_ms=(percentile(lags, 99) or 0.0) * 1000,
            loop_lag_max_ms=(max(lags) if lags else 0.0) * 1000,
            cpu_util=self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0,
            schedule_lag_mean_ms=mean(schedule_lags_s) * 1000 if schedule_lags_s else None,
            schedule_lag_p99_ms=(percentile(schedule_lags_s, 99) or 0.0) * 1000
            if schedule_lags_s
            else None,
        )
