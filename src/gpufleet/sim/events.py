"""The simulator's events: one heap ordered by (time, kind, sequence).

At equal times: hand out a step's tokens first, then new replicas, scrapes, arrivals,
requests reaching their engines, idle engines waking for them (so requests arriving at one instant share a first step, as
the live runner wakes only after the submitting handlers yield), the autoscaler (which
then sees this instant's arrivals), timeouts, and crashes last.
"""

from __future__ import annotations

from heapq import heappush
from typing import Any

(
    STEP_DONE,  # (SimReplica, StepOutcome): an engine iteration ends, its tokens go out
    REPLICA_READY,  # SimReplica: its cold start is over
    SCRAPE,  # None: the gateway reads every replica's /metrics
    ARRIVAL,  # int: request index, its client sends it
    DELIVER,  # (SimReplica, LiveRequest): a routed request reaches its engine (HTTP path)
    WAKE,  # SimReplica: an idle engine starts on what arrived this instant
    TICK,  # None: the autoscaler decides
    QUEUE_TIMEOUT,  # QueueTicket: a request waiting at the gateway reaches its deadline
    DRAIN_DEADLINE,  # SimReplica: a draining replica's requests are cut
    RETRY,  # SimReplica: a blocked engine tries again
    CRASH,  # SimReplica: its process fails (`gpufleet.sim.faults`)
) = range(11)


class EventQueue:
    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0

    def push(self, t: float, kind: int, payload: Any = None) -> None:
        self.seq += 1
        heappush(self.heap, (t, kind, self.seq, payload))

    def reserve(self, count: int) -> int:
        """Take `count` sequence numbers for events pushed later (`push_reserved`), so they
        keep the order they would have had pushed now; the first of them."""
        first = self.seq + 1
        self.seq += count
        return first

    def push_reserved(self, t: float, kind: int, seq: int, payload: Any = None) -> None:
        heappush(self.heap, (t, kind, seq, payload))


class SimClock:
    """The virtual clock every part of the simulator reads (`clock()` or `clock.now_s`)."""

    __slots__ = ("now_s",)

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s
