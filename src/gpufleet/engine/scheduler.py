"""The scheduler: which requests run in the next iteration, as vLLM v1 decides. Pure.

`schedule()` plans one iteration:

1. Running requests first, in order: each gets the tokens it still needs (1 for a decode,
   the rest of its prompt for a chunked prefill) within the token budget
   (`max_num_batched_tokens`). When the KV blocks run out, the newest running request is
   preempted back to the head of the waiting queue (its KV dropped, recomputed later).
2. If nothing was preempted, waiting requests are admitted first-come-first-served while
   `max_num_seqs` and the token budget allow; a new request first reuses the cached blocks
   of its longest cached prefix (never its last token), and only the rest is prefilled.
   With LoRA (`engine.lora`), a request whose adapter would exceed `max_loras` adapters in
   the running batch is skipped: it keeps its place and requests behind it may go first.

`update_from_output()` applies an iteration's end: every request whose scheduled tokens
reached its last token emits one new token, and finished requests hand back their blocks.
Blocks belong to the `KVCacheManager`; the scheduler only asks it.
"""

from __future__ import annotations

from collections import deque

from gpufleet.engine.kv_cache_manager import KVCacheManager
from gpufleet.engine.lora import AdapterSlots
from gpufleet.engine.outputs import EngineConfig, StepOutcome
from gpufleet.engine.request import EngineRequest, FinishReason, RequestStatus
from gpufleet.perf.step_time import StepBatch


class ScheduledWork:
    """The scheduler's half of a `ScheduledBatch` (the engine adds the times). A plain
    class: built every iteration, and mypyc compiles only an explicit `__init__`."""

    __slots__ = ("batch", "entries", "num_tokens")

    def __init__(
        self, entries: list[tuple[EngineRequest, int]], batch: StepBatch, num_tokens: int
    ) -> None:
        self.entries = entries
        self.batch = batch
        self.num_tokens = num_tokens


