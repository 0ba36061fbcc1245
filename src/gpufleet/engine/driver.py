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

Offline drivers (the simulator) may instead `begin_advance()`: an `Advance` is one
iteration or, when the coming iterations are plain decode steps, a whole run of them
(`Engine.plan_decode_run`), due at its `due_s`. A run is applied lazily: the engine keeps
its state from before the run until something needs it. `submit` and `abort` during a run
first apply the iterations that began by then and cut the run there (its `due_s` moves
earlier: the driver schedules its delivery again); `metrics` answers from the plan. At its
due time `end(advance)` applies what is left and returns the outcome to deliver: a
`StepOutcome`, or a `DecodeRunOutcome` whose tokens carry their own times. Either way the
engine ends exactly where stepping iteration by iteration would have left it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from gpufleet.engine.decode_run import DecodeRun, plan_decode_run
from gpufleet.engine.engine import Engine
from gpufleet.engine.lora import LoraAdapter
from gpufleet.engine.outputs import DecodeRunOutcome, StepOutcome
from gpufleet.engine.request import EngineRequest, FinishReason

# How long a driver waits before retrying a blocked engine (the live runner sleeps 1 ms).
BLOCKED_RETRY_S = 0.001

T = TypeVar("T")


class Advance:
    """Iterations begun on an engine, their tokens due at `due_s` (earlier once cut)."""

    __slots__ = ("due_s", "outcome", "run")

    def __init__(self, due_s: float, outcome: Outcome | None, run: DecodeRun | None) -> None:
        self.due_s = due_s
        self.outcome = outcome  # set once applied
        self.run = run  # the planned run not applied yet


Outcome = StepOutcome | DecodeRunOutcome


class EngineDriver:
    __slots__ = ("_advance", "engine")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._advance: Advance | None = None  # a run begun and not applied yet

    def submit(self, request: EngineRequest, arrival_s: float) -> None:
        """Add a request that reached the engine at `arrival_s` (engine clock)."""
        self._settle(arrival_s)
        engine = self.engine
        if not engine.has_work:
            engine.advance_to(arrival_s)
        engine.add(request)

    def add_lora(self, adapter: LoraAdapter, at_s: float) -> float:
        """Load a LoRA adapter at `at_s` (engine clock), cutting a run in progress there;
        the engine time when it is loaded (`Engine.add_lora`)."""
        self._settle(at_s)
        return self.engine.add_lora(adapter, at_s)

    def begin(self) -> StepOutcome | None:
        """Start the next iteration; its outcome is due at `outcome.now_s`. None: nothing
        ran (idle, or blocked while `engine.has_work`)."""
        engine = self.engine
        steps = engine.num_steps
        outcome = engine.step()
        return None if engine.num_steps == steps else outcome

    # -- jumps (offline drivers) ----------------------------------------------------------
    def begin_advance(self) -> Advance | None:
        """Start the next iteration, or a run of plain decode iterations (applied lazily);
        deliver `end(advance)` at `advance.due_s`. None: nothing ran (as `begin`)."""
        engine = self.engine
        run = plan_decode_run(engine, None, None)  # (`Engine.plan_decode_run`, one call less)
        if run is not None:
            advance = self._advance = Advance(run.step_end_s[-1], None, run)
            return advance
        outcome = self.begin()
        return None if outcome is None else Advance(outcome.now_s, outcome, None)

    def end(self, advance: Advance) -> Outcome:
        """The outcome of `advance` at its due time (a run is applied now if it was not)."""
        if advance.run is not None:
            advance.outcome = self.engine.run_decode(advance.run)
            advance.run = None
            self._advance = None
        assert advance.outcome is not None
        return advance.outcome

    def abort(
        self, request_id: str, at_s: float, reason: FinishReason = FinishReason.ABORT
    ) -> EngineRequest | None:
        """Drop a request at `at_s` (cutting a run in progress there)."""
        self._settle(at_s)
        return self.engine.abort(request_id, reason)

    def metrics(self, at_s: float) -> tuple[int, int, float]:
        """(running, waiting, KV cache usage) as `/metrics` would read them at `at_s`."""
        advance = self._advance
        engine = self.engine
        sched = engine.scheduler  # (every replica, every scrape: no property calls)
        if advance is not None and advance.run is not None:
            run = advance.run
            steps = run.num_steps_started_by(at_s)
            if steps < len(run.step_end_s) or not run.finishes:
                return len(sched.running), len(sched.waiting), run.kv_cache_usage_after(steps)
            self._settle(at_s)  # every step has begun: apply the run, due time unchanged
        return len(sched.running), len(sched.waiting), engine.kv_cache_usage

    def _settle(self, at_s: float) -> None:
        """Apply the iterations of the run in progress that began by `at_s`; the rest of
        the run is dropped (planned again once these are delivered)."""
        advance = self._advance
        if advance is None or advance.run is None:
            return
        run = advance.run
        outcome = self.engine.run_decode(run, max(1, run.num_steps_started_by(at_s)))
        advance.outcome = outcome
        advance.run = None
        advance.due_s = outcome.now_s
        self._advance = None


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
