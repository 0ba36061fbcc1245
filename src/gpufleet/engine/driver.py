"""The one way to drive an `Engine`: step at start, deliver at end.

The contract every driver keeps (the replica's real-time runner, the simulator, the
planner's closed-loop check, tests and benchmarks):

1. `submit` a request when it reaches the engine. An idle engine's clock first jumps to the
   arrival, so the first step ends one step time after it, however late the driver runs.
2. `begin` the next iteration: the engine computes it at once and its clock moves to the
   iteration's end (`StepOutcome.now_s`). Requests submitted before `begin` join it; later
   ones wait for the next. `None` means nothing ran: idle (`engine.has_work` is false) or
   blocked (work, but nothing schedulable now: try again `BLOCKED_RETRY_S` later).
3. Deliver the outcome's tokens (`emitted`, `finished`) at its end time and no earlier,
   then `begin` the next iteration at that same instant. Whatever the delivery causes (a
   client's next request) reaches the engine after that, as in vLLM's busy loop.

`run_virtual` plays the contract out on virtual time for offline drivers.

Later (issue 12) an advance may cover several uneventful iterations at once; its outcome's
tokens then carry their own times, and a driver delivers each at its time and begins the
next advance at the outcome's end. Drivers go through `begin()`, so that lands here.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from gpufleet.engine.engine import Engine, StepOutcome
from gpufleet.engine.request import EngineRequest

# How long a driver waits before retrying a blocked engine (the live runner sleeps 1 ms).
BLOCKED_RETRY_S = 0.001

T = TypeVar("T")


class EngineDriver:
    __slots__ = ("engine",)

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def submit(self, request: EngineRequest, arrival_s: float) -> None:
        """Add a request that reached the engine at `arrival_s` (engine clock)."""
        engine = self.engine
        if not engine.has_work:
            engine.advance_to(arrival_s)
        engine.add(request)

    def begin(self) -> StepOutcome | None:
        """Start the next iteration; its outcome is due at `outcome.now_s`. None: nothing
        ran (idle, or blocked while `engine.has_work`)."""
        outcome = self.engine.step()
        if outcome.duration_s <= 0.0 and not outcome.emitted:
            return None
        return outcome


class Arrivals(Generic[T]):
    """Things due at virtual times (requests, clients' next sends), earliest first; ties
    in the order they were added."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, T]] = []
        self._seq = 0

    def add(self, at_s: float, item: T) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at_s, self._seq, item))

    def next_s(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop(self) -> tuple[float, T]:
        at_s, _, item = heapq.heappop(self._heap)
        return at_s, item

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __len__(self) -> int:
        return len(self._heap)


def run_virtual(
    driver: EngineDriver,
    arrivals: Arrivals[T],
    admit: Callable[[float, T], EngineRequest | None],
) -> Iterator[StepOutcome]:
    """The contract on virtual time: yield each iteration's outcome at its end.

    Before each iteration, everything in `arrivals` due at or before its start is passed
    to `admit(at_s, item)` and the request it returns submitted. An idle engine skips to
    the next arrival; the loop ends when the engine is idle and nothing is due. The caller
    may add arrivals while it handles an outcome (a client's next request, due at
    `outcome.now_s` or later) and may stop iterating at any point.
    """
    engine = driver.engine
    while True:
        next_s = arrivals.next_s()
        while next_s is not None and next_s <= engine.now_s:
            at_s, item = arrivals.pop()
            request = admit(at_s, item)
            if request is not None:
                driver.submit(request, at_s)
            next_s = arrivals.next_s()
        if not engine.has_work:
            if next_s is None:
                return
            engine.advance_to(next_s)
            continue
        outcome = driver.begin()
        if outcome is None:  # blocked: retry a little later, as the live runner does
            engine.advance_to(engine.now_s + BLOCKED_RETRY_S)
            continue
        yield outcome