class Scheduler:
    def __init__(
        self, config: EngineConfig, kv: KVCacheManager, lora: AdapterSlots | None = None
    ) -> None:
        self.config = config
        self.kv = kv
        self.lora = lora
        self.running: list[EngineRequest] = []
        self.waiting: deque[EngineRequest] = deque()
        self.requests: dict[str, EngineRequest] = {}
        self.preempted: list[EngineRequest] = []  # since the last outcome took them
        # counters (monotonic)
        self.prefix_queries_tokens = 0
        self.prefix_hits_tokens = 0
        self.num_preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished_by_reason: dict[str, int] = {r.value: 0 for r in FinishReason}

    # ------------------------------------------------------------------ requests
    def add(self, req: EngineRequest) -> None:
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def abort(self, request_id: str, reason: FinishReason, now_s: float) -> EngineRequest | None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
            self._release_lora(req)
        else:
            self.waiting.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.ABORTED
        req.finish_reason = reason
        req.finished_s = now_s
        self.finished_by_reason[reason] += 1  # (a StrEnum: its value's key)
        return req

    def finish(self, req: EngineRequest, reason: FinishReason, now_s: float) -> None:
        """End a request that produced its last token (the caller drops it from running)."""
        req.finish_reason = reason
        req.finished_s = now_s
        req.status = RequestStatus.FINISHED
        self.finished_by_reason[reason] += 1  # (a StrEnum: its value's key)
        self.kv.free(req)
        del self.requests[req.request_id]
        self._release_lora(req)

    def _release_lora(self, req: EngineRequest) -> None:
        if req.lora is not None and self.lora is not None:
            self.lora.release(req.lora)

    # ------------------------------------------------------------------ scheduling
    def schedule(self, start_s: float) -> ScheduledWork | None:
        cfg = self.config
        kv = self.kv
        running = self.running
        budget = cfg.max_num_batched_tokens
        threshold = cfg.long_prefill_token_threshold
        entries: list[tuple[EngineRequest, int]] = []
        prefill_tokens: list[int] = []
        prefill_context: list[int] = []
        num_decode = 0
        decode_context = 0
        preempted_any = False

        # 1. running requests, oldest first
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            # (`num_tokens` written out: every running request, every step)
            n = req.num_prompt_tokens + req.num_output_tokens - computed
            if n <= 0:  # its last step is still in flight (pipeline parallel)
                i += 1
                continue
            if n > budget:
                n = budget
            if threshold and n > threshold:
                n = threshold
            scheduled = True
            while not kv.allocate_slots(req, n):
                victim = self._pick_victim()
                if victim is None:
                    scheduled = False
                    break
                self._preempt(victim)
                preempted_any = True
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                break
            req.num_computed_tokens = computed + n
            req.in_flight += 1  # also keeps it from being chosen as a victim below
            entries.append((req, computed + n))
            budget -= n
            if n == 1:
                num_decode += 1
                decode_context += computed
            else:
                prefill_tokens.append(n)
                prefill_context.append(computed)
            i += 1

        # 2. waiting requests, first come first served
        waiting = self.waiting
        lora = self.lora
        skipped: list[EngineRequest] = []  # over max_loras: kept in order, passed over
        # With pp > 1, spread simultaneous arrivals over the pipeline's micro-batches (as
        # vLLM's per-stage virtual engines did) instead of packing them into one.
        admit_left = len(waiting)
        if cfg.pipeline_stages > 1:
            admit_left = -(-(len(running) + len(waiting)) // cfg.pipeline_stages)
        if not preempted_any:
            while waiting and budget > 0 and len(running) < cfg.max_num_seqs and admit_left > 0:
                admit_left -= 1
                req = waiting[0]
                if req.lora is not None and lora is not None and not lora.can_admit(req.lora):
                    skipped.append(waiting.popleft())
                    continue
                hit_blocks = kv.get_computed_blocks(req)
                computed = len(hit_blocks) * kv.block_size
                n = req.num_tokens - computed
                if n > budget:
                    n = budget
                if threshold and n > threshold:
                    n = threshold
                if not kv.allocate_slots(req, n, hit_blocks):
                    break  # not enough KV for it now; FCFS keeps the rest waiting too
                waiting.popleft()
                req.num_computed_tokens = computed + n
                if not req.prefix_hit_recorded:
                    # vLLM counts queries and hits in tokens at a request's first admission.
                    req.prefix_hit_recorded = True
                    req.num_prefix_hit_tokens = computed
                    if kv.enable_caching:
                        self.prefix_queries_tokens += req.num_tokens
                        self.prefix_hits_tokens += computed
                if req.first_scheduled_s is None:
                    req.first_scheduled_s = start_s
                req.status = RequestStatus.RUNNING
                if req.lora is not None and lora is not None:
                    lora.admit(req.lora)
                running.append(req)
                req.in_flight += 1
                entries.append((req, computed + n))
                budget -= n
                if n == 1:
                    num_decode += 1
                    decode_context += computed
                else:
                    prefill_tokens.append(n)
                    prefill_context.append(computed)
            if skipped:
                waiting.extendleft(reversed(skipped))

        if not entries:
            return None
        batch = StepBatch(
            prefill_tokens=tuple(prefill_tokens),
            prefill_context_tokens=tuple(prefill_context),
            num_decode=num_decode,
            decode_context_tokens=decode_context,
        )
        return ScheduledWork(entries, batch, cfg.max_num_batched_tokens - budget)

    def _pick_victim(self) -> EngineRequest | None:
        """The newest running request that has no step in flight (vLLM: running.pop())."""
        running = self.running
        for j in range(len(running) - 1, -1, -1):
            if running[j].in_flight == 0:
                return running[j]
        return None

    def _preempt(self, req: EngineRequest) -> None:
        self.running.remove(req)
        self._release_lora(req)
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(req)
        self.num_preemptions += 1
        self.preempted.append(req)

    # ------------------------------------------------------------------ completion
    def update_from_output(
        self, entries: list[tuple[EngineRequest, int]], outcome: StepOutcome
    ) -> None:
        """The iteration that scheduled `entries` ended at `outcome.now_s`: hand out its
        tokens into `outcome` and end the requests that are done."""
        now = outcome.now_s
        max_len = self.config.max_model_len
        emitted = outcome.emitted
        finished = outcome.finished
        running_status = RequestStatus.RUNNING
        for req, ends_at in entries:
            req.in_flight -= 1
            if (
                req.status is not running_status
                or ends_at != req.num_prompt_tokens + req.num_output_tokens
            ):
                continue  # aborted meanwhile, or a prefill chunk short of the last token
            if not req.counted_output:  # (a counted answer's tokens are its count)
                req.all_token_ids.append(req.next_token_id())
            req.num_output_tokens += 1
            if req.first_token_s is None:
                req.first_token_s = now
                self.prompt_tokens += req.num_prompt_tokens
            emitted.append(req)
            reason = finish_reason(req, max_len)
            if reason is not None:
                self.finish(req, reason, now)
                finished.append(req)
        self.generation_tokens += len(emitted)
        if finished:
            self.running = [r for r in self.running if r.status is running_status]


def finish_reason(req: EngineRequest, max_model_len: int) -> FinishReason | None:
    """Why a request that just produced a token is done, or None if it goes on."""
    if req.num_output_tokens >= req.max_tokens or req.num_tokens >= max_model_len:
        return FinishReason.LENGTH
    if req.stop_after_tokens is not None and req.num_output_tokens >= req.stop_after_tokens:
        return FinishReason.STOP
    return None
