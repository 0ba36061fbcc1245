"""The engine model: vLLM v1 continuous batching over paged KV with a prefix cache. Pure.

`Engine.step()` runs one iteration: `schedule()` plans a batch (the `Scheduler` picks the
requests, the `KVCacheManager` gives them blocks) and prices it with the `StepTimeModel`;
`complete()` ends it, handing out one token to every request whose scheduled tokens reached
its last token.

With pipeline parallelism (`pipeline_stages` = pp > 1) up to pp micro-batches are in
flight: a micro-batch takes `step_time_s` end to end and a new one may start every
`step_time_s / pp`, so a lone request pays the whole pipeline per token while a loaded
engine fills the bubble. A request cannot have two decode steps in flight (its next token
is not known yet), exactly as in vLLM.

Between events that change the batch, decode iterations differ only in context length:
`plan_decode_run()` sees how many steps may be jumped over and when each ends, and
`run_decode()` applies them in one call, exactly as that many `step()` calls would
(see `gpufleet.engine.decode_run`).

There is no clock here: the engine keeps its own time `now_s`, advanced by step
durations, and a driver moves it forward across idle gaps with `advance_to`.
"""

from __future__ import annotations

import math
from collections import deque

from gpufleet.engine.decode_apply import apply_decode_run, apply_one_stage
from gpufleet.engine.decode_run import DecodeRun, plan_decode_run
from gpufleet.engine.kv_cache_manager import KVCacheManager
from gpufleet.engine.lora import AdapterSlots, LoraAdapter
from gpufleet.engine.outputs import (
    DecodeRunOutcome,
    EngineConfig,
    ScheduledBatch,
    SchedulerStats,
    StepOutcome,
)
from gpufleet.engine.request import EngineRequest, FinishReason
from gpufleet.engine.scheduler import Scheduler
from gpufleet.perf.step_time import StepTimeModel, decode_step_ends_fn, decode_step_times_fn
from gpufleet.tokenizer import block_hashes


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        step_time_model: StepTimeModel,
        seed: int = 0,
        lora: AdapterSlots | None = None,
    ):
        self.config = config
        self.lora = lora  # LoRA adapter slots (engine.lora); None: LoRA not enabled
        self.step_time_model = step_time_model
        self.decode_step_times_s = decode_step_times_fn(step_time_model)
        self.decode_step_ends_s = decode_step_ends_fn(step_time_model)
        self.seed = seed
        self.now_s = 0.0
        self.kv = KVCacheManager(
            config.num_gpu_blocks, config.block_size, enable_caching=config.enable_prefix_caching
        )
        self.scheduler = Scheduler(config, self.kv, lora)
        self.in_flight: deque[ScheduledBatch] = deque()  # oldest first
        self.next_start_s = 0.0  # earliest start of the next pipeline micro-batch
        self.num_steps = 0
        # Bumped by every change, so a planned decode run knows when it has gone stale.
        self.version = 0
        self._num_added = 0

    # ------------------------------------------------------------------ requests
    def add(self, request: EngineRequest) -> None:
        """Queue a request (FCFS). Its arrival defaults to the engine's current time."""
        if request.request_id in self.scheduler.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        limit = self.config.max_model_len
        if request.num_prompt_tokens >= limit:
            raise ValueError(
                f"prompt of {request.num_prompt_tokens} tokens does not fit max_model_len={limit}"
            )
        if request.arrival_s is None:
            request.arrival_s = self.now_s
        request.seed_if_unset(self.seed * 1_000_003 + self._num_added)
        self._num_added += 1
        if self.config.enable_prefix_caching and not request.block_hashes:
            request.block_hashes = block_hashes(request.all_token_ids, self.config.block_size)
        self.scheduler.add(request)
        self.version += 1

    def abort(
        self, request_id: str, reason: FinishReason = FinishReason.ABORT
    ) -> EngineRequest | None:
        """Drop a request at once, freeing its KV blocks. Unknown ids are ignored.

        `reason` is what it counts as: ABORT for a client that left, STOP when the server
        ended it on a stop string (the engine does not see text)."""
        self.version += 1
        return self.scheduler.abort(request_id, reason, self.now_s)

    def add_lora(self, adapter: LoraAdapter, now_s: float) -> float:
        """Load `adapter` (vLLM's add_lora) between iterations, at `now_s` or when the one
        in progress ends; the engine time when it is loaded. ValueError if it cannot be."""
        if self.lora is None:
            raise ValueError("LoRA is not enabled. Use --enable-lora to enable LoRA.")
        self.advance_to(now_s)
        self.lora.add(adapter, self.now_s)
        self.version += 1
        return self.lora.busy_until_s

    def remove_lora(self, name: str) -> bool:
        """Unregister an adapter (vLLM's remove_lora); False if it was not registered."""
        self.version += 1
        return self.lora is not None and self.lora.remove(name)

    def get(self, request_id: str) -> EngineRequest | None:
        return self.scheduler.requests.get(request_id)

    @property
    def has_work(self) -> bool:
        s = self.scheduler
        return bool(s.running or s.waiting or self.in_flight)

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache (SGLang's /flush_cache); False while requests run or wait."""
        return not self.has_work and self.kv.pool.reset_prefix_cache()

    def advance_to(self, now_s: float) -> None:
        """Move the engine clock across an idle gap (never backwards, never mid-step)."""
        if not self.in_flight and now_s > self.now_s:
            self.now_s = now_s
            self.version += 1

    # ------------------------------------------------------------------ stats
    @property
    def stats(self) -> SchedulerStats:
        s = self.scheduler
        return SchedulerStats(
            num_running=len(s.running),
            num_waiting=len(s.waiting),
            kv_cache_usage=self.kv.usage,
            num_gpu_blocks=self.config.num_gpu_blocks,
            block_size=self.config.block_size,
            prefix_cache_queries_tokens=s.prefix_queries_tokens,
            prefix_cache_hits_tokens=s.prefix_hits_tokens,
            num_preemptions=s.num_preemptions,
            prompt_tokens=s.prompt_tokens,
            generation_tokens=s.generation_tokens,
            finished_by_reason=dict(s.finished_by_reason),
            num_steps=self.num_steps,
            now_s=self.now_s,
        )

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def kv_cache_usage(self) -> float:
        return self.kv.usage

    # ------------------------------------------------------------------ stepping
    def schedule(self) -> ScheduledBatch | None:
        """Plan the next micro-batch, starting when the pipeline lets it, and put it in
        flight; None when nothing can be scheduled now."""
        start_s = max(self.now_s, self.next_start_s)
        work = self.scheduler.schedule(start_s)
        self.version += 1
        if work is None:
            return None
        step_s = self.step_time_model.step_time_s(work.batch)
        if self.lora is not None:  # loads it waits for, SGMV kernels of its adapters
            step_s += self.lora.step_extra_s(work.num_tokens, start_s)
        end_s = start_s + step_s
        in_flight = self.in_flight
        if in_flight and end_s < in_flight[-1].end_s:
            end_s = in_flight[-1].end_s  # micro-batches leave the pipeline in order
        self.next_start_s = start_s + step_s / self.config.pipeline_stages
        batch = ScheduledBatch(work.entries, work.batch, start_s, end_s, work.num_tokens)
        in_flight.append(batch)
        return batch

    def complete(self, batch: ScheduledBatch) -> StepOutcome:
        """End the oldest micro-batch in flight (`batch`): move the clock to its end and
        hand out its tokens."""
        if not self.in_flight or self.in_flight[0] is not batch:
            raise ValueError("complete() takes the oldest scheduled batch in flight")
        self.in_flight.popleft()
        outcome = StepOutcome(
            duration_s=batch.end_s - self.now_s,
            now_s=batch.end_s,
            preempted=self._take_preempted(),
            num_scheduled_tokens=batch.num_tokens,
        )
        self.now_s = batch.end_s
        self.num_steps += 1
        self.version += 1
        self.scheduler.update_from_output(batch.entries, outcome)
        return outcome

    def step(self) -> StepOutcome:
        """Run until the next micro-batch completes; return what it produced.

        With nothing to do, returns an outcome with duration 0 and no tokens.
        """
        pp = self.config.pipeline_stages
        in_flight = self.in_flight
        while len(in_flight) < pp:
            start_s = max(self.now_s, self.next_start_s)
            if in_flight and start_s >= in_flight[0].end_s:
                break  # the oldest micro-batch completes before another could start
            if self.schedule() is None:
                break
        if not in_flight:
            return StepOutcome(duration_s=0.0, now_s=self.now_s, preempted=self._take_preempted())
        return self.complete(in_flight[0])

    def _take_preempted(self) -> list[EngineRequest]:
        preempted = self.scheduler.preempted
        self.scheduler.preempted = []
        return preempted

    # ------------------------------------------------------------------ jumps
    def plan_decode_run(
        self, *, max_steps: int | None = None, until_s: float | None = None
    ) -> DecodeRun | None:
        """The longest run of coming `step()` calls that are plain decode steps (at most
        `max_steps`, none starting after `until_s`), with their end times; None when the
        next step is not one. Changes nothing: `run_decode` applies it."""
        return plan_decode_run(self, max_steps, until_s)

    def run_decode(self, run: DecodeRun, num_steps: int | None = None) -> DecodeRunOutcome:
        """Apply the first `num_steps` steps of `run` (all by default) as that many `step()`
        calls would. `run` must be the engine's latest plan, made since its last change."""
        if run.engine_version != self.version or run.engine is not self:
            raise ValueError("this decode run was planned before the engine last changed")
        planned = len(run.step_end_s)  # (run.num_steps)
        n = planned if num_steps is None else num_steps
        if not 1 <= n <= planned:
            raise ValueError(f"num_steps must be in 1..{run.num_steps}, got {n}")
        if run.calls or run.step_group:
            outcome = apply_decode_run(self, run, n)
        else:  # one stage (no pipeline calls): the lean apply
            outcome = apply_one_stage(self, run, n)
        self.version += 1
        return outcome

    def run_until(self, until_s: float = math.inf) -> list[StepOutcome | DecodeRunOutcome]:
        """Run every step that starts at or before `until_s` (by default: until the engine
        is idle), jumping over decode runs; their outcomes in order."""
        outcomes: list[StepOutcome | DecodeRunOutcome] = []
        while self.has_work and self.now_s <= until_s:
            run = self.plan_decode_run(until_s=until_s)
            if run is not None:
                outcomes.append(self.run_decode(run))
                continue
            outcome = self.step()
            if outcome.duration_s <= 0.0 and not outcome.emitted:
                break  # nothing can be scheduled: the driver must wait or add work
            outcomes.append(outcome)
        return outcomes
