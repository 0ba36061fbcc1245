"""Fixed-cadence rounds, as Prometheus scrapes its targets (wave 19).

Round k is due at `origin_s + k × interval_s`, whatever the rounds before it took: the
phase against other fixed-cadence loops (the autoscaler's ticks) holds for the whole run.
Sleeping the interval after each round instead (the gateway's scrape loop until wave 19)
moves the phase by the round's duration every interval.

A round that overruns its slot does not make the loop burst to catch up: the next round
starts at the first slot not yet begun, and the slots it passed are skipped (counted).
Prometheus does the same: its scrape loop waits on a Go ticker, which drops the ticks a
slow receiver missed, so a scrape longer than `scrape_interval` runs at the next tick
after it, never twice in a row. Pure: times in, times out.

`gpufleet up` puts the gateway's scrapes `SCRAPE_AFTER_TICK_S` after the autoscaler's
ticks (`HealthChecks.align_scrapes`), where the simulator has them (`sim_vs_live`'s
`scrape_phase_s`): one constant for both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Where a scrape falls in the autoscaler's tick interval, live (`gpufleet up`) and in the
# simulator: half an interval of 1 s after each tick.
SCRAPE_AFTER_TICK_S = 0.5


@dataclass
class Cadence:
    interval_s: float
    origin_s: float
    slot: int = 0  # the round under way (or the next one, between rounds)
    skipped: int = 0  # slots passed by rounds that overran them

    def due_s(self, slot: int | None = None) -> float:
        """When a slot's round is due (the current one by default)."""
        return self.origin_s + (self.slot if slot is None else slot) * self.interval_s

    def advance(self, now_s: float) -> float:
        """After a round that ended at `now_s`: move to the next slot not yet begun and
        return when it is due (at or after `now_s`; in the past never)."""
        late = math.ceil((now_s - self.origin_s) / self.interval_s)
        nxt = max(self.slot + 1, late)
        self.skipped += nxt - (self.slot + 1)
        self.slot = nxt
        return self.due_s()

    def rephase(self, origin_s: float, now_s: float) -> None:
        """From the next round on, slots at `origin_s` + k × interval (the round under way,
        if any, keeps its old start)."""
        self.origin_s = origin_s
        self.slot = math.floor((now_s - origin_s) / self.interval_s)
