"""Runs the pure engine in real time: step, sleep until the step's end, hand out tokens.

It keeps the engine-driver contract of `gpufleet.engine.driver` (step at start, deliver at
end) on the wall clock; the simulator keeps the same contract on a virtual one. The loop
schedules against absolute wall time (`target` = when the current step ends), so
it does not drift: a late wake-up shortens the next sleep. One step costs
`duration_s x time_scale x slow_factor` of wall time. A request's handler waits on its
`RequestStream`; the loop wakes it once per step in which the request got tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from gpufleet.engine import (
    BLOCKED_RETRY_S,
    Engine,
    EngineDriver,
    EngineRequest,
    FinishReason,
    StepOutcome,
)
from gpufleet.engine.lora import LoraAdapter

# Steps at least this long (wall) end to the sub-millisecond; shorter ones within the
# event loop's timer tick, which spares the CPU of replicas stepping every few ms.
_PRECISE_STEP_S = 0.008
# After an idle spell, how long the loop lets other arrivals be parsed before stepping.
_GATHER_ARRIVALS_S = 0.001


class RequestStream:
    """The replica-side end of one engine request.

    The engine computes a step's tokens when the step starts; they become `available` only
    when the runner reaches the step's end time, so a handler never sends a token early.
    """

    __slots__ = (
        "_waiter",
        "arrival_wall_s",
        "available",
        "ended",
        "first_token_wall_s",
        "last_token_wall_s",
        "on_tokens",
        "req",
        "sent",
    )

    def __init__(self, req: EngineRequest, arrival_wall_s: float):
        self.req = req
        self.available = 0  # output tokens whose time has come
        self.ended = False  # the request finished in the engine and its end time has come
        self.sent = 0  # output tokens already handed to the client
        # If set, the runner calls it (synchronously) instead of waking the handler when
        # tokens become available; the handler is still woken when the request ends.
        self.on_tokens: Callable[[RequestStream], None] | None = None
        self.arrival_wall_s = arrival_wall_s
        self.first_token_wall_s: float | None = None
        self.last_token_wall_s: float | None = None
        self._waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        """Until there are unsent tokens or the request has ended."""
        if self.available > self.sent or self.ended:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class EngineRunner:
    def __init__(
        self,
        engine: Engine,
        *,
        time_scale: float = 1.0,
        on_step: Callable[[StepOutcome], None] | None = None,
    ):
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.engine = engine
        self.driver = EngineDriver(engine)
        self.time_scale = time_scale
        self.slow_factor = 1.0  # fault injection: every iteration takes this much longer
        self.on_step = on_step  # called once per step when its tokens are handed out
        self.streams: dict[str, RequestStream] = {}
        self.step_wall_s = 0.0  # wall time at which the last step's tokens were handed out
        self.failed: BaseException | None = None
        self._target_wall_s = 0.0  # wall time at which the engine clock's `now_s` is reached
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    def submit(self, req: EngineRequest, received_wall_s: float | None = None) -> RequestStream:
        """Add a request that arrived at `received_wall_s` (default: now).

        An idle engine starts its clock at the arrival, not at this call, so the time the
        server spent parsing and tokenizing overlaps the simulated step instead of adding
        to every TTFT.
        """
        now = time.monotonic()
        arrival = now if received_wall_s is None else min(received_wall_s, now)
        self.driver.submit(req, self._engine_time_s(arrival))
        stream = RequestStream(req, arrival)
        self.streams[req.request_id] = stream
        self._wake.set()
        return stream

    def add_lora(self, adapter: LoraAdapter) -> float:
        """Load a LoRA adapter between iterations (vLLM's add_lora); the wall seconds until
        it is loaded. ValueError when the engine cannot load it."""
        engine = self.engine
        done_s = engine.add_lora(adapter, self._engine_time_s(time.monotonic()))
        done_wall_s = self._target_wall_s + (done_s - engine.now_s) * self.time_scale
        return max(0.0, done_wall_s - time.monotonic())

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> None:
        self.streams.pop(request_id, None)
        self.engine.abort(request_id, reason)

    def _engine_time_s(self, wall_s: float) -> float:
        """`wall_s` on the engine clock. Past the last step's end (the engine may be idle),
        the wall clock is the reference from then on, so idle gaps carry over."""
        engine = self.engine
        if engine.has_work or wall_s <= self._target_wall_s:
            return engine.now_s
        engine_s = engine.now_s + (wall_s - self._target_wall_s) / self.time_scale
        self._target_wall_s = wall_s
        return engine_s

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # the replica reports itself dead on /health
            self.failed = e
            for stream in self.streams.values():
                stream.ended = True
                stream.wake()
            raise

    async def _loop(self) -> None:
        engine = self.engine
        begin = self.driver.begin
        streams = self.streams
        clock = time.monotonic  # event-loop clocks (uvloop) tick in whole milliseconds
        self._target_wall_s = clock()
        while True:
            if not engine.has_work:
                self._wake.clear()
                await self._wake.wait()
                # No clock sync here: `submit` synced the engine clock at the arrival, so
                # the first step ends one step time after it however late we start. Let
                # requests that arrived together finish parsing first, so they share the
                # step as in vLLM, whose engine drains its whole input queue before a step.
                await asyncio.sleep(_GATHER_ARRIVALS_S)
            outcome = begin()
            if outcome is None:
                await asyncio.sleep(BLOCKED_RETRY_S)  # nothing schedulable right now; never spin
                continue
            step_wall_s = outcome.duration_s * self.time_scale * self.slow_factor
            self._target_wall_s += step_wall_s
            target = self._target_wall_s
            delay = target - clock()
            if step_wall_s < _PRECISE_STEP_S:
                await asyncio.sleep(max(delay, 0.0))  # 0: behind, still let handlers run
            else:
                # Event-loop timers tick in whole milliseconds: wake a little early and
                # yield until the step's end, so a long step ends to the sub-millisecond.
                await asyncio.sleep(delay - 0.0005 if delay > 0.001 else 0.0)
                while clock() < target:
                    await asyncio.sleep(0)
            self.step_wall_s = clock()
            if self.on_step is not None:
                self.on_step(outcome)
            # The engine has not computed the next step yet: its state is this step's end.
            for req in outcome.emitted:
                stream = streams.get(req.request_id)
                if stream is None:
                    continue
                stream.available = req.num_output_tokens
                if req.finish_reason is not None:  # finished this step
                    stream.ended = True
                if stream.on_tokens is None:
                    stream.wake()
                    continue
                try:
                    stream.on_tokens(stream)
                except Exception:  # a broken writer must not stop the engine
                    stream.on_tokens = None
                    stream.wake()
            for req in outcome.finished:
                stream = streams.pop(req.request_id, None)
                if stream is not None:
                    stream.ended = True
                    stream.wake()
